//! The resident decoder's orchestration, over any [`EngineDevice`]: a whole MoE decoder's
//! forward pass per token — embedding, RMSNorm, q/k/v, per-head q/k norm and RoPE, the KV
//! cache, attention (gated or not), `o` — or a Gated DeltaNet layer's projections, convolution
//! and recurrence on its device-resident state —, the router's top-k, the selected experts'
//! SwiGLU, shared experts (gated or not), the combine, the final norm and `lm_head` — with every
//! weight resident on the device and the activations
//! never leaving it; only the logits come back. Each kernel (`kernels/`, the `tarfa_e_*`
//! ones) computes the bits the CPU decoder computes (`decode/src/canon.rs`,
//! `decode/src/blocks.rs`): same reduction order, fused multiply-adds only where the CPU has
//! them, tarfa's own `exp`.
//!
//! Two devices implement [`EngineDevice`]: the GPU (`device.rs`, feature `cuda`: cudarc,
//! the kernels compiled by NVRTC, each step replayed from a captured CUDA graph) and, for tests,
//! the same kernels compiled for the CPU by the emulation in `cuda-emu/`, so that this very
//! orchestration — buffers, launch order and geometry, the KV cache's growth — is held to the CPU
//! decoder's logits in CI, where there is no GPU.
//!
//! The token and its position are read by the kernels from a small device buffer, so one
//! sequence of launches serves every step (what makes a graph of it replayable).
//!
//! Products of whole 32-element chunks take the tiled kernels (`tarfa_e_tmatvec`,
//! `tarfa_e_tmoe_gate_up`, `tarfa_e_tmoe_down`): a block streams up to 32
//! rows and x's columns through shared-memory stages, as many rows per block as still gives
//! every multiprocessor a block ([`EngineDevice::multiprocessors`]). Geometry only: the same
//! operations in the same order, so the same bits, for any rows per block. A tiled product that
//! reads an RMSNorm's output takes that norm in (`norm_matvec`): each block normalises x itself,
//! with the norm kernel's operations, so the norm needs no launch of its own.
//!
//! Safety: every buffer a kernel touches is owned here, allocated with the sizes the shapes
//! (checked in [`Engine::new`] and [`Engine::put_expert`]) say the kernels index; the launches
//! pass the addresses of those buffers, which live as long as the engine; the device orders the
//! launches and copies in issue order.

#![allow(unsafe_code)]

use crate::abi::{MatJob, MatJobs, MoeArgs};
use crate::hal::{warp_rows, Arg, EngineDevice, Geometry, GpuDtype, Kernel};
use crate::tile::{tile_norm_shared, tile_rows, SHARED_MAX, TILE_MAX_ROWS, TILE_THREADS};
use crate::CudaError;

mod prompt;
pub use prompt::PROMPT_PASS;

/// Host bytes of one tensor to place in VRAM: a row-major `[rows, cols]` matrix (a vector is
/// one row).
#[derive(Clone, Copy, Debug)]
pub struct HostTensor<'a> {
    /// Its elements, as stored (BF16 or F16 bit patterns, `f32`, or whole blocks of a GGUF type).
    pub bytes: &'a [u8],
    /// Element type.
    pub dtype: GpuDtype,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
}

impl HostTensor<'_> {
    fn check(&self, what: &str, rows: usize, cols: usize) -> Result<(), CudaError> {
        let need = self.dtype.row_bytes(cols).and_then(|n| n.checked_mul(rows));
        if self.rows != rows || self.cols != cols || need != Some(self.bytes.len()) {
            return Err(CudaError::Usage(format!(
                "{what}: [{}, {}] of {} bytes where [{rows}, {cols}] is needed",
                self.rows,
                self.cols,
                self.bytes.len()
            )));
        }
        Ok(())
    }
}

/// The numbers of the model the engine runs.
#[derive(Clone, Copy, Debug)]
pub struct EngineShape {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Rotated dims of each head (even, at most `head_dim`).
    pub rotary_dim: usize,
    /// RMSNorm epsilon (layer, q/k and final norms).
    pub eps: f32,
    /// Keys attended to at most, or `None`.
    pub window: Option<usize>,
    /// Attention's score scale (`head_dim^-0.5` as the CPU rounds it).
    pub scaling: f32,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the top-k weights.
    pub norm_topk_prob: bool,
    /// Gated attention (Qwen3.5): `q_proj` gives `[q_h | gate_h]` per head (`2 · heads · d`
    /// rows) and each head's output is multiplied by `sigmoid(gate_h)` before `o_proj`.
    pub attn_gate: bool,
    /// The Gated DeltaNet layers' widths, when the model has any ([`HostMixer::DeltaNet`]).
    pub delta: Option<DeltaShape>,
    /// The multi-head latent attention layers' widths, when the model has any
    /// ([`HostMixer::Mla`]): then `kv_heads` is `heads`, `head_dim` is `nope + rope`,
    /// `rotary_dim` is `rope` and `scaling` MLA's own.
    pub mla: Option<MlaDims>,
    /// A second attention form, that of the layers marked [`HostAttention::sliding`]
    /// (MiMo-V2-Flash's sliding-window layers), or none.
    pub swa: Option<SwaForm>,
    /// Values narrower than keys and scaled, in every attention layer (MiMo-V2-Flash), or none.
    pub values: Option<ValueForm>,
    /// Every SwiGLU (routed, shared and dense) clamped at this limit, above 0 (GLM-5.3-Flash's
    /// `swiglu_limit`: the gate above at it, the up to `[-limit, limit]`), or none.
    pub swiglu_limit: Option<f32>,
    /// The Kimi delta attention layers' widths, when the model has any ([`HostMixer::Kda`]).
    pub kda: Option<KdaDims>,
    /// A residual of several streams mixed by hyper-connections around each sublayer
    /// (GLM-5.3-Flash's, [`HostLayer::hyper`]), or none. Their input norm's epsilon is `eps`.
    pub hyper: Option<HyperDims>,
}

/// A Kimi delta attention layer's widths and gate (`decode`'s `family::kda`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaDims {
    /// Heads.
    pub heads: usize,
    /// A head's width, keys and values alike (at most [`MAX_DELTA_DK`]).
    pub dim: usize,
    /// The causal convolutions' length (1..=[`MAX_DELTA_KERNEL`]).
    pub kernel: usize,
    /// The forget gate's lower bound, or none (its softplus form).
    pub lower_bound: Option<f32>,
    /// The output norm's epsilon.
    pub eps: f32,
}

impl KdaDims {
    /// `heads · dim`: each of q, k and v.
    pub fn width(&self) -> usize {
        self.heads * self.dim
    }
}

/// Hyper-connections' form (`decode`'s `family::mhc`): `streams` copies of the hidden width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperDims {
    /// `hc_mult` (1..=[`MAX_HC_STREAMS`]).
    pub streams: usize,
    /// `hc_eps`.
    pub eps: f32,
    /// `hc_sinkhorn_iters` (at least 1).
    pub iters: usize,
}

impl HyperDims {
    /// Mixing weights a site's product gives: `(2 + streams) · streams`.
    pub fn mix(&self) -> usize {
        (2 + self.streams) * self.streams
    }
}

/// The most hyper-connection streams the kernels take (`TARFA_HC_MAX`).
pub const MAX_HC_STREAMS: usize = 8;

/// One hyper-connection site's weights (`hc_attn_*` or `hc_ffn_*`).
#[derive(Clone, Copy, Debug)]
pub struct HostHyper<'a> {
    /// `…_fn` `[mix, streams·hidden]`.
    pub mix: HostTensor<'a>,
    /// `…_base` `[1, mix]`.
    pub base: HostTensor<'a>,
    /// `…_scale` `[1, 3]`.
    pub scale: HostTensor<'a>,
}

/// One layer's Kimi delta attention weights (names under `self_attn.`).
#[derive(Clone, Copy, Debug)]
pub struct HostKda<'a> {
    /// `q_proj`, `k_proj`, `v_proj` `[heads·dim, hidden]`.
    pub qkv: [HostTensor<'a>; 3],
    /// `f_a_proj` `[dim, hidden]` and `f_b_proj` `[heads·dim, dim]` (the forget gate).
    pub f: [HostTensor<'a>; 2],
    /// `g_a_proj` and `g_b_proj` (the output gate), as `f`.
    pub g: [HostTensor<'a>; 2],
    /// `b_proj` `[heads, hidden]`.
    pub b: HostTensor<'a>,
    /// `q_conv1d`, `k_conv1d` and `v_conv1d` stacked: `[3·heads·dim, kernel]`.
    pub conv: HostTensor<'a>,
    /// `dt_bias` `[1, heads·dim]`.
    pub dt_bias: HostTensor<'a>,
    /// `A_log` `[1, heads]`, or with `a_neg` `−exp(A_log)`.
    pub a_log: HostTensor<'a>,
    /// Whether `a_log` holds `−exp(A_log)`.
    pub a_neg: bool,
    /// `o_norm` `[1, dim]`.
    pub norm: HostTensor<'a>,
    /// `o_proj` `[hidden, heads·dim]`.
    pub o: HostTensor<'a>,
}

/// The second attention form's numbers ([`EngineShape::swa`]): the same query heads and head
/// width as the first, its own key/value heads, window and rotated dims (and RoPE tables,
/// [`RopeTables::swa`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwaForm {
    /// Key/value heads (a divisor of the query heads).
    pub kv_heads: usize,
    /// Keys attended to at most, or `None`.
    pub window: Option<usize>,
    /// Rotated dims of each head (even, at most `head_dim`).
    pub rotary_dim: usize,
}

/// Values narrower than keys, scaled ([`EngineShape::values`]; MiMo-V2-Flash's
/// `v_head_dim` and `attention_value_scale`): `v_proj` gives `kv_heads · dim` values, each
/// multiplied by `scale` and padded with +0 to the key's width before the cache
/// (`tarfa_e_widen_heads`); each head's first `dim` outputs go to `o_proj`
/// (`tarfa_e_narrow_heads`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ValueForm {
    /// A value head's width (1..=`head_dim`).
    pub dim: usize,
    /// The values' scale.
    pub scale: f32,
}

/// RoPE tables as the CPU decoder computes them (`rotary_dim / 2` values a position): the
/// attention's, and the second form's ([`EngineShape::swa`]) when the shape has one.
#[derive(Clone, Copy, Debug)]
pub struct RopeTables<'a> {
    /// Cosines.
    pub cos: &'a [f32],
    /// Sines.
    pub sin: &'a [f32],
    /// The second form's cosines and sines.
    pub swa: Option<(&'a [f32], &'a [f32])>,
}

/// A multi-head latent attention layer's widths (DeepSeek-V3's MLA, `decode`'s `family::mla`):
/// per head a query and a key of `nope + rope` dims (the last `rope` rotated), a value of `v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaDims {
    /// `q_lora_rank`: the query's low-rank width, or none (`q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub nope: usize,
    /// `qk_rope_head_dim` (even).
    pub rope: usize,
    /// `v_head_dim` (at most `nope + rope`).
    pub v: usize,
    /// `rope_interleave`: the rotated dims are stored as interleaved pairs.
    pub interleave: bool,
    /// The latent norms' epsilon.
    pub latent_eps: f32,
}

/// A Gated DeltaNet layer's widths (Qwen3.5's `linear_attention` layers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaShape {
    /// Key (and query) heads.
    pub k_heads: usize,
    /// Value heads (a multiple of the key heads).
    pub v_heads: usize,
    /// Key head width (at most [`MAX_DELTA_DK`]).
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
    /// The causal convolution's length (1..=[`MAX_DELTA_KERNEL`]).
    pub kernel: usize,
}

impl DeltaShape {
    /// Channels of the convolution: q, k (`k_heads · dk` each) and v (`v_heads · dv`).
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.dk + self.value_dim()
    }

    /// `v_heads · dv`.
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.dv
    }
}

/// The widest DeltaNet key head the kernels take (`tarfa_e_delta_heads` holds a row's
/// elements in registers, 8 a lane).
pub const MAX_DELTA_DK: usize = 256;

/// The longest DeltaNet convolution the kernels take (`tarfa_delta_conv_at`: a lane each).
pub const MAX_DELTA_KERNEL: usize = 32;

/// One layer's Gated DeltaNet weights (names under `linear_attn.`).
#[derive(Clone, Copy, Debug)]
pub struct HostDeltaNet<'a> {
    /// `in_proj_qkv` `[conv_dim, hidden]`.
    pub qkv: HostTensor<'a>,
    /// `in_proj_z` `[v_heads·dv, hidden]`.
    pub z: HostTensor<'a>,
    /// `in_proj_b` `[v_heads, hidden]`.
    pub b: HostTensor<'a>,
    /// `in_proj_a` `[v_heads, hidden]`.
    pub a: HostTensor<'a>,
    /// `conv1d` `[conv_dim, kernel]` (its `[conv_dim, 1, kernel]` viewed as a matrix).
    pub conv: HostTensor<'a>,
    /// `dt_bias` `[1, v_heads]`.
    pub dt_bias: HostTensor<'a>,
    /// `A_log` `[1, v_heads]`, or with `a_neg` `−exp(A_log)` as a GGUF stores it (`ssm_a`).
    pub a_log: HostTensor<'a>,
    /// Whether `a_log` holds `−exp(A_log)`: the rates are its negations, not its exponentials
    /// (the CPU's `Rates::Neg`).
    pub a_neg: bool,
    /// The gated norm's weight `[1, dv]`.
    pub norm: HostTensor<'a>,
    /// `out_proj` `[hidden, v_heads·dv]`.
    pub out: HostTensor<'a>,
}

