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

/// Element type of a weight on the device: BF16 and F32 (wide loads, the tiled kernels), F16, and
/// GGUF's block types, each element dequantised inside the canonical dot as the CPU dequantises
/// it (`kernels/dequant.cuh`; a K type's products on a warp per row, [`warp_rows`], the other
/// block types' on the quad kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GpuDtype {
    /// BF16 bit patterns (widened exactly at use).
    Bf16,
    /// `f32`.
    F32,
    /// IEEE half (widened exactly at use).
    F16,
    /// 32 × int8, one F16 scale (34 bytes).
    Q8_0,
    /// 32 × 4-bit, one F16 scale, offset 8 (18 bytes).
    Q4_0,
    /// 256 × 4-bit in 8 groups, 6-bit scales and minima (144 bytes).
    Q4_K,
    /// 256 × 5-bit in 8 groups, 6-bit scales and minima (176 bytes).
    Q5_K,
    /// 256 × 6-bit in 16 groups, int8 scales (210 bytes).
    Q6_K,
    /// 32 × 4-bit, F16 scale and minimum (20 bytes).
    Q4_1,
    /// 32 × 5-bit, one F16 scale, offset 16 (22 bytes).
    Q5_0,
    /// 32 × 5-bit, F16 scale and minimum (24 bytes).
    Q5_1,
}

impl GpuDtype {
    /// Every type the kernels take.
    pub const ALL: [GpuDtype; 11] = [
        GpuDtype::Bf16,
        GpuDtype::F32,
        GpuDtype::F16,
        GpuDtype::Q8_0,
        GpuDtype::Q4_0,
        GpuDtype::Q4_K,
        GpuDtype::Q5_K,
        GpuDtype::Q6_K,
        GpuDtype::Q4_1,
        GpuDtype::Q5_0,
        GpuDtype::Q5_1,
    ];

    /// The kernels' number for it (`TARFA_BF16` … in `kernels/dequant.cuh`).
    pub fn code(self) -> i32 {
        match self {
            GpuDtype::Bf16 => 0,
            GpuDtype::F32 => 1,
            GpuDtype::F16 => 2,
            GpuDtype::Q8_0 => 3,
            GpuDtype::Q4_0 => 4,
            GpuDtype::Q4_K => 5,
            GpuDtype::Q5_K => 6,
            GpuDtype::Q6_K => 7,
            GpuDtype::Q4_1 => 8,
            GpuDtype::Q5_0 => 9,
            GpuDtype::Q5_1 => 10,
        }
    }

    /// Elements and bytes of one block (a plain type's block is one element).
    pub fn block(self) -> (usize, usize) {
        match self {
            GpuDtype::Bf16 | GpuDtype::F16 => (1, 2),
            GpuDtype::F32 => (1, 4),
            GpuDtype::Q8_0 => (32, 34),
            GpuDtype::Q4_0 => (32, 18),
            GpuDtype::Q4_K => (256, 144),
            GpuDtype::Q5_K => (256, 176),
            GpuDtype::Q6_K => (256, 210),
            GpuDtype::Q4_1 => (32, 20),
            GpuDtype::Q5_0 => (32, 22),
            GpuDtype::Q5_1 => (32, 24),
        }
    }

    /// Bytes of a row of `cols` elements, if `cols` is whole blocks (and fits).
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        let (e, b) = self.block();
        (cols % e == 0).then(|| (cols / e).checked_mul(b))?
    }

    /// Whether it is one of the K types (Q4_K, Q5_K, Q6_K: 256-element blocks), whose products
    /// take a warp per output row ([`warp_rows`]).
    pub fn k_type(self) -> bool {
        matches!(self, GpuDtype::Q4_K | GpuDtype::Q5_K | GpuDtype::Q6_K)
    }

    /// Whether the kernels read it with 16-byte loads and the tiled kernels take it (BF16, F32).
    pub fn wide(self) -> bool {
        matches!(self, GpuDtype::Bf16 | GpuDtype::F32)
    }

    /// Its name, as GGUF and JNF write it.
    pub fn name(self) -> &'static str {
        match self {
            GpuDtype::Bf16 => "BF16",
            GpuDtype::F32 => "F32",
            GpuDtype::F16 => "F16",
            GpuDtype::Q8_0 => "Q8_0",
            GpuDtype::Q4_0 => "Q4_0",
            GpuDtype::Q4_K => "Q4_K",
            GpuDtype::Q5_K => "Q5_K",
            GpuDtype::Q6_K => "Q6_K",
            GpuDtype::Q4_1 => "Q4_1",
            GpuDtype::Q5_0 => "Q5_0",
            GpuDtype::Q5_1 => "Q5_1",
        }
    }
}

