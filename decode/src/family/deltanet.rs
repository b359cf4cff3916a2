//! Gated DeltaNet (Qwen3.5's `linear_attention` layers; Qwen3-Next's too), as transformers 5.17
//! computes it in `f32` (`research/model-families.md` §3.4): a causal depthwise convolution over
//! the last `kernel` projected vectors (zeros before the first token), SiLU, L2-normalised q and
//! k (q also divided by `√dk`), the decay `g = −exp(A_log) · softplus(a + dt_bias)`,
//! `β = sigmoid(b)`, and per value head the delta-rule recurrence on an `f32` state `S [dk, dv]`,
//! one token at a time: `S ← S·e^g; m = Sᵀk; δ = (v − m)·β; S ← S + k δᵀ; o = Sᵀq`; then the
//! gated RMSNorm `w · norm(o) · silu(z)` and `out_proj`.
//!
//! transformers runs a prompt (and a first token) through its chunked kernel and later tokens
//! through the recurrence; both compute the recurrence from a zero state and agree to ~1e-7.
//! tarfa always runs the recurrence, token by token, in the canonical order: a prompt in one
//! batch and token by token give the same bits.

use tarfa_cuda::DeltaShape;

use crate::blocks::Batch;
use crate::canon;
use crate::error::{DecodeError, Result};
use crate::family::Ctx;
use crate::kernels::Isa;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

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

    /// A new sequence's state of a layer of `shape`: every value zero.
    pub fn new(shape: &DeltaShape) -> DeltaState {
        DeltaState {
            conv: vec![vec![0.0; shape.conv_dim()]; shape.kernel - 1],
            s: vec![vec![0.0; shape.dk * shape.dv]; shape.v_heads],
        }
    }
}

/// The decay rates as llama.cpp's GGUFs store them (qwen3next's and glm5-next's `ssm_a`:
/// `−exp(A_log)`, computed by the converter), under the name (below the layer's `linear_attn.`
/// or `self_attn.`) a GGUF-sourced model gives them in place of `A_log`.
pub const NEG_A: &str = "neg_exp_A_log";

/// Each head's decay rate `exp(A_log[h])`: from `A_log` (a checkpoint's), or as `−A` from
/// [`NEG_A`] (a GGUF's; the converter's rounding of the exponential, not tarfa's).
#[derive(Clone, Copy, Debug)]
pub enum Rates<'s> {
    /// `A_log`: the rate is `exp(A_log[h])`, tarfa's exponential.
    Log(WeightSlice<'s>),
    /// `−exp(A_log)` as stored: the rate is its negation.
    Neg(WeightSlice<'s>),
}

impl Rates<'_> {
    /// The rates of the layer under `prefix`: its `A_log`, else its [`NEG_A`], `heads` of them.
    pub fn of<'s>(s: &'s TensorStore, prefix: &str, heads: usize) -> Result<Rates<'s>> {
        let (name, neg) = Rates::source(s, prefix);
        let v = s.get(&name)?.vector(heads)?;
        Ok(if neg { Rates::Neg(v) } else { Rates::Log(v) })
    }

    /// The tensor the layer under `prefix` holds its rates in, and whether it is [`NEG_A`]:
    /// `A_log` when present, else `−exp(A_log)` when that is (else `A_log`, to be reported
    /// missing). The GPU engine uploads the same tensor.
    pub fn source(s: &TensorStore, prefix: &str) -> (String, bool) {
        let (log, neg) = (format!("{prefix}.A_log"), format!("{prefix}.{NEG_A}"));
        match (s.find(&log), s.find(&neg)) {
            (None, Some(_)) => (neg, true),
            _ => (log, false),
        }
    }

    /// Head `h`'s rate `exp(A_log[h])` (positive).
    pub fn get(&self, h: usize) -> f32 {
        match self {
            Rates::Log(a) => canon::exp(a.get(h)),
            Rates::Neg(a) => -a.get(h),
        }
    }
}

/// Every tensor [`layer`] reads under `prefix` (e.g. `model.layers.0.linear_attn`) exists with
/// its shape.
pub fn check(s: &TensorStore, prefix: &str, d: &DeltaShape, hidden: usize) -> Result<()> {
    let a = |n: &str| format!("{prefix}.{n}");
    s.get(&a("in_proj_qkv.weight"))?
        .matrix(d.conv_dim(), hidden)?;
    s.get(&a("in_proj_z.weight"))?
        .matrix(d.value_dim(), hidden)?;
    s.get(&a("in_proj_b.weight"))?.matrix(d.v_heads, hidden)?;
    s.get(&a("in_proj_a.weight"))?.matrix(d.v_heads, hidden)?;
    conv_weight(s, &a("conv1d.weight"), d.conv_dim(), d.kernel)?;
    s.get(&a("dt_bias"))?.vector(d.v_heads)?;
    Rates::of(s, prefix, d.v_heads)?;
    s.get(&a("norm.weight"))?.vector(d.dv)?;
    s.get(&a("out_proj.weight"))?
        .matrix(hidden, d.value_dim())?;
    Ok(())
}

