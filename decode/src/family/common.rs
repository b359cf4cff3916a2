//! The parts the families share, by tensor-name prefix: the embedding lookup, RMSNorm in its two
//! weight styles, grouped-query attention (optional q/k norm, biases, partial rotary, an output
//! gate), the dense SwiGLU MLP, routed experts and the final norm and `lm_head`. Each part is
//! checked (names and shapes) before the first token by its `check_*` twin, and computes every
//! token exactly as it would alone.

use crate::blocks::{self, AttnShape, Batch, KvCache, MoeOutputs, Route};
use crate::canon;
use crate::error::{DecodeError, Result};
use crate::family::Ctx;
use crate::kernels::Isa;
use crate::rope::Rope;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// How an RMSNorm applies its weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormStyle {
    /// `w · (x · rsqrt(mean(x²) + eps))` (weights initialised to ones).
    Weight,
    /// `(x · rsqrt(mean(x²) + eps)) · (1 + w)`, `1 + w` in `f32` (zero-centred weights:
    /// Qwen3.5/Qwen3-Next).
    OnePlus,
}

/// RMSNorm of each token in `style`.
pub fn norm(
    ctx: &Ctx<'_>,
    style: NormStyle,
    xs: &[Vec<f32>],
    w: WeightSlice<'_>,
    eps: f32,
) -> Batch {
    let isa = ctx.isa;
    let mut out: Batch = xs.iter().map(|x| vec![0.0f32; x.len()]).collect();
    let width = xs.first().map_or(0, Vec::len);
    per_token(&mut out, width, |t, o| match style {
        NormStyle::Weight => isa.rms_norm(&xs[t], |i| w.get(i), eps, o),
        NormStyle::OnePlus => isa.rms_norm(&xs[t], |i| 1.0 + w.get(i), eps, o),
    });
    out
}

/// `f(t, &mut items[t])` for every token `t`: as phases of the decoder's team (a token a task)
/// when the batch is more than one token and `tokens · width` at least 2^15 values, else on the
/// calling thread. Each token's glue (norms, RoPE) is its own computation, so which thread runs
/// it changes no bit; the threshold only keeps a decode step's one token out of a team phase.
fn per_token<S: Send>(items: &mut [S], width: usize, f: impl Fn(usize, &mut S) + Sync) {
    if items.len() > 1 && items.len() * width >= 1 << 15 {
        crate::team::map_mut(items, f);
    } else {
        for (t, item) in items.iter_mut().enumerate() {
            f(t, item);
        }
    }
}

/// RMSNorm of each `dim`-wide head of `x` in place, one weight for all heads.
pub fn norm_heads(
    isa: Isa,
    style: NormStyle,
    x: &mut [f32],
    dim: usize,
    w: WeightSlice<'_>,
    eps: f32,
) {
    let mut src = vec![0.0f32; dim];
    for head in x.chunks_exact_mut(dim) {
        src.copy_from_slice(head);
        match style {
            NormStyle::Weight => isa.rms_norm(&src, |i| w.get(i), eps, head),
            NormStyle::OnePlus => isa.rms_norm(&src, |i| 1.0 + w.get(i), eps, head),
        }
    }
}

/// The embedding rows of `tokens` (a plain lookup, no scaling), each id checked.
pub fn embed(
    s: &TensorStore,
    name: &str,
    vocab: usize,
    hidden: usize,
    tokens: &[u32],
) -> Result<Batch> {
    let embed = s.get(name)?.matrix(vocab, hidden)?;
    tokens
        .iter()
        .map(|&t| {
            if t as usize >= vocab {
                return Err(DecodeError::TokenOutOfRange { id: t, vocab });
            }
            let row = embed.row(t as usize);
            Ok((0..hidden).map(|i| row.get(i)).collect())
        })
        .collect()
}

/// The output projection: `lm_head` (named `head`), or the embedding `embed` when tied and no
/// `head` is stored.
pub fn lm_head<'s>(
    s: &'s TensorStore,
    head: &str,
    embed: &str,
    tied: bool,
    vocab: usize,
    hidden: usize,
) -> Result<MatrixRef<'s>> {
    let name = match s.find(head) {
        Some(_) => head,
        None if tied => embed,
        None => head,
    };
    s.get(name)?.matrix(vocab, hidden)
}

