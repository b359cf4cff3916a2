//! The engine's hardware abstraction: what a device must do for [`crate::Engine`] — buffers,
//! copies, launches in issue order, graphs — and the names of the kernels it launches
//! (`kernels/`, the `tarfa_e_*` entry points). Two devices implement [`EngineDevice`]: the GPU
//! ([`crate::CudaDevice`], feature `driver`) and the CPU emulation of the kernels in the
//! `tarfa-cuda-emu` test crate.

// `EngineDevice::launch` is an `unsafe fn`: its contract is the kernel's buffer sizes.
#![allow(unsafe_code)]

use crate::abi::{MatJobs, MoeArgs};
use crate::tile::TileGeometry;
use crate::CudaError;

/// Element type of a weight on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GpuDtype {
    /// BF16 bit patterns (widened exactly at use).
    Bf16,
    /// `f32`.
    F32,
}

impl GpuDtype {
    /// The kernels' number for it.
    pub fn code(self) -> i32 {
        match self {
            GpuDtype::Bf16 => 0,
            GpuDtype::F32 => 1,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            GpuDtype::Bf16 => 2,
            GpuDtype::F32 => 4,
        }
    }
}

/// A kernel of the resident decoder (`kernels/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kernel {
    /// `tarfa_e_matvec`.
    Matvec,
    /// `tarfa_e_embed`.
    Embed,
    /// `tarfa_e_rms_norm`.
    RmsNorm,
    /// `tarfa_e_attention` (with the token's q/k norm and RoPE, and its k/v cache store).
    Attention,
    /// `tarfa_e_topk`.
    Topk,
    /// `tarfa_e_moe_gate_up`.
    GateUp,
    /// `tarfa_e_moe_down`.
    Down,
    /// `tarfa_e_moe_combine`.
    Combine,
    /// `tarfa_e_tmatvec`.
    TiledMatvec,
    /// `tarfa_e_tmoe_gate_up`.
    TiledGateUp,
    /// `tarfa_e_tmoe_down`.
    TiledDown,
    /// `tarfa_e_combine_norm`.
    CombineNorm,
    /// `tarfa_e_sigmoid_topk`.
    SigmoidTopk,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 13] = [
        Kernel::Matvec,
        Kernel::Embed,
        Kernel::RmsNorm,
        Kernel::Attention,
        Kernel::Topk,
        Kernel::GateUp,
        Kernel::Down,
        Kernel::Combine,
        Kernel::TiledMatvec,
        Kernel::TiledGateUp,
        Kernel::TiledDown,
        Kernel::CombineNorm,
        Kernel::SigmoidTopk,
    ];

    /// Its name in `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Matvec => "tarfa_e_matvec",
            Kernel::Embed => "tarfa_e_embed",
            Kernel::RmsNorm => "tarfa_e_rms_norm",
            Kernel::Attention => "tarfa_e_attention",
            Kernel::Topk => "tarfa_e_topk",
            Kernel::GateUp => "tarfa_e_moe_gate_up",
            Kernel::Down => "tarfa_e_moe_down",
            Kernel::Combine => "tarfa_e_moe_combine",
            Kernel::TiledMatvec => "tarfa_e_tmatvec",
            Kernel::TiledGateUp => "tarfa_e_tmoe_gate_up",
            Kernel::TiledDown => "tarfa_e_tmoe_down",
            Kernel::CombineNorm => "tarfa_e_combine_norm",
            Kernel::SigmoidTopk => "tarfa_e_sigmoid_topk",
        }
    }
}

/// One kernel argument, as the kernel's parameter list has it.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device address.
    Ptr(u64),
    /// An `int`.
    I32(i32),
    /// A `float`.
    F32(f32),
    /// A `TarfaMatJobs` by value.
    Jobs(MatJobs),
    /// A `TarfaMoe` by value.
    Moe(MoeArgs),
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Blocks.
    pub grid: u32,
    /// Threads per block (a multiple of 32).
    pub block: u32,
    /// Dynamic shared memory in bytes.
    pub shared: u32,
}

/// Where the engine's buffers live and its kernels run, in issue order.
pub trait EngineDevice: Send + std::fmt::Debug {
    /// A device buffer.
    type Buf: Send + std::fmt::Debug;
    /// A captured sequence of launches.
    type Graph: Send;
    /// The device, in words.
    fn name(&self) -> String;
    /// Its multiprocessors (sizes the tiled launches; geometry only, never a bit of a result).
    fn multiprocessors(&self) -> usize {
        1
    }
    /// The ring its tiled kernels were compiled for (a tiled launch's dynamic shared memory is
    /// its [`TileGeometry::shared`], allowed for them if above 48 KiB; geometry only, never a
    /// bit of a result).
    fn tile(&self) -> TileGeometry;
    /// The dynamic shared memory a tiled launch may take (the tiled kernels are allowed all a
    /// block may have: 48 KiB unless the device lets them opt in to more).
    fn tile_shared_max(&self) -> u32 {
        48 * 1024
    }
    /// `len` zero bytes (at least 256-byte aligned).
    fn alloc(&self, len: usize) -> Result<Self::Buf, CudaError>;
    /// A buffer holding `bytes` (at least 256-byte aligned).
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf, CudaError>;
    /// Copy `bytes` into `buf` at `offset` (in issue order).
    fn write(&self, buf: &mut Self::Buf, offset: usize, bytes: &[u8]) -> Result<(), CudaError>;
    /// The first `len` bytes of `buf`, after everything issued before.
    fn read(&self, buf: &Self::Buf, len: usize) -> Result<Vec<u8>, CudaError>;
    /// Copy the first `len` bytes of `src` to `dst`.
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf, len: usize) -> Result<(), CudaError>;
    /// The address kernels see for `buf`.
    fn addr(&self, buf: &Self::Buf) -> u64;
    /// Wait for everything issued.
    fn sync(&self) -> Result<(), CudaError>;
    /// Launch `k` with `args` in its parameter order.
    ///
    /// # Safety
    /// The arguments must be what the kernel's parameters say, and every address with every
    /// size the kernel reads or writes under `geo` must lie in a live buffer of this device.
    unsafe fn launch(&self, k: Kernel, geo: Geometry, args: &[Arg]) -> Result<(), CudaError>;
    /// Record the launches `f` issues as a graph, or `None` if this device has no graphs.
    fn capture(
        &self,
        f: &mut dyn FnMut() -> Result<(), CudaError>,
    ) -> Result<Option<Self::Graph>, CudaError>;
    /// Replay a captured graph.
    fn replay(&self, g: &Self::Graph) -> Result<(), CudaError>;
}
