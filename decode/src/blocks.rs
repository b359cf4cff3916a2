//! Building blocks shared by the model families: linear layers, RMSNorm, grouped-query attention
//! with a KV cache, the softmax top-k router, SwiGLU experts and the expert combine. Each works on
//! a batch of tokens and computes every token exactly as it would alone (batch invariance): the
//! batch only shares weight reads, never a reduction.

use tarfa_format::Role;

use crate::canon;
use crate::error::{DecodeError, ExpertFault, Result};
use crate::experts::ExpertView;
use crate::kernels::{Isa, MatJob};
use crate::rope::Rope;
use crate::weights::{MatrixRef, WeightSlice};

/// A batch of activation vectors, one per token.
pub type Batch = Vec<Vec<f32>>;

/// `y_t = W x_t (+ b)` for every token: each output one canonical dot, the bias added after.
pub fn linear(isa: Isa, w: MatrixRef<'_>, bias: Option<WeightSlice<'_>>, xs: &[Vec<f32>]) -> Batch {
    let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    let mut out = vec![vec![0.0f32; w.rows]; xs.len()];
    isa.matmul(w, &refs, &mut out);
    if let Some(b) = bias {
        for y in &mut out {
            for (i, v) in y.iter_mut().enumerate() {
                *v += b.get(i);
            }
        }
    }
    out
}

/// Several linear layers of the same inputs in one parallel region (e.g. q, k and v).
pub fn linear_many(
    isa: Isa,
    layers: &[(MatrixRef<'_>, Option<WeightSlice<'_>>)],
    xs: &[Vec<f32>],
) -> Vec<Batch> {
    let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    let mut outs: Vec<Batch> = layers
        .iter()
        .map(|(w, _)| vec![vec![0.0f32; w.rows]; xs.len()])
        .collect();
    {
        let mut jobs: Vec<MatJob<'_, '_>> = layers
            .iter()
            .zip(outs.iter_mut())
            .map(|((m, _), out)| MatJob::new(*m, &refs, out))
            .collect();
        isa.matmul_many(&mut jobs);
    }
    for ((_, bias), out) in layers.iter().zip(outs.iter_mut()) {
        if let Some(b) = bias {
            for y in out.iter_mut() {
                for (i, v) in y.iter_mut().enumerate() {
                    *v += b.get(i);
                }
            }
        }
    }
    outs
}

/// `x += y` elementwise for every token (a residual connection).
pub fn add_into(xs: &mut [Vec<f32>], ys: &[Vec<f32>]) {
    for (x, y) in xs.iter_mut().zip(ys) {
        for (a, b) in x.iter_mut().zip(y) {
            *a += *b;
        }
    }
}

/// Shapes of one attention layer.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Keys attended to at most (sliding window), or `None` for all.
    pub window: Option<usize>,
}

/// Keys and values of one attention layer, post-RoPE, position-major.
#[derive(Clone, Debug, Default)]
pub struct KvCache {
    k: Vec<f32>,
    v: Vec<f32>,
    len: usize,
    /// Per position, what a sparse-attention indexer keeps of it (DSA: the indexer's key and
    /// pool-gate scores, [`crate::family::dsa`]); empty for other attention.
    pub index: Vec<Vec<f32>>,
    /// The indexer's keys of the complete pools of `index` computed so far, in order (a pool's
    /// key depends on its positions only; the indexer keeps those before the positions it
    /// replaces).
    pub pools: Vec<Vec<f32>>,
}

impl KvCache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keep the first `n` positions (forget every one at and after `n`), the indexer's too (its
    /// pool keys are dropped and made again from the positions kept).
    pub fn keep(&mut self, n: usize) {
        self.index.truncate(n);
        self.pools.clear();
        if n >= self.len {
            return;
        }
        let width = self.k.len() / self.len.max(1);
        self.truncate(n, width);
    }

    /// Forget every key and value at and after `pos` (not the indexer's: its layer appends
    /// them before the attention runs, and forgets its own).
    pub fn truncate(&mut self, pos: usize, width: usize) {
        self.len = self.len.min(pos);
        self.k.truncate(self.len * width);
        self.v.truncate(self.len * width);
    }
}

