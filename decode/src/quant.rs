//! Quantised (and plain) GGUF element types dequantised to `f32`, bit for bit as gguf-py 0.19's
//! `gguf.quants.dequantize` computes them (numpy, `float32` throughout).
//!
//! Every float operation below is the one numpy performs, in numpy's order, each a single IEEE
//! operation rounded to nearest-even (Rust never contracts `a·b − c` into an FMA):
//!
//! - F32, F16, BF16: the value itself (F16 and BF16 widen exactly).
//! - Q4_0, Q5_0, Q8_0: `d · q` (`d` the block's F16 scale widened, `q` a small integer).
//! - Q4_1, Q5_1: `(d · q) + m`.
//! - Q2_K: `(d · sc) · q − (dmin · m)`, each parenthesis one rounded product.
//! - Q3_K, Q6_K: `(d · sc) · q`.
//! - Q4_K, Q5_K: `(d · sc) · q − (dmin · m)`.
//! - TQ1_0, TQ2_0, IQ4_NL, MXFP4: `d · q` (MXFP4's `d` an E8M0 power of two, halved; `q` from
//!   the E2M1 table doubled); IQ4_XS: `(d · sc) · q`.
//!
//! With finite scales every product above is exact (no operand pair needs more than 24
//! significant bits), so each value is its exact real value rounded once, in the final `± m`.
//!
//! `decode/tests/quant.rs` holds every type to gguf-py's output on random blocks (edge scales
//! included) and on quantised real tensors, element by element.

use std::fmt;

use tarfa_format::Dtype;

/// Most elements in one block of any supported type (the K-quants' 256).
pub const MAX_BLOCK_ELEMS: usize = 256;

/// An element type this build dequantises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16.
    BF16,
    /// 32 × 4-bit, one F16 scale, offset 8.
    Q4_0,
    /// 32 × 4-bit, F16 scale and minimum.
    Q4_1,
    /// 32 × 5-bit, one F16 scale, offset 16.
    Q5_0,
    /// 32 × 5-bit, F16 scale and minimum.
    Q5_1,
    /// 32 × int8, one F16 scale.
    Q8_0,
    /// 256 × 2-bit in 16 groups, 4-bit scales and minima.
    Q2_K,
    /// 256 × 3-bit in 16 groups, 6-bit signed scales.
    Q3_K,
    /// 256 × 4-bit in 8 groups, 6-bit scales and minima.
    Q4_K,
    /// 256 × 5-bit in 8 groups, 6-bit scales and minima.
    Q5_K,
    /// 256 × 6-bit in 16 groups, int8 scales.
    Q6_K,
    /// 256 ternary values, five per byte in base 3, one F16 scale.
    TQ1_0,
    /// 256 ternary values, four per byte, one F16 scale.
    TQ2_0,
    /// 32 × 4-bit indices into a non-linear table, one F16 scale.
    IQ4_NL,
    /// 256 × 4-bit indices into IQ4_NL's table in 8 groups, 6-bit signed scales.
    IQ4_XS,
    /// 32 × FP4 (E2M1), one E8M0 scale.
    MXFP4,
}

/// `(type, ggml id, block elements, block bytes)`; the ids and sizes agree with the JNF dtype
/// table (`tarfa_format::Dtype`, checked by a test).
const TYPES: &[(QuantType, u32, usize, usize)] = &[
    (QuantType::F32, 0, 1, 4),
    (QuantType::F16, 1, 1, 2),
    (QuantType::BF16, 30, 1, 2),
    (QuantType::Q4_0, 2, 32, 18),
    (QuantType::Q4_1, 3, 32, 20),
    (QuantType::Q5_0, 6, 32, 22),
    (QuantType::Q5_1, 7, 32, 24),
    (QuantType::Q8_0, 8, 32, 34),
    (QuantType::Q2_K, 10, 256, 84),
    (QuantType::Q3_K, 11, 256, 110),
    (QuantType::Q4_K, 12, 256, 144),
    (QuantType::Q5_K, 13, 256, 176),
    (QuantType::Q6_K, 14, 256, 210),
    (QuantType::TQ1_0, 34, 256, 54),
    (QuantType::TQ2_0, 35, 256, 66),
    (QuantType::IQ4_NL, 20, 32, 18),
    (QuantType::IQ4_XS, 23, 256, 136),
    (QuantType::MXFP4, 39, 32, 17),
];

