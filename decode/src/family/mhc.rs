//! Manifold-constrained hyper-connections (mHC: GLM-5.3-Flash's residual), as transformers 5.17
//! computes them in `f32` (`Glm5NextTextHyperConnection`, `Glm5NextTextHyperHead`).
//!
//! The residual is `H` streams (`hc_mult`) of the hidden width, each starting as the token's
//! embedding. Before each sublayer (attention, MLP) the streams, flattened stream-major to
//! `x [H·D]`, give the mixing weights of that site (`hc_{attn,ffn}_{fn,base,scale}`):
//!
//! - `mix = fn · (x · rsqrt(mean(x²) + rms_norm_eps))`, `(2 + H)·H` values;
//! - `pre[h] = sigmoid(mix[h] · scale[0] + base[h]) + hc_eps`;
//! - `post[h] = 2 · sigmoid(mix[H + h] · scale[1] + base[H + h])`;
//! - `comb[i][j] = softmax_j(mix[2H + iH + j] · scale[2] + base[2H + iH + j]) + hc_eps`, then
//!   each column divided by its sum `+ hc_eps`, then `hc_sinkhorn_iters − 1` times each row and
//!   then each column (Sinkhorn–Knopp);
//!
//! the sublayer's input is `Σ_h pre[h] · x_h`, and its output `y` becomes the streams
//! `x'_h = post[h] · y + Σ_k comb[k][h] · x_k`. After the last layer the streams' mean is normed
//! and projected to the logits.
//!
//! Canonical order (`spec/EXACTNESS.md`): `fn`'s products are canonical dots; each row and
//! column sum of `comb` is [`canon::sum`] of its `H` values in index order; the stream sums
//! `Σ_h` run left to right from stream 0, in `f32`, unfused; the mean is that sum divided by `H`.

use crate::blocks::Batch;
use crate::canon;
use crate::error::Result;
use crate::family::common::{self, NormStyle, Skeleton};
use crate::family::Ctx;
use crate::weights::{TensorStore, WeightSlice};

/// The hyper-connections' form.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HyperSpec {
    /// `hc_mult`: streams.
    pub streams: usize,
    /// `hc_eps`: the floor added to `pre` and `comb` and to `comb`'s sums.
    pub eps: f32,
    /// `hc_sinkhorn_iters` (at least 1).
    pub iters: usize,
    /// The input norm's epsilon (`rms_norm_eps`).
    pub norm_eps: f32,
}

impl HyperSpec {
    /// Mixing weights per site: `(2 + H)·H`.
    pub fn mix(&self) -> usize {
        (2 + self.streams) * self.streams
    }
}

/// The two sites of a layer, and their tensor-name stems.
const SITES: [&str; 2] = ["hc_attn", "hc_ffn"];

/// Every tensor of both sites of layer `l` (under `layer`, e.g. `model.layers.3.`) exists with
/// its shape.
pub fn check(s: &TensorStore, layer: &str, hc: &HyperSpec, hidden: usize) -> Result<()> {
    for site in SITES {
        s.get(&format!("{layer}{site}_fn"))?
            .matrix(hc.mix(), hc.streams * hidden)?;
        s.get(&format!("{layer}{site}_base"))?.vector(hc.mix())?;
        s.get(&format!("{layer}{site}_scale"))?.vector(3)?;
    }
    Ok(())
}

/// One site's weights for one token.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    /// How much of each stream goes into the sublayer's input.
    pub pre: Vec<f32>,
    /// How much of the sublayer's output goes into each stream.
    pub post: Vec<f32>,
    /// `comb[k·H + h]`: how much of stream `k` goes into stream `h`.
    pub comb: Vec<f32>,
}