/// Attention of a batch of tokens at positions `start..start+T` (their q, k, v already normed and
/// rotated): append k and v to the cache, then for each token and head, scores over keys
/// `0..=p` (or the window), an `f32` softmax and the weighted sum of values, each reduction in
/// the canonical order. Returns the heads concatenated head-major, per token. Scores are scaled
/// by `1/√head_dim`.
pub fn attend(
    isa: Isa,
    shape: AttnShape,
    cache: &mut KvCache,
    start: usize,
    q: &[Vec<f32>],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
) -> Batch {
    // transformers: `head_dim**-0.5`, a Python float, met by f32 scores. 1/√d in f64 uses two
    // correctly rounded operations instead of a libm pow.
    let scaling = (1.0 / (shape.head_dim as f64).sqrt()) as f32;
    attend_scaled(isa, shape, scaling, cache, start, q, k, v)
}

/// [`attend`] with the scores scaled by `scaling` (DeepSeek's YaRN scales them further).
#[allow(clippy::too_many_arguments)]
pub fn attend_scaled(
    isa: Isa,
    shape: AttnShape,
    scaling: f32,
    cache: &mut KvCache,
    start: usize,
    q: &[Vec<f32>],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
) -> Batch {
    attend_with(isa, shape, scaling, None, cache, start, q, k, v)
}

/// [`attend_scaled`] over chosen positions: token `t` attends to `select[t]` (ascending, each at
/// most its own position) rather than every earlier position — DeepSeek sparse attention's
/// selection ([`crate::family::dsa`]). The softmax and the weighted sum run over them in
/// ascending order: the canonical reductions of exactly those keys.
#[allow(clippy::too_many_arguments)]
pub fn attend_selected(
    isa: Isa,
    shape: AttnShape,
    scaling: f32,
    cache: &mut KvCache,
    start: usize,
    q: &[Vec<f32>],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    select: &[Vec<usize>],
) -> Batch {
    attend_over(
        isa,
        shape,
        scaling,
        None,
        cache,
        start,
        [q, k, v],
        Some(select),
    )
}

/// [`attend_scaled`] with attention sinks: head `h`'s softmax runs over its scores and then
/// `sinks[h]` (the last element of the canonical sum and a candidate for the max), and the sink's
/// weight is dropped before the weighted sum of values (MiMo-V2-Flash, gpt-oss).
#[allow(clippy::too_many_arguments)]
pub fn attend_with(
    isa: Isa,
    shape: AttnShape,
    scaling: f32,
    sinks: Option<&[f32]>,
    cache: &mut KvCache,
    start: usize,
    q: &[Vec<f32>],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
) -> Batch {
    attend_over(isa, shape, scaling, sinks, cache, start, [q, k, v], None)
}

/// The attention core of [`attend_with`] and [`attend_selected`]: each token's keys are the
/// window's (or all earlier positions), or `select[t]` when given.
#[allow(clippy::too_many_arguments)]
fn attend_over(
    isa: Isa,
    shape: AttnShape,
    scaling: f32,
    sinks: Option<&[f32]>,
    cache: &mut KvCache,
    start: usize,
    [q, k, v]: [&[Vec<f32>]; 3],
    select: Option<&[Vec<usize>]>,
) -> Batch {
    let d = shape.head_dim;
    let width = shape.kv_heads * d;
    cache.truncate(start, width);
    debug_assert_eq!(cache.len, start);
    for (kt, vt) in k.iter().zip(v) {
        cache.k.extend_from_slice(kt);
        cache.v.extend_from_slice(vt);
        cache.len += 1;
    }
    let group = shape.heads / shape.kv_heads;
    let cache = &*cache;
    // One (token, head) per task: each head's scores, softmax and weighted sum on one thread.
    let head = |th: usize| -> Vec<f32> {
        let (t, h) = (th / shape.heads, th % shape.heads);
        let p = start + t;
        let first = match shape.window {
            Some(w) if p + 1 > w => p + 1 - w,
            _ => 0,
        };
        let chosen = select.map(|s| s[t].as_slice());
        let n = chosen.map_or(p + 1 - first, <[usize]>::len);
        let at = |i: usize| chosen.map_or(first + i, |c| c[i]);
        let kvh = h / group;
        let qh = &q[t][h * d..(h + 1) * d];
        let mut scores: Vec<f32> = (0..n)
            .map(|i| {
                let pos = at(i);
                let kk = &cache.k[pos * width + kvh * d..pos * width + (kvh + 1) * d];
                isa.dot_f32(kk, qh) * scaling
            })
            .collect();
        if let Some(s) = sinks {
            scores.push(s[h]);
        }
        isa.softmax(&mut scores);
        if sinks.is_some() {
            scores.pop();
        }
        let mut out = vec![0.0f32; d];
        isa.weighted_rows(
            &scores,
            |i| {
                let pos = at(i);
                &cache.v[pos * width + kvh * d..pos * width + (kvh + 1) * d]
            },
            &mut out,
        );
        out
    };
    // Tiny work (test-sized models, the first positions) on the calling thread. (At a threshold
    // of 2^19 the serial heads cost more at 16 threads than a parallel region:
    // `bench-logs/h200-2026-12-01-decode-d.log`.)
    let work = q.len() * shape.heads * (start + q.len()) * d;
    let heads: Vec<Vec<f32>> = if work < (1 << 15) {
        (0..q.len() * shape.heads).map(head).collect()
    } else {
        crate::team::map(q.len() * shape.heads, head)
    };
    heads.chunks(shape.heads).map(|hs| hs.concat()).collect()
}