/// Final norm and logits: of every position when `all_logits`, else of the last.
pub fn logits(
    ctx: &mut Ctx<'_>,
    x: &[Vec<f32>],
    final_norm: (NormStyle, WeightSlice<'_>, f32),
    head: MatrixRef<'_>,
    all_logits: bool,
) -> Result<Batch> {
    let keep = if all_logits {
        0
    } else {
        x.len().saturating_sub(1)
    };
    let xn = norm(ctx, final_norm.0, &x[keep..], final_norm.1, final_norm.2);
    ctx.linear("lm_head", head, None, &xn)
}

/// What the decoder skeleton every family shares needs to know of one.
#[derive(Clone, Copy, Debug)]
pub struct Skeleton<'s> {
    /// Tensor-name prefix of the text model (`model.`, or `model.language_model.`).
    pub prefix: &'s str,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Style and epsilon of the layer norms and the final norm.
    pub norm: NormStyle,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// The output projection.
    pub head: MatrixRef<'s>,
}

/// The decoder skeleton: the embedding rows, then per layer `x += mixer(norm_in(x))` and
/// `x += mlp(norm_post(x))` (`input_layernorm`, `post_attention_layernorm`), then the final
/// `norm` and the logits. A family supplies its token mixer (attention, DeltaNet) and its MLP.
pub fn decoder_forward<'c>(
    ctx: &mut Ctx<'c>,
    sk: &Skeleton<'_>,
    tokens: &[u32],
    all_logits: bool,
    mut mixer: impl FnMut(&mut Ctx<'c>, usize, &Batch) -> Result<Batch>,
    mut mlp: impl FnMut(&mut Ctx<'c>, usize, &Batch) -> Result<Batch>,
) -> Result<Batch> {
    let s = ctx.tensors;
    let (h, eps, pre) = (sk.hidden, sk.eps, sk.prefix);
    let mut x = embed(s, &format!("{pre}embed_tokens.weight"), sk.vocab, h, tokens)?;
    for l in 0..sk.layers {
        let w_in = s
            .get(&format!("{pre}layers.{l}.input_layernorm.weight"))?
            .vector(h)?;
        let xn = norm(ctx, sk.norm, &x, w_in, eps);
        let a = mixer(ctx, l, &xn)?;
        blocks::add_into(&mut x, &a);
        let w_post = s
            .get(&format!("{pre}layers.{l}.post_attention_layernorm.weight"))?
            .vector(h)?;
        let xn = norm(ctx, sk.norm, &x, w_post, eps);
        let m = mlp(ctx, l, &xn)?;
        blocks::add_into(&mut x, &m);
    }
    let w_norm = s.get(&format!("{pre}norm.weight"))?.vector(h)?;
    logits(ctx, &x, (sk.norm, w_norm, eps), sk.head, all_logits)
}

/// One attention layer's form.
#[derive(Clone, Copy, Debug)]
pub struct AttnSpec {
    /// Heads, widths, window.
    pub shape: AttnShape,
    /// Epsilon of the q/k norms.
    pub eps: f32,
    /// Per-head q/k RMSNorm before RoPE (`q_norm`, `k_norm`), and its style.
    pub qk_norm: Option<NormStyle>,
    /// Biases on q, k and v.
    pub qkv_bias: bool,
    /// A bias on o.
    pub o_bias: bool,
    /// `q_proj` gives `[q_h | gate_h]` per head and the attention output is multiplied by
    /// `sigmoid(gate)` before `o_proj` (Qwen3.5's gated attention).
    pub out_gate: bool,
    /// Values of another width, scaled values and attention sinks (MiMo-V2-Flash), if any.
    pub extra: Option<AttnExtra>,
}

/// MiMo-V2-Flash's attention beyond the usual form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnExtra {
    /// A value head's width (`v_head_dim`), at most the key's.
    pub v_dim: usize,
    /// Each value multiplied by it after `v_proj` (`attention_value_scale`), in `f32`.
    pub v_scale: f32,
    /// A learned logit per head (`self_attn.attention_sink_bias`, transformers' `sinks`) joins each softmax and is dropped after it.
    pub sinks: bool,
}

