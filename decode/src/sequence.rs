//! [`Sequence`]: what a forward pass reads and writes besides the model — each attention
//! layer's KV cache, each Gated DeltaNet layer's convolution history and recurrent state, and
//! how many positions they hold. A loaded model ([`crate::Decoder`]) is shared by any number of
//! sequences; each is a value of its own that can be created, forked (a copy that then goes its
//! own way: a second answer to the same prompt, a checkpoint before speculative tokens) and
//! truncated to a prefix (a prompt cache's common prefix, rejected draft tokens).
//!
//! A sequence's bits never depend on which other sequences exist or ran in between: every layer
//! reads only its own sequence's state (spec/EXACTNESS.md).
//!
//! A recurrent state cannot be rewound: a sequence with DeltaNet layers truncates only to its
//! full length or to 0 (its states zeroed). Keep a fork before tokens you may take back.

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::blocks::KvCache;
use crate::error::{DecodeError, Result, SequenceFault};
use crate::family::deltanet::DeltaState;

/// One layer's part of a sequence on the CPU.
#[derive(Clone, Debug)]
pub enum LayerState {
    /// An attention layer's KV cache.
    Attention(KvCache),
    /// A Gated DeltaNet layer's convolution history and recurrent state.
    DeltaNet(DeltaState),
}

impl LayerState {
    /// The KV cache of an attention layer, or the error of a state of another layout.
    pub fn kv(&mut self, layer: usize) -> Result<&mut KvCache> {
        match self {
            LayerState::Attention(kv) => Ok(kv),
            LayerState::DeltaNet(_) => Err(layout(layer)),
        }
    }

    /// The state of a DeltaNet layer, or the error of a state of another layout.
    pub fn delta(&mut self, layer: usize) -> Result<&mut DeltaState> {
        match self {
            LayerState::DeltaNet(d) => Ok(d),
            LayerState::Attention(_) => Err(layout(layer)),
        }
    }
}

fn layout(layer: usize) -> DecodeError {
    DecodeError::Sequence(SequenceFault::Layout { layer })
}

/// A device's state of a sequence (the GPU decoder's device buffers), read only by the decoder
/// that made it.
pub trait DeviceState: Any + Send + std::fmt::Debug {
    /// As `Any`, to be taken back as the device's own type.
    fn as_any(&self) -> &dyn Any;
    /// As `Any`, mutably.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<T: Any + Send + std::fmt::Debug> DeviceState for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Where a sequence's state lives.
#[derive(Debug)]
pub enum State {
    /// On the CPU: one entry per layer.
    Host(Vec<LayerState>),
    /// On a device, in the form its decoder keeps.
    Device(Box<dyn DeviceState>),
}

impl State {
    /// The per-layer states of a CPU family's sequence.
    pub fn host(&mut self) -> Result<&mut [LayerState]> {
        match self {
            State::Host(l) => Ok(l),
            State::Device(_) => Err(DecodeError::Sequence(SequenceFault::Foreign)),
        }
    }

    /// A device decoder's state, as its type `T`.
    pub fn device<T: Any>(&mut self) -> Result<&mut T> {
        match self {
            // Through the box: `Box<dyn DeviceState>` is itself a `DeviceState`.
            State::Device(d) => (**d)
                .as_any_mut()
                .downcast_mut()
                .ok_or(DecodeError::Sequence(SequenceFault::Foreign)),
            State::Host(_) => Err(DecodeError::Sequence(SequenceFault::Foreign)),
        }
    }

    /// A device decoder's state, as its type `T` (shared).
    pub fn device_ref<T: Any>(&self) -> Result<&T> {
        match self {
            State::Device(d) => (**d)
                .as_any()
                .downcast_ref()
                .ok_or(DecodeError::Sequence(SequenceFault::Foreign)),
            State::Host(_) => Err(DecodeError::Sequence(SequenceFault::Foreign)),
        }
    }
}

/// Numbers each decoder, so a sequence names the one that made it.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A new owner number (a decoder's).
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// A sequence of one decoder ([`crate::Decoder::new_sequence`]): its state and position.
#[derive(Debug)]
pub struct Sequence {
    pub(crate) owner: u64,
    /// Positions held; `None` while a pass runs and after one failed part-way on a recurrent
    /// state (then only truncating to 0 makes it usable again).
    pub(crate) len: Option<usize>,
    /// Whether a layer holds recurrent state (DeltaNet): then it cannot be rewound.
    pub(crate) recurrent: bool,
    pub(crate) family: &'static str,
    pub(crate) state: State,
}

impl Sequence {
    /// A placeholder that belongs to no decoder (while a decoder's own sequence is lent out).
    pub(crate) fn detached() -> Sequence {
        Sequence::new(0, "", false, State::Host(Vec::new()))
    }

