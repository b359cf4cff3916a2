//! The canonical reduction order and tarfa's own elementwise functions: the scalar reference.
//!
//! `spec/EXACTNESS.md` ("The canonical reduction order") is the normative text; this module is
//! its slow, obvious implementation, the one every fast path (AVX2, AVX-512, later CUDA) is
//! tested against bit for bit. Everything here is built from IEEE-754 operations that every
//! target rounds the same way — add, multiply, divide, square root, fused multiply-add, round to
//! nearest integer — and never from libm's transcendental functions, so neither a C library nor a
//! compiler can move a bit. (Built without FMA in the target features, the scalar reference's
//! `mul_add` and `round_ties_even` call the C library's `fmaf` and `roundevenf`, which IEEE-754
//! defines exactly; the SIMD paths use the instructions.)
//!
//! The order in one paragraph: a reduction over `n` elements keeps [`LANES`] = 32 partial sums,
//! all starting at `+0.0`; element `k` goes to lane `k mod 32`, and each lane takes its elements
//! in increasing `k` (a dot product with one fused multiply-add per element, a plain sum with one
//! add). Then a fixed tree folds the lanes: lane `i += lane i+16` for `i < 16`, then `+8`, `+4`,
//! `+2`, `+1`; lane 0 is the result. 32 lanes are one CUDA warp, two AVX-512 registers, four AVX2
//! registers.

/// Lane partials of every reduction.
pub const LANES: usize = 32;

/// Widen a BF16 bit pattern to the `f32` it denotes (exact: BF16 is the top half of an `f32`).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Fold 32 lane partials by the fixed tree: `+16`, `+8`, `+4`, `+2`, `+1`.
#[inline(always)]
pub fn fold_lanes(l: &mut [f32; LANES]) -> f32 {
    let mut step = LANES / 2;
    while step > 0 {
        for i in 0..step {
            l[i] += l[i + step];
        }
        step /= 2;
    }
    l[0]
}

/// Canonical dot product of BF16 weights and `f32` activations (scalar reference).
#[inline(always)]
pub fn dot_bf16(w: &[u16], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut l = [0.0f32; LANES];
    for (k, (&wk, &xk)) in w.iter().zip(x).enumerate() {
        l[k % LANES] = bf16_to_f32(wk).mul_add(xk, l[k % LANES]);
    }
    fold_lanes(&mut l)
}

/// Canonical dot product of two `f32` vectors (scalar reference).
#[inline(always)]
pub fn dot_f32(w: &[f32], x: &[f32]) -> f32 {
    debug_assert_eq!(w.len(), x.len());
    let mut l = [0.0f32; LANES];
    for (k, (&wk, &xk)) in w.iter().zip(x).enumerate() {
        l[k % LANES] = wk.mul_add(xk, l[k % LANES]);
    }
    fold_lanes(&mut l)
}

/// Canonical sum (one add per element into its lane, then the tree).
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    let mut l = [0.0f32; LANES];
    for (k, &v) in x.iter().enumerate() {
        l[k % LANES] += v;
    }
    fold_lanes(&mut l)
}

/// Canonical weighted sum of rows: `out[d] = Σ_t a[t] · rows[t][d]` for every `d`, each output a
/// reduction over `t` in the canonical order (lane `t mod 32`, fused multiply-add, the tree).
/// Attention's `Σ_t a_t v_t` is this. `row(t)` yields row `t`; every row has `out.len()` elements.
#[inline(always)]
pub fn weighted_rows<'r>(a: &[f32], row: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    let d = out.len();
    let mut lanes = vec![0.0f32; LANES * d];
    for (t, &at) in a.iter().enumerate() {
        let lane = &mut lanes[(t % LANES) * d..(t % LANES + 1) * d];
        for (acc, &v) in lane.iter_mut().zip(row(t)) {
            *acc = at.mul_add(v, *acc);
        }
    }
    let mut step = LANES / 2;
    while step > 0 {
        for i in 0..step {
            let (lo, hi) = lanes.split_at_mut((i + step) * d);
            for (a, b) in lo[i * d..(i + 1) * d].iter_mut().zip(&hi[..d]) {
                *a += *b;
            }
        }
        step /= 2;
    }
    out.copy_from_slice(&lanes[..d]);
}

// ---- exp, sigmoid, silu -------------------------------------------------------------------------

const LOG2E: f32 = std::f32::consts::LOG2_E;
// ln 2 split so that n·LN2_HI is exact for |n| ≤ 2^8 (Cody–Waite).
const LN2_HI: f32 = f32::from_bits(0x3f31_7200);
const LN2_LO: f32 = f32::from_bits(0x35bf_be8e);
/// Taylor coefficients 1/k! for k = 7..2, highest first (Horner with fused multiply-add).
const EXP_POLY: [f32; 6] = [
    1.0 / 5040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];

