//! DeepSeek sparse attention's indexer with k-pools (GLM-5.3-Flash's DSA layers), as transformers
//! 5.17 computes it in `f32` (`Glm5NextTextIndexer`): which earlier positions each query attends
//! to.
//!
//! Per token, under `{prefix}.indexer`: the indexer key `k = LayerNorm(wk · x)` (weight, bias,
//! eps 1e-6), the pool-gate scores `s = index_kpool_compress_gate · x`, the query heads
//! `q = wq_b · q_resid` (`q_resid` = the attention's normed `q_a_proj · x`) and the head weights
//! `w = weights_proj · x · index_n_heads^-0.5`. Positions fall into pools of `index_kpool` from
//! position 0; a complete pool `j` has the key `K_j[c] = Σ_i softmax_i(s_i[c] + ape[i][c]) ·
//! k_i[c]` over its tokens `i` (`index_kpool_compress_ape`). A query at position `p` scores each
//! complete pool ending at or before `p`: `Σ_h w[h] · relu(q_h · K_j · index_head_dim^-0.5)`,
//! keeps the best `index_topk / index_kpool` of them, and attends to their positions and to the
//! positions of its own pool while that pool is incomplete (`p − p mod kpool ..= p` when
//! `(p + 1) mod kpool ≠ 0`: the tail, always selected; a complete pool, its own included, is only
//! a candidate).
//!
//! The tie rule (`spec/EXACTNESS.md`): pools are ranked by score, higher first, and equal scores
//! by position, earlier first. (torch's `topk` leaves ties unspecified.) Each reduction is
//! canonical: the dots, the heads' weighted sum (a dot over the heads), the pool softmax and its
//! weighted sum over the pool's tokens in order, LayerNorm's sums.

