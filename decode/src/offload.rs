//! Where routed experts are computed: the CPU, or (feature `cuda`) the GPU for some or all of
//! them. An offloaded expert's output must be the bits the CPU would compute
//! (`blocks::experts_swiglu`), so where an expert runs — like where it was read from or cached —
//! never changes the logits; the combine stays on the CPU, in slot order.

use crate::blocks::Batch;
#[cfg(not(feature = "cuda"))]
use crate::error::DecodeError;
use crate::error::Result;
use crate::experts::ExpertView;
use crate::weights::MatrixRef;

/// Which device computes routed experts.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Device {
    /// All on the CPU.
    #[default]
    Cpu,
    /// On the GPU; an error if this build or machine has none.
    Cuda(GpuOptions),
    /// On the GPU when one is usable, else on the CPU.
    Auto(GpuOptions),
}

/// How experts use the GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuOptions {
    /// CUDA device number.
    pub ordinal: usize,
    /// VRAM for the model, in bytes. With the whole forward pass on the GPU, the weights and
    /// DeltaNet state that stay there (a margin of 1 GiB for the activations, KV caches and the
    /// CUDA context comes on top), the routed experts of as many leading layers kept on the
    /// CPU as this needs (`cpu_moe_layers`); offloading from the CPU's layers, the expert
    /// cache's size (`None`: the free VRAM less 1 GiB; 0: no cache, each expert copied for each
    /// use).
    pub vram_bytes: Option<u64>,
    /// Share of experts placed on the GPU, chosen per (layer, expert) by a fixed hash (1.0: all;
    /// the rest run on the CPU: mixed placement for models larger than VRAM).
    pub fraction: f64,
    /// The trunk's and layers' matrix products (attention projections, routers, dense and
    /// shared MLPs, `lm_head`) on the GPU too, their weights resident in VRAM once used.
    pub trunk: bool,
    /// The whole forward pass on the GPU (attention, norms, router, experts, combine; the
    /// activations kept there) when the family has that path and its trunk fits in VRAM (the
    /// routed experts of leading MoE layers left to the CPU where they do not all fit); else the
    /// layers run on the CPU with experts and products offloaded. The same bits either way: held to the CPU's on the H200 by
    /// `decode/tests/gpu.rs` and, in CI, by `cuda-emu`'s emulation of its kernels.
    pub whole_model: bool,
    /// With the whole forward pass on the GPU: replay each token's kernels from a captured CUDA
    /// graph (else launch them one by one; the same kernels and bits).
    pub graphs: bool,
    /// With the whole forward pass on the GPU: the routed experts of layers `0..n` computed on
    /// the CPU (llama.cpp's `--n-cpu-moe`, counting layers as it does: dense ones too),
    /// everything else on the GPU; `None`: as few as the VRAM (or `vram_bytes`) needs; more
    /// layers than the model has, or too few for the VRAM, is an error. The same bits either
    /// way.
    pub cpu_moe_layers: Option<usize>,
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            ordinal: 0,
            vram_bytes: None,
            fraction: 1.0,
            trunk: true,
            whole_model: true,
            graphs: true,
            cpu_moe_layers: None,
        }
    }
}

/// What an offload device did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OffloadReport {
    /// The device, in words.
    pub device: String,
    /// Expert computations run there.
    pub computed: u64,
    /// Of those, with the expert already in VRAM.
    pub vram_hits: u64,
    /// Experts copied to VRAM.
    pub uploads: u64,
    /// Bytes copied to VRAM.
    pub upload_bytes: u64,
    /// Whether streamed experts are copied from the expert ring page-locked and registered with
    /// the device (DMA), rather than staged by the driver from pageable memory.
    pub ring_registered: bool,
    /// Bytes held in the VRAM cache now.
    pub cached_bytes: u64,
    /// The VRAM cache's size.
    pub cache_bytes: u64,
    /// Trunk and layer matrix products run there.
    pub trunk_products: u64,
    /// Bytes of trunk and layer matrices resident there.
    pub trunk_bytes: u64,
    /// Trunk products left on the CPU for want of VRAM.
    pub trunk_on_cpu: u64,
    /// The whole forward pass ran on the device (`trunk_bytes` then counts every weight).
    pub whole_model: bool,
    /// Tokens run there (whole forward pass).
    pub steps: u64,
    /// Of those, replayed from a captured CUDA graph.
    pub graph_steps: u64,
    /// Passes in which prompt tokens ran together as matrices, and their tokens (counted in
    /// `steps` too).
    pub prompt_passes: u64,
    pub prompt_pass_tokens: u64,
    /// With the whole forward pass there: the CPU computed the routed experts of layers 0..this
    /// (as llama.cpp's `--n-cpu-moe` counts layers: a dense one among them has none).
    pub cpu_moe_layers: u64,
    /// With the whole forward pass there: round trips to the host within steps (one per token
    /// and layer whose experts the CPU computed; none otherwise).
    pub host_round_trips: u64,
    /// Why the whole forward pass is not on the device, when the options asked for it and it
    /// could not be (a family the engine does not run, a quantised weight, too little VRAM).
    pub whole_model_declined: Option<String>,
}