/// The constants of [`exp`] as bit patterns, by the names the CUDA kernels give them
/// (`cuda/kernels/common.cuh`; a test holds the two to each other).
pub const EXP_CONSTANT_BITS: [(&str, u32); 9] = [
    ("TARFA_LOG2E", LOG2E.to_bits()),
    ("TARFA_LN2_HI", LN2_HI.to_bits()),
    ("TARFA_LN2_LO", LN2_LO.to_bits()),
    ("TARFA_P7", EXP_POLY[0].to_bits()),
    ("TARFA_P6", EXP_POLY[1].to_bits()),
    ("TARFA_P5", EXP_POLY[2].to_bits()),
    ("TARFA_P4", EXP_POLY[3].to_bits()),
    ("TARFA_P3", EXP_POLY[4].to_bits()),
    ("TARFA_P2", EXP_POLY[5].to_bits()),
];

/// `2^k` for `-126 ≤ k ≤ 127`, built from its bits.
#[inline(always)]
fn pow2i(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// tarfa's `e^x` in `f32`: within 2 ulp of the true value, the same bits on every target.
///
/// `n = round_ties_even(x · log2 e)`, `r = x − n·ln2` in two fused steps (Cody–Waite), `e^r` by a
/// degree-7 Taylor polynomial in Horner form with fused multiply-adds, then `· 2^⌊n/2⌋ · 2^(n−⌊n/2⌋)`
/// (two exact power-of-two factors, so results near overflow and in the subnormal range round
/// once). `x` is first clamped to `[−104, 89]`, past which the result is `0` or `+∞` anyway.
/// NaN gives NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let x = x.clamp(-104.0, 89.0);
    let n = (x * LOG2E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    p = p.mul_add(r, 1.0);
    p = p.mul_add(r, 1.0);
    let n = n as i32;
    let k1 = n >> 1;
    (p * pow2i(k1)) * pow2i(n - k1)
}

/// `1 / (1 + e^(−x))`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// SiLU as torch computes it: `x / (1 + e^(−x))`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// softplus as torch computes it (β 1, threshold 20): `x` above 20, else `ln(1 + e^x)`, with
/// tarfa's `e^x` in `f32`, then `ln(1 + u)` in `f64` (`u − u²/2` below 2⁻²⁰, where `1 + u` would
/// lose `u`'s low bits) rounded once to `f32`. NaN gives NaN.
pub fn softplus(x: f32) -> f32 {
    if x.is_nan() || x > 20.0 {
        return x;
    }
    let u = exp(x) as f64;
    let l = if u < 1.0 / (1u64 << 20) as f64 {
        u - 0.5 * u * u
    } else {
        ln_f64(1.0 + u)
    };
    l as f32
}

/// `1 / √v`: two correctly rounded operations, so every target agrees.
#[inline(always)]
pub fn rsqrt(v: f32) -> f32 {
    1.0 / v.sqrt()
}

/// Softmax in place: `m = max`, `e_i = exp(x_i − m)`, `s = sum(e)` (canonical), `x_i = e_i / s`.
#[inline(always)]
pub fn softmax(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = exp(*v - m);
    }
    let s = sum(x);
    for v in x.iter_mut() {
        *v /= s;
    }
}

/// RMSNorm with a per-element weight as transformers computes it in `f32`:
/// `out_i = w_i · (x_i · rsqrt(mean(x²) + eps))`, the mean being the canonical `dot(x, x) / n`.
/// `w` widens one weight at a time (BF16 or `f32`).
#[inline(always)]
pub fn rms_norm(x: &[f32], w: impl Fn(usize) -> f32, eps: f32, out: &mut [f32]) {
    let r = rms_scale(x, eps);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = w(i) * (v * r);
    }
}

/// `rsqrt(dot(x, x) / n + eps)`: the scale of an RMSNorm.
#[inline(always)]
pub fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ms = dot_f32(x, x) / x.len() as f32;
    rsqrt(ms + eps)
}

// ---- f64 helpers for tables computed once on the host (RoPE) ------------------------------------

/// `e^y` in `f64` (own implementation: Cody–Waite reduction, degree-20 Taylor polynomial).
pub fn exp_f64(y: f64) -> f64 {
    if y.is_nan() {
        return y;
    }
    let y = y.clamp(-745.0, 710.0);
    // fdlibm's ln2_hi (32 significant bits) and ln2_lo.
    const LN2_HI64: f64 = f64::from_bits(0x3fe6_2e42_fee0_0000);
    const LN2_LO64: f64 = f64::from_bits(0x3dea_39ef_3579_3c76);
    let n = (y * std::f64::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI64, y);
    let r = (-n).mul_add(LN2_LO64, r);
    let mut p = 1.0f64;
    for k in (1..=20).rev() {
        p = p.mul_add(r / k as f64, 1.0);
    }
    let n = n as i64;
    let k1 = n / 2;
    p * pow2i64(k1) * pow2i64(n - k1)
}