impl AttnSpec {
    /// A value head's width.
    pub fn v_dim(&self) -> usize {
        self.extra.map_or(self.shape.head_dim, |e| e.v_dim)
    }

    fn q_rows(&self) -> usize {
        let q = self.shape.heads * self.shape.head_dim;
        if self.out_gate {
            2 * q
        } else {
            q
        }
    }
}

/// Every tensor [`attention`] reads under `prefix` (e.g. `model.layers.3.self_attn`) exists
/// with its shape.
pub fn check_attention(s: &TensorStore, prefix: &str, a: &AttnSpec, hidden: usize) -> Result<()> {
    let (d, nh, nkv) = (a.shape.head_dim, a.shape.heads, a.shape.kv_heads);
    let p = |n: &str| format!("{prefix}.{n}");
    s.get(&p("q_proj.weight"))?.matrix(a.q_rows(), hidden)?;
    s.get(&p("k_proj.weight"))?.matrix(nkv * d, hidden)?;
    let dv = a.v_dim();
    s.get(&p("v_proj.weight"))?.matrix(nkv * dv, hidden)?;
    s.get(&p("o_proj.weight"))?.matrix(hidden, nh * dv)?;
    if a.qk_norm.is_some() {
        s.get(&p("q_norm.weight"))?.vector(d)?;
        s.get(&p("k_norm.weight"))?.vector(d)?;
    }
    if a.qkv_bias {
        s.get(&p("q_proj.bias"))?.vector(a.q_rows())?;
        s.get(&p("k_proj.bias"))?.vector(nkv * d)?;
        s.get(&p("v_proj.bias"))?.vector(nkv * dv)?;
    }
    if a.extra.is_some_and(|e| e.sinks) {
        s.get(&p("attention_sink_bias"))?.vector(nh)?;
    }
    if a.o_bias {
        s.get(&p("o_proj.bias"))?.vector(hidden)?;
    }
    Ok(())
}

