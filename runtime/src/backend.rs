//! The three readers of expert extents behind one trait: io_uring (the default on Linux), a
//! pread thread pool (the reference and the fallback), and mmap + copy (for comparison).
//!
//! A backend takes a claimed slot with each read and gives the slot back with the outcome; it
//! never holds a slot it was not given, and gives every slot back (on drop, after waiting for
//! the reads it started).

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::str::FromStr;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::pinned::SlotWrite;

/// Which reader runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// io_uring: O_DIRECT, registered files and fixed buffers, batched submission.
    IoUring,
    /// A pool of threads each doing blocking `pread` (O_DIRECT): the reference and the fallback.
    Pread,
    /// Copy out of a read-only memory map of each file (page cache; for comparison).
    Mmap,
}

impl BackendKind {
    /// All kinds, the default first.
    pub const ALL: [BackendKind; 3] = [BackendKind::IoUring, BackendKind::Pread, BackendKind::Mmap];

    /// The name used by `--backend` and `TARFA_IO_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::IoUring => "io_uring",
            BackendKind::Pread => "pread",
            BackendKind::Mmap => "mmap",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no I/O backend: the error of [`BackendKind`]'s and
/// [`crate::BackendChoice`]'s `FromStr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownBackendName {
    /// The name given.
    pub name: String,
    /// Whether `auto` would have been accepted (a [`crate::BackendChoice`]).
    pub auto_allowed: bool,
}

impl fmt::Display for UnknownBackendName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let auto = if self.auto_allowed { "auto, " } else { "" };
        write!(
            f,
            "unknown I/O backend {:?} (expected {auto}io_uring, pread or mmap)",
            self.name
        )
    }
}

impl std::error::Error for UnknownBackendName {}

impl FromStr for BackendKind {
    type Err = UnknownBackendName;
    fn from_str(s: &str) -> Result<Self, UnknownBackendName> {
        match s {
            "io_uring" | "io-uring" | "uring" => Ok(BackendKind::IoUring),
            "pread" => Ok(BackendKind::Pread),
            "mmap" => Ok(BackendKind::Mmap),
            _ => Err(UnknownBackendName {
                name: s.to_string(),
                auto_allowed: false,
            }),
        }
    }
}

/// One extent read: `len` bytes at `offset` of file `file` (an index into the model's files).
#[derive(Clone, Copy, Debug)]
pub struct ExtentRead {
    /// The caller's tag, returned with the completion.
    pub tag: usize,
    /// File index.
    pub file: u32,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (at most the slot length).
    pub len: usize,
}

/// A finished read: the caller's tag, the slot, and whether all `len` bytes arrived.
pub type DoneRead = (usize, SlotWrite, io::Result<()>);

/// A reader of extents into ring slots.
pub trait ReadBackend: Send + fmt::Debug {
    /// Which one this is.
    fn kind(&self) -> BackendKind;
    /// Start reading `read` into `slot`. The read may only be queued until [`Self::submit`].
    fn start(&mut self, read: ExtentRead, slot: SlotWrite) -> io::Result<()>;
    /// Hand queued reads to the device (one system call for a batch, where that applies).
    fn submit(&mut self) -> io::Result<()>;
    /// Wait until at least `min` reads have finished (0: only collect what has), appending them
    /// to `done`.
    fn reap(&mut self, min: usize, done: &mut Vec<DoneRead>) -> io::Result<()>;
    /// Reads started and not yet reaped.
    fn in_flight(&self) -> usize;
}

#[cfg(target_os = "linux")]
impl ReadBackend for crate::pinned::UringReads {
    fn kind(&self) -> BackendKind {
        BackendKind::IoUring
    }
    fn start(&mut self, read: ExtentRead, slot: SlotWrite) -> io::Result<()> {
        crate::pinned::UringReads::start(self, slot, read.tag, read.file, read.offset, read.len)
    }
    fn submit(&mut self) -> io::Result<()> {
        crate::pinned::UringReads::submit(self)
    }
    fn reap(&mut self, min: usize, done: &mut Vec<DoneRead>) -> io::Result<()> {
        crate::pinned::UringReads::reap(self, min, done)
    }
    fn in_flight(&self) -> usize {
        crate::pinned::UringReads::in_flight(self)
    }
}

type Job = (ExtentRead, SlotWrite);