/// Rotate every head of `x` (width `heads · head_dim`) for position `p`.
pub fn rope_heads(rope: &Rope, x: &mut [f32], head_dim: usize, p: usize) {
    for head in x.chunks_exact_mut(head_dim) {
        rope.apply(head, p);
    }
}

/// One token's routing: `(expert, weight)` in selection-slot order.
pub type Route = Vec<(u32, f32)>;

/// The softmax router with native top-k: `P = softmax(z)` (`f32`, canonical), the `k` largest in
/// descending order (ties: the lower expert id first), renormalised by their canonical sum when
/// `norm_topk_prob`.
pub fn softmax_topk(isa: Isa, logits: &[f32], k: usize, norm_topk_prob: bool) -> Route {
    let mut p = logits.to_vec();
    isa.softmax(&mut p);
    let mut idx: Vec<u32> = (0..p.len() as u32).collect();
    // Total order: probability descending, then id ascending (NaN never occurs after softmax of
    // finite logits; total_cmp keeps even that deterministic).
    idx.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]).then(a.cmp(&b)));
    let mut route: Route = idx[..k.min(idx.len())]
        .iter()
        .map(|&e| (e, p[e as usize]))
        .collect();
    if norm_topk_prob {
        let w: Vec<f32> = route.iter().map(|r| r.1).collect();
        let s = canon::sum(&w);
        for r in &mut route {
            r.1 /= s;
        }
    }
    route
}

/// Larger first; values that compare equal (`0.0 == -0.0`) are equal, as torch's `topk` sees
/// them; NaN (never produced from finite weights) still in a fixed place.
fn descending(a: f32, b: f32) -> std::cmp::Ordering {
    if a == b {
        std::cmp::Ordering::Equal
    } else {
        b.total_cmp(&a)
    }
}