use crate::blocks::{Batch, KvCache};
use crate::canon;
use crate::error::Result;
use crate::family::Ctx;
use crate::kernels::Isa;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// One DSA indexer's widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DsaShape {
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_head_dim`.
    pub dim: usize,
    /// `index_topk`: positions selected (a multiple of `pool`).
    pub topk: usize,
    /// `index_kpool`: positions per pool.
    pub pool: usize,
    /// `q_lora_rank`: the width of `q_resid`.
    pub q_rank: usize,
}

/// Every tensor [`select`] reads under `prefix` (the attention's, e.g.
/// `model.layers.1.self_attn`) exists with its shape.
pub fn check(s: &TensorStore, prefix: &str, d: &DsaShape, hidden: usize) -> Result<()> {
    let p = |n: &str| format!("{prefix}.indexer.{n}");
    s.get(&p("wq_b.weight"))?
        .matrix(d.heads * d.dim, d.q_rank)?;
    s.get(&p("wk.weight"))?.matrix(d.dim, hidden)?;
    s.get(&p("k_norm.weight"))?.vector(d.dim)?;
    s.get(&p("k_norm.bias"))?.vector(d.dim)?;
    s.get(&p("weights_proj.weight"))?.matrix(d.heads, hidden)?;
    s.get(&p("index_kpool_compress_ape"))?
        .matrix(d.pool, d.dim)?;
    s.get(&p("index_kpool_compress_gate"))?
        .matrix(d.dim, hidden)?;
    Ok(())
}

/// torch's `relu`: negatives (and −0) to +0, a NaN kept.
fn relu(x: f32) -> f32 {
    if x > 0.0 || x.is_nan() {
        x
    } else {
        0.0
    }
}

/// LayerNorm with weight and bias: `(x − mean) · (1 / √(var + eps)) · w + b`, the mean and the
/// (biased) variance canonical sums divided by the width.
fn layer_norm(isa: Isa, x: &[f32], w: WeightSlice<'_>, b: WeightSlice<'_>, eps: f32) -> Vec<f32> {
    let n = x.len() as f32;
    let mean = canon::sum(x) / n;
    let centred: Vec<f32> = x.iter().map(|&v| v - mean).collect();
    let var = isa.dot_f32(&centred, &centred) / n;
    let r = 1.0 / (var + eps).sqrt();
    centred
        .iter()
        .enumerate()
        .map(|(i, &c)| c * r * w.get(i) + b.get(i))
        .collect()
}

/// The positions each token of the batch (at `start..`) attends to, ascending; the tokens'
/// indexer keys and gate scores appended to `cache.index` (its positions `start..` replaced).
/// `x` is the attention's input and `q_resid` its normed query LoRA.
pub fn select(
    ctx: &mut Ctx<'_>,
    prefix: &str,
    (d, hidden): (&DsaShape, usize),
    cache: &mut KvCache,
    start: usize,
    (x, q_resid): (&Batch, &Batch),
) -> Result<Vec<Vec<usize>>> {
    let s = ctx.tensors;
    let p = |n: &str| format!("{prefix}.indexer.{n}");
    let m = |n: &str, rows: usize, cols: usize| -> Result<MatrixRef<'_>> {
        s.get(&p(n))?.matrix(rows, cols)
    };
    let mut proj = ctx.linear_many(
        "dsa indexer projections",
        &[
            (m("wk.weight", d.dim, hidden)?, None),
            (m("index_kpool_compress_gate", d.dim, hidden)?, None),
            (m("weights_proj.weight", d.heads, hidden)?, None),
        ],
        x,
    )?;
    let head_w = proj.pop().expect("three outputs");
    let gates = proj.pop().expect("three outputs");
    let keys = proj.pop().expect("three outputs");
    let q = ctx.linear(
        "dsa indexer query",
        m("wq_b.weight", d.heads * d.dim, d.q_rank)?,
        None,
        q_resid,
    )?;
    let t0 = std::time::Instant::now();
    let isa = ctx.isa;
    let (nw, nb) = (
        s.get(&p("k_norm.weight"))?.vector(d.dim)?,
        s.get(&p("k_norm.bias"))?.vector(d.dim)?,
    );
    let ape = m("index_kpool_compress_ape", d.pool, d.dim)?;
    cache.index.truncate(start);
    for (k, g) in keys.iter().zip(&gates) {
        let mut packed = layer_norm(isa, k, nw, nb, 1e-6);
        packed.extend_from_slice(g);
        cache.index.push(packed);
    }
    // Every complete pool's key, once: those before `start` are kept from earlier calls (a
    // pool's key depends on its positions only), the others computed now.
    let pools = cache.index.len() / d.pool;
    cache.pools.truncate(start / d.pool);
    for j in cache.pools.len()..pools {
        let toks = &cache.index[j * d.pool..(j + 1) * d.pool];
        let mut key = vec![0.0f32; d.dim];
        let mut logits = vec![0.0f32; d.pool];
        for (c, kc) in key.iter_mut().enumerate() {
            for (i, l) in logits.iter_mut().enumerate() {
                *l = toks[i][d.dim + c] + ape.row(i).get(c);
            }
            canon::softmax(&mut logits);
            let mut acc = logits[0] * toks[0][c];
            for i in 1..d.pool {
                acc += logits[i] * toks[i][c];
            }
            *kc = acc;
        }
        cache.pools.push(key);
    }
    let pool_keys = &cache.pools;
    let scale = (1.0 / (d.dim as f64).sqrt()) as f32;
    let heads_scale = (1.0 / (d.heads as f64).sqrt()) as f32;
    let keep = d.topk / d.pool;
    let picks = (0..x.len())
        .map(|t| {
            let pos = start + t;
            let complete = (pos + 1) / d.pool;
            let w: Vec<f32> = head_w[t].iter().map(|&v| v * heads_scale).collect();
            let mut scored: Vec<(f32, usize)> = (0..complete)
                .map(|j| {
                    let relu: Vec<f32> = q[t]
                        .chunks_exact(d.dim)
                        .map(|qh| relu(isa.dot_f32(qh, &pool_keys[j]) * scale))
                        .collect();
                    (isa.dot_f32(&w, &relu), j)
                })
                .collect();
            // Higher score first, then the earlier pool; -0 is 0, and a NaN ranks above every
            // number (as in torch's topk).
            let rank = |v: f32| match v {
                v if v.is_nan() => f32::INFINITY,
                0.0 => 0.0,
                v => v,
            };
            scored.sort_by(|a, b| rank(b.0).total_cmp(&rank(a.0)).then(a.1.cmp(&b.1)));
            scored.truncate(keep);
            let mut chosen: Vec<usize> = scored.iter().map(|&(_, j)| j).collect();
            chosen.sort_unstable();
            let mut positions: Vec<usize> = chosen
                .iter()
                .flat_map(|&j| j * d.pool..(j + 1) * d.pool)
                .collect();
            positions.extend(complete * d.pool..=pos);
            positions
        })
        .collect();
    ctx.profile.add("dsa indexer", t0.elapsed());
    Ok(picks)
}
