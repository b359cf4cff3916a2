//! `qwen3_5_moe_text` (Qwen3_5MoeForCausalLM, Qwen3.5-MoE's text model) and the text part of
//! `qwen3_5_moe` checkpoints (prefix `model.language_model.`), as transformers 5.17 computes them
//! in `f32` (`research/model-families.md` §3):
//!
//! - zero-centred RMSNorms `(x · rsqrt(mean(x²) + eps)) · (1 + w)` (layers, q/k norms, final);
//! - `full_attention` layers: gated attention (`q_proj` gives `[q_h | gate_h]` per head, the
//!   output multiplied by `sigmoid(gate)` before `o_proj`), NeoX RoPE on the first quarter of
//!   each head;
//! - `linear_attention` layers: Gated DeltaNet with its state: a causal depthwise convolution
//!   over the last `linear_conv_kernel_dim` projected vectors (zeros before the first token),
//!   SiLU, L2-normalised q and k (q also divided by `√dk`), the decay
//!   `g = −exp(A_log) · softplus(a + dt_bias)`, `β = sigmoid(b)`, and per value head the
//!   delta-rule recurrence on an `f32` state `S [dk, dv]`, one token at a time:
//!   `S ← S·e^g; m = Sᵀk; δ = (v − m)·β; S ← S + k δᵀ; o = Sᵀq`; then the gated RMSNorm
//!   `w · norm(o) · silu(z)` and `out_proj`;
//! - every layer MoE: softmax top-k always renormalised, plus the shared expert scaled by
//!   `sigmoid(shared_expert_gate · x)`: `routed + gate · shared`.
//!
//! transformers runs a prompt (and a first token) through its chunked DeltaNet kernel and later
//! tokens through the recurrence; both compute the recurrence from a zero state and agree to
//! ~1e-7. tarfa always runs the recurrence, token by token, in the canonical order: a prompt in
//! one batch and token by token give the same bits.