/// One Gated DeltaNet layer of widths `d` in a model `h` wide under `prefix` over the batch,
/// token after token, its state advanced; `eps` is the gated norm's.
pub fn layer(
    ctx: &mut Ctx<'_>,
    prefix: &str,
    (d, h): (&DeltaShape, usize),
    eps: f32,
    state: &mut DeltaState,
    x: &Batch,
) -> Result<Batch> {
    let s = ctx.tensors;
    let a = |n: &str| format!("{prefix}.{n}");
    let w_qkv = s.get(&a("in_proj_qkv.weight"))?.matrix(d.conv_dim(), h)?;
    let w_z = s.get(&a("in_proj_z.weight"))?.matrix(d.value_dim(), h)?;
    let w_b = s.get(&a("in_proj_b.weight"))?.matrix(d.v_heads, h)?;
    let w_a = s.get(&a("in_proj_a.weight"))?.matrix(d.v_heads, h)?;
    let conv = conv_weight(s, &a("conv1d.weight"), d.conv_dim(), d.kernel)?;
    let dt_bias = s.get(&a("dt_bias"))?.vector(d.v_heads)?;
    let rates = Rates::of(s, prefix, d.v_heads)?;
    let norm_w = s.get(&a("norm.weight"))?.vector(d.dv)?;
    let w_out = s.get(&a("out_proj.weight"))?.matrix(h, d.value_dim())?;
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
        kernel: d.kernel,
        k_heads: d.k_heads,
        v_heads: d.v_heads,
        dk: d.dk,
        dv: d.dv,
        eps,
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
            isa, &dims, state, conv, dt_bias, rates, norm_w, &p,
        ));
    }
    ctx.profile.add("deltanet recurrence", t0.elapsed());
    ctx.linear("deltanet out", w_out, None, &out)
}

/// The depthwise convolution's weight `[conv_dim, 1, kernel]` as a `[conv_dim, kernel]` matrix.
pub(crate) fn conv_weight<'s>(
    s: &'s TensorStore,
    name: &str,
    channels: usize,
    kernel: usize,
) -> Result<MatrixRef<'s>> {
    let t = s.get(name)?;
    // `[1, channels, 1, kernel]` and `[channels, kernel]`: the same values as GGUFs of
    // glm5-next and of qwen3next hold them.
    if t.shape() != [channels, 1, kernel]
        && t.shape() != [1, channels, 1, kernel]
        && t.shape() != [channels, kernel]
    {
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

/// One token's causal depthwise convolution over `[history (oldest first), mixed]` of every
/// channel (`weight(ch)`: its `kernel` taps), then SiLU; the history advanced by `mixed`.
/// Gated DeltaNet's and KDA's.
pub(crate) fn conv_silu<'w>(
    isa: Isa,
    state: &mut DeltaState,
    weight: impl Fn(usize) -> WeightSlice<'w>,
    kernel: usize,
    mixed: &[f32],
) -> Vec<f32> {
    let mut win = vec![0.0f32; kernel];
    let mut w = vec![0.0f32; kernel];
    let c: Vec<f32> = (0..mixed.len())
        .map(|ch| {
            for (j, v) in win.iter_mut().enumerate() {
                *v = if j + 1 < kernel {
                    state.conv[j][ch]
                } else {
                    mixed[ch]
                };
            }
            let row = weight(ch);
            for (j, v) in w.iter_mut().enumerate() {
                *v = row.get(j);
            }
            canon::silu(isa.dot_f32(&w, &win))
        })
        .collect();
    if kernel > 1 {
        state.conv.remove(0);
        state.conv.push(mixed.to_vec());
    }
    c
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
    rates: Rates<'_>,
    norm_w: WeightSlice<'_>,
    p: &DeltaToken<'_>,
) -> Vec<f32> {
    let c = conv_silu(isa, state, |ch| conv.row(ch), d.kernel, p.mixed);
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
        let g = -rates.get(h) * canon::softplus(p.a[h] + dt_bias.get(h));
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
        // The same rates stored as a GGUF stores them (`−exp(A_log)`, here tarfa's own
        // exponential): the negation back is exact, so the same bits.
        let neg_a: Vec<f32> = a_log.iter().map(|&x| -canon::exp(x)).collect();
        for isa in Isa::available_all() {
            let run = |rates: Rates<'_>| -> Vec<Vec<f32>> {
                let mut state = DeltaState {
                    conv: vec![vec![0.0; ch]; d.kernel - 1],
                    s: vec![vec![0.0; d.dk * d.dv]; d.v_heads],
                };
                toks.iter()
                    .map(|(m, z, b, a)| {
                        let p = DeltaToken { mixed: m, z, b, a };
                        delta_step(
                            isa,
                            &d,
                            &mut state,
                            conv_m,
                            WeightSlice::F32(&dt_bias),
                            rates,
                            WeightSlice::F32(&norm_w),
                            &p,
                        )
                    })
                    .collect()
            };
            let ours = run(Rates::Log(WeightSlice::F32(&a_log)));
            let from_neg = run(Rates::Neg(WeightSlice::F32(&neg_a)));
            assert!(
                ours.iter()
                    .flatten()
                    .zip(from_neg.iter().flatten())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{isa:?}: rates from -exp(A_log) give other bits"
            );
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