/// A layer's token mixer.
#[derive(Clone, Copy, Debug)]
pub enum HostMixer<'a> {
    /// Grouped-query attention with a KV cache.
    Attention(HostAttention<'a>),
    /// Gated DeltaNet with its convolution history and recurrent state.
    DeltaNet(HostDeltaNet<'a>),
    /// Multi-head latent attention ([`EngineShape::mla`]) with a KV cache of its keys and
    /// values expanded per head.
    Mla(HostMla<'a>),
    /// Kimi delta attention ([`EngineShape::kda`]) with its convolution history and recurrent
    /// state.
    Kda(HostKda<'a>),
}

/// One layer's multi-head latent attention weights (names under `self_attn.`; widths of
/// [`MlaDims`], `qk = nope + rope`).
#[derive(Clone, Copy, Debug)]
pub struct HostMla<'a> {
    /// With a query LoRA: `q_a_proj` `[q_lora_rank, hidden]`, its bias (or none) and
    /// `q_a_layernorm` `[1, q_lora_rank]`.
    pub q_a: Option<(HostTensor<'a>, Option<HostTensor<'a>>, HostTensor<'a>)>,
    /// `q_b_proj` `[heads·qk, q_lora_rank]`, or without a LoRA `q_proj` `[heads·qk, hidden]`.
    pub q: HostTensor<'a>,
    /// `kv_a_proj_with_mqa` `[kv_lora_rank + rope, hidden]`.
    pub kv_a: HostTensor<'a>,
    /// Its bias, or none.
    pub kv_a_bias: Option<HostTensor<'a>>,
    /// `kv_a_layernorm` `[1, kv_lora_rank]`.
    pub kv_norm: HostTensor<'a>,
    /// `kv_b_proj` `[heads·(nope + v), kv_lora_rank]`.
    pub kv_b: HostTensor<'a>,
    /// `o_proj` `[hidden, heads·v]`.
    pub o: HostTensor<'a>,
    /// Its bias, or none.
    pub o_bias: Option<HostTensor<'a>>,
}

/// One layer's attention weights.
#[derive(Clone, Copy, Debug)]
pub struct HostAttention<'a> {
    /// `[heads·d, hidden]` (`[2·heads·d, hidden]` with [`EngineShape::attn_gate`]).
    pub q: HostTensor<'a>,
    /// `[kv_heads·d, hidden]` (the layer's form's key/value heads).
    pub k: HostTensor<'a>,
    /// `[kv_heads·v, hidden]`, `v` the values' width ([`EngineShape::values`], else `d`).
    pub v: HostTensor<'a>,
    /// `[hidden, heads·v]`.
    pub o: HostTensor<'a>,
    /// Biases of q, k, v, o.
    pub bias: [Option<HostTensor<'a>>; 4],
    /// Per-head q and k RMSNorm weights (`[1, d]` each), or none.
    pub qk_norm: Option<(HostTensor<'a>, HostTensor<'a>)>,
    /// Of the second form ([`EngineShape::swa`]): its key/value heads, window and RoPE.
    pub sliding: bool,
    /// Each head's sink logit `[1, heads]` (joins the softmax last, its weight dropped), or none.
    pub sinks: Option<HostTensor<'a>>,
}

/// How a MoE layer's router turns its logits into the selected experts and their weights (the
/// top-k and renormalisation of [`EngineShape`]).
#[derive(Clone, Copy, Debug)]
pub enum HostRoute<'a> {
    /// Softmax, the top k, renormalised when `norm_topk_prob` (`blocks::softmax_topk`).
    Softmax,
    /// GLM-4.5's (DeepSeek-V3 style): sigmoid, selection by `sigmoid + bias` within the
    /// `topk_group` best of `n_group` groups, the unbiased weights renormalised when
    /// `norm_topk_prob` and scaled (`blocks::sigmoid_group_topk`).
    SigmoidGroup {
        /// `e_score_correction_bias` `[1, experts]`.
        bias: HostTensor<'a>,
        /// Expert groups (a divisor of the experts, each at least two when above one).
        n_group: usize,
        /// Groups kept (1..=n_group).
        topk_group: usize,
        /// `routed_scaling_factor`.
        scale: f32,
    },
}

/// One layer's MLP.
#[derive(Clone, Copy, Debug)]
pub enum HostMlp<'a> {
    /// A dense SwiGLU: gate, up `[inter, hidden]`, down `[hidden, inter]`.
    Dense([HostTensor<'a>; 3]),
    /// Routed experts: the router `[experts, hidden]` and its kind; the experts themselves (all
    /// of one shape) come one by one through [`Engine::put_expert`]. Shared experts, when
    /// given, are a dense SwiGLU (gate, up `[width, hidden]`, down `[hidden, width]`) of the
    /// same input whose output is added after the routed slots' (`routed + shared`).
    Moe {
        /// Router weights.
        router: HostTensor<'a>,
        /// How the router selects.
        route: HostRoute<'a>,
        /// The shared experts' gate, up and down.
        shared: Option<[HostTensor<'a>; 3]>,
        /// The shared experts' gate `[1, hidden]` (Qwen3.5): their output is weighted by
        /// `sigmoid(gate · x)`; none, by 1.
        shared_gate: Option<HostTensor<'a>>,
    },
}

/// One decoder layer.
#[derive(Clone, Copy, Debug)]
pub struct HostLayer<'a> {
    /// `input_layernorm` `[1, hidden]`.
    pub in_norm: HostTensor<'a>,
    /// `post_attention_layernorm` `[1, hidden]`.
    pub post_norm: HostTensor<'a>,
    /// The token mixer.
    pub mixer: HostMixer<'a>,
    /// MLP.
    pub mlp: HostMlp<'a>,
    /// The hyper-connection sites around the mixer and the MLP ([`EngineShape::hyper`]), or
    /// none.
    pub hyper: Option<[HostHyper<'a>; 2]>,
}

/// What the engine holds and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineReport {
    /// The device, in words.
    pub device: String,
    /// Weight bytes resident in VRAM.
    pub weight_bytes: u64,
    /// Tokens run.
    pub steps: u64,
    /// Steps run by replaying a captured graph.
    pub graph_steps: u64,
    /// Graph captures (one per sequence stepped, plus one each time its KV cache or the
    /// engine's tables grew, or its graphs had been let go for other sequences').
    pub captures: u64,
    /// Layers whose shared experts run as one more slot of the routed launches.
    pub folded_layers: u64,
    /// Round trips to the host within steps: one per layer whose routed experts the host
    /// computed, per token (the logits' read at a step's end not counted).
    pub host_round_trips: u64,
    /// Passes of prompt tokens run as matrices ([`Engine::prompt`]), and their tokens (counted in
    /// `steps` too).
    pub prompt_passes: u64,
    pub prompt_pass_tokens: u64,
}

/// A tensor on the device.
#[derive(Debug)]
struct DevTensor<B> {
    _buf: B,
    ptr: u64,
    rows: usize,
    cols: usize,
    dtype: GpuDtype,
}

/// A layer's experts (or its dense MLP as one expert): one buffer per expert holding gate, up
/// and down, and the tables of their addresses the kernels index by expert id.
#[derive(Debug)]
struct ExpertTable<B> {
    n: usize,
    /// Width (0 until the first expert is put).
    inter: usize,
    dtype_g: Option<GpuDtype>,
    dtype_u: Option<GpuDtype>,
    dtype_d: Option<GpuDtype>,
    bufs: Vec<Option<B>>,
    gate: Vec<u64>,
    up: Vec<u64>,
    down: Vec<u64>,
    /// Device copies of the gate/up/down address tables (after [`Engine::finish`]).
    dev: Option<[B; 3]>,
}

/// [`HostAttention`] on the device (its KV cache is a sequence's, [`EngineSeq`]).
#[derive(Debug)]
struct DevAttention<B> {
    q: DevTensor<B>,
    k: DevTensor<B>,
    v: DevTensor<B>,
    o: DevTensor<B>,
    bias: [Option<DevTensor<B>>; 4],
    qk_norm: Option<DevQkNorm<B>>,
    sliding: bool,
    sinks: Option<DevTensor<B>>,
}

/// [`HostDeltaNet`] on the device (its state is a sequence's, [`EngineSeq`]).
#[derive(Debug)]
struct DevDelta<B> {
    qkv: DevTensor<B>,
    z: DevTensor<B>,
    b: DevTensor<B>,
    a: DevTensor<B>,
    conv: DevTensor<B>,
    dt_bias: DevTensor<B>,
    a_log: DevTensor<B>,
    a_neg: bool,
    norm: DevTensor<B>,
    out: DevTensor<B>,
}

/// A query LoRA's `q_a_proj`, its bias and `q_a_layernorm` on the device.
type DevLora<B> = (DevTensor<B>, Option<DevTensor<B>>, DevTensor<B>);

/// Per-head q and k RMSNorm weights on the device.
type DevQkNorm<B> = (DevTensor<B>, DevTensor<B>);

/// An attention launch's form (`Engine::attend`): the layer's key/value heads, window, RoPE
/// (the rotated half and its tables) and sinks, and where its values are.
struct Form<'a, B> {
    kv_heads: usize,
    window: Option<usize>,
    half: usize,
    tables: (u64, u64),
    sinks: Option<&'a DevTensor<B>>,
    v: u64,
}

/// [`HostMla`] on the device (its KV cache is a sequence's, [`EngineSeq`]).
#[derive(Debug)]
struct DevMla<B> {
    q_a: Option<DevLora<B>>,
    q: DevTensor<B>,
    kv_a: DevTensor<B>,
    kv_a_bias: Option<DevTensor<B>>,
    kv_norm: DevTensor<B>,
    kv_b: DevTensor<B>,
    o: DevTensor<B>,
    o_bias: Option<DevTensor<B>>,
}

/// [`HostKda`] on the device (its state is a sequence's, [`EngineSeq`]).
#[derive(Debug)]
struct DevKda<B> {
    qkv: [DevTensor<B>; 3],
    f: [DevTensor<B>; 2],
    g: [DevTensor<B>; 2],
    b: DevTensor<B>,
    conv: DevTensor<B>,
    dt_bias: DevTensor<B>,
    a_log: DevTensor<B>,
    a_neg: bool,
    norm: DevTensor<B>,
    o: DevTensor<B>,
}

/// [`HostHyper`] on the device.
#[derive(Debug)]
struct DevHyper<B> {
    mix: DevTensor<B>,
    base: DevTensor<B>,
    scale: DevTensor<B>,
}

#[derive(Debug)]
enum DevMixer<B> {
    Attention(DevAttention<B>),
    DeltaNet(DevDelta<B>),
    Mla(DevMla<B>),
    Kda(DevKda<B>),
}

impl<B> DevMixer<B> {
    /// Whether the layer keeps a KV cache (attention, MLA).
    fn attends(&self) -> bool {
        !self.recurs()
    }

    /// Whether the layer keeps a convolution history and a recurrent state (DeltaNet, KDA).
    fn recurs(&self) -> bool {
        matches!(self, DevMixer::DeltaNet(_) | DevMixer::Kda(_))
    }
}

#[derive(Debug)]
struct Layer<B> {
    in_norm: DevTensor<B>,
    post_norm: DevTensor<B>,
    mixer: DevMixer<B>,
    router: Option<DevTensor<B>>,
    route: DevRoute<B>,
    experts: ExpertTable<B>,
    /// The shared experts (one dense SwiGLU), added after the routed slots.
    shared: Option<ExpertTable<B>>,
    /// Their output's gate (`sigmoid(gate · x)` weighs it), or none.
    shared_gate: Option<DevTensor<B>>,
    /// The shared experts run as one more slot of the routed launches (set in `finish` when
    /// they have the routed experts' width and element types): expert `n` of the tables, with
    /// id `n` and weight 1 preset after the router's `k` slots (with a shared gate, the router's
    /// launch writes that weight, `sigmoid(gate · x)`, each step).
    fold: bool,
    /// Its routed experts are computed by the host ([`Engine::host_experts`]): a step stops
    /// after its top-k and hands the host the normed x and the slots' experts.
    host: bool,
    /// The hyper-connection sites around the mixer and the MLP ([`EngineShape::hyper`]).
    hyper: Option<[DevHyper<B>; 2]>,
}

/// [`HostRoute`] on the device.
#[derive(Debug)]
enum DevRoute<B> {
    Softmax,
    SigmoidGroup {
        bias: DevTensor<B>,
        n_group: i32,
        topk_group: i32,
        scale: f32,
    },
}

/// Device activations and scratch of one token.
#[derive(Debug)]
struct Activations<B> {
    params: B,
    x: B,
    xn: B,
    q: B,
    k: B,
    v: B,
    /// The values scaled and padded to the keys' width ([`EngineShape::values`]).
    vw: B,
    attn: B,
    z: B,
    probs: B,
    ids: B,
    wts: B,
    one_id: B,
    one_wt: B,
    h: B,
    y: B,
    /// The shared experts' SwiGLU (their width) and output (hidden).
    hs: B,
    ys: B,
    /// The shared experts' gate logit and weight (`sigmoid` of it).
    sgz: B,
    sgw: B,
    /// A DeltaNet layer's projections (q/k/v before the convolution, z, b, a) and the heads'
    /// output.
    mixed: B,
    dz: B,
    db: B,
    da: B,
    dout: B,
    /// An MLA layer's query LoRA (`q_a_proj`'s output and its norm), latent (`[c | k_rot]`),
    /// normed `c`, `kv_b_proj`'s output and the heads' outputs narrowed to the values' width.
    mqa: B,
    mqn: B,
    mlat: B,
    mcn: B,
    mkvb: B,
    mov: B,
    /// A KDA layer's projections (`[q | k | v]`, the gates' low-rank halves and full widths,
    /// b) and the heads' output.
    kmixed: B,
    kfa: B,
    kga: B,
    kf: B,
    kg: B,
    kb: B,
    kout: B,
    /// Hyper-connections: the streams normed (weightless), a site's mix values and weights
    /// (`[pre | post | comb]`), the collapsed sublayer input, the sublayer's output, and the
    /// ones the weightless norm multiplies by.
    hcn: B,
    hcmix: B,
    hcw: B,
    hc: B,
    hy: B,
    ones: Option<DevTensor<B>>,
    logits: B,
}

/// Engines and sequences are numbered from one counter, so a sequence names the engine that
/// made it and a captured graph the sequence it was captured for.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A sequence's state on the device, apart from the model: each attention layer's KV cache
/// (`cap` positions of `kv_heads·head_dim` floats for k and for v) and each DeltaNet layer's
/// convolution history (a ring of `kernel` rows of `conv_dim` floats, position p in row
/// p mod kernel) and each value head's `S` (`dv` rows of `dk` floats). Made by
/// [`Engine::sequence`] or [`Engine::fork`]; [`Engine::step`] runs a token of it. Any number
/// may exist beside one engine; each holds its own device memory, freed when it is dropped.
#[derive(Debug)]
pub struct EngineSeq<B> {
    id: u64,
    engine: u64,
    cap: usize,
    layers: Vec<SeqLayer<B>>,
}

#[derive(Debug)]
enum SeqLayer<B> {
    Kv { k: B, v: B },
    Delta { conv: B, state: B },
}

impl<B> EngineSeq<B> {
    /// Positions its KV caches have room for (they grow as steps need).
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

/// The graphs captured for one part of a sequence's step ([`Engine::launch_part`]: from the
/// start, or after a layer whose experts the host computes): the part without and, for the last
/// part, with the logits; and the sequence, its KV capacity, the engine's and the part at the
/// capture (the addresses and the launches they bake in).
struct Captured<G> {
    body: G,
    head: Option<G>,
    seq: u64,
    seq_cap: usize,
    cap: usize,
    part: Option<usize>,
}

/// The resident decoder. Build with [`Engine::new`], give it every expert
/// ([`Engine::put_expert`]), [`Engine::finish`], make a sequence ([`Engine::sequence`]), then
/// [`Engine::step`] it per token.
pub struct Engine<D: EngineDevice> {
    id: u64,
    dev: D,
    shape: EngineShape,
    embed: DevTensor<D::Buf>,
    final_norm: DevTensor<D::Buf>,
    /// `None`: tied to the embedding.
    lm_head: Option<DevTensor<D::Buf>>,
    layers: Vec<Layer<D::Buf>>,
    a: Activations<D::Buf>,
    /// Positions the scores and RoPE tables have room for (at least every sequence's
    /// capacity that has stepped).
    cap: usize,
    /// Positions a new sequence's KV caches have room for.
    first_cap: usize,
    /// Each query head's scores and its sink: `heads × (cap + 1)` floats.
    scores: D::Buf,
    cos: D::Buf,
    sin: D::Buf,
    /// The second attention form's tables ([`EngineShape::swa`]; one float each without).
    cos2: D::Buf,
    sin2: D::Buf,
    rope_rows: usize,
    /// The steps captured for the sequences that stepped last ([`GRAPH_SETS`] at most), the
    /// latest last.
    graphs: Vec<Captured<D::Graph>>,
    use_graphs: bool,
    /// Take RMSNorms into the tiled products that read them (`norm_matvec`).
    fuse_norms: bool,
    finished: bool,
    report: EngineReport,
    /// The buffers of [`Engine::prompt`]'s passes (made at the first).
    pass: Option<prompt::PassBufs<D::Buf>>,
    /// Run prompts as matrices where the model takes it ([`Engine::prompt`]).
    prompt_matrices: bool,
    /// A pass's attention four query heads a block where the heads take it
    /// ([`Engine::set_attention_quads`]).
    attention_quads: bool,
}

impl<D: EngineDevice> std::fmt::Debug for Engine<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("dev", &self.dev)
            .field("shape", &self.shape)
            .field("layers", &self.layers.len())
            .field("cap", &self.cap)
            .field("report", &self.report)
            .finish()
    }
}

const BLOCK: u32 = 256;

/// Threads of an attention block (one per query head): sixteen warps share its positions' scores.
const ATTN_BLOCK: u32 = 512;

/// Threads of a DeltaNet head's block (`tarfa_e_delta_heads`) for heads `dv` wide: a warp per
/// eight state rows (a warp loads eight rows at once where the key heads are at most 128 wide,
/// four where wider), at least two warps (warps 0 and 1 normalise q and k) and at most 16 (the
/// kernel's launch bound, `TARFA_DELTA_THREADS`: a thread keeps 48 floats of rows, q and k in
/// registers — 56 with KDA's decay per key channel, `tarfa_e_kda_heads`, which takes the same
/// geometry — which 1,024 threads could not each have). Geometry only: which warp runs a row
/// changes no bit.
pub fn delta_block(dv: usize) -> u32 {
    (dv.div_ceil(8).clamp(2, 16) * 32) as u32
}

/// Threads of the RMSNorm block: with its four elements loaded ahead per thread, a hidden size
/// up to 2,048 is loaded in one round.
const RMS_BLOCK: u32 = 512;

/// Threads of an MLA head's block (`tarfa_e_mla_heads`) and of the gather's blocks.
const MLA_BLOCK: u32 = 128;

/// Threads per block of the matrix-vector kernels (a quad per output row): smaller blocks spread
/// a product of few rows (the router's, `o_proj`'s) over more multiprocessors. Geometry only:
/// which thread computes a row changes no bit of it.
const MATVEC_BLOCK: u32 = 128;

/// The most floats of x a matrix-vector launch stages in shared memory (48 KiB).
const MAX_STAGE: i32 = 12 * 1024;
const FIRST_CAP: usize = 256;

/// Sequences whose captured steps the engine keeps (each step's parts, one per layer whose
/// experts the host computes and one more): a sequence stepped again after others replays its
/// own graphs instead of capturing them anew.
const GRAPH_SETS: usize = 8;

/// The widest attention head the kernels take: `tarfa_e_attention` keeps 36 × `head_dim`
/// floats of a block in shared memory (36 KiB at 256).
pub const MAX_HEAD_DIM: usize = 256;

fn geo(blocks: usize, block: u32, shared: u32) -> Result<Geometry, CudaError> {
    let grid = u32::try_from(blocks.max(1))
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| CudaError::Usage(format!("{blocks} blocks do not fit one launch")))?;
    Ok(Geometry {
        grid,
        block,
        shared,
    })
}

