//! Kimi delta attention (KDA: GLM-5.3-Flash's `linear_attention` layers), as transformers 5.17
//! computes it in `f32` (`Glm5NextTextLinearAttention`, its recurrent form):
//!
//! - `q`, `k`, `v` = `{q,k,v}_proj · x` (each `heads · dim`), each through its own causal
//!   depthwise convolution (`{q,k,v}_conv1d`, no bias, zeros before the first token) and SiLU;
//! - the forget gate per channel: `g = f_b_proj · f_a_proj · x + dt_bias`, then with a lower
//!   bound `lb` (`linear_lower_bound`, default −5) `lb · sigmoid(exp(A_log[h]) · g)`, else
//!   `−exp(A_log[h]) · softplus(g)`; `β = sigmoid(b_proj · x)` per head;
//! - per head `q` and `k` L2-normalised (`x / √(Σx² + 1e-6)`), `q` also times `dim^-0.5`, and
//!   the delta rule on an `f32` state `S [dk, dv]`: `S ← diag(e^g) S` — the decay acts on the
//!   **key** axis, one factor per key channel —, `m = Sᵀk`, `δ = (v − m)·β`, `S ← S + k δᵀ`,
//!   `o = Sᵀq`;
//! - the gated norm `o_norm.weight · (o · rsqrt(mean(o²) + rms_norm_eps)) · sigmoid(gate)` with
//!   `gate = g_b_proj · g_a_proj · x` per head, then `o_proj`.
//!
//! transformers runs prompts through its chunked form and later tokens through the recurrence
//! (they agree to ~1e-7); tarfa always runs the recurrence, token by token, in the canonical
//! order, so a prompt in one batch, in chunks and token by token give the same bits.

use crate::blocks::Batch;
use crate::canon;
use crate::error::Result;
use crate::family::deltanet::{conv_silu, conv_weight, DeltaState, Rates};
use crate::family::Ctx;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// One KDA layer's widths and gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KdaShape {
    /// `linear_num_heads`.
    pub heads: usize,
    /// `linear_head_dim` (keys and values alike).
    pub dim: usize,
    /// `linear_conv_kernel_dim`.
    pub kernel: usize,
    /// `linear_lower_bound`, or none: the softplus gate.
    pub lower_bound: Option<f32>,
    /// The output norm's epsilon (`rms_norm_eps`).
    pub eps: f32,
}

impl KdaShape {
    /// `heads · dim`: each of q, k and v.
    pub fn width(&self) -> usize {
        self.heads * self.dim
    }

    /// A new sequence's state of a layer: a zero convolution history of q, k and v and a zero
    /// `S` per head (stored `[dv][dk]`, so that `Sᵀk` is a row of dots).
    pub fn new_state(&self) -> DeltaState {
        DeltaState {
            conv: vec![vec![0.0; 3 * self.width()]; self.kernel - 1],
            s: vec![vec![0.0; self.dim * self.dim]; self.heads],
        }
    }
}

const PROJ: [&str; 3] = ["q", "k", "v"];

/// Every tensor [`layer`] reads under `prefix` (e.g. `model.layers.0.self_attn`) exists with its
/// shape.
pub fn check(s: &TensorStore, prefix: &str, k: &KdaShape, hidden: usize) -> Result<()> {
    let p = |n: &str| format!("{prefix}.{n}");
    let w = k.width();
    for x in PROJ {
        s.get(&p(&format!("{x}_proj.weight")))?.matrix(w, hidden)?;
        conv_weight(s, &p(&format!("{x}_conv1d.weight")), w, k.kernel)?;
    }
    for g in ["f", "g"] {
        s.get(&p(&format!("{g}_a_proj.weight")))?
            .matrix(k.dim, hidden)?;
        s.get(&p(&format!("{g}_b_proj.weight")))?.matrix(w, k.dim)?;
    }
    s.get(&p("dt_bias"))?.vector(w)?;
    Rates::of(s, prefix, k.heads)?;
    s.get(&p("b_proj.weight"))?.matrix(k.heads, hidden)?;
    s.get(&p("o_norm.weight"))?.vector(k.dim)?;
    s.get(&p("o_proj.weight"))?.matrix(hidden, w)?;
    Ok(())
}

