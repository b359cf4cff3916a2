//! # tarfa-runtime
//!
//! Streams expert extents of a JNF model directory from disk into a pinned ring of slots,
//! checks each one's BLAKE3 as it lands, and hands them out in completion order; and runs the GPU
//! side of decoding (`tarfa-decode` drives it).
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
//!   event recorded behind its copy completes. Without the feature (or without a driver or a
//!   GPU), [`Gpu::open`] answers [`CudaError::Absent`], saying why.
//!
//! - [`cuda_compute`] (feature `cuda`): expert SwiGLU on the GPU with the CPU's bits (the
//!   canonical reduction order on a warp; kernels compiled at run time by NVRTC from
//!   `cuda_kernels.cu` with `--fmad=false`).
//! - [`gpu_engine`]: the whole forward pass of a decoder on a device — `Engine<D>` keeps every
//!   weight, the activations and the KV caches in device buffers and launches the `tarfa_e_*`
//!   kernels of a token in a fixed order (or replays them from a captured graph); generic over
//!   [`gpu_engine::EngineDevice`], whose implementations are `cuda_engine::CudaDevice` (feature
//!   `cuda`) and the CPU emulation in the `tarfa-cuda-emu` test crate.
//!
//! All unsafe code is in the `pinned`, `cuda`, `cuda_compute`, `cuda_engine` and `gpu_engine`
//! (kernel launches: `EngineDevice::launch` is an `unsafe fn` whose contract is the kernel's
//! buffer sizes) modules, with `# Safety` contracts, and in `mapped` (the one `mmap` call of the
//! comparison backend); the crate denies it elsewhere.

#![deny(unsafe_code)]

pub mod backend;
#[cfg(feature = "bench")]
pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_absent.rs"]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_compute;
#[cfg(feature = "cuda")]
pub mod cuda_engine;
mod error;
pub mod gpu_engine;
mod mapped;
pub mod model;
mod pinned;
pub mod prefetch;
pub mod source;
pub mod verify;

pub use backend::{BackendKind, ReadBackend, UnknownBackendName};
pub use cuda::{CudaError, DeviceSink, Gpu, H2dFigures, CUDA_BUILT};
pub use error::StreamError;
pub use model::{ExpertExtent, ModelExperts, RegionSpan};
pub use pinned::{LandedSlot, PinState, PinnedRing, SlotWrite};
pub use prefetch::{LandedExpert, Prefetch};
pub use source::{
    probe_io_uring, BackendChoice, ExpertSource, SourceOptions, SourceReport, ENV_BACKEND,
    ENV_REQUIRE_IO_URING,
};