/// A device that computes some routed experts' SwiGLU.
pub trait ExpertOffload: Send + std::fmt::Debug {
    /// Whether expert `e` is computed here (else on the CPU). Fixed per expert.
    fn takes(&self, e: &ExpertView<'_>) -> bool;
    /// `down(silu(gate x) ⊙ up x)` of each expert for each of its tokens, the dots clamped
    /// with a `limit`: the bits of `blocks::experts_swiglu`, in item order.
    fn swiglu_many(
        &mut self,
        items: &[(&ExpertView<'_>, &[Vec<f32>])],
        hidden: usize,
        limit: Option<f32>,
    ) -> Result<Vec<Batch>>;
    /// `W x_t` for each token (no bias), the bits of `blocks::linear`; `None` if `W` stays on
    /// the CPU (its element type, or the trunk not placed here).
    fn linear(&mut self, w: &MatrixRef<'_>, xs: &[Vec<f32>]) -> Option<Result<Batch>>;
    /// A dense SwiGLU MLP (clamped with a `limit`), the bits of `blocks::swiglu`; `None` if it
    /// stays on the CPU.
    fn swiglu_dense(
        &mut self,
        gate: &MatrixRef<'_>,
        up: &MatrixRef<'_>,
        down: &MatrixRef<'_>,
        xs: &[Vec<f32>],
        limit: Option<f32>,
    ) -> Option<Result<Batch>>;
    /// Counters.
    fn report(&self) -> OffloadReport;
    /// The ring streamed experts land in: a device copies them from there, so it may page-lock
    /// and register it once (the bits are the same either way; a refusal leaves it pageable).
    fn use_ring(&mut self, _ring: &tarfa_runtime::PinnedRing) {}
}

/// The offload device `device` asks for: `None` for the CPU (or `Auto` without a usable GPU).
pub fn open(device: &Device) -> Result<Option<Box<dyn ExpertOffload>>> {
    match device {
        Device::Cpu => Ok(None),
        Device::Cuda(o) => open_gpu(o).map(Some),
        Device::Auto(o) => Ok(open_gpu(o).ok()),
    }
}

#[cfg(feature = "cuda")]
fn open_gpu(o: &GpuOptions) -> Result<Box<dyn ExpertOffload>> {
    Ok(Box::new(crate::gpu::GpuExperts::open(o)?))
}

#[cfg(not(feature = "cuda"))]
fn open_gpu(_: &GpuOptions) -> Result<Box<dyn ExpertOffload>> {
    Err(DecodeError::Options(crate::error::OptionsFault::NoCuda))
}

/// Whether `(layer, expert)` falls in the placed `fraction` (a fixed hash: the same experts on
/// every run, spread over layers).
pub fn placed(layer: u32, expert: u32, fraction: f64) -> bool {
    if fraction >= 1.0 {
        return true;
    }
    if fraction <= 0.0 || fraction.is_nan() {
        return false;
    }
    let h = ((u64::from(layer) << 32) | u64::from(expert)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((h >> 11) as f64 / (1u64 << 53) as f64) < fraction
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_all_none_or_about_the_fraction() {
        let n = |f: f64| {
            (0..64u32)
                .flat_map(|l| (0..128u32).map(move |e| (l, e)))
                .filter(|&(l, e)| placed(l, e, f))
                .count()
        };
        assert_eq!(n(1.0), 64 * 128);
        assert_eq!(n(0.0), 0);
        let half = n(0.5) as f64 / (64.0 * 128.0);
        assert!((half - 0.5).abs() < 0.03, "{half}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_the_feature_cuda_is_an_error_and_auto_is_the_cpu() {
        let e = open(&Device::Cuda(GpuOptions::default())).expect_err("no CUDA");
        assert!(
            matches!(e, DecodeError::Options(crate::error::OptionsFault::NoCuda)),
            "{e}"
        );
        assert!(e.to_string().contains("--features cuda"), "{e}");
        assert!(open(&Device::Auto(GpuOptions::default()))
            .expect("auto")
            .is_none());
    }
}