/// Grouped-query attention of a batch at positions `start..` under `prefix`: q, k, v (+ biases),
/// the optional output gate split off `q`, per-head q/k norm, RoPE on the rope's rotary dims, the
/// cached attention, the gate, `o_proj` (+ bias).
#[allow(clippy::too_many_arguments)]
pub fn attention(
    ctx: &mut Ctx<'_>,
    prefix: &str,
    a: &AttnSpec,
    hidden: usize,
    rope: &mut Rope,
    kv: &mut KvCache,
    start: usize,
    x: &[Vec<f32>],
) -> Result<Batch> {
    let s = ctx.tensors;
    let (d, nh, nkv) = (a.shape.head_dim, a.shape.heads, a.shape.kv_heads);
    let p = |n: &str| format!("{prefix}.{n}");
    let bias = |n: &str, on: bool| -> Result<Option<WeightSlice<'_>>> {
        if on {
            Ok(Some(s.get(&p(n))?.slice()))
        } else {
            Ok(None)
        }
    };
    let wq = s.get(&p("q_proj.weight"))?.matrix(a.q_rows(), hidden)?;
    let dv = a.v_dim();
    let wk = s.get(&p("k_proj.weight"))?.matrix(nkv * d, hidden)?;
    let wv = s.get(&p("v_proj.weight"))?.matrix(nkv * dv, hidden)?;
    let wo = s.get(&p("o_proj.weight"))?.matrix(hidden, nh * dv)?;
    let sinks: Option<Vec<f32>> = match a.extra {
        Some(e) if e.sinks => {
            let w = s.get(&p("attention_sink_bias"))?.vector(nh)?;
            Some((0..nh).map(|h| w.get(h)).collect())
        }
        _ => None,
    };
    let norms = match a.qk_norm {
        Some(style) => Some((
            style,
            s.get(&p("q_norm.weight"))?.vector(d)?,
            s.get(&p("k_norm.weight"))?.vector(d)?,
        )),
        None => None,
    };
    let (bq, bk, bv) = (
        bias("q_proj.bias", a.qkv_bias)?,
        bias("k_proj.bias", a.qkv_bias)?,
        bias("v_proj.bias", a.qkv_bias)?,
    );
    let isa = ctx.isa;
    let mut qkv = ctx.linear_many("attention q/k/v", &[(wq, bq), (wk, bk), (wv, bv)], x)?;
    let mut v = qkv.pop().expect("three outputs");
    // MiMo: values scaled, and narrower values padded with +0 to the key's width (their
    // outputs are +0 and dropped below; no other sum sees them).
    if let Some(e) = a.extra {
        for vt in v.iter_mut() {
            let mut padded = vec![0.0f32; nkv * d];
            for (head, out) in vt.chunks_exact(dv).zip(padded.chunks_exact_mut(d)) {
                for (o, &x) in out.iter_mut().zip(head) {
                    *o = x * e.v_scale;
                }
            }
            *vt = padded;
        }
    }
    let mut k = qkv.pop().expect("three outputs");
    let mut q = qkv.pop().expect("three outputs");
    // Gated attention: per head [q_h | gate_h]; the gates kept head-major.
    let gates: Option<Batch> = a.out_gate.then(|| {
        q.iter_mut()
            .map(|qg| {
                let (mut qs, mut gs) = (Vec::with_capacity(nh * d), Vec::with_capacity(nh * d));
                for h in qg.chunks_exact(2 * d) {
                    qs.extend_from_slice(&h[..d]);
                    gs.extend_from_slice(&h[d..]);
                }
                *qg = qs;
                gs
            })
            .collect()
    });
    let t0 = std::time::Instant::now();
    rope.ensure(start + x.len());
    let rope = &*rope;
    let place = |t: usize, (qt, kt): &mut (&mut Vec<f32>, &mut Vec<f32>)| {
        if let Some((style, qn, kn)) = norms {
            norm_heads(isa, style, qt, d, qn, a.eps);
            norm_heads(isa, style, kt, d, kn, a.eps);
        }
        blocks::rope_heads(rope, qt, d, start + t);
        blocks::rope_heads(rope, kt, d, start + t);
    };
    let mut pairs: Vec<(&mut Vec<f32>, &mut Vec<f32>)> = q.iter_mut().zip(k.iter_mut()).collect();
    let width = pairs.first().map_or(0, |p| p.0.len() + p.1.len());
    per_token(&mut pairs, width, place);
    let scaling = (1.0 / (d as f64).sqrt()) as f32;
    let mut o = blocks::attend_with(
        isa,
        a.shape,
        scaling,
        sinks.as_deref(),
        kv,
        start,
        &q,
        &k,
        &v,
    );
    if dv != d {
        for ot in o.iter_mut() {
            *ot = ot
                .chunks_exact(d)
                .flat_map(|h| h[..dv].iter().copied())
                .collect();
        }
    }
    if let Some(gates) = gates {
        for (ot, gt) in o.iter_mut().zip(&gates) {
            for (v, &g) in ot.iter_mut().zip(gt) {
                *v *= canon::sigmoid(g);
            }
        }
    }
    ctx.profile.add("attention core", t0.elapsed());
    let bo = bias("o_proj.bias", a.o_bias)?;
    ctx.linear("attention o", wo, bo, &o)
}

/// The dense SwiGLU MLP under `prefix` (`gate_proj`, `up_proj`, `down_proj`) exists with width
/// `inter`.
pub fn check_mlp(s: &TensorStore, prefix: &str, inter: usize, hidden: usize) -> Result<()> {
    s.get(&format!("{prefix}.gate_proj.weight"))?
        .matrix(inter, hidden)?;
    s.get(&format!("{prefix}.up_proj.weight"))?
        .matrix(inter, hidden)?;
    s.get(&format!("{prefix}.down_proj.weight"))?
        .matrix(hidden, inter)?;
    Ok(())
}