/// `x / √(Σx² + 1e-6)` (FLA's L2 norm, as transformers writes it: a square root and a division).
fn l2(isa: crate::kernels::Isa, x: &[f32]) -> Vec<f32> {
    let n = (isa.dot_f32(x, x) + 1e-6f32).sqrt();
    x.iter().map(|&v| v / n).collect()
}

/// One KDA layer of widths `k` in a model `hidden` wide under `prefix` over the batch, token
/// after token, its state advanced.
pub fn layer(
    ctx: &mut Ctx<'_>,
    prefix: &str,
    (k, hidden): (&KdaShape, usize),
    state: &mut DeltaState,
    x: &Batch,
) -> Result<Batch> {
    let s = ctx.tensors;
    let p = |n: &str| format!("{prefix}.{n}");
    let w = k.width();
    let m = |n: &str, rows: usize, cols: usize| s.get(&p(n))?.matrix(rows, cols);
    let mut proj = ctx.linear_many(
        "kda projections",
        &[
            (m("q_proj.weight", w, hidden)?, None),
            (m("k_proj.weight", w, hidden)?, None),
            (m("v_proj.weight", w, hidden)?, None),
            (m("f_a_proj.weight", k.dim, hidden)?, None),
            (m("g_a_proj.weight", k.dim, hidden)?, None),
            (m("b_proj.weight", k.heads, hidden)?, None),
        ],
        x,
    )?;
    let bv = proj.pop().expect("six outputs");
    let ga = proj.pop().expect("six outputs");
    let fa = proj.pop().expect("six outputs");
    let f = ctx.linear(
        "kda forget gate",
        m("f_b_proj.weight", w, k.dim)?,
        None,
        &fa,
    )?;
    let gate = ctx.linear(
        "kda output gate",
        m("g_b_proj.weight", w, k.dim)?,
        None,
        &ga,
    )?;
    let weights = KdaWeights {
        conv: [
            conv_weight(s, &p("q_conv1d.weight"), w, k.kernel)?,
            conv_weight(s, &p("k_conv1d.weight"), w, k.kernel)?,
            conv_weight(s, &p("v_conv1d.weight"), w, k.kernel)?,
        ],
        dt_bias: s.get(&p("dt_bias"))?.vector(w)?,
        rates: Rates::of(s, prefix, k.heads)?,
        norm: s.get(&p("o_norm.weight"))?.vector(k.dim)?,
    };
    let isa = ctx.isa;
    let t0 = std::time::Instant::now();
    let mut out = Vec::with_capacity(x.len());
    for t in 0..x.len() {
        let mixed: Vec<f32> = [&proj[0][t][..], &proj[1][t], &proj[2][t]].concat();
        let token = KdaToken {
            mixed: &mixed,
            f: &f[t],
            b: &bv[t],
            gate: &gate[t],
        };
        out.push(kda_step(isa, k, state, &weights, &token));
    }
    ctx.profile.add("kda recurrence", t0.elapsed());
    ctx.linear("kda out", m("o_proj.weight", hidden, w)?, None, &out)
}

/// The weights a KDA layer's recurrence reads (its products aside).
#[derive(Clone, Copy, Debug)]
pub struct KdaWeights<'a> {
    /// `q_conv1d`, `k_conv1d`, `v_conv1d` (`[heads·dim, kernel]` each).
    pub conv: [MatrixRef<'a>; 3],
    /// `dt_bias` (`heads·dim`: one a key channel).
    pub dt_bias: WeightSlice<'a>,
    /// The rates (`A_log`, one a head).
    pub rates: Rates<'a>,
    /// `o_norm.weight` (`dim`).
    pub norm: WeightSlice<'a>,
}

