//! The prefetch API the decoder uses: ask for the `(layer, expert)` set a token needs, receive
//! each expert as it lands and passes its check, in whatever order the device completes them.
//!
//! The driver keeps up to `queue_depth` reads in flight while slots are free, reaps what has
//! finished, refills the queue, and only then hashes the finished batch (in parallel, on the
//! rayon pool) so the device works while the CPU checks. An error — a failed read, a digest
//! mismatch — ends the prefetch: nothing more is started, reads in flight are waited for and
//! their slots freed, and experts landed but not yet handed out are dropped.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use rayon::prelude::*;

use crate::backend::{DoneRead, ExtentRead};
use crate::error::StreamError;
use crate::model::{io_err, ExpertExtent, RegionSpan};
use crate::pinned::LandedSlot;
use crate::source::ExpertSource;
use crate::verify::check_expert;

/// One expert in its ring slot, checked (unless checking was turned off). Dropping it frees the
/// slot.
#[derive(Debug)]
pub struct LandedExpert {
    slot: LandedSlot,
    extent: Arc<ExpertExtent>,
}

impl LandedExpert {
    /// Layer.
    pub fn layer(&self) -> u32 {
        self.extent.layer
    }

    /// Expert within the layer.
    pub fn expert(&self) -> u32 {
        self.extent.expert
    }

    /// Where it came from and its regions.
    pub fn extent(&self) -> &ExpertExtent {
        &self.extent
    }

    /// The extent's bytes as read (region padding included).
    pub fn bytes(&self) -> &[u8] {
        &self.slot
    }

    /// Each region with its exact bytes (padding excluded), in file order.
    pub fn regions(&self) -> impl Iterator<Item = (&RegionSpan, &[u8])> {
        self.extent
            .regions
            .iter()
            .map(|r| (r, &self.slot[r.start..r.start + r.len]))
    }

    /// The ring slot it occupies.
    pub fn slot(&self) -> u32 {
        self.slot.index()
    }

    /// Give up the expert's bookkeeping and keep its slot (e.g. to copy it to the GPU).
    pub fn into_slot(self) -> LandedSlot {
        self.slot
    }
}

/// Experts of one request, yielded as they land. See the module docs.
#[derive(Debug)]
pub struct Prefetch<'s> {
    src: &'s mut ExpertSource,
    wanted: Vec<Arc<ExpertExtent>>,
    next: usize,
    ready: VecDeque<LandedExpert>,
    done: Vec<DoneRead>,
    finished: bool,
}

impl<'s> Prefetch<'s> {
    pub(crate) fn new(
        src: &'s mut ExpertSource,
        wanted: &[(u32, u32)],
    ) -> Result<Prefetch<'s>, StreamError> {
        let mut seen = HashSet::new();
        let mut list = Vec::with_capacity(wanted.len());
        for &(layer, expert) in wanted {
            let x = src
                .model
                .get(layer, expert)
                .ok_or(StreamError::NoSuchExpert { layer, expert })?;
            if seen.insert((layer, expert)) {
                list.push(Arc::clone(x));
            }
        }
        let mut p = Prefetch {
            src,
            wanted: list,
            next: 0,
            ready: VecDeque::new(),
            done: Vec::new(),
            finished: false,
        };
        if let Err(e) = p.fill() {
            p.cancel_now();
            return Err(e);
        }
        Ok(p)
    }

    /// Experts not yet handed out (started or not).
    pub fn remaining(&self) -> usize {
        if self.finished {
            0
        } else {
            self.wanted.len() - self.next + self.src.backend.in_flight() + self.ready.len()
        }
    }

    /// Stop: start nothing more, wait for reads in flight, free their slots. Same as dropping.
    pub fn cancel(mut self) {
        self.cancel_now();
    }

    fn cancel_now(&mut self) {
        self.finished = true;
        self.ready.clear();
        let mut sink = Vec::new();
        while self.src.backend.in_flight() > 0 {
            // A backend that cannot reap keeps its slots (and frees them, or leaks them, when it
            // is dropped); none is ever handed back while the kernel may write it.
            if self.src.backend.reap(1, &mut sink).is_err() {
                break;
            }
            sink.clear();
        }
        self.done.clear();
    }

    /// Start reads while the queue has room, a slot is free and requests remain; then submit.
    fn fill(&mut self) -> Result<(), StreamError> {
        let qd = self.src.queue_depth;
        while self.next < self.wanted.len() && self.src.backend.in_flight() < qd {
            let Some(slot) = self.src.ring.try_claim() else {
                break;
            };
            let x = &self.wanted[self.next];
            let read = ExtentRead {
                tag: self.next,
                file: x.file,
                offset: x.offset,
                len: x.len,
            };
            self.src
                .backend
                .start(read, slot)
                .map_err(|e| self.read_error(self.next, e))?;
            self.next += 1;
        }
        self.src
            .backend
            .submit()
            .map_err(|e| io_err(self.src.model.dir(), "submit reads", e))
    }

    fn read_error(&self, tag: usize, source: std::io::Error) -> StreamError {
        let x = &self.wanted[tag];
        StreamError::Read {
            layer: x.layer,
            expert: x.expert,
            path: self.src.model.path(x.file).to_path_buf(),
            offset: x.offset,
            len: x.len,
            source,
        }
    }

    fn step(&mut self) -> Result<(), StreamError> {
        self.fill()?;
        if self.src.backend.in_flight() == 0 {
            return Err(StreamError::RingExhausted {
                slots: self.src.ring.slots(),
            });
        }
        let mut done = std::mem::take(&mut self.done);
        self.src
            .backend
            .reap(1, &mut done)
            .map_err(|e| io_err(self.src.model.dir(), "wait for reads", e))?;
        // Refill before hashing, so the device is busy while the batch is checked.
        let refill = self.fill();
        let mut first_err = refill.err();
        let verify = self.src.verify;
        let model = &self.src.model;
        let wanted = &self.wanted;
        let landed: Vec<Result<LandedExpert, StreamError>> = done
            .par_drain(..)
            .map(|(tag, slot, outcome)| {
                let x = &wanted[tag];
                if let Err(source) = outcome {
                    return Err(StreamError::Read {
                        layer: x.layer,
                        expert: x.expert,
                        path: model.path(x.file).to_path_buf(),
                        offset: x.offset,
                        len: x.len,
                        source,
                    });
                }
                let slot = slot.land(x.len);
                if verify {
                    check_expert(x, &slot, model.reader(x.file))?;
                }
                Ok(LandedExpert {
                    slot,
                    extent: Arc::clone(x),
                })
            })
            .collect();
        self.done = done;
        for r in landed {
            match r {
                Ok(x) => self.ready.push_back(x),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Iterator for Prefetch<'_> {
    type Item = Result<LandedExpert, StreamError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.finished {
                return None;
            }
            if let Some(x) = self.ready.pop_front() {
                return Some(Ok(x));
            }
            if self.next == self.wanted.len() && self.src.backend.in_flight() == 0 {
                self.finished = true;
                return None;
            }
            if let Err(e) = self.step() {
                self.cancel_now();
                return Some(Err(e));
            }
        }
    }
}

impl Drop for Prefetch<'_> {
    fn drop(&mut self) {
        self.cancel_now();
    }
}
