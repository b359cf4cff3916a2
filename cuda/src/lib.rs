//! # tarfa-cuda
//!
//! tarfa's GPU: the CUDA device, the kernels (the canonical reduction order of
//! `spec/EXACTNESS.md` on a warp, so that each product has the CPU's bits), their compilation by
//! NVRTC, and the engine that runs a decoder's whole forward pass on a device. The decoder
//! (`tarfa-decode`) maps a family's tensors onto the engine; the runtime (`tarfa-runtime`) copies
//! landed experts to a [`Gpu`].
//!
//! - [`Engine`] (`engine.rs`): every weight, the activations and the KV caches in device
//!   buffers; the `tarfa_e_*` kernels of a token launched in a fixed order, or replayed from a
//!   captured graph. Generic over [`EngineDevice`] (`hal.rs`), whose implementations are
//!   [`CudaDevice`] (feature `driver`) and the CPU emulation in the `tarfa-cuda-emu` test crate,
//!   so CI holds this very orchestration to the CPU decoder's logits without a GPU.
//! - `abi.rs`: the structures kernels take by value, in their C layout. `tile.rs`: the tiled
//!   products' shared-memory ring. `switches.rs`: `TARFA_CUDA_TILE` and `TARFA_CUDA_PDL`.
//! - `kernels/`: the CUDA C, one file per op family (`dequant.cuh`, `common.cuh`, `offload.cu`,
//!   `matvec.cu`, `norm.cu`, `attention.cu`, `route.cu`, `moe.cu`, `tiled.cu`), included in that
//!   order by
//!   `kernels/tarfa.cu`; [`KERNELS_CU`] is that translation unit flattened by the build script.
//! - Feature `driver` (cudarc; libcuda and libnvrtc loaded at run time, no toolkit at build):
//!   [`Gpu`] (`gpu.rs`; `gpu_absent.rs` without it says CUDA is absent), `nvrtc.rs` (compile and
//!   load the kernels), [`CudaDevice`] (`device.rs`: streams, `cuLaunchKernelEx`, graphs,
//!   programmatic dependent launch), [`offload`] (the per-product kernels of the offload path).
//! - [`CudaError`]: one error type for the device and the engine.
//!
//! Unsafe code is allowed only in `gpu.rs`, `nvrtc.rs`, `device.rs`, `offload.rs` (the driver
//! FFI and launches), `hal.rs` (the declaration of the `unsafe fn launch` contract) and
//! `engine.rs` (its launches), each block with its safety argument; the crate denies it
//! elsewhere.

#![deny(unsafe_code)]

mod abi;
mod engine;
mod error;
mod hal;
mod switches;
mod tile;

#[cfg(feature = "driver")]
mod device;
#[cfg(feature = "driver")]
mod gpu;
#[cfg(not(feature = "driver"))]
#[path = "gpu_absent.rs"]
mod gpu;
#[cfg(feature = "driver")]
mod nvrtc;
#[cfg(feature = "driver")]
pub mod offload;

pub use abi::{MatJob, MatJobs, MoeArgs, MAX_JOBS};
pub use engine::{
    delta_block, DeltaShape, Engine, EngineReport, EngineSeq, EngineShape, HostAttention,
    HostDeltaNet, HostHyper, HostKda, HostLayer, HostMixer, HostMla, HostMlp, HostRoute,
    HostTensor, HyperDims, KdaDims, MlaDims, RopeTables, SwaForm, ValueForm, MAX_DELTA_DK,
    MAX_DELTA_KERNEL, MAX_HC_STREAMS, MAX_HEAD_DIM, PROMPT_PASS,
};
#[cfg(feature = "driver")]
pub use error::drv;
pub use error::CudaError;
pub use gpu::{Gpu, CUDA_BUILT};
pub use hal::{warp_rows, Arg, EngineDevice, Geometry, GpuDtype, Kernel};
pub use switches::{pdl_wanted, tile_wanted};
pub use tile::{tile_norm_shared, TileGeometry};

#[cfg(feature = "driver")]
pub use device::{CudaDevice, Graph};
#[cfg(feature = "driver")]
pub use nvrtc::{arch_for, compile_kernels};

/// The kernels' source: `kernels/tarfa.cu` with its includes flattened (the build script), as
/// NVRTC compiles it.
pub const KERNELS_CU: &str = include_str!(concat!(env!("OUT_DIR"), "/tarfa_kernels.cu"));
