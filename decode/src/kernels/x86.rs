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

/// [`dot_avx2`] of BF16 weights where the CPU has AVX2 and FMA.
pub fn dot_bf16_on_avx2(w: &[u16], x: &[f32]) -> Option<f32> {
    // SAFETY: features checked; the body asserts the lengths.
    has_avx2().then(|| unsafe { dot_avx2(w, x) })
}

/// [`dot_avx2`] of `f32` weights where the CPU has AVX2 and FMA.
pub fn dot_f32_on_avx2(w: &[f32], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx2().then(|| unsafe { dot_avx2(w, x) })
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

/// [`dot_avx512`] of BF16 weights where the CPU has AVX-512F.
pub fn dot_bf16_on_avx512(w: &[u16], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dot_avx512(w, x) })
}

/// [`dot_avx512`] of `f32` weights where the CPU has AVX-512F.
pub fn dot_f32_on_avx512(w: &[f32], x: &[f32]) -> Option<f32> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dot_avx512(w, x) })
}

/// A weight element type: how 8 or 16 of them become `f32` lanes, and one for the tail.
trait Weight: Copy {
    fn widen(self) -> f32;
    /// # Safety
    /// 8 readable elements at `p`; AVX2 available.
    unsafe fn load8(p: *const Self) -> __m256;
    /// # Safety
    /// 16 readable elements at `p`; AVX-512F available.
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Weight for u16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> __m256 {
        // SAFETY: the caller guarantees 8 readable u16 at p and AVX2.
        unsafe {
            let h = _mm_loadu_si128(p as *const __m128i);
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }
    #[inline(always)]
    unsafe fn load16(p: *const u16) -> __m512 {
        // SAFETY: the caller guarantees 16 readable u16 at p and AVX-512F.
        unsafe {
            let h = _mm256_loadu_si256(p as *const __m256i);
            _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
        }
    }
}

impl Weight for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 8 readable f32 at p and AVX2.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees 16 readable f32 at p and AVX-512F.
        unsafe { _mm512_loadu_ps(p) }
    }
}

/// [`fold_lanes`] of the 32 lanes in two 16-lane registers, in registers: `+16` is `a0 + a1`
/// lane by lane, `+8` the low half plus the high half, then `+4`, `+2`, `+1` the same way — the
/// tree's additions, each with the same two operands in the same order (the lower lane first).
///
/// # Safety
/// AVX-512F must be available.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn fold512(a0: __m512, a1: __m512) -> f32 {
    let v = _mm512_add_ps(a0, a1);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    // SAFETY: AVX-512F implies AVX.
    unsafe { fold256(_mm256_add_ps(_mm512_castps512_ps256(v), hi)) }
}

/// [`fold_lanes`] of the 32 lanes in four 8-lane registers (lanes 8j..8j+7 in `a[j]`).
///
/// # Safety
/// AVX is available (AVX2 callers).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn fold_ymm4(a: [__m256; 4]) -> f32 {
    let v0 = _mm256_add_ps(a[0], a[2]);
    let v1 = _mm256_add_ps(a[1], a[3]);
    // SAFETY: AVX2 implies AVX.
    unsafe { fold256(_mm256_add_ps(v0, v1)) }
}

/// The last three steps of the tree (`+4`, `+2`, `+1`) on 8 lanes.
///
/// # Safety
/// AVX is available.
#[inline]
#[target_feature(enable = "avx")]
unsafe fn fold256(v8: __m256) -> f32 {
    let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
    let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
    let v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
    _mm_cvtss_f32(v1)
}

/// Spilled register lanes: finish the tail by the scalar lane rule, fold.
#[inline(always)]
fn finish<W: Weight>(mut l: [f32; LANES], w: &[W], x: &[f32], from: usize) -> f32 {
    for k in from..w.len() {
        l[k % LANES] = w[k].widen().mul_add(x[k], l[k % LANES]);
    }
    fold_lanes(&mut l)
}

