//! The resident decoder on the GPU: a whole Qwen3-MoE-style forward pass per token on the device
//! — embedding, RMSNorm, q/k/v, per-head q/k norm and RoPE, the KV cache, attention, `o`, the
//! softmax router's top-k, the selected experts' SwiGLU, the combine, the final norm and
//! `lm_head` — with every weight resident in VRAM and the activations never leaving it; only the
//! logits come back. Each kernel (`cuda_kernels.cu`, the `tarfa_e_*` ones) computes the bits the
//! CPU decoder computes (`decode/src/canon.rs`, `decode/src/blocks.rs`): same reduction order,
//! fused multiply-adds only where the CPU has them, tarfa's own `exp`.
//!
//! The token and its position are read by the kernels from a small device buffer, so one
//! sequence of launches serves every step: it is captured once as a CUDA graph and replayed
//! (re-captured when the KV cache grows), which removes the host's launch cost per kernel.
//!
//! Safety: every buffer a kernel touches is owned here, allocated with the sizes the shapes
//! (checked in [`MoeEngine::new`] and [`MoeEngine::put_expert`]) say the kernels index; the
//! launches pass raw device addresses of those buffers, which live as long as the engine; one
//! stream orders everything.

#![allow(unsafe_code)]

use std::sync::Arc;

use cudarc::driver::{
    sys, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};

use crate::cuda::{CudaError, Gpu};
use crate::cuda_compute::{drv, load_kernels, GpuDtype};

/// Host bytes of one tensor to place in VRAM: a row-major `[rows, cols]` matrix (a vector is
/// one row).
#[derive(Clone, Copy, Debug)]
pub struct HostTensor<'a> {
    /// Its elements, as stored (BF16 bit patterns or `f32`).
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
        let need = rows
            .checked_mul(cols)
            .and_then(|n| n.checked_mul(self.dtype.size()));
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
}

/// One layer's attention weights.
#[derive(Clone, Copy, Debug)]
pub struct HostAttention<'a> {
    /// `[heads·d, hidden]`.
    pub q: HostTensor<'a>,
    /// `[kv_heads·d, hidden]`.
    pub k: HostTensor<'a>,
    /// `[kv_heads·d, hidden]`.
    pub v: HostTensor<'a>,
    /// `[hidden, heads·d]`.
    pub o: HostTensor<'a>,
    /// Biases of q, k, v, o.
    pub bias: [Option<HostTensor<'a>>; 4],
    /// Per-head q and k RMSNorm weights (`[1, d]` each), or none.
    pub qk_norm: Option<(HostTensor<'a>, HostTensor<'a>)>,
}

/// One layer's MLP.
#[derive(Clone, Copy, Debug)]
pub enum HostMlp<'a> {
    /// A dense SwiGLU: gate, up `[inter, hidden]`, down `[hidden, inter]`.
    Dense([HostTensor<'a>; 3]),
    /// Routed experts: the router `[experts, hidden]`; the experts themselves (all of one
    /// shape) come one by one through [`MoeEngine::put_expert`].
    Moe {
        /// Router weights.
        router: HostTensor<'a>,
    },
}

/// One decoder layer.
#[derive(Clone, Copy, Debug)]
pub struct HostLayer<'a> {
    /// `input_layernorm` `[1, hidden]`.
    pub in_norm: HostTensor<'a>,
    /// `post_attention_layernorm` `[1, hidden]`.
    pub post_norm: HostTensor<'a>,
    /// Attention.
    pub attn: HostAttention<'a>,
    /// MLP.
    pub mlp: HostMlp<'a>,
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
    /// Graph captures (one, plus one each time the KV cache grew).
    pub captures: u64,
}

/// A tensor in VRAM.
#[derive(Debug)]
struct DevTensor {
    _buf: CudaSlice<u8>,
    ptr: u64,
    rows: usize,
    cols: usize,
    dtype: GpuDtype,
}