    pub(crate) fn new(owner: u64, family: &'static str, recurrent: bool, state: State) -> Sequence {
        Sequence {
            owner,
            len: Some(0),
            recurrent,
            family,
            state,
        }
    }

    /// Positions it holds (the next token runs at this position); `None` after a pass failed
    /// part-way through a recurrent state (truncate it to 0 to use it again).
    pub fn len(&self) -> Option<usize> {
        self.len
    }

    /// Whether it holds no position.
    pub fn is_empty(&self) -> bool {
        self.len == Some(0)
    }

    /// Whether a layer holds recurrent state (Gated DeltaNet), so that it truncates only to
    /// its length or to 0.
    pub fn is_recurrent(&self) -> bool {
        self.recurrent
    }

    /// Where a pass over it starts: its length, or why it cannot run.
    pub(crate) fn start(&self) -> Result<usize> {
        self.len
            .ok_or(DecodeError::Sequence(SequenceFault::Unknown {
                family: self.family,
            }))
    }

    /// What truncating to `n` asks of the state: nothing (already there), a prefix kept
    /// (attention only), or every state zeroed (to 0); or why it cannot be done.
    pub(crate) fn truncation(&self, n: usize) -> Result<Truncation> {
        let Some(len) = self.len else {
            return if n == 0 {
                Ok(Truncation::Zero)
            } else {
                Err(DecodeError::Sequence(SequenceFault::Unknown {
                    family: self.family,
                }))
            };
        };
        if n > len {
            return Err(DecodeError::Sequence(SequenceFault::Beyond {
                len,
                asked: n,
            }));
        }
        Ok(if n == len {
            Truncation::None
        } else if n == 0 {
            Truncation::Zero
        } else if self.recurrent {
            return Err(DecodeError::Sequence(SequenceFault::CannotRewind {
                family: self.family,
                at: len,
                asked: n,
            }));
        } else {
            Truncation::Keep(n)
        })
    }
}

/// What truncating a sequence asks of its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Truncation {
    /// Nothing: it holds that many positions.
    None,
    /// Keep the first `n` positions (no recurrent state).
    Keep(usize),
    /// Forget every position: KV caches emptied, recurrent states zeroed.
    Zero,
}

/// [`Truncation`] applied to a CPU state: KV caches cut, DeltaNet states zeroed.
pub(crate) fn truncate_host(layers: &mut [LayerState], t: Truncation) {
    let keep = match t {
        Truncation::None => return,
        Truncation::Keep(n) => n,
        Truncation::Zero => 0,
    };
    for l in layers {
        match l {
            LayerState::Attention(kv) => kv.keep(keep),
            LayerState::DeltaNet(d) => d.zero(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(recurrent: bool, len: Option<usize>) -> Sequence {
        let mut s = Sequence::new(1, "f", recurrent, State::Host(Vec::new()));
        s.len = len;
        s
    }

    /// A sequence truncates to any prefix of its length; a recurrent one only to its length or
    /// to 0; one whose recurrent state a failed pass left unknown only to 0; never past its
    /// end.
    #[test]
    fn truncation_keeps_a_prefix_but_never_rewinds_a_recurrent_state() {
        let plain = seq(false, Some(5));
        assert_eq!(plain.truncation(5).ok(), Some(Truncation::None));
        assert_eq!(plain.truncation(3).ok(), Some(Truncation::Keep(3)));
        assert_eq!(plain.truncation(0).ok(), Some(Truncation::Zero));
        assert!(matches!(
            plain.truncation(6),
            Err(DecodeError::Sequence(SequenceFault::Beyond {
                len: 5,
                asked: 6
            }))
        ));
        let rec = seq(true, Some(5));
        assert_eq!(rec.truncation(5).ok(), Some(Truncation::None));
        assert_eq!(rec.truncation(0).ok(), Some(Truncation::Zero));
        assert!(matches!(
            rec.truncation(3),
            Err(DecodeError::Sequence(SequenceFault::CannotRewind {
                at: 5,
                asked: 3,
                ..
            }))
        ));
        let lost = seq(true, None);
        assert!(matches!(
            lost.start(),
            Err(DecodeError::Sequence(SequenceFault::Unknown { .. }))
        ));
        assert_eq!(lost.truncation(0).ok(), Some(Truncation::Zero));
        assert!(lost.truncation(2).is_err());
    }
}