/// The dense SwiGLU MLP under `prefix`: `down(silu(gate x) ⊙ up x)`, the gate and up dots
/// clamped with a `limit` ([`crate::kernels::MatJob::clamped`]).
pub fn mlp(
    ctx: &mut Ctx<'_>,
    part: &'static str,
    (prefix, inter, hidden): (&str, usize, usize),
    limit: Option<f32>,
    x: &[Vec<f32>],
) -> Result<Batch> {
    let s = ctx.tensors;
    let g = s
        .get(&format!("{prefix}.gate_proj.weight"))?
        .matrix(inter, hidden)?;
    let u = s
        .get(&format!("{prefix}.up_proj.weight"))?
        .matrix(inter, hidden)?;
    let dn = s
        .get(&format!("{prefix}.down_proj.weight"))?
        .matrix(hidden, inter)?;
    ctx.swiglu(part, (g, u, dn), limit, x)
}

/// The router's logits `W x` of each token (`W`: `[experts, hidden]`).
pub fn router_logits(ctx: &mut Ctx<'_>, w: MatrixRef<'_>, x: &[Vec<f32>]) -> Result<Batch> {
    ctx.linear("router", w, None, x)
}

/// Run each selected expert once over the tokens routed to it (experts in any order: each output
/// lands in its token's selection slot), then combine per token in slot order; each SwiGLU's
/// dots clamped with a `limit`, on the CPU or the offload device alike.
pub fn routed_experts(
    ctx: &mut Ctx<'_>,
    layer: u32,
    routes: &[Route],
    x: &Batch,
    limit: Option<f32>,
) -> Result<Batch> {
    let t = std::time::Instant::now();
    let mut wanted: Vec<u32> = routes.iter().flat_map(|r| r.iter().map(|s| s.0)).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let hidden = x.first().map_or(0, |v| v.len());
    // (token, slot, weight) pairs routed to expert e, in token order.
    let routed_to = |e: u32| -> Vec<(usize, usize, f32)> {
        routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| {
                r.iter()
                    .enumerate()
                    .filter(move |(_, s)| s.0 == e)
                    .map(move |(k, s)| (t, k, s.1))
            })
            .collect()
    };
    let mut outs = MoeOutputs::new(routes);
    let isa = ctx.isa;
    let mut offload = ctx.offload.as_deref_mut();
    ctx.experts.with_experts(layer, &wanted, |views| {
        let mine: Vec<Vec<(usize, usize, f32)>> =
            views.iter().map(|v| routed_to(v.expert)).collect();
        let xs: Vec<Batch> = mine
            .iter()
            .map(|m| m.iter().map(|&(t, _, _)| x[t].clone()).collect())
            .collect();
        // Experts the offload device takes run there; the rest in one parallel region here.
        // Either way each output is the same bits, stored by (token, slot).
        let on_device: Vec<bool> = views
            .iter()
            .map(|v| offload.as_ref().is_some_and(|o| o.takes(v)))
            .collect();
        let items: Vec<_> = views
            .iter()
            .zip(&xs)
            .zip(&on_device)
            .filter(|(_, &d)| !d)
            .map(|((v, b), _)| (v.clone(), b.as_slice()))
            .collect();
        let mut cpu = blocks::experts_swiglu(isa, &items, hidden, limit)?.into_iter();
        let device_items: Vec<(&crate::experts::ExpertView<'_>, &[Vec<f32>])> = views
            .iter()
            .zip(&xs)
            .zip(&on_device)
            .filter(|(_, &d)| d)
            .map(|((v, b), _)| (v, b.as_slice()))
            .collect();
        let mut dev = match (&mut offload, device_items.is_empty()) {
            (Some(o), false) => o.swiglu_many(&device_items, hidden, limit)?,
            _ => Vec::new(),
        }
        .into_iter();
        for (i, m) in mine.iter().enumerate() {
            let y = if on_device[i] {
                dev.next().expect("one device output per device expert")
            } else {
                cpu.next().expect("one CPU output per CPU expert")
            };
            for (&(t, k, w), yt) in m.iter().zip(&y) {
                outs.put(t, k, yt, w);
            }
        }
        Ok(())
    })?;
    ctx.profile
        .add("experts (read, check, compute)", t.elapsed());
    Ok(outs.combine())
}
