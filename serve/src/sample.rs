//! Choosing a token from a step's logits, and its log-probabilities: greedy by default, or
//! sampled with a counter-based generator, so a request's tokens are a function of its logits,
//! its settings and its seed alone — never of what else runs or in which order.
//!
//! Sampling, in this order (the same bits on every machine: `f64` arithmetic in a fixed order and
//! tarfa's own `exp`, never the platform's libm):
//! 1. the candidates sorted by logit, highest first, ties to the lower id;
//! 2. `top_k` (0: all) keeps the first k;
//! 3. each candidate's weight `exp((l − l₀) / temperature)` (`l₀` the highest), summed in that
//!    order;
//! 4. `top_p` keeps the shortest prefix whose weight reaches `top_p` of the total (1: all);
//! 5. `min_p` keeps those whose weight is at least `min_p` of the highest's (0: all);
//! 6. `u ∈ [0, 1)` from the generator keyed by (seed, choice, position): the first candidate whose
//!    running weight exceeds `u · total` of what is kept.
//!
//! Log-probabilities are the fp32 log-softmax of the logits: `l − m − ln Σ exp(l − m)`, the sum in
//! the canonical order of `tarfa_decode::canon`.

use tarfa_decode::canon;

/// A request's sampling settings (temperature above 0).
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Divides the logits; above 0.
    pub temperature: f64,
    /// Keep the k likeliest (0: all).
    pub top_k: usize,
    /// Keep the likeliest whose probability reaches this (1: all).
    pub top_p: f64,
    /// Keep those at least this share of the likeliest's probability (0: all).
    pub min_p: f64,
    /// The generator's key.
    pub seed: u64,
}

/// SplitMix64's finaliser: a bijection of 64 bits that mixes every input bit into every output.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator: a uniform `[0, 1)` with 53 random bits for (seed, choice, position), a
/// counter-based draw that needs no state.
pub fn uniform(seed: u64, choice: u64, position: u64) -> f64 {
    let x = mix(mix(mix(seed) ^ choice) ^ position);
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// The token chosen from `logits`: the highest (ties to the lowest id) without sampling, else
/// drawn as this module says, at generated position `position` of choice `choice`.
pub fn choose(logits: &[f32], s: Option<&Sampling>, choice: u64, position: u64) -> u32 {
    let Some(s) = s else {
        return tarfa_decode::argmax(logits);
    };
    let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
    // Highest first, a NaN last (it never wins a draw), ties to the lower id: a total order.
    ids.sort_by(|&a, &b| {
        let (x, y) = (logits[a as usize], logits[b as usize]);
        x.is_nan()
            .cmp(&y.is_nan())
            .then(y.total_cmp(&x))
            .then(a.cmp(&b))
    });
    if s.top_k > 0 {
        ids.truncate(s.top_k);
    }
    let top = f64::from(logits[ids[0] as usize]);
    let weights: Vec<f64> = ids
        .iter()
        .map(|&i| {
            let l = f64::from(logits[i as usize]);
            if l.is_nan() {
                0.0
            } else {
                canon::exp_f64((l - top) / s.temperature)
            }
        })
        .collect();
    let total: f64 = weights.iter().sum();
    let mut keep = weights.len();
    if s.top_p < 1.0 {
        let mut run = 0.0;
        for (i, w) in weights.iter().enumerate() {
            run += w;
            if run >= s.top_p * total {
                keep = i + 1;
                break;
            }
        }
    }
    if s.min_p > 0.0 {
        keep = weights[..keep]
            .iter()
            .position(|&w| w < s.min_p * weights[0])
            .unwrap_or(keep)
            .max(1);
    }
    let kept: f64 = weights[..keep].iter().sum();
    let target = uniform(s.seed, choice, position) * kept;
    let mut run = 0.0;
    for (i, w) in weights[..keep].iter().enumerate() {
        run += w;
        if run > target {
            return ids[i];
        }
    }
    ids[keep - 1]
}

/// The fp32 log-softmax of `logits`.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|&l| canon::exp(l - m)).collect();
    let ln = canon::ln_f64(f64::from(canon::sum(&e)).max(f64::MIN_POSITIVE)) as f32;
    logits.iter().map(|&l| l - m - ln).collect()
}