use crate::blocks::{self, AttnShape, Batch, KvCache, Route};
use crate::canon;
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, DecodeError, Result};
use crate::family::common::{self, AttnSpec, NormStyle, Skeleton};
use crate::family::{Ctx, Family};
use crate::gpu_resident::{MixerPlan, MlpPlan, RoutePlan, SharedPlan, WholePlan};
use crate::kernels::Isa;
use crate::rope::Rope;
use crate::sequence::{LayerState, State};
use crate::weights::{MatrixRef, TensorStore, WeightSlice};
use tarfa_cuda::DeltaShape;

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Gated full attention with a KV cache.
    Full,
    /// Gated DeltaNet with a convolution and a recurrent state.
    Linear,
}

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3_5MoeConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads` (full-attention layers).
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default 256).
    pub head_dim: usize,
    /// `rms_norm_eps` (default 1e-6).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e4) and rotated dims (`partial_rotary_factor` default 0.25).
    pub rope: RopeConfig,
    /// `attention_bias`: biases on q, k, v and o.
    pub attention_bias: bool,
    /// Each layer's mixer (`layer_types`, or every `full_attention_interval`-th layer full).
    pub layer_types: Vec<LayerType>,
    /// `linear_conv_kernel_dim` (default 4).
    pub conv_kernel: usize,
    /// `linear_num_key_heads` (default 16).
    pub lin_k_heads: usize,
    /// `linear_num_value_heads` (default 32).
    pub lin_v_heads: usize,
    /// `linear_key_head_dim` (default 128).
    pub lin_k_dim: usize,
    /// `linear_value_head_dim` (default 128).
    pub lin_v_dim: usize,
    /// `num_experts` (default 256).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `shared_expert_intermediate_size` (default 512).
    pub shared_width: usize,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
    /// Tensor-name prefix of the text model: `model.` (text checkpoints) or
    /// `model.language_model.` (`qwen3_5_moe` checkpoints).
    pub prefix: String,
}

impl Qwen3_5MoeConfig {
    /// Parse a `qwen3_5_moe_text` config, or the `text_config` of a `qwen3_5_moe` one.
    pub fn parse(v: &serde_json::Value) -> Result<Qwen3_5MoeConfig> {
        use limits::*;
        let top = ConfigReader::new(v)?;
        let (c, prefix) = if top.str("model_type")? == Some("qwen3_5_moe") {
            match top.object("text_config")? {
                Some(t) => (t, "model.language_model."),
                None => return Err(bad("text_config", ConfigFault::Missing)),
            }
        } else {
            (top, "model.")
        };
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, _) = attention_dims(&c)?;
        let head_dim = c.usize("head_dim", MAX_DIM)?.unwrap_or(256);
        if head_dim == 0 {
            return Err(bad("head_dim", ConfigFault::Zero));
        }
        let num_layers = c.positive("num_hidden_layers", MAX_LAYERS)?;
        let layer_types = match c.raw("layer_types") {
            Some(serde_json::Value::Array(a)) => {
                if a.len() != num_layers {
                    return Err(bad(
                        "layer_types",
                        ConfigFault::LayerTypesCount {
                            entries: a.len(),
                            layers: num_layers,
                        },
                    ));
                }
                a.iter()
                    .map(|t| match t.as_str() {
                        Some("full_attention") => Ok(LayerType::Full),
                        Some("linear_attention") => Ok(LayerType::Linear),
                        _ => Err(bad(
                            "layer_types",
                            ConfigFault::LayerType {
                                value: t.to_string(),
                            },
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            Some(other) => {
                return Err(bad(
                    "layer_types",
                    ConfigFault::NotAList {
                        value: other.to_string(),
                    },
                ))
            }
            None => {
                let every = c.usize("full_attention_interval", MAX_LAYERS)?.unwrap_or(4);
                if every == 0 {
                    return Err(bad("full_attention_interval", ConfigFault::Zero));
                }
                (0..num_layers)
                    .map(|i| {
                        if (i + 1) % every == 0 {
                            LayerType::Full
                        } else {
                            LayerType::Linear
                        }
                    })
                    .collect()
            }
        };
        let lin_k_heads = c.usize("linear_num_key_heads", MAX_HEADS)?.unwrap_or(16);
        let lin_v_heads = c.usize("linear_num_value_heads", MAX_HEADS)?.unwrap_or(32);
        if lin_k_heads == 0 || lin_v_heads == 0 || lin_v_heads % lin_k_heads != 0 {
            return Err(bad(
                "linear_num_value_heads",
                ConfigFault::NotAMultiple {
                    value: lin_v_heads,
                    of_key: "linear_num_key_heads",
                    of: lin_k_heads,
                },
            ));
        }
        let positive_or = |key: &str, default: usize| -> Result<usize> {
            match c.usize(key, MAX_DIM)? {
                Some(0) => Err(bad(key, ConfigFault::Zero)),
                Some(n) => Ok(n),
                None => Ok(default),
            }
        };
        let num_experts = c.usize("num_experts", MAX_EXPERTS)?.unwrap_or(256);
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts == 0 || top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let tie = match c.bool("tie_word_embeddings")? {
            Some(t) => t,
            None => top.bool("tie_word_embeddings")?.unwrap_or(false),
        };
        Ok(Qwen3_5MoeConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-6)?,
            rope: RopeConfig::read(&c, head_dim, 10000.0, 0.25)?,
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            layer_types,
            conv_kernel: positive_or("linear_conv_kernel_dim", 4)?,
            lin_k_heads,
            lin_v_heads,
            lin_k_dim: positive_or("linear_key_head_dim", 128)?,
            lin_v_dim: positive_or("linear_value_head_dim", 128)?,
            num_experts,
            top_k,
            shared_width: c
                .usize("shared_expert_intermediate_size", MAX_DIM)?
                .unwrap_or(512),
            tie_word_embeddings: tie,
            prefix: prefix.to_string(),
        })
    }

    fn key_dim(&self) -> usize {
        self.lin_k_heads * self.lin_k_dim
    }

    fn value_dim(&self) -> usize {
        self.lin_v_heads * self.lin_v_dim
    }

    fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
}

/// One Gated DeltaNet layer's state: the last `kernel − 1` projected vectors (oldest first) and
/// each value head's `S`, stored transposed (`[dv][dk]`, so that `Sᵀk` is a row of dots).
#[derive(Clone, Debug, Default)]
pub struct DeltaState {
    /// The convolution's history: `kernel − 1` vectors of `conv_dim`, oldest first.
    pub conv: Vec<Vec<f32>>,
    /// Each value head's state, `dv` rows of `dk`.
    pub s: Vec<Vec<f32>>,
}

impl DeltaState {
    /// Back to zeros (no position seen), its shape kept.
    pub fn zero(&mut self) {
        for v in self.conv.iter_mut().chain(self.s.iter_mut()) {
            v.fill(0.0);
        }
    }
}

/// The decoder: config and RoPE tables. A sequence holds a KV cache per full-attention layer
/// and a DeltaNet state per linear-attention layer.
#[derive(Debug)]
pub struct Qwen3_5Moe {
    cfg: Qwen3_5MoeConfig,
    rope: Rope,
}

impl Qwen3_5Moe {
    /// Check the config against the resident tensors (names and shapes) and build the state.
    pub fn new(cfg: Qwen3_5MoeConfig, store: &TensorStore) -> Result<Qwen3_5Moe> {
        let m = Qwen3_5Moe {
            rope: Rope::new(cfg.rope.theta, cfg.rope.rotary_dim),
            cfg,
        };
        m.check(store)?;
        Ok(m)
    }

    fn name(&self, n: &str) -> String {
        format!("{}{n}", self.cfg.prefix)
    }

    fn attn_spec(&self) -> AttnSpec {
        let c = &self.cfg;
        AttnSpec {
            shape: AttnShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                window: None,
            },
            eps: c.rms_norm_eps,
            qk_norm: Some(NormStyle::OnePlus),
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            out_gate: true,
        }
    }

    fn lm_head<'s>(&self, s: &'s TensorStore) -> Result<MatrixRef<'s>> {
        let c = &self.cfg;
        common::lm_head(
            s,
            "lm_head.weight",
            &self.name("embed_tokens.weight"),
            c.tie_word_embeddings,
            c.vocab_size,
            c.hidden_size,
        )
    }

    fn check(&self, s: &TensorStore) -> Result<()> {
        let c = &self.cfg;
        let h = c.hidden_size;
        s.get(&self.name("embed_tokens.weight"))?
            .matrix(c.vocab_size, h)?;
        s.get(&self.name("norm.weight"))?.vector(h)?;
        self.lm_head(s)?;
        for l in 0..c.num_layers {
            let p = |n: &str| self.name(&format!("layers.{l}.{n}"));
            s.get(&p("input_layernorm.weight"))?.vector(h)?;
            s.get(&p("post_attention_layernorm.weight"))?.vector(h)?;
            match c.layer_types[l] {
                LayerType::Full => {
                    common::check_attention(s, &p("self_attn"), &self.attn_spec(), h)?
                }
                LayerType::Linear => {
                    let a = |n: &str| p(&format!("linear_attn.{n}"));
                    s.get(&a("in_proj_qkv.weight"))?.matrix(c.conv_dim(), h)?;
                    s.get(&a("in_proj_z.weight"))?.matrix(c.value_dim(), h)?;
                    s.get(&a("in_proj_b.weight"))?.matrix(c.lin_v_heads, h)?;
                    s.get(&a("in_proj_a.weight"))?.matrix(c.lin_v_heads, h)?;
                    conv_weight(s, &a("conv1d.weight"), c.conv_dim(), c.conv_kernel)?;
                    s.get(&a("dt_bias"))?.vector(c.lin_v_heads)?;
                    s.get(&a("A_log"))?.vector(c.lin_v_heads)?;
                    s.get(&a("norm.weight"))?.vector(c.lin_v_dim)?;
                    s.get(&a("out_proj.weight"))?.matrix(h, c.value_dim())?;
                }
            }
            s.get(&p("mlp.gate.weight"))?.matrix(c.num_experts, h)?;
            common::check_mlp(s, &p("mlp.shared_expert"), c.shared_width, h)?;
            s.get(&p("mlp.shared_expert_gate.weight"))?.matrix(1, h)?;
        }
        Ok(())
    }

    /// One Gated DeltaNet layer over the batch, token after token.
    fn linear_attention(
        &self,
        ctx: &mut Ctx<'_>,
        state: &mut DeltaState,
        l: usize,
        x: &Batch,
    ) -> Result<Batch> {
        let c = self.cfg.clone();
        let s = ctx.tensors;
        let h = c.hidden_size;
        let a = |n: &str| self.name(&format!("layers.{l}.linear_attn.{n}"));
        let w_qkv = s.get(&a("in_proj_qkv.weight"))?.matrix(c.conv_dim(), h)?;
        let w_z = s.get(&a("in_proj_z.weight"))?.matrix(c.value_dim(), h)?;
        let w_b = s.get(&a("in_proj_b.weight"))?.matrix(c.lin_v_heads, h)?;
        let w_a = s.get(&a("in_proj_a.weight"))?.matrix(c.lin_v_heads, h)?;
        let conv = conv_weight(s, &a("conv1d.weight"), c.conv_dim(), c.conv_kernel)?;
        let dt_bias = s.get(&a("dt_bias"))?.vector(c.lin_v_heads)?;
        let a_log = s.get(&a("A_log"))?.vector(c.lin_v_heads)?;
        let norm_w = s.get(&a("norm.weight"))?.vector(c.lin_v_dim)?;
        let w_out = s.get(&a("out_proj.weight"))?.matrix(h, c.value_dim())?;
        let isa = ctx.isa;
        let mut proj = ctx.linear_many(
            "deltanet projections",
            &[(w_qkv, None), (w_z, None), (w_b, None), (w_a, None)],
            x,
        )?;
        let av = proj.pop().expect("four outputs");
        let bv = proj.pop().expect("four outputs");
        let zv = proj.pop().expect("four outputs");
        let mixed = proj.pop().expect("four outputs");
        let t0 = std::time::Instant::now();
        let dims = DeltaDims {
            kernel: c.conv_kernel,
            k_heads: c.lin_k_heads,
            v_heads: c.lin_v_heads,
            dk: c.lin_k_dim,
            dv: c.lin_v_dim,
            eps: c.rms_norm_eps,
        };
        let mut out = Vec::with_capacity(x.len());
        for t in 0..x.len() {
            let p = DeltaToken {
                mixed: &mixed[t],
                z: &zv[t],
                b: &bv[t],
                a: &av[t],
            };
            out.push(delta_step(
                isa, &dims, state, conv, dt_bias, a_log, norm_w, &p,
            ));
        }
        ctx.profile.add("deltanet recurrence", t0.elapsed());
        ctx.linear("deltanet out", w_out, None, &out)
    }

    fn moe(c: &Qwen3_5MoeConfig, ctx: &mut Ctx<'_>, l: usize, x: &Batch) -> Result<Batch> {
        let h = c.hidden_size;
        let p = |n: &str| format!("{}layers.{l}.mlp.{n}", c.prefix);
        let s = ctx.tensors;
        let router = s.get(&p("gate.weight"))?.matrix(c.num_experts, h)?;
        let isa = ctx.isa;
        let routes: Vec<Route> = common::router_logits(ctx, router, x)?
            .iter()
            .map(|z| blocks::softmax_topk(isa, z, c.top_k, true))
            .collect();
        let mut out = common::routed_experts(ctx, l as u32, &routes, x)?;
        let shared = common::mlp(
            ctx,
            "shared expert",
            &p("shared_expert"),
            c.shared_width,
            h,
            x,
        )?;
        let gate = s.get(&p("shared_expert_gate.weight"))?.matrix(1, h)?;
        let g = common::router_logits(ctx, gate, x)?;
        for ((o, sh), gt) in out.iter_mut().zip(&shared).zip(&g) {
            let scale = canon::sigmoid(gt[0]);
            for (a, &b) in o.iter_mut().zip(sh) {
                *a += scale * b;
            }
        }
        Ok(out)
    }
}

/// The depthwise convolution's weight `[conv_dim, 1, kernel]` as a `[conv_dim, kernel]` matrix.
pub(crate) fn conv_weight<'s>(
    s: &'s TensorStore,
    name: &str,
    channels: usize,
    kernel: usize,
) -> Result<MatrixRef<'s>> {
    let t = s.get(name)?;
    if t.shape() != [channels, 1, kernel] {
        return Err(DecodeError::BadTensor {
            name: name.into(),
            fault: crate::error::TensorFault::Shape {
                shape: t.shape().to_vec(),
                expected: vec![channels, 1, kernel],
            },
        });
    }
    Ok(MatrixRef {
        name: t.name(),
        rows: channels,
        cols: kernel,
        data: t.slice(),
    })
}

/// Widths of a Gated DeltaNet layer.
#[derive(Clone, Copy, Debug)]
pub struct DeltaDims {
    /// The convolution's length.
    pub kernel: usize,
    /// Key heads.
    pub k_heads: usize,
    /// Value heads.
    pub v_heads: usize,
    /// Key head width.
    pub dk: usize,
    /// Value head width.
    pub dv: usize,
    /// The gated norm's epsilon.
    pub eps: f32,
}

/// One token's projections.
#[derive(Clone, Copy, Debug)]
pub struct DeltaToken<'a> {
    /// `in_proj_qkv · x` (q, k, v before the convolution).
    pub mixed: &'a [f32],
    /// `in_proj_z · x`.
    pub z: &'a [f32],
    /// `in_proj_b · x`.
    pub b: &'a [f32],
    /// `in_proj_a · x`.
    pub a: &'a [f32],
}

/// One token through a Gated DeltaNet layer's convolution and recurrence, its state advanced.
/// Returns the gated-normed output of every value head, head-major (before `out_proj`). Public
/// so that other implementations (the GPU's kernels, `cuda-emu`) are held to it.
#[allow(clippy::too_many_arguments)]
pub fn delta_step(
    isa: Isa,
    d: &DeltaDims,
    state: &mut DeltaState,
    conv: MatrixRef<'_>,
    dt_bias: WeightSlice<'_>,
    a_log: WeightSlice<'_>,
    norm_w: WeightSlice<'_>,
    p: &DeltaToken<'_>,
) -> Vec<f32> {
    let channels = p.mixed.len();
    // Causal depthwise convolution over [history (oldest first), this token], then SiLU.
    let mut win = vec![0.0f32; d.kernel];
    let mut w = vec![0.0f32; d.kernel];
    let c: Vec<f32> = (0..channels)
        .map(|ch| {
            for (j, v) in win.iter_mut().enumerate() {
                *v = if j + 1 < d.kernel {
                    state.conv[j][ch]
                } else {
                    p.mixed[ch]
                };
            }
            let row = conv.row(ch);
            for (j, v) in w.iter_mut().enumerate() {
                *v = row.get(j);
            }
            canon::silu(isa.dot_f32(&w, &win))
        })
        .collect();
    if d.kernel > 1 {
        state.conv.remove(0);
        state.conv.push(p.mixed.to_vec());
    }
    let key_dim = d.k_heads * d.dk;
    let (q_all, rest) = c.split_at(key_dim);
    let (k_all, v_all) = rest.split_at(key_dim);
    // L2 norm with eps 1e-6 added to the sum; q also divided by √dk (f32 of the f64 root).
    let l2 = |x: &[f32]| -> Vec<f32> {
        let r = canon::rsqrt(isa.dot_f32(x, x) + 1e-6f32);
        x.iter().map(|&v| v * r).collect()
    };
    let inv_scale = (d.dk as f64).sqrt() as f32;
    let qs: Vec<Vec<f32>> = q_all
        .chunks_exact(d.dk)
        .map(|q| l2(q).into_iter().map(|v| v / inv_scale).collect())
        .collect();
    let ks: Vec<Vec<f32>> = k_all.chunks_exact(d.dk).map(l2).collect();
    let group = d.v_heads / d.k_heads;
    let head = |(h, s): (usize, &mut Vec<f32>)| -> Vec<f32> {
        let (q, k) = (&qs[h / group], &ks[h / group]);
        let v = &v_all[h * d.dv..(h + 1) * d.dv];
        let beta = canon::sigmoid(p.b[h]);
        let g = -canon::exp(a_log.get(h)) * canon::softplus(p.a[h] + dt_bias.get(h));
        let decay = canon::exp(g);
        for x in s.iter_mut() {
            *x *= decay;
        }
        let mut o = vec![0.0f32; d.dv];
        for (j, (row, oj)) in s.chunks_exact_mut(d.dk).zip(o.iter_mut()).enumerate() {
            let m = isa.dot_f32(row, k);
            let delta = (v[j] - m) * beta;
            for (x, &ki) in row.iter_mut().zip(k) {
                *x += ki * delta;
            }
            *oj = isa.dot_f32(row, q);
        }
        // Gated RMSNorm: w · (o · rsqrt(mean(o²) + eps)), then · silu(z).
        let mut y = vec![0.0f32; d.dv];
        isa.rms_norm(&o, |i| norm_w.get(i), d.eps, &mut y);
        let z = &p.z[h * d.dv..(h + 1) * d.dv];
        for (yi, &zi) in y.iter_mut().zip(z) {
            *yi *= canon::silu(zi);
        }
        y
    };
    // Heads are independent: threads only change which core computes which head.
    let heads: Vec<Vec<f32>> = if d.v_heads * d.dk * d.dv < (1 << 16) {
        state.s.iter_mut().enumerate().map(head).collect()
    } else {
        crate::team::map_mut(&mut state.s, |h, s| head((h, s)))
    };
    heads.concat()
}

impl Family for Qwen3_5Moe {
    fn name(&self) -> &'static str {
        "qwen3_5_moe"
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn num_layers(&self) -> usize {
        self.cfg.num_layers
    }

    fn top_k(&self) -> usize {
        self.cfg.top_k
    }

    fn whole_plan(&self) -> Option<WholePlan> {
        let c = &self.cfg;
        Some(WholePlan {
            family: "qwen3_5_moe",
            prefix: c.prefix.clone(),
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            norm: NormStyle::OnePlus,
            eps: c.rms_norm_eps,
            attn: self.attn_spec(),
            rope: c.rope.clone(),
            num_experts: c.num_experts,
            top_k: c.top_k,
            // Always renormalised (see `moe`).
            norm_topk_prob: true,
            mixers: c
                .layer_types
                .iter()
                .map(|t| match t {
                    LayerType::Full => MixerPlan::Attention,
                    LayerType::Linear => MixerPlan::DeltaNet,
                })
                .collect(),
            delta: Some(DeltaShape {
                k_heads: c.lin_k_heads,
                v_heads: c.lin_v_heads,
                dk: c.lin_k_dim,
                dv: c.lin_v_dim,
                kernel: c.conv_kernel,
            }),
            mlps: vec![
                MlpPlan::Moe {
                    router: "mlp.gate.weight",
                    route: RoutePlan::Softmax,
                    shared: c.shared_width,
                };
                c.num_layers
            ],
            shared: SharedPlan {
                prefix: "mlp.shared_expert",
                gate: Some("mlp.shared_expert_gate.weight"),
            },
        })
    }

    fn recurrent(&self) -> bool {
        self.cfg.layer_types.contains(&LayerType::Linear)
    }

    fn new_state(&mut self) -> Result<State> {
        let c = &self.cfg;
        Ok(State::Host(
            c.layer_types
                .iter()
                .map(|t| match t {
                    LayerType::Full => LayerState::Attention(KvCache::default()),
                    LayerType::Linear => LayerState::DeltaNet(DeltaState {
                        conv: vec![vec![0.0; c.conv_dim()]; c.conv_kernel - 1],
                        s: vec![vec![0.0; c.lin_k_dim * c.lin_v_dim]; c.lin_v_heads],
                    }),
                })
                .collect(),
        ))
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        state: &mut State,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let layers = state.host()?;
        let c = self.cfg.clone();
        let spec = self.attn_spec();
        let sk = Skeleton {
            prefix: &c.prefix,
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers: c.num_layers,
            norm: NormStyle::OnePlus,
            eps: c.rms_norm_eps,
            head: self.lm_head(ctx.tensors)?,
        };
        let logits = common::decoder_forward(
            ctx,
            &sk,
            tokens,
            all_logits,
            |ctx, l, xn| match c.layer_types[l] {
                LayerType::Full => {
                    let prefix = format!("{}layers.{l}.self_attn", c.prefix);
                    let (rope, kv) = (&mut self.rope, layers[l].kv(l)?);
                    common::attention(ctx, &prefix, &spec, c.hidden_size, rope, kv, start, xn)
                }
                LayerType::Linear => {
                    let d = layers[l].delta(l)?;
                    self.linear_attention(ctx, d, l, xn)
                }
            },
            |ctx, l, xn| Self::moe(&c, ctx, l, xn),
        )?;
        Ok(logits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1).
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut z = seed;
        (0..n)
            .map(|_| {
                z = z
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// One token's (mixed, z, b, a).
    type Token = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    /// The Gated DeltaNet equations of `research/model-families.md` §3.4 written out in `f64`,
    /// independently of `delta_step`: conv state, recurrence and gated norm over `steps` tokens.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        d: &DeltaDims,
        conv: &[f32],
        dt_bias: &[f32],
        a_log: &[f32],
        norm_w: &[f32],
        toks: &[Token],
        keep_state: bool,
    ) -> Vec<Vec<f64>> {
        let ch = 2 * d.k_heads * d.dk + d.v_heads * d.dv;
        let silu = |x: f64| x / (1.0 + (-x).exp());
        let mut hist: Vec<Vec<f64>> = vec![vec![0.0; ch]; d.kernel - 1];
        let mut s = vec![vec![vec![0.0f64; d.dv]; d.dk]; d.v_heads];
        let mut outs = Vec::new();
        for (mixed, z, b, a) in toks {
            if !keep_state {
                hist = vec![vec![0.0; ch]; d.kernel - 1];
                s = vec![vec![vec![0.0f64; d.dv]; d.dk]; d.v_heads];
            }
            let cur: Vec<f64> = mixed.iter().map(|&v| v as f64).collect();
            let c: Vec<f64> = (0..ch)
                .map(|i| {
                    let mut acc = 0.0;
                    for j in 0..d.kernel {
                        let x = if j + 1 < d.kernel { hist[j][i] } else { cur[i] };
                        acc += conv[i * d.kernel + j] as f64 * x;
                    }
                    silu(acc)
                })
                .collect();
            hist.remove(0);
            hist.push(cur);
            let kd = d.k_heads * d.dk;
            let l2 = |x: &[f64]| -> Vec<f64> {
                let n = (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
                x.iter().map(|v| v / n).collect()
            };
            let mut out = Vec::new();
            for h in 0..d.v_heads {
                let kh = h / (d.v_heads / d.k_heads);
                let q: Vec<f64> = l2(&c[kh * d.dk..(kh + 1) * d.dk])
                    .iter()
                    .map(|v| v / (d.dk as f64).sqrt())
                    .collect();
                let k = l2(&c[kd + kh * d.dk..kd + (kh + 1) * d.dk]);
                let v = &c[2 * kd + h * d.dv..2 * kd + (h + 1) * d.dv];
                let beta = 1.0 / (1.0 + (-(b[h] as f64)).exp());
                let sp = ((a[h] + dt_bias[h]) as f64).exp().ln_1p();
                let g = -(a_log[h] as f64).exp() * sp;
                let st = &mut s[h];
                for row in st.iter_mut() {
                    for x in row.iter_mut() {
                        *x *= g.exp();
                    }
                }
                let mut o = vec![0.0; d.dv];
                for j in 0..d.dv {
                    let m: f64 = (0..d.dk).map(|i| st[i][j] * k[i]).sum();
                    let delta = (v[j] - m) * beta;
                    for i in 0..d.dk {
                        st[i][j] += k[i] * delta;
                    }
                }
                for (j, oj) in o.iter_mut().enumerate() {
                    *oj = (0..d.dk).map(|i| st[i][j] * q[i]).sum();
                }
                let ms = o.iter().map(|v| v * v).sum::<f64>() / d.dv as f64;
                let r = 1.0 / (ms + d.eps as f64).sqrt();
                for j in 0..d.dv {
                    out.push(norm_w[j] as f64 * o[j] * r * silu(z[h * d.dv + j] as f64));
                }
            }
            outs.push(out);
        }
        outs
    }

    #[test]
    fn delta_step_follows_the_recurrence_and_carries_its_state() {
        // dk ≠ dv, so a transposed state would not pass.
        let d = DeltaDims {
            kernel: 4,
            k_heads: 2,
            v_heads: 4,
            dk: 8,
            dv: 12,
            eps: 1e-6,
        };
        let ch = 2 * d.k_heads * d.dk + d.v_heads * d.dv;
        let conv: Vec<f32> = values(1, ch * d.kernel);
        let dt_bias = values(2, d.v_heads);
        let a_log = values(3, d.v_heads);
        let norm_w: Vec<f32> = values(4, d.dv).iter().map(|v| 1.0 + 0.1 * v).collect();
        let toks: Vec<_> = (0..6u64)
            .map(|t| {
                (
                    values(10 + t, ch)
                        .iter()
                        .map(|v| 2.0 * v)
                        .collect::<Vec<_>>(),
                    values(20 + t, d.v_heads * d.dv),
                    values(30 + t, d.v_heads),
                    values(40 + t, d.v_heads),
                )
            })
            .collect();
        let conv_m = MatrixRef {
            name: "conv",
            rows: ch,
            cols: d.kernel,
            data: WeightSlice::F32(&conv),
        };
        for isa in Isa::available_all() {
            let mut state = DeltaState {
                conv: vec![vec![0.0; ch]; d.kernel - 1],
                s: vec![vec![0.0; d.dk * d.dv]; d.v_heads],
            };
            let ours: Vec<Vec<f32>> = toks
                .iter()
                .map(|(m, z, b, a)| {
                    let p = DeltaToken { mixed: m, z, b, a };
                    delta_step(
                        isa,
                        &d,
                        &mut state,
                        conv_m,
                        WeightSlice::F32(&dt_bias),
                        WeightSlice::F32(&a_log),
                        WeightSlice::F32(&norm_w),
                        &p,
                    )
                })
                .collect();
            let want = naive(&d, &conv, &dt_bias, &a_log, &norm_w, &toks, true);
            let forgetful = naive(&d, &conv, &dt_bias, &a_log, &norm_w, &toks, false);
            let dist = |x: &[Vec<f64>], step: usize| {
                ours[step]
                    .iter()
                    .zip(&x[step])
                    .map(|(&a, &b)| (a as f64 - b).abs())
                    .fold(0.0f64, f64::max)
            };
            for step in 0..toks.len() {
                assert!(
                    dist(&want, step) < 1e-5,
                    "{isa:?} step {step}: {}",
                    dist(&want, step)
                );
            }
            // Forgetting the conv and recurrent state moves every later step far past that.
            for step in 1..toks.len() {
                assert!(dist(&forgetful, step) > 1e-2, "{isa:?} step {step}");
            }
        }
    }

    #[test]
    fn softplus_is_log1p_exp_within_an_ulp() {
        for i in -400..=400 {
            let x = i as f32 * 0.07;
            let want = (x as f64).exp().ln_1p();
            let got = canon::softplus(x) as f64;
            let tol = (want.abs() * 2f64.powi(-23)).max(f64::MIN_POSITIVE);
            let want = if x > 20.0 { x as f64 } else { want };
            assert!(
                (got - want).abs() <= tol,
                "softplus({x}) = {got}, want {want}"
            );
        }
    }
}