fn int(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v)
        .map_err(|_| CudaError::Usage(format!("{what} {v} is too large for the GPU kernels")))
}

fn foreign_layout(layer: usize) -> CudaError {
    CudaError::Usage(format!(
        "layer {layer} of the sequence is not the engine's kind of layer"
    ))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The host's routed experts of a layer placed there ([`Engine::host_experts`]): given the
/// layer, its normed x (`hidden` floats) and the slots' expert numbers (`top_k`, in slot order),
/// write each slot's output — `down(silu(gate·x) ⊙ up·x)`, unweighted, computed as the kernels
/// compute it — into `y` (`top_k × hidden` floats, slot after slot).
pub type HostExperts<'a> =
    dyn FnMut(usize, &[f32], &[u32], &mut [f32]) -> Result<(), CudaError> + 'a;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

impl<D: EngineDevice> Engine<D> {
    /// Copy the trunk and every layer's weights (experts aside) to the device, checking each
    /// tensor's shape against `shape`.
    pub fn new(
        dev: D,
        shape: EngineShape,
        embed: HostTensor<'_>,
        final_norm: HostTensor<'_>,
        lm_head: Option<HostTensor<'_>>,
        layers: &[HostLayer<'_>],
        n_experts: usize,
    ) -> Result<Engine<D>, CudaError> {
        let s = shape;
        let (h, d) = (s.hidden, s.head_dim);
        let attends = layers
            .iter()
            .any(|l| !matches!(l.mixer, HostMixer::DeltaNet(_) | HostMixer::Kda(_)));
        if attends && d > MAX_HEAD_DIM {
            return Err(CudaError::HeadDimTooLarge {
                head_dim: d,
                max: MAX_HEAD_DIM,
            });
        }
        // The rest the decoder's config parsing guarantees: a caller's mistake if broken.
        if s.heads == 0
            || s.kv_heads == 0
            || s.heads % s.kv_heads != 0
            || d == 0
            || s.rotary_dim > d
            || s.rotary_dim % 2 != 0
            || h == 0
            || s.vocab == 0
            || s.top_k == 0
        {
            return Err(CudaError::Usage(format!(
                "the GPU decoder does not take this shape: {s:?}"
            )));
        }
        for v in [s.vocab, h, s.heads * d, s.kv_heads * d, n_experts] {
            int(v, "a dimension")?;
        }
        // Every product's rows as quads of threads in one launch.
        int(s.vocab.saturating_mul(4), "lm_head's threads")?;
        let mut report = EngineReport {
            device: dev.name(),
            ..EngineReport::default()
        };
        let up = |t: &HostTensor<'_>,
                  what: &str,
                  rows: usize,
                  cols: usize,
                  report: &mut EngineReport|
         -> Result<DevTensor<D::Buf>, CudaError> {
            t.check(what, rows, cols)?;
            let buf = dev.upload(t.bytes)?;
            report.weight_bytes += t.bytes.len() as u64;
            Ok(DevTensor {
                ptr: dev.addr(&buf),
                _buf: buf,
                rows,
                cols,
                dtype: t.dtype,
            })
        };
        let embed_d = up(&embed, "embedding", s.vocab, h, &mut report)?;
        let final_d = up(&final_norm, "final norm", 1, h, &mut report)?;
        let head_d = match lm_head {
            Some(t) => Some(up(&t, "lm_head", s.vocab, h, &mut report)?),
            None => None,
        };
        let (qd, kvd) = (s.heads * d, s.kv_heads * d);
        // Gated attention: q_proj gives each head's query and its output gate.
        let q_rows = if s.attn_gate { 2 * qd } else { qd };
        if let Some(ds) = s.delta {
            if ds.k_heads == 0
                || ds.v_heads % ds.k_heads != 0
                || ds.dk == 0
                || ds.dk > MAX_DELTA_DK
                || ds.dv == 0
                || ds.kernel == 0
                || ds.kernel > MAX_DELTA_KERNEL
            {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take these DeltaNet widths: {ds:?}"
                )));
            }
            for v in [ds.conv_dim(), ds.value_dim(), ds.conv_dim() * ds.kernel] {
                int(v, "a DeltaNet dimension")?;
            }
        }
        if let Some(m) = s.mla {
            if s.kv_heads != s.heads
                || d != m.nope + m.rope
                || s.rotary_dim != m.rope
                || m.v == 0
                || m.v > d
                || m.kv_lora_rank == 0
                || m.q_lora_rank == Some(0)
                || s.attn_gate
            {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take these MLA widths: {m:?} in {s:?}"
                )));
            }
            for v in [
                m.kv_lora_rank + m.rope,
                s.heads * (m.nope + m.v),
                s.heads * m.v,
            ] {
                int(v, "an MLA dimension")?;
            }
        }
        if let Some(w) = s.swa {
            if w.kv_heads == 0
                || s.heads % w.kv_heads != 0
                || w.rotary_dim > d
                || w.rotary_dim % 2 != 0
                || s.mla.is_some()
                || s.attn_gate
            {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take this second attention form: {w:?} in {s:?}"
                )));
            }
            int(w.kv_heads * d, "a dimension")?;
        }
        if let Some(k) = s.kda {
            if k.heads == 0
                || k.dim == 0
                || k.dim > MAX_DELTA_DK
                || k.kernel == 0
                || k.kernel > MAX_DELTA_KERNEL
            {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take these KDA widths: {k:?}"
                )));
            }
            int(3 * k.width(), "a dimension")?;
        }
        if let Some(hc) = s.hyper {
            if hc.streams == 0 || hc.streams > MAX_HC_STREAMS || hc.iters == 0 {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take these hyper-connections: {hc:?}"
                )));
            }
            int(hc.streams * h, "a dimension")?;
        }
        if let Some(l) = s.swiglu_limit {
            if !(l.is_finite() && l > 0.0) {
                return Err(CudaError::Usage(format!(
                    "a SwiGLU limit of {l}: it must be finite and above 0"
                )));
            }
        }
        if let Some(v) = s.values {
            if v.dim == 0 || v.dim > d || s.mla.is_some() || s.attn_gate {
                return Err(CudaError::Usage(format!(
                    "the GPU decoder does not take these values: {v:?} in {s:?}"
                )));
            }
        }
        // The widest layer's keys (its KV heads · d) and values.
        let max_kvd = s.swa.map_or(kvd, |w| kvd.max(w.kv_heads * d));
        let vdim = s.values.map_or(d, |v| v.dim);
        let mut dev_layers = Vec::with_capacity(layers.len());
        for (l, hl) in layers.iter().enumerate() {
            let w = |n: &str| format!("layer {l} {n}");
            let mixer =
                match &hl.mixer {
                    HostMixer::Attention(a) => {
                        if s.mla.is_some() {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: an attention layer beside MLA layers"
                            )));
                        }
                        let kvh = match (a.sliding, s.swa) {
                            (false, _) => s.kv_heads,
                            (true, Some(w)) => w.kv_heads,
                            (true, None) => {
                                return Err(CudaError::Usage(format!(
                                    "layer {l}: a sliding layer without the shape's second form"
                                )))
                            }
                        };
                        let (kvd, vd) = (kvh * d, kvh * vdim);
                        let bias_rows = [q_rows, kvd, vd, h];
                        let mut bias: [Option<DevTensor<D::Buf>>; 4] = [None, None, None, None];
                        for (i, b) in a.bias.iter().enumerate() {
                            if let Some(b) = b {
                                bias[i] = Some(up(b, &w("bias"), 1, bias_rows[i], &mut report)?);
                            }
                        }
                        let qk_norm = match &a.qk_norm {
                            Some((qn, kn)) => {
                                if qn.dtype != kn.dtype {
                                    return Err(CudaError::Usage(format!(
                                        "layer {l}: q_norm and k_norm of different element types"
                                    )));
                                }
                                Some((
                                    up(qn, &w("q_norm"), 1, d, &mut report)?,
                                    up(kn, &w("k_norm"), 1, d, &mut report)?,
                                ))
                            }
                            None => None,
                        };
                        let sinks = match &a.sinks {
                            Some(t) => Some(up(t, &w("attention sinks"), 1, s.heads, &mut report)?),
                            None => None,
                        };
                        DevMixer::Attention(DevAttention {
                            q: up(&a.q, &w("q_proj"), q_rows, h, &mut report)?,
                            k: up(&a.k, &w("k_proj"), kvd, h, &mut report)?,
                            v: up(&a.v, &w("v_proj"), vd, h, &mut report)?,
                            o: up(&a.o, &w("o_proj"), h, s.heads * vdim, &mut report)?,
                            bias,
                            qk_norm,
                            sliding: a.sliding,
                            sinks,
                        })
                    }
                    HostMixer::DeltaNet(t) => {
                        let Some(ds) = s.delta else {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: a DeltaNet layer without the shape's DeltaNet widths"
                            )));
                        };
                        let (cd, vd, vh) = (ds.conv_dim(), ds.value_dim(), ds.v_heads);
                        // The convolution's weights are read one element at a time.
                        if t.conv.dtype.block().0 != 1 {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: a DeltaNet convolution of block type {:?}",
                                t.conv.dtype
                            )));
                        }
                        DevMixer::DeltaNet(DevDelta {
                            qkv: up(&t.qkv, &w("in_proj_qkv"), cd, h, &mut report)?,
                            z: up(&t.z, &w("in_proj_z"), vd, h, &mut report)?,
                            b: up(&t.b, &w("in_proj_b"), vh, h, &mut report)?,
                            a: up(&t.a, &w("in_proj_a"), vh, h, &mut report)?,
                            conv: up(&t.conv, &w("conv1d"), cd, ds.kernel, &mut report)?,
                            dt_bias: up(&t.dt_bias, &w("dt_bias"), 1, vh, &mut report)?,
                            a_log: up(
                                &t.a_log,
                                &w(if t.a_neg {
                                    "ssm_a (-exp(A_log))"
                                } else {
                                    "A_log"
                                }),
                                1,
                                vh,
                                &mut report,
                            )?,
                            a_neg: t.a_neg,
                            norm: up(&t.norm, &w("DeltaNet norm"), 1, ds.dv, &mut report)?,
                            out: up(&t.out, &w("out_proj"), h, vd, &mut report)?,
                        })
                    }
                    HostMixer::Mla(m) => {
                        let Some(md) = s.mla else {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: an MLA layer without the shape's MLA widths"
                            )));
                        };
                        let rank = md.kv_lora_rank;
                        let q_cols = match (&m.q_a, md.q_lora_rank) {
                            (Some(_), Some(r)) => r,
                            (None, None) => h,
                            _ => {
                                return Err(CudaError::Usage(format!(
                                    "layer {l}: an MLA query LoRA where the widths say otherwise"
                                )))
                            }
                        };
                        let opt = |b: &Option<HostTensor<'_>>,
                               what: &str,
                               n: usize,
                               report: &mut EngineReport|
                     -> Result<Option<DevTensor<D::Buf>>, CudaError> {
                        b.as_ref().map(|b| up(b, &w(what), 1, n, report)).transpose()
                    };
                        let q_a = match &m.q_a {
                            Some((qa, qb, qn)) => Some((
                                up(qa, &w("q_a_proj"), q_cols, h, &mut report)?,
                                opt(qb, "q_a_proj bias", q_cols, &mut report)?,
                                up(qn, &w("q_a_layernorm"), 1, q_cols, &mut report)?,
                            )),
                            None => None,
                        };
                        DevMixer::Mla(DevMla {
                            q_a,
                            q: up(&m.q, &w("MLA q"), qd, q_cols, &mut report)?,
                            kv_a: up(
                                &m.kv_a,
                                &w("kv_a_proj_with_mqa"),
                                rank + md.rope,
                                h,
                                &mut report,
                            )?,
                            kv_a_bias: opt(
                                &m.kv_a_bias,
                                "kv_a_proj_with_mqa bias",
                                rank + md.rope,
                                &mut report,
                            )?,
                            kv_norm: up(&m.kv_norm, &w("kv_a_layernorm"), 1, rank, &mut report)?,
                            kv_b: up(
                                &m.kv_b,
                                &w("kv_b_proj"),
                                s.heads * (md.nope + md.v),
                                rank,
                                &mut report,
                            )?,
                            o: up(&m.o, &w("o_proj"), h, s.heads * md.v, &mut report)?,
                            o_bias: opt(&m.o_bias, "o_proj bias", h, &mut report)?,
                        })
                    }
                    HostMixer::Kda(t) => {
                        let Some(kd) = s.kda else {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: a KDA layer without the shape's KDA widths"
                            )));
                        };
                        let (wd, dim) = (kd.width(), kd.dim);
                        if t.conv.dtype.block().0 != 1 {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: a KDA convolution of block type {:?}",
                                t.conv.dtype
                            )));
                        }
                        let mut r = |t: &HostTensor<'_>, what: &str, rows: usize, cols: usize| {
                            up(t, &w(what), rows, cols, &mut report)
                        };
                        DevMixer::Kda(DevKda {
                            qkv: [
                                r(&t.qkv[0], "q_proj", wd, h)?,
                                r(&t.qkv[1], "k_proj", wd, h)?,
                                r(&t.qkv[2], "v_proj", wd, h)?,
                            ],
                            f: [
                                r(&t.f[0], "f_a_proj", dim, h)?,
                                r(&t.f[1], "f_b_proj", wd, dim)?,
                            ],
                            g: [
                                r(&t.g[0], "g_a_proj", dim, h)?,
                                r(&t.g[1], "g_b_proj", wd, dim)?,
                            ],
                            b: r(&t.b, "b_proj", kd.heads, h)?,
                            conv: r(&t.conv, "q/k/v conv1d", 3 * wd, kd.kernel)?,
                            dt_bias: r(&t.dt_bias, "dt_bias", 1, wd)?,
                            a_log: r(&t.a_log, "A_log", 1, kd.heads)?,
                            a_neg: t.a_neg,
                            norm: r(&t.norm, "o_norm", 1, dim)?,
                            o: r(&t.o, "o_proj", h, wd)?,
                        })
                    }
                };
            let hyper = match (&hl.hyper, s.hyper) {
                (None, None) => None,
                (_, Some(_)) if !matches!(hl.mixer, HostMixer::Kda(_)) => {
                    return Err(CudaError::Usage(format!(
                        "layer {l}: hyper-connections beside a mixer other than KDA"
                    )))
                }
                (Some(sites), Some(hc)) => {
                    let mut site = |t: &HostHyper<'_>,
                                    name: &str|
                     -> Result<DevHyper<D::Buf>, CudaError> {
                        Ok(DevHyper {
                            mix: up(
                                &t.mix,
                                &w(&format!("{name}_fn")),
                                hc.mix(),
                                hc.streams * h,
                                &mut report,
                            )?,
                            base: up(
                                &t.base,
                                &w(&format!("{name}_base")),
                                1,
                                hc.mix(),
                                &mut report,
                            )?,
                            scale: up(&t.scale, &w(&format!("{name}_scale")), 1, 3, &mut report)?,
                        })
                    };
                    Some([site(&sites[0], "hc_attn")?, site(&sites[1], "hc_ffn")?])
                }
                _ => {
                    return Err(CudaError::Usage(format!(
                        "layer {l}: hyper-connection sites where the shape says otherwise"
                    )))
                }
            };
            let (router, route, experts, shared, shared_gate) = match &hl.mlp {
                HostMlp::Moe {
                    router,
                    route,
                    shared,
                    shared_gate,
                } => {
                    if n_experts == 0 || s.top_k > n_experts {
                        return Err(CudaError::Usage(format!(
                            "layer {l}: top-{} of {n_experts} experts",
                            s.top_k
                        )));
                    }
                    let route = match *route {
                        HostRoute::Softmax => DevRoute::Softmax,
                        HostRoute::SigmoidGroup {
                            bias,
                            n_group,
                            topk_group,
                            scale,
                        } => {
                            let size = n_experts / n_group.max(1);
                            if n_group == 0
                                || n_experts % n_group != 0
                                || (n_group > 1 && size < 2)
                                || topk_group == 0
                                || topk_group > n_group
                            {
                                return Err(CudaError::Usage(format!(
                                    "layer {l}: {topk_group} of {n_group} groups of {n_experts} experts"
                                )));
                            }
                            if shared_gate.is_some() {
                                return Err(CudaError::Usage(format!(
                                    "layer {l}: a shared-expert gate beside the sigmoid router"
                                )));
                            }
                            DevRoute::SigmoidGroup {
                                bias: up(&bias, &w("router bias"), 1, n_experts, &mut report)?,
                                n_group: int(n_group, "expert groups")?,
                                topk_group: int(topk_group, "expert groups")?,
                                scale,
                            }
                        }
                    };
                    let shared_t = match shared {
                        Some([g, u, dn]) => {
                            let mut t = ExpertTable::new(1);
                            t.put(&dev, 0, h, [g, u, dn], &mut report)?;
                            Some(t)
                        }
                        None => None,
                    };
                    let shared_gate = match shared_gate {
                        Some(g) if shared.is_some() => {
                            Some(up(g, &w("shared-expert gate"), 1, h, &mut report)?)
                        }
                        Some(_) => {
                            return Err(CudaError::Usage(format!(
                                "layer {l}: a shared-expert gate without shared experts"
                            )))
                        }
                        None => None,
                    };
                    (
                        Some(up(router, &w("router"), n_experts, h, &mut report)?),
                        route,
                        ExpertTable::new(n_experts),
                        shared_t,
                        shared_gate,
                    )
                }
                HostMlp::Dense([g, u, dn]) => {
                    let mut t = ExpertTable::new(1);
                    t.put(&dev, 0, h, [g, u, dn], &mut report)?;
                    (None, DevRoute::Softmax, t, None, None)
                }
            };
            dev_layers.push(Layer {
                in_norm: up(&hl.in_norm, &w("input norm"), 1, h, &mut report)?,
                post_norm: up(&hl.post_norm, &w("post-attention norm"), 1, h, &mut report)?,
                mixer,
                router,
                route,
                experts,
                shared,
                shared_gate,
                fold: false,
                host: false,
                hyper,
            });
        }
        let z = |n: usize| dev.alloc(n.max(1) * 4);
        let kk = s.top_k.max(1);
        let streams = s.hyper.map_or(1, |hc| hc.streams);
        let kw = s.kda.map_or(1, |k| k.width());
        let kdim = s.kda.map_or(1, |k| k.dim);
        let ones = match s.hyper {
            Some(hc) => {
                let n = hc.streams * h;
                let bytes: Vec<u8> = (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect();
                let buf = dev.upload(&bytes)?;
                Some(DevTensor {
                    ptr: dev.addr(&buf),
                    _buf: buf,
                    rows: 1,
                    cols: n,
                    dtype: GpuDtype::F32,
                })
            }
            None => None,
        };
        let a = Activations {
            params: z(2)?,
            x: z(streams * h)?,
            xn: z(h)?,
            q: z(q_rows)?,
            k: z(max_kvd)?,
            v: z(max_kvd)?,
            vw: z(if s.values.is_some() { max_kvd } else { 1 })?,
            attn: z(qd)?,
            z: z(n_experts)?,
            // The softmax router's probabilities, or the sigmoid router's s, c and group scores.
            probs: z(3 * n_experts)?,
            // One slot more than the router's: the folded shared experts' (`Layer::fold`).
            ids: z(kk + 1)?,
            wts: z(kk + 1)?,
            one_id: dev.upload(&0i32.to_le_bytes())?,
            one_wt: dev.upload(&1.0f32.to_le_bytes())?,
            h: z(1)?,
            y: z((kk + 1) * h)?,
            hs: z(1)?,
            ys: z(h)?,
            sgz: z(1)?,
            sgw: z(1)?,
            mixed: z(s.delta.map_or(1, |ds| ds.conv_dim()))?,
            dz: z(s.delta.map_or(1, |ds| ds.value_dim()))?,
            db: z(s.delta.map_or(1, |ds| ds.v_heads))?,
            da: z(s.delta.map_or(1, |ds| ds.v_heads))?,
            dout: z(s.delta.map_or(1, |ds| ds.value_dim()))?,
            mqa: z(s.mla.and_then(|m| m.q_lora_rank).unwrap_or(1))?,
            mqn: z(s.mla.and_then(|m| m.q_lora_rank).unwrap_or(1))?,
            mlat: z(s.mla.map_or(1, |m| m.kv_lora_rank + m.rope))?,
            mcn: z(s.mla.map_or(1, |m| m.kv_lora_rank))?,
            mkvb: z(s.mla.map_or(1, |m| s.heads * (m.nope + m.v)))?,
            mov: z(s.mla.map_or(1, |m| s.heads * m.v).max(s.heads * vdim))?,
            kmixed: z(3 * kw)?,
            kfa: z(kdim)?,
            kga: z(kdim)?,
            kf: z(kw)?,
            kg: z(kw)?,
            kb: z(s.kda.map_or(1, |k| k.heads))?,
            kout: z(kw)?,
            hcn: z(if s.hyper.is_some() { streams * h } else { 1 })?,
            hcmix: z(s.hyper.map_or(1, |hc| hc.mix()))?,
            hcw: z(s.hyper.map_or(1, |hc| hc.mix()))?,
            hc: z(h)?,
            hy: z(h)?,
            ones,
            logits: z(s.vocab)?,
        };
        let half = s.rotary_dim / 2;
        let half2 = s.swa.map_or(0, |w| w.rotary_dim / 2);
        Ok(Engine {
            id: next_id(),
            scores: z(s.heads * (FIRST_CAP + 1))?,
            cos: z(FIRST_CAP * half)?,
            sin: z(FIRST_CAP * half)?,
            cos2: z(FIRST_CAP * half2)?,
            sin2: z(FIRST_CAP * half2)?,
            rope_rows: 0,
            cap: FIRST_CAP,
            first_cap: FIRST_CAP,
            shape: s,
            embed: embed_d,
            final_norm: final_d,
            lm_head: head_d,
            layers: dev_layers,
            a,
            graphs: Vec::new(),
            use_graphs: true,
            fuse_norms: true,
            finished: false,
            report,
            pass: None,
            prompt_matrices: true,
            attention_quads: true,
            dev,
        })
    }

    /// Have the host compute `layer`'s routed experts (before [`Engine::finish`]): none of them
    /// is copied to the device; each step stops after the layer's top-k, hands the host the
    /// normed x and the slots' expert numbers, and takes back the slots' outputs, which the
    /// device then weighs and combines in slot order with the shared experts' as for any layer
    /// (the same bits: the host computes each expert's output as the kernels do).
    pub fn host_experts(&mut self, layer: usize) -> Result<(), CudaError> {
        if self.finished {
            return Err(CudaError::Usage(
                "experts placed on the host after the GPU decoder was finished".into(),
            ));
        }
        if self.shape.hyper.is_some() {
            return Err(CudaError::Usage(
                "routed experts on the host beside hyper-connections".into(),
            ));
        }
        match self.layers.get_mut(layer) {
            Some(l) if l.router.is_some() => {
                l.host = true;
                Ok(())
            }
            Some(_) => Err(CudaError::Usage(format!(
                "layer {layer} has no routed experts"
            ))),
            None => Err(CudaError::Usage(format!("no layer {layer}"))),
        }
    }

    /// The layers whose routed experts the host computes.
    pub fn host_layers(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&i| self.layers[i].host)
            .collect()
    }

    /// Copy expert `e` of `layer` (gate, up `[inter, hidden]`, down `[hidden, inter]`) to the
    /// device.
    pub fn put_expert(
        &mut self,
        layer: usize,
        e: usize,
        gate: HostTensor<'_>,
        up: HostTensor<'_>,
        down: HostTensor<'_>,
    ) -> Result<(), CudaError> {
        let h = self.shape.hidden;
        let Some(l) = self.layers.get_mut(layer) else {
            return Err(CudaError::Usage(format!("no layer {layer}")));
        };
        if l.router.is_none() || l.host {
            return Err(CudaError::Usage(format!(
                "layer {layer} has no routed experts on the device"
            )));
        }
        l.experts
            .put(&self.dev, e, h, [&gate, &up, &down], &mut self.report)
    }

    /// Every routed expert of every layer present: build the address tables.
    pub fn finish(&mut self) -> Result<(), CudaError> {
        if self.finished {
            return Err(CudaError::Usage(
                "the GPU decoder was finished twice".into(),
            ));
        }
        let (mut max_inter, mut max_shared) = (1, 1);
        for (i, l) in self.layers.iter_mut().enumerate() {
            max_inter = max_inter.max(l.experts.inter);
            if l.host {
                // No routed expert on the device; its shared experts run alone.
                if let Some(t) = l.shared.as_mut() {
                    max_shared = max_shared.max(t.inter);
                    t.upload_tables(&self.dev)?;
                }
                continue;
            }
            if let Some(e) = l.experts.bufs.iter().position(|b| b.is_none()) {
                return Err(CudaError::Usage(format!(
                    "layer {i}: expert {e} was never copied to the GPU"
                )));
            }
            if let Some(t) = l.shared.as_mut() {
                let e = &mut l.experts;
                l.fold = t.inter == e.inter
                    && t.dtype_g == e.dtype_g
                    && t.dtype_u == e.dtype_u
                    && t.dtype_d == e.dtype_d;
                if l.fold {
                    self.report.folded_layers += 1;
                    // Expert n of the tables (the buffers stay the shared table's).
                    e.gate.push(t.gate[0]);
                    e.up.push(t.up[0]);
                    e.down.push(t.down[0]);
                } else {
                    max_shared = max_shared.max(t.inter);
                    t.upload_tables(&self.dev)?;
                }
            }
            l.experts.upload_tables(&self.dev)?;
        }
        let k = self.shape.top_k.max(1);
        self.a.h = self.dev.alloc((k + 1) * max_inter * 4)?;
        // The folded slot: id n (every layer has n experts), weight 1 (its products exact, so
        // the combine adds the shared output itself after the routed slots); a layer with a
        // shared gate has its router's launch write that weight each step instead.
        let n = i32::try_from(self.layers.iter().map(|l| l.experts.n).max().unwrap_or(0))
            .map_err(|_| CudaError::Usage("too many experts".into()))?;
        self.dev.write(&mut self.a.ids, k * 4, &n.to_le_bytes())?;
        self.dev
            .write(&mut self.a.wts, k * 4, &1.0f32.to_le_bytes())?;
        self.a.hs = self.dev.alloc(max_shared * 4)?;
        self.dev.sync()?;
        self.finished = true;
        Ok(())
    }

    /// Replay each step from a captured graph when the device has graphs (the default), or
    /// launch its kernels one by one. The same kernels with the same arguments either way.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        self.graphs.clear();
    }

    /// Take each RMSNorm into the tiled product launch that reads it (the default), or give it
    /// a launch of its own. The same operations in the same order either way.
    pub fn set_norm_fusion(&mut self, on: bool) {
        self.fuse_norms = on;
        self.graphs.clear();
    }

    /// What the engine holds and did.
    pub fn report(&self) -> EngineReport {
        self.report.clone()
    }

    /// Whether a layer carries recurrent state (a DeltaNet layer): a sequence's steps then
    /// cannot be rewound, only continued or started over ([`Engine::reset_state`]).
    pub fn recurrent(&self) -> bool {
        self.layers.iter().any(|l| l.mixer.recurs())
    }

    /// A new sequence: empty KV caches of the first capacity, DeltaNet states zero.
    pub fn sequence(&self) -> Result<EngineSeq<D::Buf>, CudaError> {
        self.seq_with(self.first_cap, None, 0)
    }

    /// A copy of `seq` whose first `len` positions are `seq`'s (its KV rows `0..len`, its
    /// DeltaNet states as they stand: the caller holds `len` to be where they stand).
    pub fn fork(
        &self,
        seq: &EngineSeq<D::Buf>,
        len: usize,
    ) -> Result<EngineSeq<D::Buf>, CudaError> {
        self.check_seq(seq)?;
        if len > seq.cap {
            return Err(CudaError::Usage(format!(
                "a fork of {len} positions from a sequence with room for {}",
                seq.cap
            )));
        }
        self.seq_with(seq.cap, Some(seq), len)
    }

    /// A sequence of `cap` positions: zeros, or `from`'s first `len` KV rows and its states.
    fn seq_with(
        &self,
        cap: usize,
        from: Option<&EngineSeq<D::Buf>>,
        len: usize,
    ) -> Result<EngineSeq<D::Buf>, CudaError> {
        let dev = &self.dev;
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, l) in self.layers.iter().enumerate() {
            let old = from.map(|f| &f.layers[i]);
            let kvd = self.kv_width(l);
            let made = match (&l.mixer, old) {
                (m, None) if m.attends() => SeqLayer::Kv {
                    k: dev.alloc(cap * kvd * 4)?,
                    v: dev.alloc(cap * kvd * 4)?,
                },
                (m, Some(SeqLayer::Kv { k, v })) if m.attends() => {
                    let (mut k2, mut v2) = (dev.alloc(cap * kvd * 4)?, dev.alloc(cap * kvd * 4)?);
                    dev.copy(k, &mut k2, len * kvd * 4)?;
                    dev.copy(v, &mut v2, len * kvd * 4)?;
                    SeqLayer::Kv { k: k2, v: v2 }
                }
                (m, old) if m.recurs() => {
                    let (cb, sb) = self.state_bytes(&l.mixer)?;
                    let (mut conv, mut state) = (dev.alloc(cb)?, dev.alloc(sb)?);
                    match old {
                        None => {}
                        Some(SeqLayer::Delta { conv: c, state: st }) => {
                            dev.copy(c, &mut conv, cb)?;
                            dev.copy(st, &mut state, sb)?;
                        }
                        Some(SeqLayer::Kv { .. }) => return Err(foreign_layout(i)),
                    }
                    SeqLayer::Delta { conv, state }
                }
                (_, _) => return Err(foreign_layout(i)),
            };
            layers.push(made);
        }
        Ok(EngineSeq {
            id: next_id(),
            engine: self.id,
            cap,
            layers,
        })
    }

    /// The bytes of a recurrent layer's convolution history (a ring of `kernel` rows of its
    /// channels) and of its state (each head's rows).
    fn state_bytes(&self, m: &DevMixer<D::Buf>) -> Result<(usize, usize), CudaError> {
        let s = self.shape;
        match (m, s.delta, s.kda) {
            (DevMixer::DeltaNet(_), Some(ds), _) => Ok((
                ds.kernel * ds.conv_dim() * 4,
                ds.v_heads * ds.dv * ds.dk * 4,
            )),
            (DevMixer::Kda(_), _, Some(k)) => {
                Ok((k.kernel * 3 * k.width() * 4, k.heads * k.dim * k.dim * 4))
            }
            _ => Err(CudaError::Usage(
                "a recurrent layer without its widths".into(),
            )),
        }
    }

    /// A position's floats in layer `l`'s key (and value) cache: its key/value heads · d.
    fn kv_width(&self, l: &Layer<D::Buf>) -> usize {
        let s = self.shape;
        let kvh = match (&l.mixer, s.swa) {
            (DevMixer::Attention(at), Some(w)) if at.sliding => w.kv_heads,
            _ => s.kv_heads,
        };
        kvh * s.head_dim
    }

    /// `seq` was made by this engine.
    fn check_seq(&self, seq: &EngineSeq<D::Buf>) -> Result<(), CudaError> {
        if seq.engine != self.id || seq.layers.len() != self.layers.len() {
            return Err(CudaError::Usage("a sequence of another GPU decoder".into()));
        }
        Ok(())
    }

    /// Forget every position of `seq`: its DeltaNet layers' convolution histories and states
    /// back to zeros (the KV caches need nothing: a step writes its own row and reads rows up
    /// to it).
    pub fn reset_state(&mut self, seq: &mut EngineSeq<D::Buf>) -> Result<(), CudaError> {
        self.check_seq(seq)?;
        for (l, sl) in self.layers.iter().zip(&mut seq.layers) {
            if let SeqLayer::Delta { conv: c, state: st } = sl {
                let (cb, sb) = self.state_bytes(&l.mixer)?;
                self.dev.write(c, 0, &vec![0u8; cb])?;
                self.dev.write(st, 0, &vec![0u8; sb])?;
            }
        }
        Ok(())
    }

    /// Run `token` of `seq` at position `pos` (positions from `pos` on are overwritten); the
    /// logits when `want_logits`. `(cos, sin)` are the RoPE tables of positions `0..=pos` at
    /// least (`rotary_dim / 2` per position, as the CPU decoder computes them). `host` computes
    /// the routed experts of the layers placed on the host ([`Engine::host_experts`]; never
    /// called when there are none).
    pub fn step(
        &mut self,
        seq: &mut EngineSeq<D::Buf>,
        token: u32,
        pos: usize,
        rope: RopeTables<'_>,
        want_logits: bool,
        host: &mut HostExperts<'_>,
    ) -> Result<Option<Vec<f32>>, CudaError> {
        if !self.finished {
            return Err(CudaError::Usage("the GPU decoder was not finished".into()));
        }
        self.check_seq(seq)?;
        if token as usize >= self.shape.vocab {
            return Err(CudaError::Usage(format!(
                "token {token} is outside the vocabulary of {}",
                self.shape.vocab
            )));
        }
        int(pos, "a position")?;
        let n = pos
            .checked_add(1)
            .ok_or_else(|| CudaError::Usage("position too large".into()))?;
        self.ensure_cap(seq, n)?;
        self.ensure_rope(n, rope)?;
        // Rows at or after `pos` may hold an earlier pass's: never read (attention reads
        // 0..=pos) and overwritten as positions are run.
        let params: Vec<u8> = [token as i32, pos as i32]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        self.dev.write(&mut self.a.params, 0, &params)?;
        // The step in parts, the host's experts between them (one part without host layers).
        let mut after = None;
        let mut replayed = true;
        loop {
            let next = self.next_host(after);
            replayed &= self.run_part(seq, after, want_logits && next.is_none())?;
            match next {
                Some(l) => {
                    self.host_layer(l, host)?;
                    after = Some(l);
                }
                None => break,
            }
        }
        if replayed {
            self.report.graph_steps += 1;
        }
        self.finish_step(want_logits)
    }

    /// The first layer after `after` (from the first, `None`) whose experts are the host's.
    fn next_host(&self, after: Option<usize>) -> Option<usize> {
        let from = after.map_or(0, |l| l + 1);
        (from..self.layers.len()).find(|&i| self.layers[i].host)
    }

    /// Launch the part of the step after `after` ([`Engine::launch_part`]), and the head after it
    /// when `head` (the last part only): replayed from the graphs captured for this sequence at
    /// these capacities (the addresses they bake in), captured when there are none (a new
    /// sequence, or a cache that grew); or launched one by one. Whether it was replayed.
    fn run_part(
        &mut self,
        seq: &EngineSeq<D::Buf>,
        after: Option<usize>,
        head: bool,
    ) -> Result<bool, CudaError> {
        let cap = self.cap;
        let found = self.graphs.iter().position(|g| {
            g.seq == seq.id && g.seq_cap == seq.cap && g.cap == cap && g.part == after
        });
        if let Some(i) = found {
            // Most recently used last.
            let g = self.graphs.remove(i);
            self.graphs.push(g);
        } else if self.use_graphs {
            let parts = 1 + self.layers.iter().filter(|l| l.host).count();
            if self.graphs.len() >= GRAPH_SETS * parts {
                self.graphs.remove(0);
            }
            let last = self.next_host(after).is_none();
            let body = self
                .dev
                .capture(&mut || self.launch_part(seq, after).map(|_| ()))?;
            let with_head = match last {
                true => self.dev.capture(&mut || {
                    self.launch_part(seq, after)?;
                    self.launch_head()
                })?,
                false => None,
            };
            match (body, with_head.is_some() == last) {
                (Some(body), true) => {
                    self.graphs.push(Captured {
                        body,
                        head: with_head,
                        seq: seq.id,
                        seq_cap: seq.cap,
                        cap,
                        part: after,
                    });
                    self.report.captures += 1;
                }
                // A device without graphs: launch one by one.
                _ => self.use_graphs = false,
            }
        }
        match self.graphs.last() {
            Some(g) if self.use_graphs => {
                match (&g.head, head) {
                    (Some(h), true) => self.dev.replay(h)?,
                    (_, true) => return Err(CudaError::Usage("a part without its head".into())),
                    (_, false) => self.dev.replay(&g.body)?,
                }
                Ok(true)
            }
            _ => {
                self.launch_part(seq, after)?;
                if head {
                    self.launch_head()?;
                }
                Ok(false)
            }
        }
    }

    /// Layer `l`'s routed experts on the host: the normed x and the slots' experts read back
    /// (after everything issued), their outputs computed by `host` and written to `y`.
    fn host_layer(&mut self, l: usize, host: &mut HostExperts<'_>) -> Result<(), CudaError> {
        let (h, k) = (self.shape.hidden, self.shape.top_k);
        let n = self.layers[l].experts.n;
        let xn = f32s(&self.dev.read(&self.a.xn, h * 4)?);
        let ids: Vec<u32> = self
            .dev
            .read(&self.a.ids, k * 4)?
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .map(|e| u32::try_from(e).ok().filter(|&e| (e as usize) < n))
            .collect::<Option<_>>()
            .ok_or_else(|| CudaError::Usage(format!("layer {l}: the top-k chose no expert")))?;
        let mut y = vec![0.0f32; k * h];
        host(l, &xn, &ids, &mut y)?;
        self.report.host_round_trips += 1;
        self.dev.write(&mut self.a.y, 0, &f32_bytes(&y))
    }

    /// Count the step, and read its logits when wanted.
    fn finish_step(&mut self, want_logits: bool) -> Result<Option<Vec<f32>>, CudaError> {
        self.report.steps += 1;
        if !want_logits {
            return Ok(None);
        }
        let bytes = self.dev.read(&self.a.logits, self.shape.vocab * 4)?;
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }

    /// The device's RoPE tables hold rows `0..n` (copied from `cos`, `sin`: `rotary_dim / 2`
    /// values a position, at least `n` rows; the tables have room, `ensure_cap`).
    /// The RoPE tables of positions `0..n` on the device (both forms' when the shape has two),
    /// from `rope`, which must cover them.
    fn ensure_rope(&mut self, n: usize, rope: RopeTables<'_>) -> Result<(), CudaError> {
        if self.rope_rows >= n {
            return Ok(());
        }
        let s = self.shape;
        let swa = match (s.swa, rope.swa) {
            (Some(w), Some(t)) => Some((w.rotary_dim / 2, t)),
            (None, _) => None,
            (Some(_), None) => {
                return Err(CudaError::Usage(
                    "no RoPE tables for the second attention form".into(),
                ))
            }
        };
        let rows = self.rope_rows;
        let slice = |(cos, sin): (&[f32], &[f32]), half: usize| {
            let (a, b) = (rows * half, n * half);
            match (cos.get(a..b), sin.get(a..b)) {
                (Some(c), Some(sn)) => Ok((a, c.to_vec(), sn.to_vec())),
                _ => Err(CudaError::Usage(format!(
                    "RoPE tables of {} values for {n} positions",
                    cos.len().min(sin.len())
                ))),
            }
        };
        let first = slice((rope.cos, rope.sin), s.rotary_dim / 2)?;
        let second = swa.map(|(half, t)| slice(t, half)).transpose()?;
        for (i, part) in [Some(first), second].into_iter().enumerate() {
            let Some((at, c, sn)) = part else { continue };
            if c.is_empty() {
                continue;
            }
            let (cb, sb) = match i {
                0 => (&mut self.cos, &mut self.sin),
                _ => (&mut self.cos2, &mut self.sin2),
            };
            self.dev.write(cb, at * 4, &f32_bytes(&c))?;
            self.dev.write(sb, at * 4, &f32_bytes(&sn))?;
        }
        self.rope_rows = n;
        Ok(())
    }

    /// Grow `seq`'s KV caches to hold `n` positions, and the scores and RoPE tables with them
    /// (doubling), keeping what they hold.
    fn ensure_cap(&mut self, seq: &mut EngineSeq<D::Buf>, n: usize) -> Result<(), CudaError> {
        let grown = |from: usize| -> Result<usize, CudaError> {
            let mut cap = from;
            while cap < n {
                cap = cap
                    .checked_mul(2)
                    .ok_or_else(|| CudaError::Usage("context too long".into()))?;
            }
            int(cap, "a context length")?;
            Ok(cap)
        };
        let s = self.shape;
        let dev = &self.dev;
        let grow = |old: &D::Buf, old_len: usize, len: usize| -> Result<D::Buf, CudaError> {
            let mut new = dev.alloc(len.max(1) * 4)?;
            dev.copy(old, &mut new, old_len.min(len) * 4)?;
            Ok(new)
        };
        // Every new buffer is made (and filled) before any old one is let go, so a failure
        // leaves the sequence and the tables as they were, and the graphs that bake them in
        // still right; the graphs of what is replaced are dropped with it.
        if n > seq.cap {
            let cap = grown(seq.cap)?;
            let mut made = Vec::new();
            for (sl, l) in seq.layers.iter().zip(&self.layers) {
                let kvd = self.kv_width(l);
                if let SeqLayer::Kv { k, v } = sl {
                    made.push((
                        grow(k, seq.cap * kvd, cap * kvd)?,
                        grow(v, seq.cap * kvd, cap * kvd)?,
                    ));
                }
            }
            let mut made = made.into_iter();
            for l in &mut seq.layers {
                if let SeqLayer::Kv { k, v } = l {
                    let (k2, v2) = made.next().ok_or_else(|| {
                        CudaError::Usage("fewer new KV caches than attention layers".into())
                    })?;
                    *k = k2;
                    *v = v2;
                }
            }
            seq.cap = cap;
            self.graphs.retain(|g| g.seq != seq.id);
        }
        if seq.cap > self.cap {
            let cap = seq.cap;
            int((cap + 1).saturating_mul(s.heads), "the attention scores")?;
            let half = s.rotary_dim / 2;
            let half2 = s.swa.map_or(0, |w| w.rotary_dim / 2);
            let cos = grow(&self.cos, self.cap * half, cap * half)?;
            let sin = grow(&self.sin, self.cap * half, cap * half)?;
            let cos2 = grow(&self.cos2, self.cap * half2, cap * half2)?;
            let sin2 = grow(&self.sin2, self.cap * half2, cap * half2)?;
            let scores = dev.alloc((s.heads * (cap + 1)).max(1) * 4)?;
            (self.cos, self.sin, self.scores) = (cos, sin, scores);
            (self.cos2, self.sin2) = (cos2, sin2);
            self.cap = cap;
            self.graphs.clear();
        }
        Ok(())
    }

    /// Give every new sequence room for `n` positions to begin with (at least 1; the default
    /// 256), for tests that make the caches grow within a few steps. Geometry only: how often
    /// a cache grows changes no bit.
    pub fn set_first_capacity(&mut self, n: usize) {
        self.first_cap = n.max(1);
    }

    fn p(&self, b: &D::Buf) -> u64 {
        self.dev.addr(b)
    }

    /// `jobs` as one launch's table, and their rows.
    fn mat_jobs(jobs: &[MatJob]) -> Result<(MatJobs, i32), CudaError> {
        let mut m = MatJobs::default();
        let mut rows = 0i32;
        for (i, j) in jobs.iter().enumerate() {
            m.job[i] = *j;
            m.row_start[i] = rows;
            rows = rows
                .checked_add(j.rows)
                .ok_or_else(|| CudaError::Usage("too many rows in one launch".into()))?;
        }
        m.row_start[jobs.len()] = rows;
        m.n = jobs.len() as i32;
        Ok((m, rows))
    }

    /// Whether `jobs` take the tiled kernel: each reads job 0's x with wide loads, and they share
    /// its columns (whole 32-element chunks) and element type.
    fn tiles(jobs: &[MatJob]) -> bool {
        let first = jobs[0];
        jobs.iter().all(|j| {
            j.vec == 1
                && j.cols % 32 == 0
                && j.cols == first.cols
                && j.dtype == first.dtype
                && j.x == first.x
        })
    }

    /// The tiled launch of `jobs` (`tiles`), taking x in through the RMSNorm `norm` (its
    /// weights, and where block 0 stores the normed x, or 0) when given.
    fn tiled_matvec(
        &self,
        m: MatJobs,
        rows: i32,
        norm: Option<(&DevTensor<D::Buf>, u64)>,
    ) -> Result<(), CudaError> {
        let nr = tile_rows(rows as usize, TILE_MAX_ROWS, self.dev.multiprocessors());
        let mut shared = self.dev.tile().shared();
        let (nw, ndt, keep) = match norm {
            Some((w, keep)) => {
                shared += tile_norm_shared(w.cols) as u32;
                (w.ptr, w.dtype.code(), keep)
            }
            None => (0, 0, 0),
        };
        // SAFETY: as in `matvec`, and every job has job 0's cols (a multiple of 32), dtype and
        // x, with 16-byte aligned rows (`vec`); the block has the tile's shared memory (the ring
        // the device's kernels were compiled for), and with a norm cols floats more (within what
        // the tiled kernels are allowed, `norm_matvec`), whose weights hold cols elements, as
        // `keep` (when not 0) holds cols floats.
        unsafe {
            self.dev.launch(
                Kernel::TiledMatvec,
                geo((rows as usize).div_ceil(nr), TILE_THREADS, shared)?,
                &[
                    Arg::Jobs(m),
                    Arg::I32(nr as i32),
                    Arg::Ptr(nw),
                    Arg::I32(ndt),
                    Arg::F32(self.shape.eps),
                    Arg::Ptr(keep),
                ],
            )
        }
    }

    /// Whether `norm_matvec` takes the norm `w` into the products `jobs`' launch.
    fn norm_fuses(&self, w: &DevTensor<D::Buf>, jobs: &[MatJob]) -> bool {
        let cols = jobs[0].cols as usize;
        let shared = self.dev.tile().shared() as usize + tile_norm_shared(cols);
        self.fuse_norms
            && w.cols == cols
            && shared <= self.dev.tile_shared_max() as usize
            && Self::tiles(jobs)
    }

    /// `xn` = RMSNorm_w(x) (as `rms_norm`), then the products `jobs`, each reading `xn`. In one
    /// launch when they tile and a block may keep x beside the ring: every block normalises x
    /// itself (the same operations), and block 0 stores it at `xn` only when `keep` (for a later
    /// launch) — without `keep`, `xn` may afterwards hold an earlier norm's output, so only a
    /// caller that reads nothing of `xn` later passes `keep = false`. Else the norm's own launch,
    /// then the products'. No job may write x or `xn` (the blocks read x while others finish).
    fn norm_matvec(
        &self,
        x: u64,
        w: &DevTensor<D::Buf>,
        xn: u64,
        keep: bool,
        jobs: &[MatJob],
    ) -> Result<(), CudaError> {
        debug_assert!(jobs.iter().all(|j| j.y != x && j.y != xn));
        if self.norm_fuses(w, jobs) {
            let raw: Vec<MatJob> = jobs.iter().map(|j| MatJob { x, ..*j }).collect();
            let (m, rows) = Self::mat_jobs(&raw)?;
            return self.tiled_matvec(m, rows, Some((w, if keep { xn } else { 0 })));
        }
        self.rms_norm(x, w, xn)?;
        self.matvec(jobs)
    }

    /// The products `jobs` in one launch.
    fn matvec(&self, jobs: &[MatJob]) -> Result<(), CudaError> {
        let (mut m, rows) = Self::mat_jobs(jobs)?;
        if Self::tiles(jobs) {
            return self.tiled_matvec(m, rows, None);
        }
        // x staged in shared memory when every product reads the same x with wide loads and it
        // fits the 48 KiB a block may take without opting in.
        let widest = jobs.iter().map(|j| j.cols).max().unwrap_or(0);
        if jobs.iter().all(|j| j.x == jobs[0].x && j.vec == 1) && widest > 0 && widest <= MAX_STAGE
        {
            m.stage = widest;
        }
        // A K type among the products: a warp per row (`warp_rows`), else a quad.
        let warps = warp_rows(jobs.iter().map(|j| j.dtype));
        let (kernel, threads) = if warps {
            (Kernel::WarpMatvec, rows as usize * 32)
        } else {
            (Kernel::Matvec, rows as usize * 4)
        };
        // SAFETY: each job's `w` is a resident matrix of `rows × cols` elements of `dtype`
        // (checked at upload), `x` a buffer of at least `cols` floats, `y` of at least `rows`,
        // `bias` (when set) of `rows` elements; `vec` only when `cols` is a multiple of 8 (every
        // row and x 16-byte aligned: buffers are 256-byte aligned). Quads past the last row
        // compute the last row again and write nothing (as do warps). With `stage`, each block copies the first
        // `stage` floats of the shared x (the widest product's columns, which that buffer holds)
        // into `stage × 4` bytes of shared memory.
        unsafe {
            self.dev.launch(
                kernel,
                geo(
                    threads.div_ceil(MATVEC_BLOCK as usize),
                    MATVEC_BLOCK,
                    m.stage as u32 * 4,
                )?,
                &[Arg::Jobs(m)],
            )
        }
    }

    fn job(
        &self,
        w: &DevTensor<D::Buf>,
        x: u64,
        y: u64,
        bias: Option<&DevTensor<D::Buf>>,
        acc: bool,
    ) -> MatJob {
        MatJob {
            w: w.ptr,
            x,
            y,
            bias: bias.map_or(0, |b| b.ptr),
            rows: w.rows as i32,
            cols: w.cols as i32,
            dtype: w.dtype.code(),
            bias_dtype: bias.map_or(0, |b| b.dtype.code()),
            accumulate: i32::from(acc),
            vec: i32::from(w.dtype.wide() && w.cols % 8 == 0),
        }
    }

    fn rms_norm(&self, x: u64, w: &DevTensor<D::Buf>, out: u64) -> Result<(), CudaError> {
        self.rms_norm_eps(x, w, out, self.shape.eps)
    }

    /// `out` = RMSNorm_w(x) of `w.cols` elements, of epsilon `eps`.
    fn rms_norm_eps(
        &self,
        x: u64,
        w: &DevTensor<D::Buf>,
        out: u64,
        eps: f32,
    ) -> Result<(), CudaError> {
        // SAFETY: `x` and `out` hold `w.cols` floats (a hidden-sized activation, an MLA latent,
        // or the hyper-connections' streams·hidden and `hcn`), `w` `w.cols` elements.
        unsafe {
            self.dev.launch(
                Kernel::RmsNorm,
                geo(1, RMS_BLOCK, 0)?,
                &[
                    Arg::Ptr(x),
                    Arg::Ptr(w.ptr),
                    Arg::I32(w.dtype.code()),
                    Arg::I32(w.cols as i32),
                    Arg::F32(eps),
                    Arg::Ptr(out),
                ],
            )
        }
    }

    /// The layer after which the next layer's input norm is not taken into its mixer's first
    /// launch but into layer `i`'s combine: that next layer, if so.
    fn next_norm(&self, i: usize) -> Option<&DevTensor<D::Buf>> {
        let next = self.layers.get(i + 1);
        next.filter(|n| !self.norm_fuses(&n.in_norm, &self.mixer_inputs(n)))
            .map(|n| &n.in_norm)
    }

    /// Launch the step — embedding, then every layer over `seq`'s state; `x` holds the residual
    /// stream after it — from its start (`after` none: the embedding) or from the rest of layer
    /// `after`'s MLP (its routed experts' outputs written to `y` by the host), up to the end
    /// of the last layer — `None` — or up to the top-k of the next layer whose routed experts
    /// the host computes — `Some(that layer)`.
    fn launch_part(
        &self,
        seq: &EngineSeq<D::Buf>,
        after: Option<usize>,
    ) -> Result<Option<usize>, CudaError> {
        if let Some(hc) = self.shape.hyper {
            if after.is_some() {
                return Err(CudaError::Usage(
                    "host experts beside hyper-connections".into(),
                ));
            }
            self.launch_hyper(seq, hc)?;
            return Ok(None);
        }
        let a = &self.a;
        let (x, xn, params) = (self.p(&a.x), self.p(&a.xn), self.p(&a.params));
        // A layer's input norm is taken into its mixer's first launch (norm_matvec); where it
        // cannot be, into the layer before's combine (its MLP's last launch).
        let (first, mut normed) = match after {
            Some(i) => {
                let l = &self.layers[i];
                let next = self.next_norm(i);
                let (ids, wts, k) = self.slots(l);
                self.mlp_rest(l, (ids, wts, k), xn, (x, false), next)?;
                (i + 1, next.is_some())
            }
            None => {
                self.embed(params, x)?;
                (0, false)
            }
        };
        for i in first..self.layers.len() {
            let l = &self.layers[i];
            let inputs = self.mixer_inputs(l);
            // KDA reads the normed x after its first launch: kept.
            let keep = matches!(l.mixer, DevMixer::Kda(_));
            if normed {
                self.matvec(&inputs)?;
            } else {
                self.norm_matvec(x, &l.in_norm, xn, keep, &inputs)?;
            }
            match (&l.mixer, &seq.layers[i]) {
                (DevMixer::Attention(at), SeqLayer::Kv { k, v }) => self.attention(at, k, v)?,
                (DevMixer::DeltaNet(t), SeqLayer::Delta { conv, state }) => {
                    self.deltanet(t, conv, state)?
                }
                (DevMixer::Mla(m), SeqLayer::Kv { k, v }) => self.mla(m, k, v)?,
                (DevMixer::Kda(t), SeqLayer::Delta { conv, state }) => {
                    self.kda(t, (conv, state), x, true)?
                }
                _ => return Err(foreign_layout(i)),
            }
            let next = self.next_norm(i);
            let slots = self.route(l, xn, x)?;
            if l.host {
                return Ok(Some(i));
            }
            self.mlp_rest(l, slots, xn, (x, false), next)?;
            normed = next.is_some();
        }
        Ok(None)
    }

    /// The embedding row of the token `params[0]` into `x`.
    fn embed(&self, params: u64, x: u64) -> Result<(), CudaError> {
        let h = self.shape.hidden;
        // SAFETY: params[0] < vocab (checked in `step`), the table is `vocab × hidden`, x holds
        // `hidden` floats.
        unsafe {
            self.dev.launch(
                Kernel::Embed,
                geo(h.div_ceil(BLOCK as usize), BLOCK, 0)?,
                &[
                    Arg::Ptr(self.embed.ptr),
                    Arg::I32(self.embed.dtype.code()),
                    Arg::I32(h as i32),
                    Arg::Ptr(params),
                    Arg::Ptr(x),
                ],
            )
        }
    }

    /// The products of the normed x that open layer `l`'s mixer: q, k, v (attention); the
    /// projections q/k/v, z, b and a (DeltaNet).
    fn mixer_inputs(&self, l: &Layer<D::Buf>) -> Vec<MatJob> {
        let a = &self.a;
        let xn = self.p(&a.xn);
        match &l.mixer {
            DevMixer::Attention(at) => vec![
                self.job(&at.q, xn, self.p(&a.q), at.bias[0].as_ref(), false),
                self.job(&at.k, xn, self.p(&a.k), at.bias[1].as_ref(), false),
                self.job(&at.v, xn, self.p(&a.v), at.bias[2].as_ref(), false),
            ],
            DevMixer::Mla(m) => {
                let q = match &m.q_a {
                    Some((qa, bias, _)) => self.job(qa, xn, self.p(&a.mqa), bias.as_ref(), false),
                    None => self.job(&m.q, xn, self.p(&a.q), None, false),
                };
                let latent = self.job(&m.kv_a, xn, self.p(&a.mlat), m.kv_a_bias.as_ref(), false);
                vec![q, latent]
            }
            DevMixer::DeltaNet(t) => vec![
                self.job(&t.qkv, xn, self.p(&a.mixed), None, false),
                self.job(&t.z, xn, self.p(&a.dz), None, false),
                self.job(&t.b, xn, self.p(&a.db), None, false),
                self.job(&t.a, xn, self.p(&a.da), None, false),
            ],
            // q, k and v side by side in `kmixed`, and the forget gate's first half; the rest
            // of the layer's products of xn in `kda`.
            DevMixer::Kda(t) => {
                let (m, w4) = (
                    self.p(&a.kmixed),
                    4 * self.shape.kda.map_or(0, |k| k.width()) as u64,
                );
                vec![
                    self.job(&t.qkv[0], xn, m, None, false),
                    self.job(&t.qkv[1], xn, m + w4, None, false),
                    self.job(&t.qkv[2], xn, m + 2 * w4, None, false),
                    self.job(&t.f[0], xn, self.p(&a.kfa), None, false),
                ]
            }
        }
    }

    /// Attention of the token (its q, k, v computed) over the sequence's KV cache of the layer
    /// (`kcache`, `vcache`), then `o` added to x.
    fn attention(
        &self,
        at: &DevAttention<D::Buf>,
        kcache: &D::Buf,
        vcache: &D::Buf,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let (mut form, kvh) = match (at.sliding, s.swa) {
            (true, Some(w)) => (
                Form {
                    window: w.window,
                    half: w.rotary_dim / 2,
                    tables: (self.p(&self.cos2), self.p(&self.sin2)),
                    ..self.form()
                },
                w.kv_heads,
            ),
            _ => (self.form(), s.kv_heads),
        };
        form.kv_heads = kvh;
        form.sinks = at.sinks.as_ref();
        let mut out = self.p(&a.attn);
        if let Some(vf) = s.values {
            // SAFETY: v holds kv_heads·dim floats (v_proj's rows), vw kv_heads·d (the widest
            // layer's); a thread per output.
            let n = kvh * s.head_dim;
            unsafe {
                self.dev.launch(
                    Kernel::WidenHeads,
                    geo(n.div_ceil(MLA_BLOCK as usize), MLA_BLOCK, 0)?,
                    &[
                        Arg::Ptr(self.p(&a.v)),
                        Arg::I32(kvh as i32),
                        Arg::I32(vf.dim as i32),
                        Arg::I32(s.head_dim as i32),
                        Arg::F32(vf.scale),
                        Arg::Ptr(self.p(&a.vw)),
                    ],
                )?;
            }
            form.v = self.p(&a.vw);
            self.attend(&at.qk_norm, form, kcache, vcache)?;
            out = self.p(&a.mov);
            self.narrow(vf.dim, out)?;
        } else {
            self.attend(&at.qk_norm, form, kcache, vcache)?;
        }
        let x = self.p(&a.x);
        self.matvec(&[self.job(&at.o, out, x, at.bias[3].as_ref(), true)])
    }

    /// The first attention form's launch ([`EngineShape`]'s own heads, window and RoPE; no
    /// sinks; the values in `a.v`).
    fn form(&self) -> Form<'_, D::Buf> {
        let s = self.shape;
        Form {
            kv_heads: s.kv_heads,
            window: s.window,
            half: s.rotary_dim / 2,
            tables: (self.p(&self.cos), self.p(&self.sin)),
            sinks: None,
            v: self.p(&self.a.v),
        }
    }

    /// `out` (heads × `vd`) = each head's first `vd` outputs of `a.attn`
    /// (`tarfa_e_narrow_heads`).
    fn narrow(&self, vd: usize, out: u64) -> Result<(), CudaError> {
        let s = self.shape;
        let n = s.heads * vd;
        // SAFETY: attn holds heads·head_dim floats, out heads·vd (vd ≤ head_dim: `mov` is
        // allocated for the widest such use); a thread per output.
        unsafe {
            self.dev.launch(
                Kernel::NarrowHeads,
                geo(n.div_ceil(MLA_BLOCK as usize), MLA_BLOCK, 0)?,
                &[
                    Arg::Ptr(self.p(&self.a.attn)),
                    Arg::I32(s.heads as i32),
                    Arg::I32(s.head_dim as i32),
                    Arg::I32(vd as i32),
                    Arg::Ptr(out),
                ],
            )
        }
    }

    /// `tarfa_e_attention` of the token's q, k and v (`a.q`, `a.k`, `a.v`) over the layer's KV
    /// cache into `a.attn`: the q/k norms `qk_norm` (or none) and RoPE on each head's first
    /// `2·half` dims first.
    fn attend(
        &self,
        qk_norm: &Option<DevQkNorm<D::Buf>>,
        form: Form<'_, D::Buf>,
        kcache: &D::Buf,
        vcache: &D::Buf,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let d = s.head_dim;
        let params = self.p(&a.params);
        let (q, k, v, attn) = (self.p(&a.q), self.p(&a.k), form.v, self.p(&a.attn));
        let (heads, kvh, di) = (s.heads as i32, form.kv_heads as i32, d as i32);
        let half = form.half as i32;
        let window = form.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let ((cos, sin), scores) = (form.tables, self.p(&self.scores));
        let (sinks, sink_dt) = form.sinks.map_or((0, 0), |t| (t.ptr, t.dtype.code()));
        let (kc, vc) = (self.p(kcache), self.p(vcache));
        let (norm, qn, kn, ndt) = match qk_norm {
            Some((qn, kn)) => (1i32, qn.ptr, kn.ptr, qn.dtype.code()),
            None => (0, 0, 0, 0),
        };
        // Gated attention: each head's query then its gate in q.
        let qstride = if s.attn_gate { 2 * di } else { di };
        // The scores in shared memory after the 32 × d partials, as many as 48 KiB leaves
        // room for beside q, the key and two warps' scratch (7,680 at d = 128); a longer
        // context keeps them in `scores`.
        let sh_scores = prompt::sh_scores(d, self.cap);
        // SAFETY: one block per head (ATTN_BLOCK ≥ two warps); q holds heads·qstride floats, k
        // and v the layer's kv_heads·d; the norm weights d elements; the sequence's caches
        // `seq.cap × kv_heads·d` floats and the form's RoPE tables `cap × half` (cap ≥
        // seq.cap), with params[1] < seq.cap (ensure_cap in `step`); scores hold
        // heads × (cap + 1) floats (a head's scores and its sink); the sinks (when given)
        // heads elements; shared memory 36 × d floats (d ≤ 256: 36 KiB) and sh_scores more
        // (within 48 KiB).
        unsafe {
            self.dev.launch(
                Kernel::Attention,
                geo(s.heads, ATTN_BLOCK, ((36 * d + sh_scores) * 4) as u32)?,
                &[
                    Arg::Ptr(q),
                    Arg::Ptr(k),
                    Arg::Ptr(v),
                    Arg::Ptr(qn),
                    Arg::Ptr(kn),
                    Arg::I32(ndt),
                    Arg::I32(norm),
                    Arg::F32(s.eps),
                    Arg::I32(heads),
                    Arg::I32(kvh),
                    Arg::I32(di),
                    Arg::I32(half),
                    Arg::Ptr(cos),
                    Arg::Ptr(sin),
                    Arg::Ptr(params),
                    Arg::Ptr(kc),
                    Arg::Ptr(vc),
                    Arg::I32(window),
                    Arg::F32(s.scaling),
                    Arg::Ptr(scores),
                    Arg::I32(self.cap as i32 + 1),
                    Arg::Ptr(attn),
                    Arg::I32(sh_scores as i32),
                    Arg::I32(qstride),
                    Arg::I32(i32::from(s.attn_gate)),
                    Arg::Ptr(sinks),
                    Arg::I32(sink_dt),
                ],
            )
        }
    }

    /// An MLA layer's step once its first products are computed (`mixer_inputs`: the query's
    /// LoRA or the query, and the latent `[c | k_rot]`): the latent norms and the query's and
    /// `kv_b_proj`'s products, each head's query, key and value assembled and rotated
    /// (`tarfa_e_mla_heads`), the attention (no norm, no further RoPE: `half` 0) over the
    /// layer's cache of expanded keys and values, the heads narrowed to the values' width
    /// (`tarfa_e_narrow_heads`), and `o_proj` added to x: `family::mla::layer`'s operations.
    fn mla(&self, m: &DevMla<D::Buf>, kcache: &D::Buf, vcache: &D::Buf) -> Result<(), CudaError> {
        let s = self.shape;
        let md = s
            .mla
            .ok_or_else(|| CudaError::Usage("an MLA layer without its widths".into()))?;
        let a = &self.a;
        let (q, latent, cn, kvb) = (
            self.p(&a.q),
            self.p(&a.mlat),
            self.p(&a.mcn),
            self.p(&a.mkvb),
        );
        let mut jobs = Vec::with_capacity(2);
        if let Some((_, _, qn)) = &m.q_a {
            let (qa, qan) = (self.p(&a.mqa), self.p(&a.mqn));
            self.rms_norm_eps(qa, qn, qan, md.latent_eps)?;
            jobs.push(self.job(&m.q, qan, q, None, false));
        }
        // The latent's first kv_lora_rank floats (`c`).
        self.rms_norm_eps(latent, &m.kv_norm, cn, md.latent_eps)?;
        jobs.push(self.job(&m.kv_b, cn, kvb, None, false));
        self.matvec(&jobs)?;
        let (k, v, params) = (self.p(&a.k), self.p(&a.v), self.p(&a.params));
        let (cos, sin) = (self.p(&self.cos), self.p(&self.sin));
        // SAFETY: one block per head; q, k and v hold heads·(nope + rope) floats (head_dim,
        // checked in `new`), the latent kv_lora_rank + rope, kvb heads·(nope + v); the RoPE
        // tables cap × rope/2 (rotary_dim is rope) with params[1] < cap (ensure_cap in
        // `step`); shared memory rope floats.
        unsafe {
            self.dev.launch(
                Kernel::MlaHeads,
                geo(s.heads, MLA_BLOCK, (md.rope * 4) as u32)?,
                &[
                    Arg::Ptr(q),
                    Arg::Ptr(latent),
                    Arg::Ptr(kvb),
                    Arg::I32(md.nope as i32),
                    Arg::I32(md.rope as i32),
                    Arg::I32(md.v as i32),
                    Arg::I32(md.kv_lora_rank as i32),
                    Arg::I32(i32::from(md.interleave)),
                    Arg::Ptr(cos),
                    Arg::Ptr(sin),
                    Arg::Ptr(params),
                    Arg::Ptr(k),
                    Arg::Ptr(v),
                ],
            )?;
        }
        let form = Form {
            half: 0,
            ..self.form()
        };
        self.attend(&None, form, kcache, vcache)?;
        let (out, x) = (self.p(&a.mov), self.p(&a.x));
        self.narrow(md.v, out)?;
        self.matvec(&[self.job(&m.o, out, x, m.o_bias.as_ref(), true)])
    }

    /// The Gated DeltaNet step of the token (its projections computed), one launch: the
    /// convolution (its history advanced), every value head's recurrence (its state advanced)
    /// and gated norm; then `out_proj` added to x.
    fn deltanet(
        &self,
        t: &DevDelta<D::Buf>,
        conv_state: &D::Buf,
        state: &D::Buf,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let ds = s
            .delta
            .ok_or_else(|| CudaError::Usage("a DeltaNet layer without its widths".into()))?;
        let (x, dout) = (self.p(&a.x), self.p(&a.dout));
        // q's divisor: common's `(dk as f64).sqrt() as f32`.
        let q_div = (ds.dk as f64).sqrt() as f32;
        // SAFETY: a block per value head (delta_block: ≥ two warps, ≤ the kernel's bound);
        // mixed holds conv_dim floats, the convolution's weights conv_dim × kernel elements of a
        // one-element type (checked in `new`), the history kernel × conv_dim floats, params[1] a
        // position ≥ 0; z and dout v_heads·dv floats, b and a v_heads; dt_bias and A_log v_heads
        // elements, the norm dv; the state v_heads·dv·dk floats; dk ≤ MAX_DELTA_DK (checked in
        // `new`); shared memory 2·dk + 2·dv floats.
        unsafe {
            self.dev.launch(
                Kernel::DeltaHeads,
                geo(
                    ds.v_heads,
                    delta_block(ds.dv),
                    ((2 * ds.dk + 2 * ds.dv) * 4) as u32,
                )?,
                &[
                    Arg::Ptr(self.p(&a.mixed)),
                    Arg::Ptr(t.conv.ptr),
                    Arg::I32(t.conv.dtype.code()),
                    Arg::I32(ds.kernel as i32),
                    Arg::Ptr(self.p(conv_state)),
                    Arg::Ptr(self.p(&a.params)),
                    Arg::Ptr(self.p(&a.dz)),
                    Arg::Ptr(self.p(&a.db)),
                    Arg::Ptr(self.p(&a.da)),
                    Arg::Ptr(t.dt_bias.ptr),
                    Arg::I32(t.dt_bias.dtype.code()),
                    Arg::Ptr(t.a_log.ptr),
                    Arg::I32(t.a_log.dtype.code()),
                    Arg::I32(i32::from(t.a_neg)),
                    Arg::Ptr(t.norm.ptr),
                    Arg::I32(t.norm.dtype.code()),
                    Arg::I32(ds.k_heads as i32),
                    Arg::I32(ds.v_heads as i32),
                    Arg::I32(ds.dk as i32),
                    Arg::I32(ds.dv as i32),
                    Arg::F32(q_div),
                    Arg::F32(s.eps),
                    Arg::Ptr(self.p(state)),
                    Arg::Ptr(dout),
                ],
            )?;
        }
        self.matvec(&[self.job(&t.out, dout, x, None, true)])
    }

    /// The rest of a KDA layer (its first products done, [`Engine::mixer_inputs`]; `xn` holds
    /// the normed input): the output gate's first half and b, both gates' second halves, the
    /// heads (`tarfa_e_kda_heads`), then `o_proj` into `out` (added to it when `acc`).
    fn kda(
        &self,
        t: &DevKda<D::Buf>,
        (conv_state, state): (&D::Buf, &D::Buf),
        out: u64,
        acc: bool,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let kd = s
            .kda
            .ok_or_else(|| CudaError::Usage("a KDA layer without its widths".into()))?;
        let (xn, kout) = (self.p(&a.xn), self.p(&a.kout));
        let (kfa, kga, kf, kg) = (self.p(&a.kfa), self.p(&a.kga), self.p(&a.kf), self.p(&a.kg));
        self.matvec(&[
            self.job(&t.g[0], xn, kga, None, false),
            self.job(&t.b, xn, self.p(&a.kb), None, false),
            self.job(&t.f[1], kfa, kf, None, false),
        ])?;
        self.matvec(&[self.job(&t.g[1], kga, kg, None, false)])?;
        // `dim^-0.5` as the CPU rounds it.
        let q_scale = (1.0 / (kd.dim as f64).sqrt()) as f32;
        // SAFETY: a block per head (delta_block: ≥ two warps, ≤ the kernel's bound); kmixed
        // holds 3·heads·dim floats, the stacked convolutions 3·heads·dim × kernel elements of a
        // one-element type (checked in `new`), the history kernel × 3·heads·dim floats, params[1]
        // a position ≥ 0; kf, kg and kout heads·dim floats, kb heads; dt_bias heads·dim
        // elements, A_log heads, the norm dim; the state heads·dim² floats; dim ≤ MAX_DELTA_DK
        // (checked in `new`); shared memory 5·dim floats.
        unsafe {
            self.dev.launch(
                Kernel::KdaHeads,
                geo(kd.heads, delta_block(kd.dim), (5 * kd.dim * 4) as u32)?,
                &[
                    Arg::Ptr(self.p(&a.kmixed)),
                    Arg::Ptr(t.conv.ptr),
                    Arg::I32(t.conv.dtype.code()),
                    Arg::I32(kd.kernel as i32),
                    Arg::Ptr(self.p(conv_state)),
                    Arg::Ptr(self.p(&a.params)),
                    Arg::Ptr(kf),
                    Arg::Ptr(self.p(&a.kb)),
                    Arg::Ptr(kg),
                    Arg::Ptr(t.dt_bias.ptr),
                    Arg::I32(t.dt_bias.dtype.code()),
                    Arg::Ptr(t.a_log.ptr),
                    Arg::I32(t.a_log.dtype.code()),
                    Arg::I32(i32::from(t.a_neg)),
                    Arg::I32(i32::from(kd.lower_bound.is_some())),
                    Arg::F32(kd.lower_bound.unwrap_or(0.0)),
                    Arg::Ptr(t.norm.ptr),
                    Arg::I32(t.norm.dtype.code()),
                    Arg::I32(kd.heads as i32),
                    Arg::I32(kd.dim as i32),
                    Arg::F32(q_scale),
                    Arg::F32(kd.eps),
                    Arg::Ptr(self.p(state)),
                    Arg::Ptr(kout),
                ],
            )?;
        }
        self.matvec(&[self.job(&t.o, kout, out, None, acc)])
    }

    /// The layer's MLP of its post-attention norm of `x` (into `xn`), added to `x`; then, given
    /// the next layer's input norm, `xn` = that norm of the new `x` (in the combine's launch).
    /// The layer's slots: its experts' numbers and weights and how many (a dense layer: its one
    /// MLP as expert 0, weight 1).
    fn slots(&self, l: &Layer<D::Buf>) -> (u64, u64, usize) {
        let a = &self.a;
        match &l.router {
            Some(_) => (self.p(&a.ids), self.p(&a.wts), self.shape.top_k),
            None => (self.p(&a.one_id), self.p(&a.one_wt), 1),
        }
    }

    /// The post-attention norm of `x` (into `xn`) and, in a MoE layer, the router and its
    /// top-k: the slots ([`Engine::slots`]).
    fn route(&self, l: &Layer<D::Buf>, xn: u64, x: u64) -> Result<(u64, u64, usize), CudaError> {
        let s = self.shape;
        let a = &self.a;
        match &l.router {
            Some(router) => {
                let (z, probs) = (self.p(&a.z), self.p(&a.probs));
                // The experts read the normed x too: block 0 keeps it. The shared experts'
                // gate (a row) in the same launch.
                let mut route = vec![self.job(router, xn, z, None, false)];
                if let Some(g) = &l.shared_gate {
                    route.push(self.job(g, xn, self.p(&a.sgz), None, false));
                }
                self.norm_matvec(x, &l.post_norm, xn, true, &route)?;
                let (ids, wts) = (self.p(&a.ids), self.p(&a.wts));
                let (n, ki) = (router.rows as i32, s.top_k as i32);
                let renorm = i32::from(s.norm_topk_prob);
                // The gate's weight: the folded slot's (wts[k]) or the combine's.
                let (gz, gw) = match (&l.shared_gate, l.fold) {
                    (Some(_), true) => (self.p(&a.sgz), wts + 4 * s.top_k as u64),
                    (Some(_), false) => (self.p(&a.sgz), self.p(&a.sgw)),
                    (None, _) => (0, 0),
                };
                match &l.route {
                    // SAFETY: z holds `n` floats (n = the router's rows = experts) and probs
                    // 3n, ids and wts `k` (k ≤ n, checked in `new`) and one more (the folded
                    // slot's); gz and gw (when not 0) a float each; one warp.
                    DevRoute::Softmax => unsafe {
                        self.dev.launch(
                            Kernel::Topk,
                            geo(1, 32, 0)?,
                            &[
                                Arg::Ptr(z),
                                Arg::I32(n),
                                Arg::I32(ki),
                                Arg::I32(renorm),
                                Arg::Ptr(probs),
                                Arg::Ptr(ids),
                                Arg::Ptr(wts),
                                Arg::Ptr(gz),
                                Arg::Ptr(gw),
                            ],
                        )?;
                    },
                    // SAFETY: as above, the bias holds n elements of its type, the groups divide
                    // n (checked in `new`), the scratch (probs) 3n floats.
                    DevRoute::SigmoidGroup {
                        bias,
                        n_group,
                        topk_group,
                        scale,
                    } => unsafe {
                        self.dev.launch(
                            Kernel::SigmoidTopk,
                            geo(1, 32, 0)?,
                            &[
                                Arg::Ptr(z),
                                Arg::I32(n),
                                Arg::Ptr(bias.ptr),
                                Arg::I32(bias.dtype.code()),
                                Arg::I32(ki),
                                Arg::I32(*n_group),
                                Arg::I32(*topk_group),
                                Arg::I32(renorm),
                                Arg::F32(*scale),
                                Arg::Ptr(probs),
                                Arg::Ptr(ids),
                                Arg::Ptr(wts),
                            ],
                        )?;
                    },
                }
            }
            None => self.rms_norm(x, &l.post_norm, xn)?,
        }
        Ok(self.slots(l))
    }

    /// The rest of the layer's MLP, its slots chosen ([`Engine::route`]): the routed experts
    /// (unless the host computed their outputs into `y`), the shared experts, and the combine
    /// added to `x`; then, given the next layer's input norm, `xn` = that norm of the new `x`
    /// (in the combine's launch).
    fn mlp_rest(
        &self,
        l: &Layer<D::Buf>,
        (ids, wts, k): (u64, u64, usize),
        xn: u64,
        x: (u64, bool),
        next: Option<&DevTensor<D::Buf>>,
    ) -> Result<(), CudaError> {
        let a = &self.a;
        let (hb, yb) = (self.p(&a.h), self.p(&a.y));
        let hi = self.shape.hidden as i32;
        if l.fold {
            // The shared experts as slot k (id n, weight 1 or their gate's: `Layer::fold`).
            self.swiglu_slots(&l.experts, ids, k + 1, xn, hb, yb)?;
            return self.combine(yb, wts, k as i32 + 1, hi, (0, 0), x, next.map(|w| (w, xn)));
        }
        if !l.host {
            self.swiglu_slots(&l.experts, ids, k, xn, hb, yb)?;
        }
        let sh = match &l.shared {
            Some(t) => {
                let ys = self.p(&a.ys);
                self.swiglu_slots(t, self.p(&a.one_id), 1, xn, self.p(&a.hs), ys)?;
                ys
            }
            None => 0,
        };
        let shw = match &l.shared_gate {
            Some(_) => self.p(&a.sgw),
            None => 0,
        };
        self.combine(yb, wts, k as i32, hi, (sh, shw), x, next.map(|w| (w, xn)))
    }

    /// `y[s] = down_e(silu(gate_e xn) ⊙ up_e xn)` for the expert `e = ids[s]` of each of the `k`
    /// slots of table `t`, through `h` (`k × t.inter` floats): the tiled kernels where the widths
    /// are whole 32-element chunks.
    fn swiglu_slots(
        &self,
        t: &ExpertTable<D::Buf>,
        ids: u64,
        k: usize,
        xn: u64,
        hb: u64,
        yb: u64,
    ) -> Result<(), CudaError> {
        let s = self.shape;
        let m = t.args(&self.dev, (s.hidden, s.swiglu_limit))?;
        let ki = k as i32;
        // SAFETY: ids hold k experts' numbers < n_experts (the kernel clamps anything else), each
        // an expert buffer of gate/up `inter × hidden` and down `hidden × inter` elements; xn
        // holds hidden floats, h `k × inter` (k ≤ top_k, inter ≤ the largest width, allocated in
        // `finish`; the shared experts' own buffer for them) and y `k × hidden`; `vec` only for
        // widths that are multiples of 8.
        if t.inter % 32 == 0 && s.hidden % 32 == 0 && t.wide() {
            let sms = self.dev.multiprocessors();
            let np = tile_rows(k * t.inter, TILE_MAX_ROWS / 2, sms);
            // A power of two ≤ 32 dividing hidden: a down block's rows are of one slot.
            let nr = tile_rows(k * s.hidden, TILE_MAX_ROWS, sms);
            let shared = self.dev.tile().shared();
            let tile = |n: usize, per: usize| geo(n.div_ceil(per), TILE_THREADS, shared);
            // SAFETY: as above; inter and hidden are whole chunks, so every row and each slot's
            // h (h + slot·inter floats) are 16-byte aligned (expert matrices start 256-byte
            // aligned, `put`), as cp.async needs; each block has the tile's shared memory (the
            // ring the device's kernels were compiled for).
            return unsafe {
                self.dev.launch(
                    Kernel::TiledGateUp,
                    tile(k * t.inter, np)?,
                    &[
                        Arg::Moe(m),
                        Arg::Ptr(ids),
                        Arg::I32(ki),
                        Arg::Ptr(xn),
                        Arg::Ptr(hb),
                        Arg::I32(np as i32),
                    ],
                )?;
                self.dev.launch(
                    Kernel::TiledDown,
                    tile(k * s.hidden, nr)?,
                    &[
                        Arg::Moe(m),
                        Arg::Ptr(ids),
                        Arg::I32(ki),
                        Arg::Ptr(hb),
                        Arg::Ptr(yb),
                        Arg::I32(nr as i32),
                    ],
                )
            };
        }
        let per_row = |rows: usize, per: usize| {
            geo(
                (rows * per).div_ceil(MATVEC_BLOCK as usize),
                MATVEC_BLOCK,
                0,
            )
        };
        // A K type: a warp per row (`warp_rows`), else a quad.
        let (gu, dn) = (warp_rows([m.dtype_g, m.dtype_u]), warp_rows([m.dtype_d]));
        let pick = |warp: bool, w: Kernel, q: Kernel| if warp { (w, 32) } else { (q, 4) };
        let ((gk, gper), (dk, dper)) = (
            pick(gu, Kernel::WarpGateUp, Kernel::GateUp),
            pick(dn, Kernel::WarpDown, Kernel::Down),
        );
        unsafe {
            self.dev.launch(
                gk,
                per_row(k * t.inter, gper)?,
                &[
                    Arg::Moe(m),
                    Arg::Ptr(ids),
                    Arg::I32(ki),
                    Arg::Ptr(xn),
                    Arg::Ptr(hb),
                ],
            )?;
            self.dev.launch(
                dk,
                per_row(k * s.hidden, dper)?,
                &[
                    Arg::Moe(m),
                    Arg::Ptr(ids),
                    Arg::I32(ki),
                    Arg::Ptr(hb),
                    Arg::Ptr(yb),
                ],
            )
        }
    }

    /// x += the k slots' outputs `y` weighted by `wts`, in slot order, then the shared experts'
    /// output `sh` (when not 0) — with `set`, x = that sum; with `norm` (w, out), then out =
    /// RMSNorm_w(x), in the same launch (not with `set`).
    #[allow(clippy::too_many_arguments)]
    fn combine(
        &self,
        yb: u64,
        wts: u64,
        k: i32,
        hidden: i32,
        (sh, shw): (u64, u64),
        (x, set): (u64, bool),
        norm: Option<(&DevTensor<D::Buf>, u64)>,
    ) -> Result<(), CudaError> {
        if set && norm.is_some() {
            return Err(CudaError::Usage("a combine stored alone and normed".into()));
        }
        if let Some((w, out)) = norm {
            // SAFETY: y holds k × hidden floats, wts k, x, out and sh (when not 0) hidden, shw
            // (when not 0) a float, w hidden elements.
            return unsafe {
                self.dev.launch(
                    Kernel::CombineNorm,
                    geo(1, RMS_BLOCK, 0)?,
                    &[
                        Arg::Ptr(yb),
                        Arg::Ptr(wts),
                        Arg::I32(k),
                        Arg::I32(hidden),
                        Arg::Ptr(sh),
                        Arg::Ptr(shw),
                        Arg::Ptr(x),
                        Arg::Ptr(w.ptr),
                        Arg::I32(w.dtype.code()),
                        Arg::F32(self.shape.eps),
                        Arg::Ptr(out),
                    ],
                )
            };
        }
        // SAFETY: y holds k × hidden floats, wts k, x and sh (when not 0) hidden, shw (when not
        // 0) a float (allocated in `new`/`finish`).
        unsafe {
            self.dev.launch(
                Kernel::Combine,
                geo((hidden as usize).div_ceil(BLOCK as usize), BLOCK, 0)?,
                &[
                    Arg::Ptr(yb),
                    Arg::Ptr(wts),
                    Arg::I32(k),
                    Arg::I32(hidden),
                    Arg::Ptr(sh),
                    Arg::Ptr(shw),
                    Arg::Ptr(x),
                    Arg::I32(i32::from(set)),
                ],
            )
        }
    }

    /// Final norm and `lm_head` into the logits buffer (of the streams' mean, with
    /// hyper-connections).
    fn launch_head(&self) -> Result<(), CudaError> {
        let a = &self.a;
        let (mut x, xn, logits) = (self.p(&a.x), self.p(&a.xn), self.p(&a.logits));
        if let Some(hc) = self.shape.hyper {
            let (h, c) = (self.shape.hidden, self.p(&a.hc));
            // SAFETY: x holds streams·hidden floats, hc hidden; a thread per element.
            unsafe {
                self.dev.launch(
                    Kernel::HcMean,
                    geo(h.div_ceil(BLOCK as usize), BLOCK, 0)?,
                    &[
                        Arg::Ptr(x),
                        Arg::I32(hc.streams as i32),
                        Arg::I32(h as i32),
                        Arg::Ptr(c),
                    ],
                )?;
            }
            x = c;
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let job = [self.job(head, xn, logits, None, false)];
        self.norm_matvec(x, &self.final_norm, xn, false, &job)
    }

    /// A token's pass through a model with hyper-connections (from its start: no layer's
    /// experts are the host's). The embedding into every stream; then per layer, for the mixer
    /// and then the MLP, the site's weights (its product of the weightless-normed streams, then
    /// `tarfa_e_hc_weights`), the streams collapsed into the sublayer's input, the sublayer
    /// (its norm taken into its first products; its output in `hy`, not added), and its output
    /// mixed into the streams (`tarfa_e_hc_expand`). As `mhc::decoder_forward`.
    fn launch_hyper(&self, seq: &EngineSeq<D::Buf>, hc: HyperDims) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let h = s.hidden;
        let (x, xn, c, hy) = (self.p(&a.x), self.p(&a.xn), self.p(&a.hc), self.p(&a.hy));
        let params = self.p(&a.params);
        for k in 0..hc.streams {
            self.embed(params, x + (4 * k * h) as u64)?;
        }
        let ones = self
            .a
            .ones
            .as_ref()
            .ok_or_else(|| CudaError::Usage("hyper-connections without their norm".into()))?;
        let blocks = h.div_ceil(BLOCK as usize);
        for (i, l) in self.layers.iter().enumerate() {
            let sites = l
                .hyper
                .as_ref()
                .ok_or_else(|| CudaError::Usage(format!("layer {i}: no hyper-connections")))?;
            for (site, part) in sites.iter().zip([0, 1]) {
                let (hcmix, hcw) = (self.p(&a.hcmix), self.p(&a.hcw));
                let job = [self.job(&site.mix, self.p(&a.hcn), hcmix, None, false)];
                self.norm_matvec(x, ones, self.p(&a.hcn), false, &job)?;
                // SAFETY: hcmix and hcw hold (2 + streams)·streams floats, base as many
                // elements, scale 3; streams ≤ MAX_HC_STREAMS (checked in `new`); one thread.
                // Then x streams·hidden floats, c and hy hidden; a thread per element.
                unsafe {
                    self.dev.launch(
                        Kernel::HcWeights,
                        geo(1, 32, 0)?,
                        &[
                            Arg::Ptr(hcmix),
                            Arg::Ptr(site.base.ptr),
                            Arg::I32(site.base.dtype.code()),
                            Arg::Ptr(site.scale.ptr),
                            Arg::I32(site.scale.dtype.code()),
                            Arg::I32(hc.streams as i32),
                            Arg::F32(hc.eps),
                            Arg::I32(hc.iters as i32),
                            Arg::Ptr(hcw),
                        ],
                    )?;
                    self.dev.launch(
                        Kernel::HcCollapse,
                        geo(blocks, BLOCK, 0)?,
                        &[
                            Arg::Ptr(x),
                            Arg::Ptr(hcw),
                            Arg::I32(hc.streams as i32),
                            Arg::I32(h as i32),
                            Arg::Ptr(c),
                        ],
                    )?;
                }
                if part == 0 {
                    self.norm_matvec(c, &l.in_norm, xn, true, &self.mixer_inputs(l))?;
                    match (&l.mixer, &seq.layers[i]) {
                        (DevMixer::Kda(t), SeqLayer::Delta { conv, state }) => {
                            self.kda(t, (conv, state), hy, false)?
                        }
                        _ => {
                            return Err(CudaError::Usage(format!(
                                "layer {i}: a mixer the engine does not run beside \
                                 hyper-connections"
                            )))
                        }
                    }
                } else {
                    let slots = self.route(l, xn, c)?;
                    self.mlp_rest(l, slots, xn, (hy, true), None)?;
                }
                // SAFETY: as the collapse above; hy holds the sublayer's hidden floats.
                unsafe {
                    self.dev.launch(
                        Kernel::HcExpand,
                        geo(blocks, BLOCK, 0)?,
                        &[
                            Arg::Ptr(x),
                            Arg::Ptr(hcw),
                            Arg::Ptr(hy),
                            Arg::I32(hc.streams as i32),
                            Arg::I32(h as i32),
                        ],
                    )?;
                }
            }
        }
        Ok(())
    }
}