/// GLM-4.5's router (DeepSeek-V3 style) on one token's router logits `z`:
/// `s = sigmoid(z)`; selection scores `c = s + bias`; experts in `n_group` equal groups, each
/// group scored by the sum of its two largest `c`; the `topk_group` best groups kept (ties: the
/// lower group), every other expert's `c` set to −∞ (transformers 5.17's `masked_fill`); the `k`
/// largest `c` selected in descending order (ties: the lower id). Weights are the *unbiased*
/// `s` of the selected experts, divided by `Σ s + 1e-20` when `norm_topk_prob`, then multiplied
/// by `scale` (`routed_scaling_factor`). The caller checks `n_group` divides the expert count
/// into groups of at least two.
pub fn sigmoid_group_topk(
    z: &[f32],
    bias: WeightSlice<'_>,
    k: usize,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    scale: f32,
) -> Route {
    let n = z.len();
    let s: Vec<f32> = z.iter().map(|&v| canon::sigmoid(v)).collect();
    let mut c: Vec<f32> = s
        .iter()
        .enumerate()
        .map(|(e, &v)| v + bias.get(e))
        .collect();
    let size = n / n_group.max(1);
    if n_group > 1 && size >= 2 {
        let score: Vec<f32> = c
            .chunks_exact(size)
            .map(|g| {
                let mut v = g.to_vec();
                v.sort_by(|&a, &b| descending(a, b));
                v[0] + v[1]
            })
            .collect();
        let mut groups: Vec<usize> = (0..score.len()).collect();
        groups.sort_by(|&a, &b| descending(score[a], score[b]).then(a.cmp(&b)));
        let mut keep = vec![false; score.len()];
        for &g in groups.iter().take(topk_group) {
            keep[g] = true;
        }
        for (e, v) in c.iter_mut().enumerate() {
            if !keep[e / size] {
                *v = f32::NEG_INFINITY;
            }
        }
    }
    let mut idx: Vec<u32> = (0..n as u32).collect();
    idx.sort_by(|&a, &b| descending(c[a as usize], c[b as usize]).then(a.cmp(&b)));
    let mut route: Route = idx[..k.min(n)]
        .iter()
        .map(|&e| (e, s[e as usize]))
        .collect();
    if norm_topk_prob {
        let w: Vec<f32> = route.iter().map(|r| r.1).collect();
        let denom = canon::sum(&w) + 1e-20f32;
        for r in &mut route {
            r.1 /= denom;
        }
    }
    for r in &mut route {
        r.1 *= scale;
    }
    route
}

/// The SwiGLU MLP `down(silu(gate x) ⊙ up x)` of each token, from separate gate/up matrices or a
/// fused gate_up (rows `0..I` gate, `I..2I` up); with a `limit`, the gate's and up's dots
/// clamped first ([`MatJob::clamped`]).
pub fn swiglu(
    isa: Isa,
    gate: MatrixRef<'_>,
    up: MatrixRef<'_>,
    down: MatrixRef<'_>,
    xs: &[Vec<f32>],
    limit: Option<f32>,
) -> Batch {
    let refs: Vec<&[f32]> = xs.iter().map(|x| x.as_slice()).collect();
    let mut h = vec![vec![0.0f32; gate.rows]; xs.len()];
    isa.matmul_many(&mut [MatJob::swiglu_gate(gate, up, &refs, &mut h).clamped(limit)]);
    linear(isa, down, None, &h)
}

/// The gate, up and down projections of a routed expert (fused gate_up split: rows `0..I` gate,
/// `I..2I` up), checked against the hidden size.
pub fn expert_projections<'a>(
    e: &ExpertView<'a>,
    hidden: usize,
) -> Result<(MatrixRef<'a>, MatrixRef<'a>, MatrixRef<'a>)> {
    let bad = |fault: ExpertFault| DecodeError::BadExpert {
        layer: e.layer,
        expert: e.expert,
        fault,
    };
    if let Some(r) = e
        .roles()
        .find(|r| !matches!(r, Role::Gate | Role::Up | Role::Down | Role::GateUp))
    {
        return Err(bad(ExpertFault::ForeignRole { role: r }));
    }
    let down = e.part(Role::Down).ok_or_else(|| bad(ExpertFault::NoDown))?;
    let (gate, up) = match (e.part(Role::Gate), e.part(Role::Up), e.part(Role::GateUp)) {
        (Some(g), Some(u), None) => (g, u),
        (None, None, Some(gu)) if gu.rows % 2 == 0 => {
            let i = gu.rows / 2;
            (gu.rows(0, i), gu.rows(i, 2 * i))
        }
        _ => return Err(bad(ExpertFault::NoGateUp)),
    };
    if gate.cols != hidden
        || up.cols != hidden
        || up.rows != gate.rows
        || down.cols != gate.rows
        || down.rows != hidden
    {
        return Err(bad(ExpertFault::ShapesMisfit {
            gate: [gate.rows, gate.cols],
            up: [up.rows, up.cols],
            down: [down.rows, down.cols],
            hidden,
        }));
    }
    Ok((gate, up, down))
}