/// The canonical dot in four 8-lane registers (lanes 8j..8j+7 in register j).
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2<W: Weight>(w: &[W], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a = [_mm256_setzero_ps(); 4];
    let mut k = 0;
    while k < n {
        for (j, acc) in a.iter_mut().enumerate() {
            // SAFETY: k + 8j + 8 <= n <= len; AVX2 and FMA by this function's contract.
            unsafe {
                let wv = W::load8(wp.add(k + 8 * j));
                let xv = _mm256_loadu_ps(xp.add(k + 8 * j));
                *acc = _mm256_fmadd_ps(wv, xv, *acc);
            }
        }
        k += LANES;
    }
    if n == w.len() {
        // SAFETY: AVX2 and FMA by this function's contract.
        return unsafe { fold_ymm4(a) };
    }
    let mut l = [0.0f32; LANES];
    for (j, acc) in a.iter().enumerate() {
        // SAFETY: l has 32 floats; 8j + 8 <= 32.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * j), *acc) };
    }
    finish(l, w, x, n)
}

/// The canonical dot in two 16-lane registers (lanes 0..15 and 16..31).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512<W: Weight>(w: &[W], x: &[f32]) -> f32 {
    assert_eq!(w.len(), x.len());
    let n = w.len() / LANES * LANES;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut a0 = _mm512_setzero_ps();
    let mut a1 = _mm512_setzero_ps();
    let mut k = 0;
    while k < n {
        // SAFETY: k + 32 <= n <= len; AVX-512F by this function's contract.
        unsafe {
            a0 = _mm512_fmadd_ps(W::load16(wp.add(k)), _mm512_loadu_ps(xp.add(k)), a0);
            a1 = _mm512_fmadd_ps(
                W::load16(wp.add(k + 16)),
                _mm512_loadu_ps(xp.add(k + 16)),
                a1,
            );
        }
        k += LANES;
    }
    if n == w.len() {
        // SAFETY: AVX-512F by this function's contract.
        return unsafe { fold512(a0, a1) };
    }
    let mut l = [0.0f32; LANES];
    // SAFETY: l has 32 floats.
    unsafe {
        _mm512_storeu_ps(l.as_mut_ptr(), a0);
        _mm512_storeu_ps(l.as_mut_ptr().add(16), a1);
    }
    finish(l, w, x, n)
}

/// [`dots_avx512`] of one BF16 row against 4 vectors, where the CPU has AVX-512F.
pub fn dots4_bf16_on_avx512(w: &[u16], xs: [&[f32]; 4]) -> Option<[f32; 4]> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dots_avx512([w], xs)[0] })
}

/// [`dots_avx512`] of one `f32` row against 4 vectors, where the CPU has AVX-512F.
pub fn dots4_f32_on_avx512(w: &[f32], xs: [&[f32]; 4]) -> Option<[f32; 4]> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dots_avx512([w], xs)[0] })
}

/// [`dots_avx512`] of two BF16 rows against 4 vectors, where the CPU has AVX-512F.
pub fn dots2x4_bf16_on_avx512(ws: [&[u16]; 2], xs: [&[f32]; 4]) -> Option<[[f32; 4]; 2]> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dots_avx512(ws, xs) })
}

/// [`dots_avx512`] of two `f32` rows against 4 vectors, where the CPU has AVX-512F.
pub fn dots2x4_f32_on_avx512(ws: [&[f32]; 2], xs: [&[f32]; 4]) -> Option<[[f32; 4]; 2]> {
    // SAFETY: as above.
    has_avx512().then(|| unsafe { dots_avx512(ws, xs) })
}

/// [`dots_avx2`] of BF16 weights against 2 vectors, where the CPU has AVX2 and FMA.
pub fn dots2_bf16_on_avx2(w: &[u16], xs: [&[f32]; 2]) -> Option<[f32; 2]> {
    // SAFETY: as above.
    has_avx2().then(|| unsafe { dots_avx2(w, xs) })
}

/// [`dots_avx2`] of `f32` weights against 2 vectors, where the CPU has AVX2 and FMA.
pub fn dots2_f32_on_avx2(w: &[f32], xs: [&[f32]; 2]) -> Option<[f32; 2]> {
    // SAFETY: as above.
    has_avx2().then(|| unsafe { dots_avx2(w, xs) })
}