impl<B> ExpertTable<B> {
    /// The gate/up/down address tables copied to the device (the kernels index them).
    fn upload_tables<D: EngineDevice<Buf = B>>(&mut self, dev: &D) -> Result<(), CudaError> {
        let t = |v: &[u64]| {
            let b: Vec<u8> = v.iter().flat_map(|p| p.to_le_bytes()).collect();
            dev.upload(&b)
        };
        self.dev = Some([t(&self.gate)?, t(&self.up)?, t(&self.down)?]);
        Ok(())
    }

    /// Whether gate and up are of one type that takes the wide loads (BF16 or F32).
    fn wide_gu(&self) -> bool {
        self.dtype_g.is_none_or(GpuDtype::wide) && self.dtype_u == self.dtype_g
    }

    /// Whether its experts' types take the wide loads and the tiled kernels (BF16, F32).
    fn wide(&self) -> bool {
        self.wide_gu() && self.dtype_d.is_none_or(GpuDtype::wide)
    }

    /// The kernels' view of the table (after [`ExpertTable::upload_tables`]).
    fn args<D: EngineDevice<Buf = B>>(
        &self,
        dev: &D,
        (hidden, limit): (usize, Option<f32>),
    ) -> Result<MoeArgs, CudaError> {
        let tables = self
            .dev
            .as_ref()
            .ok_or_else(|| CudaError::Usage("experts not finished".into()))?;
        Ok(MoeArgs {
            gate: dev.addr(&tables[0]),
            up: dev.addr(&tables[1]),
            down: dev.addr(&tables[2]),
            // With the folded shared experts, one more than `n`.
            n_experts: self.gate.len() as i32,
            inter: self.inter as i32,
            hidden: hidden as i32,
            dtype_g: self.dtype_g.unwrap_or(GpuDtype::Bf16).code(),
            dtype_u: self.dtype_u.unwrap_or(GpuDtype::Bf16).code(),
            dtype_d: self.dtype_d.unwrap_or(GpuDtype::Bf16).code(),
            vec_gu: i32::from(self.wide_gu() && hidden % 8 == 0),
            vec_d: i32::from(self.dtype_d.is_none_or(GpuDtype::wide) && self.inter % 8 == 0),
            limit: limit.unwrap_or(0.0),
        })
    }