/// A layer's experts (or its dense MLP as one expert): one VRAM buffer per expert holding gate,
/// up and down, and the tables of their addresses the kernels index by expert id.
#[derive(Debug)]
struct ExpertTable {
    n: usize,
    /// Width (0 until the first expert is put).
    inter: usize,
    dtype_gu: Option<GpuDtype>,
    dtype_d: Option<GpuDtype>,
    bufs: Vec<Option<CudaSlice<u8>>>,
    gate: Vec<u64>,
    up: Vec<u64>,
    down: Vec<u64>,
    /// Device copies of gate/up/down address tables (after [`MoeEngine::finish`]).
    dev: Option<[CudaSlice<u64>; 3]>,
}

#[derive(Debug)]
struct Layer {
    in_norm: DevTensor,
    post_norm: DevTensor,
    q: DevTensor,
    k: DevTensor,
    v: DevTensor,
    o: DevTensor,
    bias: [Option<DevTensor>; 4],
    qk_norm: Option<(DevTensor, DevTensor)>,
    router: Option<DevTensor>,
    experts: ExpertTable,
    kcache: CudaSlice<f32>,
    vcache: CudaSlice<f32>,
}

/// The C layout of `TarfaMatJob` in `cuda_kernels.cu`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MatJob {
    w: u64,
    x: u64,
    y: u64,
    bias: u64,
    rows: i32,
    cols: i32,
    dtype: i32,
    bias_dtype: i32,
    accumulate: i32,
    vec: i32,
}

const MAX_JOBS: usize = 4;

/// The C layout of `TarfaMatJobs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MatJobs {
    job: [MatJob; MAX_JOBS],
    row_start: [i32; MAX_JOBS + 1],
    n: i32,
}

/// The C layout of `TarfaMoe`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct MoeArgs {
    gate: u64,
    up: u64,
    down: u64,
    n_experts: i32,
    inter: i32,
    hidden: i32,
    dtype_gu: i32,
    dtype_d: i32,
    vec_gu: i32,
    vec_d: i32,
}

// SAFETY: plain #[repr(C)] data whose layout matches the kernels' structs field for field (u64
// for each pointer, i32 for each int; sizes 56, 248 and 56 bytes on both sides).
unsafe impl DeviceRepr for MatJobs {}
// SAFETY: as above.
unsafe impl DeviceRepr for MoeArgs {}

#[derive(Debug)]
struct Kernels {
    matvec: CudaFunction,
    embed: CudaFunction,
    rms_norm: CudaFunction,
    qk_rope: CudaFunction,
    attention: CudaFunction,
    topk: CudaFunction,
    gate_up: CudaFunction,
    down: CudaFunction,
    combine: CudaFunction,
}

/// Device activations and scratch of one token.
#[derive(Debug)]
struct Activations {
    params: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    q: CudaSlice<f32>,
    k: CudaSlice<f32>,
    v: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    z: CudaSlice<f32>,
    probs: CudaSlice<f32>,
    ids: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    one_id: CudaSlice<i32>,
    one_wt: CudaSlice<f32>,
    h: CudaSlice<f32>,
    y: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

/// The resident decoder. Build with [`MoeEngine::new`], give it every expert
/// ([`MoeEngine::put_expert`]), [`MoeEngine::finish`], then [`MoeEngine::step`] per token.
#[derive(Debug)]
pub struct MoeEngine {
    stream: Arc<CudaStream>,
    k: Kernels,
    shape: EngineShape,
    embed: DevTensor,
    final_norm: DevTensor,
    /// `None`: tied to the embedding.
    lm_head: Option<DevTensor>,
    layers: Vec<Layer>,
    a: Activations,
    /// Positions the KV caches, scores and RoPE tables have room for.
    cap: usize,
    scores: CudaSlice<f32>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    rope_rows: usize,
    graphs: Option<Graphs>,
    use_graphs: bool,
    finished: bool,
    report: EngineReport,
}

/// The captured step (without and with the logits) and the cache size it was captured at.
struct Graphs {
    body: CudaGraph,
    with_head: CudaGraph,
    cap: usize,
}

// SAFETY: a CUDA graph may be launched from any thread with its context bound (cudarc binds it
// in `launch`); the engine owns its graphs and uses them only through `&mut self`, so never from
// two threads at once, as the driver requires of graph objects.
unsafe impl Send for Graphs {}

impl std::fmt::Debug for Graphs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graphs").field("cap", &self.cap).finish()
    }
}

const BLOCK: u32 = 256;
const FIRST_CAP: usize = 256;

