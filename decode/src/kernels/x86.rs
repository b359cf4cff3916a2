//! AVX2+FMA and AVX-512 paths of the canonical dot products: the decoder's one module of
//! `unsafe` code (`std::arch` intrinsics behind run-time feature detection).
//!
//! Each path keeps the canonical 32 lanes in registers — four `__m256` (lanes 8j..8j+7 in
//! register j) or two `__m512` (lanes 16j..16j+15) — feeds element `k` to lane `k mod 32` with
//! one fused multiply-add, takes a tail shorter than 32 through the scalar lane rule, and folds
//! with the fixed tree (`+16`, `+8`, `+4`, `+2`, `+1`). So each gives exactly the scalar
//! reference's bits; `tests/kernels.rs` checks that on random and adversarial inputs.
//!
//! # Safety (whole module)
//! Every function here is `#[target_feature]`: calling it is sound only on a CPU with those
//! features, which [`super::Isa::available`] checks before [`super::Isa`] hands one out. Loads are
//! unaligned (`loadu`) and stay inside the slices, whose lengths are checked first.

#![allow(unsafe_code)]
// Register arrays are indexed by lane group, the order the canonical lanes are named in.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use crate::canon::{bf16_to_f32, fold_lanes, LANES};

fn has_avx2() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
}

// Safe entry points: each checks the CPU (a cached atomic load) before calling its
// `#[target_feature]` body, and answers `None` where the CPU lacks the features.

/// [`dot_bf16_avx2`] where the CPU has AVX2 and FMA.
pub fn dot_bf16_on_avx2(w: &[u16], x: &[f32]) -> Option<f32> {
    // SAFETY: features checked; the body asserts the lengths.
    has_avx2().then(|| unsafe { dot_bf16_avx2(w, x) })
}

/// [`dot_f32_avx2`] where the CPU has AVX2 and FMA.
pub fn dot_f32_on_avx2(w: &[f32], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx2().then(|| unsafe { dot_f32_avx2(w, x) })
}

/// [`canon::silu`]`(g_i) · u_i` for every `i`, compiled with FMA instructions (the same
/// fused operations `canon` names, so the same bits as the scalar reference).
pub fn silu_mul_on_fma(g: &[f32], u: &[f32]) -> Option<Vec<f32>> {
    // SAFETY: features checked.
    has_avx2().then(|| unsafe { silu_mul_fma(g, u) })
}

/// `silu(g) · u` for one pair, compiled with FMA instructions.
#[inline]
pub fn silu_mul_one_on_fma(g: f32, u: f32) -> Option<f32> {
    // SAFETY: features checked.
    has_avx2().then(|| unsafe { silu_mul_one_fma(g, u) })
}

#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_one_fma(g: f32, u: f32) -> f32 {
    crate::canon::silu(g) * u
}

/// [`canon::softmax`] compiled with FMA instructions.
pub fn softmax_on_fma(x: &mut [f32]) -> bool {
    // SAFETY: features checked.
    has_avx2() && {
        unsafe { softmax_fma(x) };
        true
    }
}

/// [`canon::weighted_rows`] compiled with FMA instructions.
pub fn weighted_rows_on_fma<'r>(
    a: &[f32],
    row: impl Fn(usize) -> &'r [f32],
    out: &mut [f32],
) -> bool {
    // SAFETY: features checked.
    has_avx2() && {
        unsafe { weighted_rows_fma(a, row, out) };
        true
    }
}

/// [`canon::rms_norm`] compiled with FMA instructions.
pub fn rms_norm_on_fma(x: &[f32], w: impl Fn(usize) -> f32, eps: f32, out: &mut [f32]) -> bool {
    // SAFETY: features checked.
    has_avx2() && {
        unsafe { rms_norm_fma(x, w, eps, out) };
        true
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_fma(g: &[f32], u: &[f32]) -> Vec<f32> {
    g.iter()
        .zip(u)
        .map(|(&a, &b)| crate::canon::silu(a) * b)
        .collect()
}

#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_fma(x: &mut [f32]) {
    crate::canon::softmax(x)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_rows_fma<'r>(a: &[f32], row: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
    crate::canon::weighted_rows(a, row, out)
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rms_norm_fma(x: &[f32], w: impl Fn(usize) -> f32, eps: f32, out: &mut [f32]) {
    crate::canon::rms_norm(x, w, eps, out)
}

/// [`dot_bf16_avx512`] where the CPU has AVX-512F.
pub fn dot_bf16_on_avx512(w: &[u16], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dot_bf16_avx512(w, x) })
}

/// [`dot_f32_avx512`] where the CPU has AVX-512F.
pub fn dot_f32_on_avx512(w: &[f32], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dot_f32_avx512(w, x) })
}