/// The SwiGLU of several routed experts, each over the tokens routed to it: the gate and up
/// products of all of them, with the SiLU gate (clamped with a `limit`), in one parallel region;
/// the down products in a second. Each output
/// is computed exactly as [`swiglu`] computes it alone.
pub fn experts_swiglu(
    isa: Isa,
    experts: &[(ExpertView<'_>, &[Vec<f32>])],
    hidden: usize,
    limit: Option<f32>,
) -> Result<Vec<Batch>> {
    let proj = experts
        .iter()
        .map(|(e, _)| expert_projections(e, hidden))
        .collect::<Result<Vec<_>>>()?;
    let inputs: Vec<Vec<&[f32]>> = experts
        .iter()
        .map(|(_, xs)| xs.iter().map(|x| x.as_slice()).collect())
        .collect();
    let mut h: Vec<Batch> = proj
        .iter()
        .zip(experts)
        .map(|(p, (_, xs))| vec![vec![0.0f32; p.0.rows]; xs.len()])
        .collect();
    {
        let mut jobs: Vec<MatJob<'_, '_>> = proj
            .iter()
            .zip(&inputs)
            .zip(h.iter_mut())
            .map(|((p, x), out)| MatJob::swiglu_gate(p.0, p.1, x, out).clamped(limit))
            .collect();
        isa.matmul_many(&mut jobs);
    }
    let h_refs: Vec<Vec<&[f32]>> = h
        .iter()
        .map(|b| b.iter().map(|x| x.as_slice()).collect())
        .collect();
    let mut y: Vec<Batch> = h
        .iter()
        .map(|b| vec![vec![0.0f32; hidden]; b.len()])
        .collect();
    {
        let mut jobs: Vec<MatJob<'_, '_>> = proj
            .iter()
            .zip(&h_refs)
            .zip(y.iter_mut())
            .map(|((p, x), out)| MatJob::new(p.2, x, out))
            .collect();
        isa.matmul_many(&mut jobs);
    }
    Ok(y)
}

/// Routed experts' outputs, by token and selection slot, combined in slot order.
#[derive(Debug)]
pub struct MoeOutputs {
    slots: Vec<Vec<Option<Vec<f32>>>>,
}

impl MoeOutputs {
    /// Room for `routes` (one per token).
    pub fn new(routes: &[Route]) -> MoeOutputs {
        MoeOutputs {
            slots: routes.iter().map(|r| vec![None; r.len()]).collect(),
        }
    }

    /// Store `y · w` (each product rounded) for token `t`, slot `k`.
    pub fn put(&mut self, t: usize, k: usize, y: &[f32], w: f32) {
        self.slots[t][k] = Some(y.iter().map(|&v| v * w).collect());
    }

    /// `Σ_k contribution_k` per token, added in slot order starting from slot 0. Every slot must
    /// have been filled.
    pub fn combine(self) -> Batch {
        self.slots
            .into_iter()
            .map(|slots| {
                let mut it = slots
                    .into_iter()
                    .map(|s| s.expect("every routed slot computed"));
                let mut acc = it.next().unwrap_or_default();
                for c in it {
                    for (a, b) in acc.iter_mut().zip(&c) {
                        *a += *b;
                    }
                }
                acc
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A KV cache keeps the first n positions (its rows for k and v), forgets the rest, and
    /// keeping more than it holds changes nothing.
    #[test]
    fn a_kv_cache_keeps_a_prefix() {
        let mut c = KvCache {
            k: (0..10).map(|i| i as f32).collect(),
            v: (10..20).map(|i| i as f32).collect(),
            len: 5,
            index: (0..5).map(|i| vec![i as f32]).collect(),
            pools: Vec::new(),
        };
        c.keep(9);
        assert_eq!(
            (c.len(), c.k.len(), c.v.len(), c.index.len()),
            (5, 10, 10, 5)
        );
        c.keep(2);
        assert_eq!((c.len(), c.index.len()), (2, 2));
        assert_eq!(c.k, [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(c.v, [10.0, 11.0, 12.0, 13.0]);
        c.keep(0);
        assert!(c.is_empty() && c.k.is_empty() && c.v.is_empty());
    }

    fn logit(p: f32) -> f32 {
        // sigmoid⁻¹, so tests can state scores directly.
        (p / (1.0 - p)).ln()
    }

    /// Experts of dropped groups are masked with −∞ (transformers 5.17's `masked_fill`), not 0:
    /// with every selection score of the kept groups below 0, a 0 mask would pick experts 0 and
    /// 1 of a dropped group. transformers' `DeepseekV3TopkRouter` on these biases, zero logits,
    /// 4 groups keeping 2, top-2 and renormalisation gives experts [4, 5], weights [0.5, 0.5].
    #[test]
    fn dropped_groups_are_masked_below_any_score() {
        let bias = [-0.9f32, -0.8, -0.6, -0.65, -0.52, -0.55, -2.0, -2.1];
        let r = sigmoid_group_topk(&[0.0; 8], WeightSlice::F32(&bias), 2, 4, 2, true, 1.0);
        assert_eq!(r, vec![(4, 0.5), (5, 0.5)]);
    }

    #[test]
    fn group_limited_routing_changes_the_choice_and_weights_ignore_the_bias() {
        // 8 experts in 4 groups of 2. Scores: group 0 has the single best expert (0.95) but a weak
        // partner; group 2 has two good ones.
        let s = [0.95f32, 0.10, 0.60, 0.55, 0.80, 0.79, 0.20, 0.15];
        let z: Vec<f32> = s.iter().map(|&p| logit(p)).collect();
        let zero = [0.0f32; 8];
        let bias = WeightSlice::F32(&zero);
        // Without groups: the two best experts overall.
        let all = sigmoid_group_topk(&z, bias, 2, 1, 1, false, 1.0);
        assert_eq!(all.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 4]);
        // One group kept of 4: group 2 (0.80 + 0.79) beats group 0 (0.95 + 0.10).
        let one = sigmoid_group_topk(&z, bias, 2, 4, 1, false, 1.0);
        assert_eq!(one.iter().map(|r| r.0).collect::<Vec<_>>(), vec![4, 5]);
        // Two groups kept: 2 and then 1 (0.60 + 0.55 > 0.95 + 0.10): still experts 4 and 5.
        let two = sigmoid_group_topk(&z, bias, 2, 4, 2, false, 1.0);
        assert_eq!(two.iter().map(|r| r.0).collect::<Vec<_>>(), vec![4, 5]);
        // Three groups kept: group 0 is back, and with it expert 0.
        let three = sigmoid_group_topk(&z, bias, 2, 4, 3, false, 1.0);
        assert_eq!(three.iter().map(|r| r.0).collect::<Vec<_>>(), vec![0, 4]);
        // The correction bias moves the selection, never the weights.
        let mut b = [0.0f32; 8];
        b[7] = 1.0;
        let biased = sigmoid_group_topk(&z, WeightSlice::F32(&b), 2, 1, 1, false, 1.0);
        assert_eq!(biased[0].0, 7);
        assert_eq!(biased[0].1, canon::sigmoid(z[7]));
    }

    #[test]
    fn renormalisation_adds_the_tiny_epsilon_and_scaling_follows_it() {
        let z = [0.3f32, -1.0, 2.0, 0.5];
        let zero = [0.0f32; 4];
        let r = sigmoid_group_topk(&z, WeightSlice::F32(&zero), 2, 1, 1, true, 2.5);
        let (a, b) = (canon::sigmoid(2.0), canon::sigmoid(0.5));
        let d = canon::sum(&[a, b]) + 1e-20f32;
        assert_eq!(r, vec![(2, a / d * 2.5), (3, b / d * 2.5)]);
    }

    #[test]
    fn experts_of_dropped_groups_are_never_chosen() {
        let z = [0.0f32; 4];
        let b = [-2.0f32, -2.0, -0.1, -0.2];
        let r = sigmoid_group_topk(&z, WeightSlice::F32(&b), 2, 2, 1, false, 1.0);
        // Group 1 (0.4 + 0.3) is kept.
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 3]);
        let b = [-0.1f32, -0.1, -0.9, -0.9];
        let r = sigmoid_group_topk(&z, WeightSlice::F32(&b), 2, 2, 1, false, 1.0);
        // Group 0 kept (0.4 + 0.4); k = 2 takes the kept pair.
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
        let b = [-0.6f32, -0.7, -0.9, -0.95];
        let r = sigmoid_group_topk(&z, WeightSlice::F32(&b), 2, 2, 1, false, 1.0);
        // Group 0 kept though both its scores are negative (−0.1, −0.2): the masked experts 2
        // and 3 (−∞) are never chosen. (A 0 mask, tarfa's rule before 2026-12-07, chose them.)
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![0, 1]);
    }
}