/// One token's mixing weights from its `mix` values (`fn · norm(x)`). Public for the GPU
/// kernels' test (cuda-emu), as are [`collapse_one`], [`expand_one`] and [`streams_mean`].
pub fn weights(hc: &HyperSpec, mix: &[f32], base: WeightSlice<'_>, scale: WeightSlice<'_>) -> Mix {
    let n = hc.streams;
    let (s0, s1, s2) = (scale.get(0), scale.get(1), scale.get(2));
    let pre = (0..n)
        .map(|h| canon::sigmoid(mix[h] * s0 + base.get(h)) + hc.eps)
        .collect();
    let post = (0..n)
        .map(|h| 2.0 * canon::sigmoid(mix[n + h] * s1 + base.get(n + h)))
        .collect();
    let mut comb: Vec<f32> = (0..n * n)
        .map(|i| mix[2 * n + i] * s2 + base.get(2 * n + i))
        .collect();
    for row in comb.chunks_exact_mut(n) {
        canon::softmax(row);
        for v in row.iter_mut() {
            *v += hc.eps;
        }
    }
    let rows = |c: &mut [f32]| {
        for row in c.chunks_exact_mut(n) {
            let d = canon::sum(row) + hc.eps;
            for v in row.iter_mut() {
                *v /= d;
            }
        }
    };
    let cols = |c: &mut [f32]| {
        let mut col = vec![0.0f32; n];
        for j in 0..n {
            for (i, v) in col.iter_mut().enumerate() {
                *v = c[i * n + j];
            }
            let d = canon::sum(&col) + hc.eps;
            for i in 0..n {
                c[i * n + j] /= d;
            }
        }
    };
    cols(&mut comb);
    for _ in 1..hc.iters {
        rows(&mut comb);
        cols(&mut comb);
    }
    Mix { pre, post, comb }
}

/// Site `site` of layer `layer` over the batch's streams `xs` (`[H·D]` per token): each token's
/// mixing weights and the sublayer's input `Σ_h pre[h] · x_h`.
fn collapse(
    ctx: &mut Ctx<'_>,
    (layer, site): (&str, &str),
    hc: &HyperSpec,
    hidden: usize,
    xs: &Batch,
) -> Result<(Vec<Mix>, Batch)> {
    let s = ctx.tensors;
    let w_fn = s
        .get(&format!("{layer}{site}_fn"))?
        .matrix(hc.mix(), hc.streams * hidden)?;
    let base = s.get(&format!("{layer}{site}_base"))?.vector(hc.mix())?;
    let scale = s.get(&format!("{layer}{site}_scale"))?.vector(3)?;
    let isa = ctx.isa;
    let normed: Batch = xs
        .iter()
        .map(|x| {
            let mut o = vec![0.0f32; x.len()];
            isa.rms_norm(x, |_| 1.0, hc.norm_eps, &mut o);
            o
        })
        .collect();
    let mix = ctx.linear("hyper-connection mix", w_fn, None, &normed)?;
    let mixes: Vec<Mix> = mix.iter().map(|m| weights(hc, m, base, scale)).collect();
    let collapsed = xs
        .iter()
        .zip(&mixes)
        .map(|(x, m)| collapse_one(hc, hidden, m, x))
        .collect();
    Ok((mixes, collapsed))
}

/// One token's sublayer input from its streams `x` (`[H·D]`): `Σ_h pre[h] · x_h`, left to right
/// from stream 0, each product rounded, then the sum.
pub fn collapse_one(hc: &HyperSpec, hidden: usize, m: &Mix, x: &[f32]) -> Vec<f32> {
    (0..hidden)
        .map(|d| {
            let mut acc = m.pre[0] * x[d];
            for h in 1..hc.streams {
                acc += m.pre[h] * x[h * hidden + d];
            }
            acc
        })
        .collect()
}

/// One token's streams `x` after a sublayer whose output is `y`:
/// `x'_h = post[h] · y + Σ_k comb[k][h] · x_k` (the sum left to right from stream 0).
pub fn expand_one(hc: &HyperSpec, hidden: usize, m: &Mix, x: &mut [f32], y: &[f32]) {
    let n = hc.streams;
    let old = x.to_vec();
    for h in 0..n {
        for d in 0..hidden {
            let mut acc = m.comb[h] * old[d];
            for k in 1..n {
                acc += m.comb[k * n + h] * old[k * hidden + d];
            }
            x[h * hidden + d] = m.post[h] * y[d] + acc;
        }
    }
}

/// The streams after a sublayer whose output is `ys` ([`expand_one`] for each token).
fn expand(hc: &HyperSpec, hidden: usize, mixes: &[Mix], xs: &mut Batch, ys: &Batch) {
    for ((x, m), y) in xs.iter_mut().zip(mixes).zip(ys) {
        expand_one(hc, hidden, m, x, y);
    }
}