/// The `n` likeliest of `lp` (log-probabilities), highest first, ties to the lower id.
pub fn top(lp: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut ids: Vec<u32> = (0..lp.len() as u32).collect();
    let n = n.min(ids.len());
    if n == 0 {
        return Vec::new();
    }
    // A total order (a NaN last), so the selection never meets an inconsistent comparison.
    let key = |i: u32| {
        let v = lp[i as usize];
        (v.is_nan(), -v)
    };
    let cmp = |a: &u32, b: &u32| {
        let (x, y) = (key(*a), key(*b));
        x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)).then(a.cmp(b))
    };
    ids.select_nth_unstable_by(n - 1, cmp);
    ids.truncate(n);
    ids.sort_by(cmp);
    ids.into_iter().map(|i| (i, lp[i as usize])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(temperature: f64, top_k: usize, top_p: f64, min_p: f64, seed: u64) -> Sampling {
        Sampling {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
        }
    }

    #[test]
    fn the_generator_is_a_function_of_its_key() {
        assert_eq!(uniform(1, 0, 5), uniform(1, 0, 5));
        assert_ne!(uniform(1, 0, 5), uniform(2, 0, 5));
        assert_ne!(uniform(1, 0, 5), uniform(1, 1, 5));
        assert_ne!(uniform(1, 0, 5), uniform(1, 0, 6));
        // Uniform enough: 10,000 draws, each tenth of [0, 1) within 15% of its share.
        let mut bins = [0u32; 10];
        for p in 0..10_000 {
            let u = uniform(42, 0, p);
            assert!((0.0..1.0).contains(&u));
            bins[(u * 10.0) as usize] += 1;
        }
        assert!(bins.iter().all(|&b| (850..1150).contains(&b)), "{bins:?}");
    }

    #[test]
    fn the_filters_keep_what_they_say() {
        let logits = [0.0f32, 5.0, 4.0, -1.0, 5.0];
        // Greedy: the highest, ties to the lower id.
        assert_eq!(choose(&logits, None, 0, 0), 1);
        // top_k 1 is greedy whatever the draw.
        for p in 0..50 {
            assert_eq!(choose(&logits, Some(&s(1.0, 1, 1.0, 0.0, 9)), 0, p), 1);
        }
        // top_k 2: only ids 1 and 4 (tied highest), both drawn.
        let drawn: std::collections::BTreeSet<u32> = (0..200)
            .map(|p| choose(&logits, Some(&s(1.0, 2, 1.0, 0.0, 9)), 0, p))
            .collect();
        assert_eq!(drawn, [1, 4].into());
        // min_p 0.5: exp(-1) < 0.5 drops id 2; ids 1 and 4 stay.
        let drawn: std::collections::BTreeSet<u32> = (0..200)
            .map(|p| choose(&logits, Some(&s(1.0, 0, 1.0, 0.5, 3)), 0, p))
            .collect();
        assert_eq!(drawn, [1, 4].into());
        // A high temperature reaches the unlikely ones.
        let drawn: std::collections::BTreeSet<u32> = (0..2000)
            .map(|p| choose(&logits, Some(&s(100.0, 0, 1.0, 0.0, 3)), 0, p))
            .collect();
        assert_eq!(drawn, [0, 1, 2, 3, 4].into());
        // top_p 0.3: the first weight alone is over 0.3 of the total, so only id 1.
        for p in 0..50 {
            assert_eq!(choose(&logits, Some(&s(1.0, 0, 0.3, 0.0, 1)), 0, p), 1);
        }
    }

    #[test]
    fn log_softmax_sums_to_one_and_top_is_ordered() {
        let lp = log_softmax(&[1.0, 2.0, 3.0, 3.0]);
        let total: f64 = lp.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert_eq!(
            top(&lp, 3).iter().map(|t| t.0).collect::<Vec<_>>(),
            [2, 3, 1]
        );
        assert!(top(&lp, 0).is_empty());
        assert_eq!(top(&lp, 9).len(), 4);
    }
}