/// Why bytes could not be dequantised.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// The element type is not one this build dequantises.
    #[error(
        "element type {dtype} is not supported by this build's decoder (it computes with {})",
        supported_names()
    )]
    Unsupported {
        /// The type.
        dtype: Dtype,
    },
    /// The byte length is not a whole number of blocks, or does not match the output.
    #[error("{dtype}: {bytes} bytes cannot be dequantised into {elems} elements ({block_elems} elements in {block_bytes}-byte blocks)")]
    Length {
        /// The type.
        dtype: Dtype,
        /// Bytes given.
        bytes: usize,
        /// Output elements given.
        elems: usize,
        /// Elements per block.
        block_elems: usize,
        /// Bytes per block.
        block_bytes: usize,
    },
}

impl QuantType {
    /// Every supported type.
    pub const ALL: [QuantType; 18] = [
        QuantType::F32,
        QuantType::F16,
        QuantType::BF16,
        QuantType::Q4_0,
        QuantType::Q4_1,
        QuantType::Q5_0,
        QuantType::Q5_1,
        QuantType::Q8_0,
        QuantType::Q2_K,
        QuantType::Q3_K,
        QuantType::Q4_K,
        QuantType::Q5_K,
        QuantType::Q6_K,
        QuantType::TQ1_0,
        QuantType::TQ2_0,
        QuantType::IQ4_NL,
        QuantType::IQ4_XS,
        QuantType::MXFP4,
    ];

    fn entry(self) -> &'static (QuantType, u32, usize, usize) {
        // Every variant has its row (test `every_type_has_one_row_matching_the_dtype_table`).
        TYPES.iter().find(|e| e.0 == self).unwrap_or(&TYPES[0])
    }

    /// The type of a JNF dtype, or `None` when this build does not dequantise it.
    pub fn from_dtype(dtype: Dtype) -> Option<QuantType> {
        TYPES.iter().find(|e| e.1 == dtype.code()).map(|e| e.0)
    }

    /// [`QuantType::from_dtype`], or an error naming the type.
    pub fn of(dtype: Dtype) -> Result<QuantType, QuantError> {
        QuantType::from_dtype(dtype).ok_or(QuantError::Unsupported { dtype })
    }

    /// The JNF dtype (its code is the ggml type id).
    pub fn dtype(self) -> Dtype {
        Dtype::from_ggml_id(self.entry().1).unwrap_or(Dtype::F32)
    }

    /// Elements per block.
    pub fn block_elems(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// Elements held by `bytes` bytes, or `None` when that is not a whole number of blocks.
    pub fn elems_of(self, bytes: usize) -> Option<usize> {
        bytes
            .is_multiple_of(self.block_bytes())
            .then(|| bytes / self.block_bytes())
            .and_then(|b| b.checked_mul(self.block_elems()))
    }

    /// Dequantise whole blocks: `out.len()` must be `bytes.len() / block_bytes · block_elems`.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
        let (be, bb) = (self.block_elems(), self.block_bytes());
        if !bytes.len().is_multiple_of(bb) || self.elems_of(bytes.len()) != Some(out.len()) {
            return Err(QuantError::Length {
                dtype: self.dtype(),
                bytes: bytes.len(),
                elems: out.len(),
                block_elems: be,
                block_bytes: bb,
            });
        }
        let f: fn(&[u8], &mut [f32]) = match self {
            QuantType::F32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                return Ok(());
            }
            QuantType::F16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f16(b, 0);
                }
                return Ok(());
            }
            QuantType::BF16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16);
                }
                return Ok(());
            }
            QuantType::Q4_0 => q4_0,
            QuantType::Q4_1 => q4_1,
            QuantType::Q5_0 => q5_0,
            QuantType::Q5_1 => q5_1,
            QuantType::Q8_0 => q8_0,
            QuantType::Q2_K => q2_k,
            QuantType::Q3_K => q3_k,
            QuantType::Q4_K => q4_k,
            QuantType::Q5_K => q5_k,
            QuantType::Q6_K => q6_k,
            QuantType::TQ1_0 => tq1_0,
            QuantType::TQ2_0 => tq2_0,
            QuantType::IQ4_NL => iq4_nl,
            QuantType::IQ4_XS => iq4_xs,
            QuantType::MXFP4 => mxfp4,
        };
        for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
            f(b, o);
        }
        Ok(())
    }
}

impl fmt::Display for QuantType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.dtype().name())
    }
}

/// Whether this build dequantises (and so computes with) `dtype`.
pub fn is_supported(dtype: Dtype) -> bool {
    QuantType::from_dtype(dtype).is_some()
}