/// One token's inputs of a KDA layer's recurrence.
#[derive(Clone, Copy, Debug)]
pub struct KdaToken<'a> {
    /// `[q_proj · x | k_proj · x | v_proj · x]` (before the convolutions).
    pub mixed: &'a [f32],
    /// The forget gate's `f_b_proj · f_a_proj · x` (`heads·dim`).
    pub f: &'a [f32],
    /// `b_proj · x` (one a head).
    pub b: &'a [f32],
    /// The output gate's `g_b_proj · g_a_proj · x` (`heads·dim`).
    pub gate: &'a [f32],
}

/// One token through a KDA layer's convolutions and recurrence, its state advanced: the
/// gated-normed output of every head, head-major (before `o_proj`). Public for the GPU
/// kernel's test (`tarfa_e_kda_heads`, cuda-emu).
pub fn kda_step(
    isa: crate::kernels::Isa,
    k: &KdaShape,
    state: &mut DeltaState,
    wt: &KdaWeights<'_>,
    p: &KdaToken<'_>,
) -> Vec<f32> {
    let w = k.width();
    let c = conv_silu(
        isa,
        state,
        |ch| wt.conv[ch / w].row(ch % w),
        k.kernel,
        p.mixed,
    );
    let (qs, rest) = c.split_at(w);
    let (ks, vs) = rest.split_at(w);
    // `dim^-0.5`, a Python float, met by f32 values.
    let q_scale = (1.0 / (k.dim as f64).sqrt()) as f32;
    let head = |h: usize, st: &mut Vec<f32>| -> Vec<f32> {
        let r = h * k.dim..(h + 1) * k.dim;
        let q: Vec<f32> = l2(isa, &qs[r.clone()])
            .into_iter()
            .map(|v| v * q_scale)
            .collect();
        let kk = l2(isa, &ks[r.clone()]);
        let v = &vs[r.clone()];
        let a = wt.rates.get(h);
        let decay: Vec<f32> = r
            .clone()
            .map(|i| {
                let g = p.f[i] + wt.dt_bias.get(i);
                canon::exp(match k.lower_bound {
                    Some(lb) => lb * canon::sigmoid(a * g),
                    None => -a * softplus_torch(g),
                })
            })
            .collect();
        let beta = canon::sigmoid(p.b[h]);
        let mut o = vec![0.0f32; k.dim];
        for (j, (row, oj)) in st.chunks_exact_mut(k.dim).zip(o.iter_mut()).enumerate() {
            for (x, &e) in row.iter_mut().zip(&decay) {
                *x *= e;
            }
            let mem = isa.dot_f32(row, &kk);
            let delta = (v[j] - mem) * beta;
            for (x, &ki) in row.iter_mut().zip(&kk) {
                *x += ki * delta;
            }
            *oj = isa.dot_f32(row, &q);
        }
        let mut yh = vec![0.0f32; k.dim];
        isa.rms_norm(&o, |i| wt.norm.get(i), k.eps, &mut yh);
        for (yi, &gi) in yh.iter_mut().zip(&p.gate[r]) {
            *yi *= canon::sigmoid(gi);
        }
        yh
    };
    // Heads are independent: threads only change which core computes which head (as Gated
    // DeltaNet's, the same threshold).
    let heads: Vec<Vec<f32>> = if k.heads * k.dim * k.dim < (1 << 16) {
        state
            .s
            .iter_mut()
            .enumerate()
            .map(|(h, st)| head(h, st))
            .collect()
    } else {
        crate::team::map_mut(&mut state.s, head)
    };
    heads.concat()
}

/// transformers' KDA softplus: `g` above 20, else `ln(1 + exp(g))` (not `log1p`).
fn softplus_torch(g: f32) -> f32 {
    if g > 20.0 {
        g
    } else {
        canon::ln_f64((1.0 + canon::exp(g)) as f64) as f32
    }
}