fn pow2i64(k: i64) -> f64 {
    f64::from_bits(((k + 1023) as u64) << 52)
}

/// `ln v` in `f64` for finite `v > 0` (own implementation: `v = m·2^e` with `m ∈ [√½, √2)`,
/// `ln m = 2·atanh((m−1)/(m+1))` by its series).
pub fn ln_f64(v: f64) -> f64 {
    debug_assert!(v > 0.0 && v.is_finite());
    let bits = v.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m /= 2.0;
        e += 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut p = 0.0f64;
    for k in (0..=20).rev() {
        p = p.mul_add(s2, 1.0 / (2 * k + 1) as f64);
    }
    2.0 * s * p + e as f64 * std::f64::consts::LN_2
}

/// `(sin x, cos x)` in `f64` for `|x| < 2^30` (own implementation: reduction by π/2 in three
/// parts, Taylor polynomials on `[−π/4, π/4]`).
pub fn sincos_f64(x: f64) -> (f64, f64) {
    // π/2 in three pieces (fdlibm's pio2_1, pio2_2, pio2_3: 33 bits each).
    const P1: f64 = f64::from_bits(0x3ff9_21fb_5440_0000);
    const P2: f64 = f64::from_bits(0x3dd0_b461_1a60_0000);
    const P3: f64 = f64::from_bits(0x3ba3_198a_2e00_0000);
    let k = (x * std::f64::consts::FRAC_2_PI).round_ties_even();
    let r = x - k * P1 - k * P2 - k * P3;
    let r2 = r * r;
    // sin r = r·Σ (−1)^i r^{2i}/(2i+1)!, cos r = Σ (−1)^i r^{2i}/(2i)!, i ≤ 10.
    let mut s = 0.0f64;
    let mut c = 0.0f64;
    for i in (0..=10).rev() {
        let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
        s = s.mul_add(r2, sign / factorial(2 * i + 1));
        c = c.mul_add(r2, sign / factorial(2 * i));
    }
    let s = s * r;
    match (k as i64).rem_euclid(4) {
        0 => (s, c),
        1 => (c, -s),
        2 => (-s, -c),
        _ => (-c, s),
    }
}

fn factorial(n: u32) -> f64 {
    (1..=n).fold(1.0f64, |a, k| a * k as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_kernels_use_exactly_these_exp_constants() {
        let cu = tarfa_cuda::KERNELS_CU;
        for (name, bits) in EXP_CONSTANT_BITS {
            let line = format!("#define {name} {bits:#010x}");
            assert!(cu.contains(&line), "the kernels lack `{line}`");
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_f64_exp_over_the_used_range() {
        let mut worst = 0u32;
        let mut x = -103.0f32;
        while x < 88.7 {
            let want = (x as f64).exp() as f32;
            let got = exp(x);
            if want.is_normal() {
                worst = worst.max(want.to_bits().abs_diff(got.to_bits()));
            }
            x += 0.001_37;
        }
        assert!(worst <= 2, "exp is {worst} ulp off");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(200.0), f32::INFINITY);
        assert_eq!(exp(-200.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn f64_helpers_agree_with_std_to_a_few_ulp() {
        for i in 0..2000 {
            let x = -40.0 + i as f64 * 0.0413;
            let (s, c) = sincos_f64(x * 50.0);
            assert!((s - (x * 50.0).sin()).abs() < 1e-14, "sin {x}");
            assert!((c - (x * 50.0).cos()).abs() < 1e-14, "cos {x}");
            let e = exp_f64(x);
            assert!(((e - x.exp()) / x.exp()).abs() < 4e-16, "exp {x}");
            let v = 1e-3 + i as f64 * 17.7;
            assert!((ln_f64(v) - v.ln()).abs() < 4e-15, "ln {v}");
        }
    }

    #[test]
    fn fold_is_the_fixed_tree() {
        let mut l = [0.0f32; LANES];
        for (i, v) in l.iter_mut().enumerate() {
            *v = i as f32;
        }
        assert_eq!(fold_lanes(&mut l), (0..32).sum::<i32>() as f32);
        // Rounding reveals the order: 1e8 in lane 0 and lane 16 cancel before the small terms join.
        let mut l = [0.0f32; LANES];
        l[0] = 1e8;
        l[16] = -1e8;
        l[1] = 1.0;
        assert_eq!(fold_lanes(&mut l), 1.0);
    }
}