    fn new(n: usize) -> ExpertTable<B> {
        ExpertTable {
            n,
            inter: 0,
            dtype_g: None,
            dtype_u: None,
            dtype_d: None,
            bufs: (0..n).map(|_| None).collect(),
            gate: vec![0; n],
            up: vec![0; n],
            down: vec![0; n],
            dev: None,
        }
    }

    /// Copy one expert's gate | up | down into one buffer (each at a 256-byte boundary).
    fn put<D: EngineDevice<Buf = B>>(
        &mut self,
        dev: &D,
        e: usize,
        hidden: usize,
        [g, u, d]: [&HostTensor<'_>; 3],
        report: &mut EngineReport,
    ) -> Result<(), CudaError> {
        if e >= self.n {
            return Err(CudaError::Usage(format!("expert {e} of {}", self.n)));
        }
        // The first expert fixes the layer's width; every other must have it.
        let inter = if self.inter == 0 { g.rows } else { self.inter };
        if inter == 0 {
            return Err(CudaError::Usage("an expert of width 0".into()));
        }
        int(inter, "an expert width")?;
        g.check("expert gate", inter, hidden)?;
        u.check("expert up", inter, hidden)?;
        d.check("expert down", hidden, inter)?;
        if self.dtype_g.is_some_and(|t| t != g.dtype)
            || self.dtype_u.is_some_and(|t| t != u.dtype)
            || self.dtype_d.is_some_and(|t| t != d.dtype)
        {
            return Err(CudaError::Usage(
                "a layer's experts of different element types".into(),
            ));
        }
        self.inter = inter;
        self.dtype_g = Some(g.dtype);
        self.dtype_u = Some(u.dtype);
        self.dtype_d = Some(d.dtype);
        let pad = |n: usize| n.div_ceil(256) * 256;
        let (og, ou) = (0, pad(g.bytes.len()));
        let od = ou + pad(u.bytes.len());
        let mut host = vec![0u8; od + d.bytes.len()];
        host[og..og + g.bytes.len()].copy_from_slice(g.bytes);
        host[ou..ou + u.bytes.len()].copy_from_slice(u.bytes);
        host[od..].copy_from_slice(d.bytes);
        let buf = dev.upload(&host)?;
        let base = dev.addr(&buf);
        report.weight_bytes += (g.bytes.len() + u.bytes.len() + d.bytes.len()) as u64;
        self.gate[e] = base + og as u64;
        self.up[e] = base + ou as u64;
        self.down[e] = base + od as u64;
        self.bufs[e] = Some(buf);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::delta_block;

    /// A DeltaNet block is whole warps, at least two (q and k are normalised by warps 0 and 1),
    /// a warp per eight rows up to the kernel's launch bound (`TARFA_DELTA_THREADS`), never past
    /// it (a launch past a kernel's bound fails).
    #[test]
    fn deltanet_blocks_stay_within_the_kernels_launch_bound() {
        let bound: u32 = crate::KERNELS_CU
            .lines()
            .find_map(|l| l.strip_prefix("#define TARFA_DELTA_THREADS "))
            .and_then(|v| v.trim().parse().ok())
            .expect("kernels/deltanet.cu defines TARFA_DELTA_THREADS");
        for dv in 1..=1024 {
            let b = delta_block(dv);
            assert!(
                b.is_multiple_of(32) && b >= 64 && b <= bound,
                "dv {dv}: {b}"
            );
            assert!(dv > 8 * (bound as usize / 32) || b as usize >= 32 * dv.div_ceil(8).max(2));
        }
        assert_eq!(delta_block(128), bound);
    }
}