/// One token's streams' mean (`[D]`): their sum left to right from stream 0, divided by `H`.
pub fn streams_mean(hc: &HyperSpec, hidden: usize, x: &[f32]) -> Vec<f32> {
    let n = hc.streams as f32;
    (0..hidden)
        .map(|d| {
            let mut acc = x[d];
            for k in 1..hc.streams {
                acc += x[k * hidden + d];
            }
            acc / n
        })
        .collect()
}

/// The decoder skeleton with hyper-connections: the embedding copied into every stream, then per
/// layer the attention site (`input_layernorm` of the collapsed streams, the token mixer) and the
/// MLP site (`post_attention_layernorm`, the MLP), each expanded back into the streams; then the
/// streams' mean, the final `norm` and the logits.
pub fn decoder_forward<'c>(
    ctx: &mut Ctx<'c>,
    sk: &Skeleton<'_>,
    hc: &HyperSpec,
    tokens: &[u32],
    all_logits: bool,
    mut mixer: impl FnMut(&mut Ctx<'c>, usize, &Batch) -> Result<Batch>,
    mut mlp: impl FnMut(&mut Ctx<'c>, usize, &Batch) -> Result<Batch>,
) -> Result<Batch> {
    let s = ctx.tensors;
    let (h, eps, pre) = (sk.hidden, sk.eps, sk.prefix);
    let embedded = common::embed(s, &format!("{pre}embed_tokens.weight"), sk.vocab, h, tokens)?;
    let mut x: Batch = embedded.iter().map(|e| e.repeat(hc.streams)).collect();
    for l in 0..sk.layers {
        let layer = format!("{pre}layers.{l}.");
        let (mixes, c) = collapse(ctx, (&layer, SITES[0]), hc, h, &x)?;
        let w_in = s
            .get(&format!("{layer}input_layernorm.weight"))?
            .vector(h)?;
        let xn = common::norm(ctx, sk.norm, &c, w_in, eps);
        let a = mixer(ctx, l, &xn)?;
        expand(hc, h, &mixes, &mut x, &a);
        let (mixes, c) = collapse(ctx, (&layer, SITES[1]), hc, h, &x)?;
        let w_post = s
            .get(&format!("{layer}post_attention_layernorm.weight"))?
            .vector(h)?;
        let xn = common::norm(ctx, sk.norm, &c, w_post, eps);
        let m = mlp(ctx, l, &xn)?;
        expand(hc, h, &mixes, &mut x, &m);
    }
    let mean: Batch = x.iter().map(|x| streams_mean(hc, h, x)).collect();
    let w_norm = s.get(&format!("{pre}norm.weight"))?.vector(h)?;
    common::logits(
        ctx,
        &mean,
        (NormStyle::Weight, w_norm, eps),
        sk.head,
        all_logits,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Sinkhorn iterations leave `comb` doubly stochastic up to `hc_eps`, whatever the
    /// logits; `pre` and `post` are in their ranges.
    #[test]
    fn sinkhorn_gives_a_doubly_stochastic_mix() {
        let hc = HyperSpec {
            streams: 4,
            eps: 1e-6,
            iters: 20,
            norm_eps: 1e-5,
        };
        let mix: Vec<f32> = (0..hc.mix())
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7)
            .collect();
        let base = vec![0.1f32; hc.mix()];
        let scale = [1.0f32, 0.5, 2.0];
        let m = weights(&hc, &mix, WeightSlice::F32(&base), WeightSlice::F32(&scale));
        for h in 0..4 {
            assert!(m.pre[h] > 0.0 && m.pre[h] <= 1.0 + 1e-6);
            assert!(m.post[h] > 0.0 && m.post[h] < 2.0);
            let col: f32 = (0..4).map(|i| m.comb[i * 4 + h]).sum();
            let row: f32 = (0..4).map(|j| m.comb[h * 4 + j]).sum();
            assert!(
                (col - 1.0).abs() < 1e-4 && (row - 1.0).abs() < 1e-3,
                "{row} {col}"
            );
        }
    }
}