/// The supported types' names, comma-separated.
pub fn supported_names() -> String {
    QuantType::ALL
        .iter()
        .map(|t| t.dtype().name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Dequantise whole blocks of `dtype` into `out` (see [`QuantType::dequantize`]); an unsupported
/// type is an error naming it.
pub fn dequantize_blocks(dtype: Dtype, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    QuantType::of(dtype)?.dequantize(bytes, out)
}

/// The F16 at `b[i..i + 2]`, widened (exact; NaN payloads kept, as numpy's `astype` does).
#[inline]
fn f16(b: &[u8], i: usize) -> f32 {
    crate::weights::f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

// Block layouts are ggml's (`ggml-common.h`); the index arithmetic follows gguf-py's reshapes.

/// Q4_0: `d` F16, `qs[16]`; element `j < 16` is `qs[j] & 15`, `j ≥ 16` is `qs[j − 16] >> 4`.
fn q4_0(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 0);
    let (lo, hi) = out.split_at_mut(16);
    for ((&q, o0), o1) in b[2..18].iter().zip(lo).zip(hi) {
        *o0 = d * ((q & 0x0F) as i32 - 8) as f32;
        *o1 = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// Q4_1: `d`, `m` F16, `qs[16]`.
fn q4_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16(b, 0), f16(b, 2));
    let (lo, hi) = out.split_at_mut(16);
    for ((&q, o0), o1) in b[4..20].iter().zip(lo).zip(hi) {
        *o0 = d * (q & 0x0F) as f32 + m;
        *o1 = d * (q >> 4) as f32 + m;
    }
}

/// Q5_0: `d` F16, `qh` u32, `qs[16]`; element `j` as Q4_0's, its fifth bit bit `j` of the
/// little-endian `qh`; offset 16.
fn q5_0(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let (lo, hi) = out.split_at_mut(16);
    for (l, ((&q, o0), o1)) in b[6..22].iter().zip(lo).zip(hi).enumerate() {
        let q0 = (q & 0x0F) | ((((qh >> l) & 1) as u8) << 4);
        let q1 = (q >> 4) | ((((qh >> (l + 16)) & 1) as u8) << 4);
        *o0 = d * (q0 as i32 - 16) as f32;
        *o1 = d * (q1 as i32 - 16) as f32;
    }
}

/// Q5_1: `d`, `m` F16, `qh` u32, `qs[16]`.
fn q5_1(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16(b, 0), f16(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    let (lo, hi) = out.split_at_mut(16);
    for (l, ((&q, o0), o1)) in b[8..24].iter().zip(lo).zip(hi).enumerate() {
        let q0 = (q & 0x0F) | ((((qh >> l) & 1) as u8) << 4);
        let q1 = (q >> 4) | ((((qh >> (l + 16)) & 1) as u8) << 4);
        *o0 = d * q0 as f32 + m;
        *o1 = d * q1 as f32 + m;
    }
}

/// Q8_0: `d` F16, `qs[32]` int8.
fn q8_0(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..34]) {
        *o = (q as i8) as f32 * d;
    }
}

/// Q2_K: `scales[16]`, `qs[64]`, `d`, `dmin` F16. Element `k = 128i + 32s + l` is
/// `(qs[32i + l] >> 2s) & 3`, in group `k / 16` (scale `scales[g] & 15`, minimum `scales[g] >> 4`).
fn q2_k(b: &[u8], out: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let (d, dmin) = (f16(b, 80), f16(b, 82));
    for i in 0..2 {
        for s in 0..4 {
            for h in 0..2 {
                let g = scales[8 * i + 2 * s + h];
                let dl = d * (g & 0x0F) as f32;
                let ml = dmin * (g >> 4) as f32;
                let base = 128 * i + 32 * s + 16 * h;
                let src = &qs[32 * i + 16 * h..32 * i + 16 * h + 16];
                for (o, &q) in out[base..base + 16].iter_mut().zip(src) {
                    *o = dl * ((q >> (2 * s)) & 3) as f32 - ml;
                }
            }
        }
    }
}

/// Q3_K: `hmask[32]`, `qs[64]`, `scales[12]`, `d` F16.
fn q3_k(b: &[u8], out: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let sc = &b[96..108];
    let d = f16(b, 108);
    for i in 0..2 {
        for s in 0..4 {
            // Bit `4i + s` of hmask[l]; a clear bit subtracts 4.
            let bit = 4 * i + s;
            for h in 0..2 {
                let j = 8 * i + 2 * s + h;
                let lo = (sc[j % 8] >> (4 * (j / 8))) & 0x0F;
                let hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 0x03;
                let dl = d * ((lo | (hi << 4)) as i32 - 32) as f32;
                let base = 128 * i + 32 * s + 16 * h;
                let qsrc = &qs[32 * i + 16 * h..32 * i + 16 * h + 16];
                let hsrc = &hmask[16 * h..16 * h + 16];
                for ((o, &q), &m) in out[base..base + 16].iter_mut().zip(qsrc).zip(hsrc) {
                    let ql = ((q >> (2 * s)) & 3) as i32;
                    let hm = (((m >> bit) & 1) ^ 1) as i32;
                    *o = dl * (ql - (hm << 2)) as f32;
                }
            }
        }
    }
}

/// The eight 6-bit scales and minima of a Q4_K/Q5_K block (`get_scale_min` of gguf-py).
fn scale_min_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut mn) = ([0u8; 8], [0u8; 8]);
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        mn[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, mn)
}