/// `threads` workers, each taking one read at a time and doing a blocking `pread` loop into the
/// slot: the obvious implementation, and the one the others are tested against.
#[derive(Debug)]
pub struct PreadPool {
    jobs: Option<Sender<Job>>,
    results: Receiver<DoneRead>,
    workers: Vec<JoinHandle<()>>,
    in_flight: usize,
}

impl PreadPool {
    /// Start `threads` workers over `files`.
    pub fn new(files: Arc<Vec<File>>, threads: usize) -> io::Result<PreadPool> {
        let (job_tx, job_rx) = channel::<Job>();
        let (done_tx, results) = channel::<DoneRead>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut workers = Vec::new();
        for i in 0..threads.max(1) {
            let (rx, tx, files) = (Arc::clone(&job_rx), done_tx.clone(), Arc::clone(&files));
            let worker = std::thread::Builder::new()
                .name(format!("tarfa-pread-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let Ok((read, mut slot)) = job else { return };
                    let result = match files.get(read.file as usize) {
                        Some(f) => {
                            f.read_exact_at(&mut slot.as_mut_slice()[..read.len], read.offset)
                        }
                        None => Err(io::Error::other("no such file index")),
                    };
                    if tx.send((read.tag, slot, result)).is_err() {
                        return;
                    }
                })?;
            workers.push(worker);
        }
        Ok(PreadPool {
            jobs: Some(job_tx),
            results,
            workers,
            in_flight: 0,
        })
    }
}

impl ReadBackend for PreadPool {
    fn kind(&self) -> BackendKind {
        BackendKind::Pread
    }
    fn start(&mut self, read: ExtentRead, slot: SlotWrite) -> io::Result<()> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| io::Error::other("pool stopped"))?;
        if read.len > slot.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "read larger than a slot",
            ));
        }
        jobs.send((read, slot))
            .map_err(|_| io::Error::other("pread workers have stopped"))?;
        self.in_flight += 1;
        Ok(())
    }
    fn submit(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn reap(&mut self, min: usize, done: &mut Vec<DoneRead>) -> io::Result<()> {
        let mut got = 0;
        while self.in_flight > 0 {
            let r = if got < min {
                self.results
                    .recv()
                    .map_err(|_| io::Error::other("pread workers have stopped"))?
            } else {
                match self.results.try_recv() {
                    Ok(r) => r,
                    Err(_) => break,
                }
            };
            self.in_flight -= 1;
            got += 1;
            done.push(r);
        }
        Ok(())
    }
    fn in_flight(&self) -> usize {
        self.in_flight
    }
}

impl Drop for PreadPool {
    fn drop(&mut self) {
        // Closing the job channel ends the workers once they finish their current read; their
        // slots come back through `results` and are freed when the receiver is dropped.
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Copies each extent out of a read-only map of its file, on the calling thread, at `start`.
#[derive(Debug)]
pub struct MmapCopy {
    maps: Vec<crate::mapped::FileMap>,
    done: Vec<DoneRead>,
}

impl MmapCopy {
    /// Over the maps of the layer files, by file index.
    pub(crate) fn new(maps: Vec<crate::mapped::FileMap>) -> MmapCopy {
        MmapCopy {
            maps,
            done: Vec::new(),
        }
    }
}

impl ReadBackend for MmapCopy {
    fn kind(&self) -> BackendKind {
        BackendKind::Mmap
    }
    fn start(&mut self, read: ExtentRead, mut slot: SlotWrite) -> io::Result<()> {
        let result = (|| {
            let map = self
                .maps
                .get(read.file as usize)
                .ok_or_else(|| io::Error::other("no such file index"))?;
            let start = usize::try_from(read.offset).map_err(io::Error::other)?;
            // Still held by the file (not truncated since it was mapped).
            let src = map.bytes(start, read.len)?;
            let dst = slot.as_mut_slice();
            if read.len > dst.len() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "read larger than a slot",
                ));
            }
            dst[..read.len].copy_from_slice(src);
            Ok(())
        })();
        self.done.push((read.tag, slot, result));
        Ok(())
    }
    fn submit(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn reap(&mut self, _min: usize, done: &mut Vec<DoneRead>) -> io::Result<()> {
        done.append(&mut self.done);
        Ok(())
    }
    fn in_flight(&self) -> usize {
        self.done.len()
    }
}
