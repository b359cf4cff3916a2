//! # tarfa-runtime
//!
//! Streams expert extents of a JNF model directory from disk into a pinned ring of slots,
//! checks each one's BLAKE3 as it lands, and hands them out in completion order; and makes the
//! host-to-device copies of landed experts.
//!
//! - [`ModelExperts`]: where each `(layer, expert)` lies — its layer file and its extent, one
//!   4096-aligned contiguous range read in one `O_DIRECT` request — and its recorded hashes.
//! - [`ExpertSource`]: the model, a [`PinnedRing`] of slots sized to the largest expert
//!   (`mlock`'d; a refusal is a warning), and one of three backends behind [`ReadBackend`]:
//!   io_uring (the default on Linux: `O_DIRECT`, registered files and fixed buffers, queue depth
//!   64–256, batched submission), a pread thread pool (the reference and the fallback), and
//!   mmap + copy (for comparison). At start-up it probes io_uring and says in its
//!   [`SourceReport`] what runs and why. `TARFA_IO_BACKEND` (or [`SourceOptions::backend`])
//!   forces a backend; `TARFA_REQUIRE_IO_URING=1` turns a fallback from io_uring into an error.
//! - [`ExpertSource::prefetch`]: ask for a set of experts, receive [`LandedExpert`]s as they land
//!   and pass their check, out of order. An error (a failed read, a BLAKE3 mismatch naming layer,
//!   expert, file and offset) ends the prefetch; ending it, by error or by drop, waits for the
//!   reads in flight and frees their slots.
//!
//! Slot lifetime is explicit: a slot belongs to the free list, to one writer token (the CPU or the
//! kernel filling it), or to one landed expert, and is reused only after its token is dropped —
//! never while the kernel may still write it.
//! - [`DeviceSink`] (feature `cuda`): registers the ring's anonymous mapping with
//!   `cuMemHostRegister_v2` (not write-combined) and copies each landed, checked expert to VRAM
//!   with `cuMemcpyHtoDAsync` on its own stream; the slot goes back to the ring only after the
//!   event recorded behind its copy completes. The device is tarfa-cuda's [`Gpu`]; without the
//!   feature (or without a driver or a GPU), [`Gpu::open`] answers [`CudaError::Absent`],
//!   saying why.
//!
//! The GPU's compute (the engine, its kernels, NVRTC) is the `tarfa-cuda` crate; this one is
//! I/O only.
//!
//! All unsafe code is in the `pinned` and `device_sink` modules, with `# Safety` contracts, and
//! in `mapped` (the one `mmap` call of the comparison backend); the crate denies it elsewhere.

#![deny(unsafe_code)]

pub mod backend;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "cuda")]
mod device_sink;
#[cfg(not(feature = "cuda"))]
#[path = "device_sink_absent.rs"]
mod device_sink;
mod error;
mod mapped;
pub mod model;
mod pinned;
pub mod prefetch;
pub mod source;
pub mod verify;

pub use backend::{BackendKind, ReadBackend, UnknownBackendName};
pub use device_sink::{register_ring, DeviceSink};
pub use error::StreamError;
pub use model::{ExpertExtent, ModelExperts, RegionSpan};
pub use pinned::{LandedSlot, PinState, PinnedRing, SlotWrite};
pub use prefetch::{LandedExpert, Prefetch};
pub use source::{
    probe_io_uring, BackendChoice, ExpertSource, SourceOptions, SourceReport, ENV_BACKEND,
    ENV_REQUIRE_IO_URING,
};
/// The device a [`DeviceSink`] copies to, and its errors (tarfa-cuda's).
pub use tarfa_cuda::{CudaError, Gpu, CUDA_BUILT};

/// The pure host-to-device rate of a registered ring ([`DeviceSink::bench_h2d`]).
#[derive(Clone, Copy, Debug)]
pub struct H2dFigures {
    /// Bytes copied (the ring's size × repeats).
    pub bytes: u64,
    /// Wall time, the last copy's completion included.
    pub elapsed: std::time::Duration,
}

impl H2dFigures {
    /// Decimal gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}