/// Whether a product (or the experts' launch) of matrices with the type codes `codes` takes the
/// warp kernels (`tarfa_e_wmatvec`, `tarfa_e_wmoe_gate_up`, `tarfa_e_wmoe_down`: a warp per
/// output row, `kernels/matvec.cu`'s `tarfa_warp_acc`) rather than the quad kernels: when any is
/// a K type, whose rows the warp kernels take with their blocks unrolled (2.4 times the quads'
/// tokens/s on a Q4_K_M model, spec/EXACTNESS.md row (mm)). The 32-element block types stay on
/// the quads (their warp path is the generic one, measured slower than the quads, row (ll)),
/// except beside a K type in one launch. Which threads compute a row changes no bit: both hold
/// the canonical order's 32 logical lanes.
pub fn warp_rows(codes: impl IntoIterator<Item = i32>) -> bool {
    let k = |c: i32| GpuDtype::ALL.iter().any(|t| t.code() == c && t.k_type());
    codes.into_iter().any(k)
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
    /// `tarfa_e_wmatvec` (a warp per row: block types).
    WarpMatvec,
    /// `tarfa_e_wmoe_gate_up`.
    WarpGateUp,
    /// `tarfa_e_wmoe_down`.
    WarpDown,
    /// `tarfa_e_delta_heads` (Gated DeltaNet: convolution, recurrence and gated norm, a block per
    /// value head).
    DeltaHeads,
    /// `tarfa_e_kda_heads` (Kimi delta attention: convolutions, per-channel decay, recurrence and
    /// gated norm, a block per head: `kernels/kda.cu`).
    KdaHeads,
    /// `tarfa_e_hc_weights` (a hyper-connection site's mixing weights: `kernels/mhc.cu`).
    HcWeights,
    /// `tarfa_e_hc_collapse` (the streams into a sublayer's input).
    HcCollapse,
    /// `tarfa_e_hc_expand` (a sublayer's output into the streams).
    HcExpand,
    /// `tarfa_e_hc_mean` (the streams' mean).
    HcMean,
    /// `tarfa_e_mm` (a chunk's products: rows × tokens, `kernels/batch.cu`).
    Mm,
    /// `tarfa_e_moe_group` (a chunk's (token, slot) pairs grouped by expert).
    MoeGroup,
    /// `tarfa_e_mm_gate_up` (a chunk's routed gate and up, expert by expert).
    MmGateUp,
    /// `tarfa_e_mm_down`.
    MmDown,
    /// `tarfa_e_embed_many`.
    EmbedMany,
    /// `tarfa_e_kv_store` (a chunk's keys and values into the caches).
    KvStore,
    /// `tarfa_e_attention_many`.
    AttentionMany,
    /// `tarfa_e_attention_quads` (a chunk's attention, four query heads of a group a block).
    AttentionQuads,
    /// `tarfa_e_topk_many`.
    TopkMany,
    /// `tarfa_e_sigmoid_topk_many`.
    SigmoidTopkMany,
    /// `tarfa_e_mla_heads` (MLA's queries, keys and values assembled and rotated, a block per
    /// head: `kernels/mla.cu`).
    MlaHeads,
    /// `tarfa_e_widen_heads` (values scaled and padded to the keys' width).
    WidenHeads,
    /// `tarfa_e_narrow_heads` (heads' outputs narrowed to the values' width).
    NarrowHeads,
}

impl Kernel {
    /// Every kernel.
    pub const ALL: [Kernel; 35] = [
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
        Kernel::WarpMatvec,
        Kernel::WarpGateUp,
        Kernel::WarpDown,
        Kernel::DeltaHeads,
        Kernel::KdaHeads,
        Kernel::HcWeights,
        Kernel::HcCollapse,
        Kernel::HcExpand,
        Kernel::HcMean,
        Kernel::Mm,
        Kernel::MoeGroup,
        Kernel::MmGateUp,
        Kernel::MmDown,
        Kernel::EmbedMany,
        Kernel::KvStore,
        Kernel::AttentionMany,
        Kernel::AttentionQuads,
        Kernel::TopkMany,
        Kernel::SigmoidTopkMany,
        Kernel::MlaHeads,
        Kernel::WidenHeads,
        Kernel::NarrowHeads,
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
            Kernel::WarpMatvec => "tarfa_e_wmatvec",
            Kernel::WarpGateUp => "tarfa_e_wmoe_gate_up",
            Kernel::WarpDown => "tarfa_e_wmoe_down",
            Kernel::DeltaHeads => "tarfa_e_delta_heads",
            Kernel::KdaHeads => "tarfa_e_kda_heads",
            Kernel::HcWeights => "tarfa_e_hc_weights",
            Kernel::HcCollapse => "tarfa_e_hc_collapse",
            Kernel::HcExpand => "tarfa_e_hc_expand",
            Kernel::HcMean => "tarfa_e_hc_mean",
            Kernel::Mm => "tarfa_e_mm",
            Kernel::MoeGroup => "tarfa_e_moe_group",
            Kernel::MmGateUp => "tarfa_e_mm_gate_up",
            Kernel::MmDown => "tarfa_e_mm_down",
            Kernel::EmbedMany => "tarfa_e_embed_many",
            Kernel::KvStore => "tarfa_e_kv_store",
            Kernel::AttentionMany => "tarfa_e_attention_many",
            Kernel::AttentionQuads => "tarfa_e_attention_quads",
            Kernel::TopkMany => "tarfa_e_topk_many",
            Kernel::SigmoidTopkMany => "tarfa_e_sigmoid_topk_many",
            Kernel::MlaHeads => "tarfa_e_mla_heads",
            Kernel::WidenHeads => "tarfa_e_widen_heads",
            Kernel::NarrowHeads => "tarfa_e_narrow_heads",
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

#[cfg(test)]
mod tests {
    use super::GpuDtype;

    /// Each type's number is the one the kernels define for it (`#define TARFA_<NAME> <code>` in
    /// `kernels/dequant.cuh`), and no two types share one.
    #[test]
    fn every_type_has_the_kernels_number() {
        for t in GpuDtype::ALL {
            let line = format!("#define TARFA_{} {}\n", t.name(), t.code());
            assert!(
                crate::KERNELS_CU.contains(&line),
                "the kernels lack `{line}`"
            );
            assert_eq!(
                GpuDtype::ALL
                    .iter()
                    .filter(|u| u.code() == t.code())
                    .count(),
                1
            );
        }
        assert_eq!(GpuDtype::Q6_K.row_bytes(512), Some(420));
        assert_eq!(GpuDtype::Q8_0.row_bytes(48), None);
        assert!(GpuDtype::Bf16.wide() && !GpuDtype::F16.wide() && !GpuDtype::Q8_0.wide());
    }
}