fn ptr_of<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _record) = s.device_ptr(stream);
    p
}

fn cfg(blocks: usize, threads: u32, shared: u32) -> Result<LaunchConfig, CudaError> {
    let blocks = u32::try_from(blocks.max(1))
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| CudaError::Usage(format!("{blocks} blocks do not fit one launch")))?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    })
}

fn int(v: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(v)
        .map_err(|_| CudaError::Usage(format!("{what} {v} is too large for the GPU kernels")))
}

fn dcode(d: GpuDtype) -> i32 {
    match d {
        GpuDtype::Bf16 => 0,
        GpuDtype::F32 => 1,
    }
}

impl MoeEngine {
    /// Compile the kernels and copy the trunk and every layer's weights (experts aside) to
    /// VRAM, checking each tensor's shape against `shape`.
    pub fn new(
        gpu: &Gpu,
        shape: EngineShape,
        embed: HostTensor<'_>,
        final_norm: HostTensor<'_>,
        lm_head: Option<HostTensor<'_>>,
        layers: &[HostLayer<'_>],
        n_experts: usize,
    ) -> Result<MoeEngine, CudaError> {
        let s = shape;
        let (h, d) = (s.hidden, s.head_dim);
        if s.heads == 0
            || s.kv_heads == 0
            || s.heads % s.kv_heads != 0
            || d == 0
            || d > 256
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
        let module = load_kernels(gpu)?;
        let ctx = gpu.ctx().clone();
        // SAFETY: this context's buffers are used on the engine's one stream only, ordered by it;
        // cudarc's cross-stream events are not needed (and cannot be recorded in a graph).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("stream creation"))?;
        let f = |n: &str| module.load_function(n).map_err(drv("kernel lookup"));
        let k = Kernels {
            matvec: f("tarfa_e_matvec")?,
            embed: f("tarfa_e_embed")?,
            rms_norm: f("tarfa_e_rms_norm")?,
            qk_rope: f("tarfa_e_qk_rope")?,
            attention: f("tarfa_e_attention")?,
            topk: f("tarfa_e_topk")?,
            gate_up: f("tarfa_e_moe_gate_up")?,
            down: f("tarfa_e_moe_down")?,
            combine: f("tarfa_e_moe_combine")?,
        };
        let mut report = EngineReport {
            device: format!("{} (CUDA device {})", gpu.name(), gpu.ordinal()),
            ..EngineReport::default()
        };
        let up = |t: &HostTensor<'_>,
                  what: &str,
                  rows: usize,
                  cols: usize,
                  report: &mut EngineReport| {
            t.check(what, rows, cols)?;
            let buf = stream
                .clone_htod(t.bytes)
                .map_err(drv("host-to-device copy"))?;
            report.weight_bytes += t.bytes.len() as u64;
            Ok::<_, CudaError>(DevTensor {
                ptr: ptr_of(&buf, &stream),
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
        let mut dev_layers = Vec::with_capacity(layers.len());
        for (l, hl) in layers.iter().enumerate() {
            let w = |n: &str| format!("layer {l} {n}");
            let a = &hl.attn;
            let bias_rows = [qd, kvd, kvd, h];
            let mut bias: [Option<DevTensor>; 4] = [None, None, None, None];
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
            let (router, experts) = match &hl.mlp {
                HostMlp::Moe { router } => {
                    if n_experts == 0 || s.top_k > n_experts {
                        return Err(CudaError::Usage(format!(
                            "layer {l}: top-{} of {n_experts} experts",
                            s.top_k
                        )));
                    }
                    (
                        Some(up(router, &w("router"), n_experts, h, &mut report)?),
                        ExpertTable::new(n_experts),
                    )
                }
                HostMlp::Dense([g, u, dn]) => {
                    let mut t = ExpertTable::new(1);
                    t.put(&stream, 0, h, [g, u, dn], &mut report)?;
                    (None, t)
                }
            };
            dev_layers.push(Layer {
                in_norm: up(&hl.in_norm, &w("input norm"), 1, h, &mut report)?,
                post_norm: up(&hl.post_norm, &w("post-attention norm"), 1, h, &mut report)?,
                q: up(&a.q, &w("q_proj"), qd, h, &mut report)?,
                k: up(&a.k, &w("k_proj"), kvd, h, &mut report)?,
                v: up(&a.v, &w("v_proj"), kvd, h, &mut report)?,
                o: up(&a.o, &w("o_proj"), h, qd, &mut report)?,
                bias,
                qk_norm,
                router,
                experts,
                kcache: stream
                    .alloc_zeros::<f32>(FIRST_CAP * kvd)
                    .map_err(drv("allocation"))?,
                vcache: stream
                    .alloc_zeros::<f32>(FIRST_CAP * kvd)
                    .map_err(drv("allocation"))?,
            });
        }
        let z = |n: usize| {
            stream
                .alloc_zeros::<f32>(n.max(1))
                .map_err(drv("allocation"))
        };
        let kk = s.top_k.max(1);
        let a = Activations {
            params: stream.alloc_zeros::<i32>(2).map_err(drv("allocation"))?,
            x: z(h)?,
            xn: z(h)?,
            q: z(qd)?,
            k: z(kvd)?,
            v: z(kvd)?,
            attn: z(qd)?,
            z: z(n_experts)?,
            probs: z(n_experts)?,
            ids: stream.alloc_zeros::<i32>(kk).map_err(drv("allocation"))?,
            wts: z(kk)?,
            one_id: stream
                .clone_htod(&[0i32])
                .map_err(drv("host-to-device copy"))?,
            one_wt: stream
                .clone_htod(&[1.0f32])
                .map_err(drv("host-to-device copy"))?,
            h: z(1)?,
            y: z(kk * h)?,
            logits: z(s.vocab)?,
        };
        let half = s.rotary_dim / 2;
        Ok(MoeEngine {
            scores: z(s.heads * FIRST_CAP)?,
            cos: z(FIRST_CAP * half)?,
            sin: z(FIRST_CAP * half)?,
            rope_rows: 0,
            cap: FIRST_CAP,
            stream: stream.clone(),
            k,
            shape: s,
            embed: embed_d,
            final_norm: final_d,
            lm_head: head_d,
            layers: dev_layers,
            a,
            graphs: None,
            use_graphs: true,
            finished: false,
            report,
        })
    }

    /// Copy expert `e` of `layer` (gate, up `[inter, hidden]`, down `[hidden, inter]`) to VRAM.
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
        if l.router.is_none() {
            return Err(CudaError::Usage(format!(
                "layer {layer} has no routed experts"
            )));
        }
        l.experts
            .put(&self.stream, e, h, [&gate, &up, &down], &mut self.report)
    }

    /// Every routed expert of every layer present: build the address tables.
    pub fn finish(&mut self) -> Result<(), CudaError> {
        let mut max_inter = 1;
        for (i, l) in self.layers.iter_mut().enumerate() {
            max_inter = max_inter.max(l.experts.inter);
            if let Some(e) = l.experts.bufs.iter().position(|b| b.is_none()) {
                return Err(CudaError::Usage(format!(
                    "layer {i}: expert {e} was never copied to the GPU"
                )));
            }
            let t = |v: &[u64]| {
                self.stream
                    .clone_htod(v)
                    .map_err(drv("host-to-device copy"))
            };
            l.experts.dev = Some([t(&l.experts.gate)?, t(&l.experts.up)?, t(&l.experts.down)?]);
        }
        self.a.h = self
            .stream
            .alloc_zeros::<f32>(self.shape.top_k.max(1) * max_inter)
            .map_err(drv("allocation"))?;
        self.stream.synchronize().map_err(drv("synchronize"))?;
        self.finished = true;
        Ok(())
    }

    /// Replay each step from a captured CUDA graph (the default), or launch its kernels one by
    /// one. The same kernels with the same arguments either way.
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        self.graphs = None;
    }

    /// What the engine holds and did.
    pub fn report(&self) -> EngineReport {
        self.report.clone()
    }

    /// Run `token` at position `pos` (positions from `pos` on are overwritten); the logits when
    /// `want_logits`. `cos`/`sin` are the RoPE tables of positions `0..=pos` at least
    /// (`rotary_dim / 2` per position, as the CPU decoder computes them).
    pub fn step(
        &mut self,
        token: u32,
        pos: usize,
        cos: &[f32],
        sin: &[f32],
        want_logits: bool,
    ) -> Result<Option<Vec<f32>>, CudaError> {
        if !self.finished {
            return Err(CudaError::Usage("the GPU decoder was not finished".into()));
        }
        if token as usize >= self.shape.vocab {
            return Err(CudaError::Usage(format!(
                "token {token} is outside the vocabulary of {}",
                self.shape.vocab
            )));
        }
        let half = self.shape.rotary_dim / 2;
        let need = pos
            .checked_add(1)
            .and_then(|n| n.checked_mul(half))
            .ok_or_else(|| CudaError::Usage("position too large".into()))?;
        if cos.len() < need || sin.len() < need {
            return Err(CudaError::Usage(format!(
                "RoPE tables of {} values for position {pos}",
                cos.len().min(sin.len())
            )));
        }
        int(pos, "a position")?;
        self.ensure_cap(pos + 1)?;
        if self.rope_rows < pos + 1 {
            let (a, b) = (self.rope_rows * half, (pos + 1) * half);
            if b > a {
                let mut dst = self.cos.slice_mut(a..b);
                self.stream
                    .memcpy_htod(&cos[a..b], &mut dst)
                    .map_err(drv("host-to-device copy"))?;
                let mut dst = self.sin.slice_mut(a..b);
                self.stream
                    .memcpy_htod(&sin[a..b], &mut dst)
                    .map_err(drv("host-to-device copy"))?;
            }
            self.rope_rows = pos + 1;
        }
        // Positions at or after `pos` hold stale rows from an earlier sequence: never read
        // (attention reads 0..=pos) and overwritten as positions are run.
        let params = [token as i32, pos as i32];
        self.stream
            .memcpy_htod(&params[..], &mut self.a.params)
            .map_err(drv("host-to-device copy"))?;
        if self.use_graphs {
            if self.graphs.as_ref().is_none_or(|g| g.cap != self.cap) {
                self.graphs = None;
                let body = self.capture(false)?;
                let with_head = self.capture(true)?;
                self.graphs = Some(Graphs {
                    body,
                    with_head,
                    cap: self.cap,
                });
                self.report.captures += 1;
            }
            let g = self.graphs.as_ref().expect("captured above");
            let graph = if want_logits { &g.with_head } else { &g.body };
            graph.launch().map_err(drv("graph launch"))?;
            self.report.graph_steps += 1;
        } else {
            self.launch_body()?;
            if want_logits {
                self.launch_head()?;
            }
        }
        self.report.steps += 1;
        if !want_logits {
            return Ok(None);
        }
        let out = self
            .stream
            .clone_dtoh(&self.a.logits)
            .map_err(drv("device-to-host copy"))?;
        Ok(Some(out))
    }

    fn capture(&self, head: bool) -> Result<CudaGraph, CudaError> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(drv("graph capture"))?;
        let launched = self
            .launch_body()
            .and_then(|()| if head { self.launch_head() } else { Ok(()) });
        let graph = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(drv("graph capture"));
        launched?;
        graph?.ok_or_else(|| CudaError::Usage("the captured step is empty".into()))
    }

    /// Grow the KV caches, scores and RoPE tables to hold `n` positions (doubling), keeping
    /// what they hold.
    fn ensure_cap(&mut self, n: usize) -> Result<(), CudaError> {
        if n <= self.cap {
            return Ok(());
        }
        let mut cap = self.cap;
        while cap < n {
            cap = cap
                .checked_mul(2)
                .ok_or_else(|| CudaError::Usage("context too long".into()))?;
        }
        int(cap, "a context length")?;
        let s = self.shape;
        let kvd = s.kv_heads * s.head_dim;
        let half = s.rotary_dim / 2;
        let stream = self.stream.clone();
        let grow = |old: &CudaSlice<f32>, len: usize| -> Result<CudaSlice<f32>, CudaError> {
            let mut new = stream
                .alloc_zeros::<f32>(len.max(1))
                .map_err(drv("allocation"))?;
            let keep = old.len().min(len);
            let mut dst = new.slice_mut(0..keep);
            stream
                .memcpy_dtod(&old.slice(0..keep), &mut dst)
                .map_err(drv("device-to-device copy"))?;
            Ok(new)
        };
        let mut layers = std::mem::take(&mut self.layers);
        for l in &mut layers {
            l.kcache = grow(&l.kcache, cap * kvd)?;
            l.vcache = grow(&l.vcache, cap * kvd)?;
        }
        self.layers = layers;
        self.cos = grow(&self.cos, cap * half)?;
        self.sin = grow(&self.sin, cap * half)?;
        self.scores = self
            .stream
            .alloc_zeros::<f32>((s.heads * cap).max(1))
            .map_err(drv("allocation"))?;
        self.cap = cap;
        Ok(())
    }

    fn p<T>(&self, s: &CudaSlice<T>) -> u64 {
        ptr_of(s, &self.stream)
    }

    /// `x` ← the product jobs (one launch).
    fn matvec(&self, jobs: &[MatJob]) -> Result<(), CudaError> {
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
        let threads = rows as usize * 4;
        // SAFETY: each job's `w` is a resident matrix of `rows × cols` elements of `dtype`
        // (checked at upload), `x` a buffer of at least `cols` floats, `y` of at least `rows`,
        // `bias` (when set) of `rows` elements; `vec` only when `cols` is a multiple of 8 (every
        // row and x 16-byte aligned: buffers are 256-byte aligned). Quads past the last row
        // compute the last row again and write nothing.
        unsafe {
            self.stream
                .launch_builder(&self.k.matvec)
                .arg(&m)
                .launch(cfg(threads.div_ceil(BLOCK as usize), BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
        }
        Ok(())
    }

    fn job(&self, w: &DevTensor, x: u64, y: u64, bias: Option<&DevTensor>, acc: bool) -> MatJob {
        MatJob {
            w: w.ptr,
            x,
            y,
            bias: bias.map_or(0, |b| b.ptr),
            rows: w.rows as i32,
            cols: w.cols as i32,
            dtype: dcode(w.dtype),
            bias_dtype: bias.map_or(0, |b| dcode(b.dtype)),
            accumulate: i32::from(acc),
            vec: i32::from(w.cols % 8 == 0),
        }
    }

    fn rms_norm(&self, x: u64, w: &DevTensor, out: u64) -> Result<(), CudaError> {
        let (wp, dt, n, eps) = (w.ptr, dcode(w.dtype), w.cols as i32, self.shape.eps);
        // SAFETY: `x` and `out` hold `n` floats (hidden-sized activations), `w` `n` elements.
        unsafe {
            self.stream
                .launch_builder(&self.k.rms_norm)
                .arg(&x)
                .arg(&wp)
                .arg(&dt)
                .arg(&n)
                .arg(&eps)
                .arg(&out)
                .launch(cfg(1, BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
        }
        Ok(())
    }

    /// Embedding, then every layer; `x` holds the residual stream after it.
    fn launch_body(&self) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let (h, d) = (s.hidden, s.head_dim);
        let (x, xn, params) = (self.p(&a.x), self.p(&a.xn), self.p(&a.params));
        let (ep, edt, hi) = (self.embed.ptr, dcode(self.embed.dtype), h as i32);
        // SAFETY: params[0] < vocab (checked in `step`), the table is `vocab × hidden`, x holds
        // `hidden` floats.
        unsafe {
            self.stream
                .launch_builder(&self.k.embed)
                .arg(&ep)
                .arg(&edt)
                .arg(&hi)
                .arg(&params)
                .arg(&x)
                .launch(cfg(h.div_ceil(BLOCK as usize), BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
        }
        let (q, k, v, attn) = (self.p(&a.q), self.p(&a.k), self.p(&a.v), self.p(&a.attn));
        let (heads, kvh, di) = (s.heads as i32, s.kv_heads as i32, d as i32);
        let half = (s.rotary_dim / 2) as i32;
        let window = s.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
        let (cos, sin, scores) = (self.p(&self.cos), self.p(&self.sin), self.p(&self.scores));
        let cap = self.cap as i32;
        for l in &self.layers {
            self.rms_norm(x, &l.in_norm, xn)?;
            self.matvec(&[
                self.job(&l.q, xn, q, l.bias[0].as_ref(), false),
                self.job(&l.k, xn, k, l.bias[1].as_ref(), false),
                self.job(&l.v, xn, v, l.bias[2].as_ref(), false),
            ])?;
            let (kc, vc) = (self.p(&l.kcache), self.p(&l.vcache));
            let (norm, qn, kn, ndt) = match &l.qk_norm {
                Some((qn, kn)) => (1i32, qn.ptr, kn.ptr, dcode(qn.dtype)),
                None => (0, 0, 0, 0),
            };
            let warps = s.heads + s.kv_heads;
            let per_block = 4usize;
            let eps = s.eps;
            // SAFETY: q holds heads·d floats, k and v kv_heads·d; the norm weights d elements;
            // the caches `cap × kv_heads·d` floats and the RoPE tables `cap × half` with
            // params[1] < cap (ensure_cap in `step`); shared memory is d floats per warp.
            unsafe {
                self.stream
                    .launch_builder(&self.k.qk_rope)
                    .arg(&q)
                    .arg(&k)
                    .arg(&v)
                    .arg(&qn)
                    .arg(&kn)
                    .arg(&ndt)
                    .arg(&norm)
                    .arg(&eps)
                    .arg(&heads)
                    .arg(&kvh)
                    .arg(&di)
                    .arg(&half)
                    .arg(&cos)
                    .arg(&sin)
                    .arg(&params)
                    .arg(&kc)
                    .arg(&vc)
                    .launch(cfg(
                        warps.div_ceil(per_block),
                        32 * per_block as u32,
                        (per_block * d * 4) as u32,
                    )?)
                    .map_err(drv("kernel launch"))?;
            }
            let scaling = s.scaling;
            // SAFETY: one block per head; scores hold heads × cap floats and the caches rows
            // 0..=params[1] < cap; shared memory 32 × d floats (d ≤ 256: 32 KiB).
            unsafe {
                self.stream
                    .launch_builder(&self.k.attention)
                    .arg(&q)
                    .arg(&kc)
                    .arg(&vc)
                    .arg(&params)
                    .arg(&heads)
                    .arg(&kvh)
                    .arg(&di)
                    .arg(&window)
                    .arg(&scaling)
                    .arg(&scores)
                    .arg(&cap)
                    .arg(&attn)
                    .launch(cfg(s.heads, BLOCK, (32 * d * 4) as u32)?)
                    .map_err(drv("kernel launch"))?;
            }
            self.matvec(&[self.job(&l.o, attn, x, l.bias[3].as_ref(), true)])?;
            self.rms_norm(x, &l.post_norm, xn)?;
            self.mlp(l, xn, x)?;
        }
        Ok(())
    }

    /// The layer's MLP of `xn`, added to `x`.
    fn mlp(&self, l: &Layer, xn: u64, x: u64) -> Result<(), CudaError> {
        let s = self.shape;
        let a = &self.a;
        let t = &l.experts;
        let dev = t
            .dev
            .as_ref()
            .ok_or_else(|| CudaError::Usage("experts not finished".into()))?;
        let (ids, wts, k) = match &l.router {
            Some(router) => {
                let (z, probs) = (self.p(&a.z), self.p(&a.probs));
                self.matvec(&[self.job(router, xn, z, None, false)])?;
                let (ids, wts) = (self.p(&a.ids), self.p(&a.wts));
                let (n, k, renorm) = (
                    router.rows as i32,
                    s.top_k as i32,
                    i32::from(s.norm_topk_prob),
                );
                // SAFETY: z and probs hold `n` floats (n = the router's rows = experts), ids and
                // wts `k` (k ≤ n, checked in `new`); one warp.
                unsafe {
                    self.stream
                        .launch_builder(&self.k.topk)
                        .arg(&z)
                        .arg(&n)
                        .arg(&k)
                        .arg(&renorm)
                        .arg(&probs)
                        .arg(&ids)
                        .arg(&wts)
                        .launch(cfg(1, 32, 0)?)
                        .map_err(drv("kernel launch"))?;
                }
                (ids, wts, s.top_k)
            }
            None => (self.p(&a.one_id), self.p(&a.one_wt), 1),
        };
        let (gd, dd) = (
            t.dtype_gu.unwrap_or(GpuDtype::Bf16),
            t.dtype_d.unwrap_or(GpuDtype::Bf16),
        );
        let m = MoeArgs {
            gate: self.p(&dev[0]),
            up: self.p(&dev[1]),
            down: self.p(&dev[2]),
            n_experts: t.n as i32,
            inter: t.inter as i32,
            hidden: s.hidden as i32,
            dtype_gu: dcode(gd),
            dtype_d: dcode(dd),
            vec_gu: i32::from(s.hidden % 8 == 0),
            vec_d: i32::from(t.inter % 8 == 0),
        };
        let (hb, yb, ki, hi) = (self.p(&a.h), self.p(&a.y), k as i32, s.hidden as i32);
        // SAFETY: ids hold k experts' numbers < n_experts (the kernel clamps anything else), each
        // an expert buffer of gate/up `inter × hidden` and down `hidden × inter` elements; x
        // (xn) holds hidden floats, h `k × inter` (k ≤ top_k, inter ≤ max_inter) and y
        // `k × hidden`; `vec` only for widths that are multiples of 8.
        unsafe {
            self.stream
                .launch_builder(&self.k.gate_up)
                .arg(&m)
                .arg(&ids)
                .arg(&ki)
                .arg(&xn)
                .arg(&hb)
                .launch(cfg((k * t.inter * 4).div_ceil(BLOCK as usize), BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
            self.stream
                .launch_builder(&self.k.down)
                .arg(&m)
                .arg(&ids)
                .arg(&ki)
                .arg(&hb)
                .arg(&yb)
                .launch(cfg((k * s.hidden * 4).div_ceil(BLOCK as usize), BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
            self.stream
                .launch_builder(&self.k.combine)
                .arg(&yb)
                .arg(&wts)
                .arg(&ki)
                .arg(&hi)
                .arg(&x)
                .launch(cfg(s.hidden.div_ceil(BLOCK as usize), BLOCK, 0)?)
                .map_err(drv("kernel launch"))?;
        }
        Ok(())
    }

    /// Final norm and `lm_head` into the logits buffer.
    fn launch_head(&self) -> Result<(), CudaError> {
        let a = &self.a;
        let (x, xn, logits) = (self.p(&a.x), self.p(&a.xn), self.p(&a.logits));
        self.rms_norm(x, &self.final_norm, xn)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        // lm_head has more rows than one launch's i32 quads only past 500M rows: refused in new.
        self.matvec(&[self.job(head, xn, logits, None, false)])
    }
}

impl ExpertTable {
    fn new(n: usize) -> ExpertTable {
        ExpertTable {
            n,
            inter: 0,
            dtype_gu: None,
            dtype_d: None,
            bufs: (0..n).map(|_| None).collect(),
            gate: vec![0; n],
            up: vec![0; n],
            down: vec![0; n],
            dev: None,
        }
    }

    /// Copy one expert's gate | up | down into one buffer (each at a 256-byte boundary).
    fn put(
        &mut self,
        stream: &Arc<CudaStream>,
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
        if g.dtype != u.dtype {
            return Err(CudaError::Usage(
                "an expert's gate and up of different element types".into(),
            ));
        }
        if self.dtype_gu.is_some_and(|t| t != g.dtype) || self.dtype_d.is_some_and(|t| t != d.dtype)
        {
            return Err(CudaError::Usage(
                "a layer's experts of different element types".into(),
            ));
        }
        self.inter = inter;
        self.dtype_gu = Some(g.dtype);
        self.dtype_d = Some(d.dtype);
        let pad = |n: usize| n.div_ceil(256) * 256;
        let (og, ou) = (0, pad(g.bytes.len()));
        let od = ou + pad(u.bytes.len());
        let mut host = vec![0u8; od + d.bytes.len()];
        host[og..og + g.bytes.len()].copy_from_slice(g.bytes);
        host[ou..ou + u.bytes.len()].copy_from_slice(u.bytes);
        host[od..].copy_from_slice(d.bytes);
        let buf = stream
            .clone_htod(&host)
            .map_err(drv("host-to-device copy"))?;
        let base = ptr_of(&buf, stream);
        report.weight_bytes += (g.bytes.len() + u.bytes.len() + d.bytes.len()) as u64;
        self.gate[e] = base + og as u64;
        self.up[e] = base + ou as u64;
        self.down[e] = base + od as u64;
        self.bufs[e] = Some(buf);
        Ok(())
    }
}