/// `R` rows' canonical dots against `T` vectors at once: for each (row, vector), exactly
/// [`dot_avx512`]'s two 16-lane registers, fused multiply-adds in increasing `k` and the same
/// tail and fold — so each result is that pair's canonical dot, bit for bit — but each 32
/// elements of a row are loaded (and, for BF16, widened) once for all `T` vectors, and each 32 of
/// a vector once for all `R` rows (2 × 4: 16 accumulators, 12 loads for 16 multiply-adds).
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
unsafe fn dots_avx512<W: Weight, const R: usize, const T: usize>(
    ws: [&[W]; R],
    xs: [&[f32]; T],
) -> [[f32; T]; R] {
    let len = ws[0].len();
    for w in &ws {
        assert_eq!(w.len(), len);
    }
    for x in &xs {
        assert_eq!(len, x.len());
    }
    let n = len / LANES * LANES;
    let wp = ws.map(|w| w.as_ptr());
    let xp = xs.map(|x| x.as_ptr());
    let mut a0 = [[_mm512_setzero_ps(); T]; R];
    let mut a1 = [[_mm512_setzero_ps(); T]; R];
    let mut k = 0;
    while k < n {
        // SAFETY: k + 32 <= n <= every slice's length; AVX-512F by this function's contract.
        unsafe {
            let w0 = wp.map(|p| W::load16(p.add(k)));
            let w1 = wp.map(|p| W::load16(p.add(k + 16)));
            for t in 0..T {
                let x0 = _mm512_loadu_ps(xp[t].add(k));
                let x1 = _mm512_loadu_ps(xp[t].add(k + 16));
                for r in 0..R {
                    a0[r][t] = _mm512_fmadd_ps(w0[r], x0, a0[r][t]);
                    a1[r][t] = _mm512_fmadd_ps(w1[r], x1, a1[r][t]);
                }
            }
        }
        k += LANES;
    }
    let mut out = [[0.0f32; T]; R];
    for r in 0..R {
        for t in 0..T {
            if n == len {
                // SAFETY: AVX-512F by this function's contract.
                out[r][t] = unsafe { fold512(a0[r][t], a1[r][t]) };
                continue;
            }
            let mut l = [0.0f32; LANES];
            // SAFETY: l has 32 floats.
            unsafe {
                _mm512_storeu_ps(l.as_mut_ptr(), a0[r][t]);
                _mm512_storeu_ps(l.as_mut_ptr().add(16), a1[r][t]);
            }
            out[r][t] = finish(l, ws[r], xs[t], n);
        }
    }
    out
}

/// [`dot_avx2`]'s four 8-lane registers for each of `T` vectors, the row's elements loaded once
/// for all of them (as [`dots_avx512`]).
///
/// # Safety
/// AVX2 and FMA must be available.
#[target_feature(enable = "avx2,fma")]
unsafe fn dots_avx2<W: Weight, const T: usize>(w: &[W], xs: [&[f32]; T]) -> [f32; T] {
    for x in &xs {
        assert_eq!(w.len(), x.len());
    }
    let n = w.len() / LANES * LANES;
    let wp = w.as_ptr();
    let xp = xs.map(|x| x.as_ptr());
    let mut a = [[_mm256_setzero_ps(); 4]; T];
    let mut k = 0;
    while k < n {
        for j in 0..4 {
            // SAFETY: k + 8j + 8 <= n <= every slice's length; AVX2 and FMA by contract.
            unsafe {
                let wv = W::load8(wp.add(k + 8 * j));
                for t in 0..T {
                    a[t][j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(xp[t].add(k + 8 * j)), a[t][j]);
                }
            }
        }
        k += LANES;
    }
    let mut out = [0.0f32; T];
    for t in 0..T {
        if n == w.len() {
            // SAFETY: AVX2 and FMA by this function's contract.
            out[t] = unsafe { fold_ymm4(a[t]) };
            continue;
        }
        let mut l = [0.0f32; LANES];
        for j in 0..4 {
            // SAFETY: l has 32 floats; 8j + 8 <= 32.
            unsafe { _mm256_storeu_ps(l.as_mut_ptr().add(8 * j), a[t][j]) };
        }
        out[t] = finish(l, w, xs[t], n);
    }
    out
}