/// Spill register lanes, finish the tail by the scalar lane rule, fold.
#[inline(always)]
fn finish_bf16(mut l: [f32; LANES], w: &[u16], x: &[f32], from: usize) -> f32 {
    for k in from..w.len() {
        l[k % LANES] = bf16_to_f32(w[k]).mul_add(x[k], l[k % LANES]);
    }
    fold_lanes(&mut l)
}

#[inline(always)]
fn finish_f32(mut l: [f32; LANES], w: &[f32], x: &[f32], from: usize) -> f32 {
    for k in from..w.len() {
        l[k % LANES] = w[k].mul_add(x[k], l[k % LANES]);
    }
    fold_lanes(&mut l)
}

/// 8 BF16 values (128 bits) widened to 8 `f32`.
#[inline(always)]
unsafe fn widen8(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable u16 at p.
    unsafe {
        let h = _mm_loadu_si128(p as *const __m128i);
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
    }
}

/// # Safety
/// AVX2 and FMA must be available; `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_bf16_avx2(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut k = 0;
    while k < n {
        for (j, acc) in a.iter_mut().enumerate() {
            // SAFETY: k + 8j + 8 <= n <= len.
            unsafe {
                let wv = widen8(wp.add(k + 8 * j));
                let xv = _mm256_loadu_ps(xp.add(k + 8 * j));
                *acc = _mm256_fmadd_ps(wv, xv, *acc);
            }
        }
        k += LANES;
    }
    let mut l = [0.0f32; LANES];
    for (j, acc) in a.iter().enumerate() {
        // SAFETY: l has 32 floats; 8j + 8 <= 32.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * j), *acc) };
    }
    finish_bf16(l, w, x, n)
}

/// # Safety
/// AVX2 and FMA must be available; `w.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_avx2(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut k = 0;
    while k < n {
        for (j, acc) in a.iter_mut().enumerate() {
            // SAFETY: k + 8j + 8 <= n <= len.
            unsafe {
                let wv = _mm256_loadu_ps(wp.add(k + 8 * j));
                let xv = _mm256_loadu_ps(xp.add(k + 8 * j));
                *acc = _mm256_fmadd_ps(wv, xv, *acc);
            }
        }
        k += LANES;
    }
    let mut l = [0.0f32; LANES];
    for (j, acc) in a.iter().enumerate() {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * j), *acc) };
    }
    finish_f32(l, w, x, n)
}

/// 16 BF16 values (256 bits) widened to 16 `f32`.
#[inline(always)]
unsafe fn widen16(p: *const u16) -> __m512 {
    // SAFETY: the caller guarantees 16 readable u16 at p.
    unsafe {
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }
}

/// # Safety
/// AVX-512F must be available; `w.len() == x.len()`.
#[target_feature(enable = "avx512f")]
unsafe fn dot_bf16_avx512(w: &[u16], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = _mm512_setzero_ps();
    let mut k = 0;
    while k < n {
        // SAFETY: k + 32 <= n <= len.
        unsafe {
            a0 = _mm512_fmadd_ps(widen16(wp.add(k)), _mm512_loadu_ps(xp.add(k)), a0);
            a1 = _mm512_fmadd_ps(widen16(wp.add(k + 16)), _mm512_loadu_ps(xp.add(k + 16)), a1);
        }
        k += LANES;
    }
    let mut l = [0.0f32; LANES];
    // SAFETY: l has 32 floats.
    unsafe {
        _mm512_storeu_ps(l.as_mut_ptr(), a0);
        _mm512_storeu_ps(l.as_mut_ptr().add(16), a1);
    }
    finish_bf16(l, w, x, n)
}

/// # Safety
/// AVX-512F must be available; `w.len() == x.len()`.
#[target_feature(enable = "avx512f")]
unsafe fn dot_f32_avx512(w: &[f32], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = _mm512_setzero_ps();
    let mut k = 0;
    while k < n {
        // SAFETY: k + 32 <= n <= len.
        unsafe {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(k)), _mm512_loadu_ps(xp.add(k)), a0);
            a1 = _mm512_fmadd_ps(
                _mm512_loadu_ps(wp.add(k + 16)),
                _mm512_loadu_ps(xp.add(k + 16)),
                a1,
            );
        }
        k += LANES;
    }
    let mut l = [0.0f32; LANES];
    // SAFETY: l has 32 floats.
    unsafe {
        _mm512_storeu_ps(l.as_mut_ptr(), a0);
        _mm512_storeu_ps(l.as_mut_ptr().add(16), a1);
    }
    finish_f32(l, w, x, n)
}