/// Q4_K: `d`, `dmin` F16, `scales[12]`, `qs[128]`. Element `k = 64i + 32s + l` is
/// `(qs[32i + l] >> 4s) & 15`, in group `k / 32`.
fn q4_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16(b, 0), f16(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let qs = &b[16..144];
    for g in 0..8 {
        let dg = d * sc[g] as f32;
        let mg = dmin * mn[g] as f32;
        let (i, s) = (g / 2, g % 2);
        for l in 0..32 {
            let q = (qs[32 * i + l] >> (4 * s)) & 0x0F;
            out[32 * g + l] = dg * q as f32 - mg;
        }
    }
}

/// Q5_K: `d`, `dmin` F16, `scales[12]`, `qh[32]`, `qs[128]`; the fifth bit of element
/// `32g + l` is bit `g` of `qh[l]`.
fn q5_k(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16(b, 0), f16(b, 2));
    let (sc, mn) = scale_min_k4(&b[4..16]);
    let qh = &b[16..48];
    let qs = &b[48..176];
    for g in 0..8 {
        let dg = d * sc[g] as f32;
        let mg = dmin * mn[g] as f32;
        let (i, s) = (g / 2, g % 2);
        for l in 0..32 {
            let lo = (qs[32 * i + l] >> (4 * s)) & 0x0F;
            let hi = (qh[l] >> g) & 1;
            let q = lo | (hi << 4);
            out[32 * g + l] = dg * q as f32 - mg;
        }
    }
}

/// Q6_K: `ql[128]`, `qh[64]`, `scales[16]` int8, `d` F16. Element `k = 128i + 64s + m`
/// (`m < 64`) has low bits `(ql[64i + m] >> 4s) & 15`; element `k = 128i + 32t + l` has high bits
/// `(qh[32i + l] >> 2t) & 3`; offset 32; group `k / 16`.
fn q6_k(b: &[u8], out: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16(b, 208);
    for i in 0..2 {
        for t in 0..4 {
            // Elements 128i + 32t + l: low bits from ql[64i + 32(t % 2) + l], nibble t / 2.
            let lo0 = 64 * i + 32 * (t % 2);
            for h in 0..2 {
                let dg = d * (scales[8 * i + 2 * t + h] as i8) as f32;
                let base = 128 * i + 32 * t + 16 * h;
                let lsrc = &ql[lo0 + 16 * h..lo0 + 16 * h + 16];
                let hsrc = &qh[32 * i + 16 * h..32 * i + 16 * h + 16];
                for ((o, &l), &hb) in out[base..base + 16].iter_mut().zip(lsrc).zip(hsrc) {
                    let lo = (l >> (4 * (t / 2))) & 0x0F;
                    let hi = (hb >> (2 * t)) & 0x03;
                    *o = dg * ((lo | (hi << 4)) as i32 - 32) as f32;
                }
            }
        }
    }
}

/// TQ1_0: `qs[48]`, `qh[4]`, `d` F16. Bytes hold base-3 digits scaled to 0..256: digit `p` of a
/// byte `v` is `((v · 3^p mod 256) · 3) >> 8`, minus 1. Elements: 160 from `qs[0..32]`
/// (`32p + l`), 80 from `qs[32..48]` (`16p + l`), 16 from `qh` (`4p + l`).
fn tq1_0(b: &[u8], out: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let d = f16(b, 52);
    let trit = |v: u8, p: usize| -> f32 {
        let x = v.wrapping_mul(POW3[p]) as u16;
        (((x * 3) >> 8) as i32 - 1) as f32
    };
    for p in 0..5 {
        for l in 0..32 {
            out[32 * p + l] = d * trit(b[l], p);
        }
        for l in 0..16 {
            out[160 + 16 * p + l] = d * trit(b[32 + l], p);
        }
    }
    for p in 0..4 {
        for l in 0..4 {
            out[240 + 4 * p + l] = d * trit(b[48 + l], p);
        }
    }
}

/// TQ2_0: `qs[64]`, `d` F16. Element `k = 128i + 32s + l` is `((qs[32i + l] >> 2s) & 3) − 1`.
fn tq2_0(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 64);
    for i in 0..2 {
        for s in 0..4 {
            let base = 128 * i + 32 * s;
            for (o, &q) in out[base..base + 32].iter_mut().zip(&b[32 * i..32 * i + 32]) {
                *o = d * (((q >> (2 * s)) & 3) as i32 - 1) as f32;
            }
        }
    }
}

/// The non-linear 4-bit table of IQ4_NL and IQ4_XS.
const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: `d` F16, `qs[16]` (element `j < 16` low nibble of `qs[j]`, else high of `qs[j − 16]`).
fn iq4_nl(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 0);
    let (lo, hi) = out.split_at_mut(16);
    for ((&q, o0), o1) in b[2..18].iter().zip(lo).zip(hi) {
        *o0 = d * IQ4_VALUES[(q & 0x0F) as usize] as f32;
        *o1 = d * IQ4_VALUES[(q >> 4) as usize] as f32;
    }
}

/// IQ4_XS: `d` F16, `scales_h` u16, `scales_l[4]`, `qs[128]`. Group `g` (32 elements) has scale
/// `((scales_l[g / 2] >> 4(g % 2)) & 15 | ((scales_h >> 2g) & 3) << 4) − 32`; element
/// `32g + 16s + m` is nibble `s` of `qs[16g + m]`.
fn iq4_xs(b: &[u8], out: &mut [f32]) {
    let d = f16(b, 0);
    let sh = u16::from_le_bytes([b[2], b[3]]);
    let sl = &b[4..8];
    let qs = &b[8..136];
    for g in 0..8 {
        let lo = (sl[g / 2] >> (4 * (g % 2))) & 0x0F;
        let hi = ((sh >> (2 * g)) & 3) as u8;
        let sc = (lo | (hi << 4)) as i32 - 32;
        let dl = d * sc as f32;
        for k in 0..32 {
            let (s, m) = (k / 16, k % 16);
            let n = (qs[16 * g + m] >> (4 * s)) & 0x0F;
            out[32 * g + k] = dl * IQ4_VALUES[n as usize] as f32;
        }
    }
}

/// The E2M1 values doubled, MXFP4's table.
const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4: `e` E8M0, `qs[16]`. `d = 2^(e − 128)` (half the E8M0 value, as ggml's
/// `ggml_e8m0_to_fp32_half`; subnormal for `e < 2`); element as IQ4_NL's layout, table E2M1 ×2.
fn mxfp4(b: &[u8], out: &mut [f32]) {
    let e = b[0] as u32;
    let d = f32::from_bits(if e < 2 {
        0x0020_0000 << e
    } else {
        (e - 1) << 23
    });
    let (lo, hi) = out.split_at_mut(16);
    for ((&q, o0), o1) in b[1..17].iter().zip(lo).zip(hi) {
        *o0 = d * MXFP4_VALUES[(q & 0x0F) as usize] as f32;
        *o1 = d * MXFP4_VALUES[(q >> 4) as usize] as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_one_row_matching_the_dtype_table() {
        for t in QuantType::ALL {
            assert_eq!(TYPES.iter().filter(|e| e.0 == t).count(), 1, "{t:?}");
            let g = t.dtype().geometry();
            assert_eq!(
                (g.block_elems as usize, g.block_bytes as usize),
                (t.block_elems(), t.block_bytes()),
                "{t:?}"
            );
            assert_eq!(QuantType::from_dtype(t.dtype()), Some(t));
            assert_eq!(format!("{t:?}"), t.dtype().name());
            assert!(t.block_elems() <= MAX_BLOCK_ELEMS);
        }
        assert_eq!(TYPES.len(), QuantType::ALL.len());
    }

    #[test]
    fn unsupported_types_and_bad_lengths_are_errors_naming_the_type() {
        let iq = Dtype::from_name("IQ2_XXS").expect("in the table");
        assert!(!is_supported(iq));
        let e = dequantize_blocks(iq, &[0; 66], &mut [0.0; 256]).expect_err("an error");
        assert!(e.to_string().contains("IQ2_XXS"), "{e}");
        let e = dequantize_blocks(Dtype::Q8_0, &[0; 33], &mut [0.0; 32]).expect_err("an error");
        assert!(e.to_string().contains("Q8_0"), "{e}");
        let e = dequantize_blocks(Dtype::Q8_0, &[0; 34], &mut [0.0; 31]).expect_err("an error");
        assert!(matches!(e, QuantError::Length { .. }), "{e}");
    }
}
