//! The CPU kernels: canonical dot products on the instruction set chosen once at start-up, and
//! matrix-vector products that split work across threads only along outputs.
//!
//! [`Isa`] names a path; [`Isa::best`] picks the widest this CPU runs; `TARFA_ISA` (or
//! `--isa`) forces one. Every path gives the scalar reference's bits (`canon`), so the choice
//! changes speed, never output.

use std::fmt;

use crate::canon;
use crate::weights::{MatrixRef, WeightSlice};

#[cfg(target_arch = "x86_64")]
mod x86;

/// Environment variable that forces an instruction-set path: `scalar`, `avx2`, `avx512`.
pub const ENV_ISA: &str = "TARFA_ISA";

/// Why an instruction-set path was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IsaFault {
    /// A name that is no path.
    #[error("unknown instruction set {name:?} (scalar, avx2, avx512)")]
    Unknown {
        /// The name given.
        name: String,
    },
    /// A path this CPU cannot run.
    #[error("this CPU cannot run the {isa} kernels")]
    Unavailable {
        /// The path.
        isa: Isa,
    },
}

/// An instruction-set path of the canonical kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The scalar reference (`canon`): every other path is tested against it.
    Scalar,
    /// x86-64 AVX2 with FMA: four 8-lane registers.
    Avx2,
    /// x86-64 AVX-512F: two 16-lane registers.
    Avx512,
}

impl Isa {
    /// Every path, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Scalar, Isa::Avx2, Isa::Avx512];

    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest available path.
    pub fn best() -> Isa {
        [Isa::Avx512, Isa::Avx2]
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// Every path this CPU runs.
    pub fn available_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }

    /// The path named by `TARFA_ISA`, else [`Isa::best`]. A named path this CPU lacks is an error.
    pub fn from_env() -> Result<Isa, IsaFault> {
        match std::env::var(ENV_ISA) {
            Ok(v) if !v.is_empty() && v != "auto" => v.parse::<Isa>().and_then(Isa::checked),
            _ => Ok(Isa::best()),
        }
    }

    /// `Ok(self)` if this CPU runs it.
    pub fn checked(self) -> Result<Isa, IsaFault> {
        if self.available() {
            Ok(self)
        } else {
            Err(IsaFault::Unavailable { isa: self })
        }
    }

    /// Canonical dot product of a weight row and `x`. A quantised row is dequantised to `f32`
    /// (exactly gguf-py's values) and then takes the `f32` dot: the bits of the same row stored
    /// as `f32`.
    #[inline]
    pub fn dot(self, w: WeightSlice<'_>, x: &[f32]) -> f32 {
        match w {
            WeightSlice::Bf16(w) => self.dot_bf16(w, x),
            WeightSlice::F32(w) => self.dot_f32(w, x),
            WeightSlice::Quant(q) => {
                let mut buf = vec![0.0f32; q.len()];
                q.dequantize_into(&mut buf);
                self.dot_f32(&buf, x)
            }
        }
    }

    /// [`Isa::dot`] with `buf` for a quantised row's `f32` values (reused across calls).
    #[inline]
    fn dot_with(self, w: WeightSlice<'_>, x: &[f32], buf: &[f32]) -> f32 {
        match w {
            WeightSlice::Quant(_) => self.dot_f32(buf, x),
            _ => self.dot(w, x),
        }
    }

    /// `out[i] = self.dot_with(w, xs[i], buf)` for every `i`: the row's canonical dot with each
    /// vector, the same bits as one at a time, computed four (AVX-512) or two (AVX2) vectors at
    /// a time so that each part of the row is loaded and widened once for all of them.
    fn dots_with(
        self,
        w: WeightSlice<'_>,
        xs: &[&[f32]],
        buf: &[f32],
        mut out: impl FnMut(usize, f32),
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            let (bf16, f32s): (Option<&[u16]>, Option<&[f32]>) = match w {
                WeightSlice::Bf16(r) => (Some(r), None),
                WeightSlice::F32(r) => (None, Some(r)),
                WeightSlice::Quant(_) => (None, Some(buf)),
            };
            let mut i = 0;
            match self {
                Isa::Avx512 => {
                    while i + 4 <= xs.len() {
                        let four = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                        let d = match (bf16, f32s) {
                            (Some(r), _) => x86::dots4_bf16_on_avx512(r, four),
                            (_, Some(r)) => x86::dots4_f32_on_avx512(r, four),
                            _ => None,
                        };
                        let Some(d) = d else { break };
                        for (j, v) in d.into_iter().enumerate() {
                            out(i + j, v);
                        }
                        i += 4;
                    }
                }
                Isa::Avx2 => {
                    while i + 2 <= xs.len() {
                        let two = [xs[i], xs[i + 1]];
                        let d = match (bf16, f32s) {
                            (Some(r), _) => x86::dots2_bf16_on_avx2(r, two),
                            (_, Some(r)) => x86::dots2_f32_on_avx2(r, two),
                            _ => None,
                        };
                        let Some(d) = d else { break };
                        for (j, v) in d.into_iter().enumerate() {
                            out(i + j, v);
                        }
                        i += 2;
                    }
                }
                Isa::Scalar => {}
            }
            for (j, x) in xs.iter().enumerate().skip(i) {
                out(j, self.dot_with(w, x, buf));
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        for (j, x) in xs.iter().enumerate() {
            out(j, self.dot_with(w, x, buf));
        }
    }

    /// `out(i, t, dot(ws[i], xs[t]))` for both rows and every vector (`bufs[i]`: a quantised row's
    /// `f32` values): on AVX-512 two rows and four vectors at a time, each 32 elements of a vector
    /// loaded once for both rows and each 32 of a row once for the four (a register tile); rows of
    /// different element types, other paths and the last vectors through [`Isa::dots_with`] a row
    /// at a time, row 0 before row 1. Every value is its pair's canonical dot.
    fn dots2_with(
        self,
        ws: [WeightSlice<'_>; 2],
        xs: &[&[f32]],
        bufs: [&[f32]; 2],
        mut out: impl FnMut(usize, usize, f32),
    ) {
        let mut i = 0;
        #[cfg(target_arch = "x86_64")]
        if self == Isa::Avx512 {
            fn as_f32<'a>(w: WeightSlice<'a>, buf: &'a [f32]) -> Option<&'a [f32]> {
                match w {
                    WeightSlice::F32(r) => Some(r),
                    WeightSlice::Quant(_) => Some(buf),
                    WeightSlice::Bf16(_) => None,
                }
            }
            let bf16 = match ws {
                [WeightSlice::Bf16(a), WeightSlice::Bf16(b)] => Some([a, b]),
                _ => None,
            };
            let f32s = as_f32(ws[0], bufs[0])
                .zip(as_f32(ws[1], bufs[1]))
                .map(|(a, b)| [a, b]);
            while i + 4 <= xs.len() && (bf16.is_some() || f32s.is_some()) {
                let four = [xs[i], xs[i + 1], xs[i + 2], xs[i + 3]];
                let d = match (bf16, f32s) {
                    (Some(r), _) => x86::dots2x4_bf16_on_avx512(r, four),
                    (_, Some(r)) => x86::dots2x4_f32_on_avx512(r, four),
                    _ => None,
                };
                let Some(d) = d else { break };
                for (r, row) in d.iter().enumerate() {
                    for (j, &v) in row.iter().enumerate() {
                        out(r, i + j, v);
                    }
                }
                i += 4;
            }
        }
        if i < xs.len() {
            for (r, (&w, &buf)) in ws.iter().zip(&bufs).enumerate() {
                self.dots_with(w, &xs[i..], buf, |t, v| out(r, i + t, v));
            }
        }
    }

    /// Canonical dot product of BF16 weights and `x`.
    #[inline]
    pub fn dot_bf16(self, w: &[u16], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len(), "dot of unequal lengths");
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::dot_bf16_on_avx2(w, x).unwrap_or_else(|| canon::dot_bf16(w, x)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::dot_bf16_on_avx512(w, x).unwrap_or_else(|| canon::dot_bf16(w, x)),
            _ => canon::dot_bf16(w, x),
        }
    }

    /// Canonical dot product of two `f32` vectors.
    #[inline]
    pub fn dot_f32(self, w: &[f32], x: &[f32]) -> f32 {
        assert_eq!(w.len(), x.len(), "dot of unequal lengths");
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::dot_f32_on_avx2(w, x).unwrap_or_else(|| canon::dot_f32(w, x)),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::dot_f32_on_avx512(w, x).unwrap_or_else(|| canon::dot_f32(w, x)),
            _ => canon::dot_f32(w, x),
        }
    }

    /// `silu(g) · u` for one pair.
    #[inline]
    pub fn silu_mul_one(self, g: f32, u: f32) -> f32 {
        #[cfg(target_arch = "x86_64")]
        if self != Isa::Scalar {
            if let Some(v) = x86::silu_mul_one_on_fma(g, u) {
                return v;
            }
        }
        canon::silu(g) * u
    }

    /// [`canon::softmax`] in place.
    pub fn softmax(self, x: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self != Isa::Scalar && x86::softmax_on_fma(x) {
            return;
        }
        canon::softmax(x)
    }

    /// [`canon::weighted_rows`].
    pub fn weighted_rows<'r>(self, a: &[f32], row: impl Fn(usize) -> &'r [f32], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self != Isa::Scalar && x86::weighted_rows_on_fma(a, &row, out) {
            return;
        }
        canon::weighted_rows(a, row, out)
    }

    /// [`canon::rms_norm`].
    pub fn rms_norm(self, x: &[f32], w: impl Fn(usize) -> f32, eps: f32, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self != Isa::Scalar && x86::rms_norm_on_fma(x, &w, eps, out) {
            return;
        }
        canon::rms_norm(x, w, eps, out)
    }

    /// `out[t][r] = dot(m.row(r), xs[t])` for every token `t` and row `r`: a matrix times a batch
    /// of vectors. Each output is one canonical dot, so neither the thread count nor the batch
    /// size changes a bit. See [`Isa::matmul_many`].
    pub fn matmul(self, m: MatrixRef<'_>, xs: &[&[f32]], out: &mut [Vec<f32>]) {
        self.matmul_many(&mut [MatJob::new(m, xs, out)]);
    }

    /// Several matrix products in one parallel phase (e.g. the gate and up projections of every
    /// selected expert of a layer). The rows of all jobs, laid end to end and weighed by their
    /// bytes, are cut into chunks (at multiples of four rows) that every thread of the decoder's
    /// team (`team::broadcast`) takes in order from one counter until none is left: contiguous
    /// sequential streams, and a slowed thread takes fewer. `TARFA_SPLIT=static` gives each
    /// thread one equal share instead. Each output is still one canonical dot on one thread, so
    /// the split changes no bit.
    pub fn matmul_many(self, jobs: &mut [MatJob<'_, '_>]) {
        let mut starts = Vec::with_capacity(jobs.len());
        let mut total = 0usize;
        for job in jobs.iter() {
            let m = job.m;
            assert_eq!(job.xs.len(), job.out.len());
            for (x, o) in job.xs.iter().zip(job.out.iter()) {
                assert_eq!(x.len(), m.cols, "{}: input length", m.name);
                assert_eq!(o.len(), m.rows, "{}: output length", m.name);
            }
            if let Some(up) = job.up {
                assert_eq!(
                    (up.rows, up.cols),
                    (m.rows, m.cols),
                    "{}: paired shapes",
                    up.name
                );
            }
            starts.push(total);
            total += m.rows * job_row_bytes(job);
        }
        let jobs_ro: &[MatJob<'_, '_>] = jobs;
        // The first row of job j at or after global byte g (a multiple of 4, or the row count).
        let boundary = |j: usize, g: usize| -> usize {
            let m = jobs_ro[j].m;
            let b = job_row_bytes(&jobs_ro[j]).max(1);
            if g <= starts[j] {
                return 0;
            }
            let r = (g - starts[j]).div_ceil(b).div_ceil(4) * 4;
            r.min(m.rows)
        };
        // The rows of global bytes a..b (each job's part of it, at multiples of four rows).
        let range = |a: usize, b: usize, mine: &mut Vec<RowsDone>| {
            for (j, job) in jobs_ro.iter().enumerate() {
                let (r0, r1) = (boundary(j, a), boundary(j, b));
                if r0 < r1 {
                    let mut res = vec![vec![0.0f32; r1 - r0]; job.xs.len()];
                    self.rows_into(job, r0, r1, &mut res);
                    mine.push((j, r0, res));
                }
            }
        };
        let shares: Vec<Vec<RowsDone>> = if total < SERIAL_BYTES {
            // Tiny products (test-sized models) are cheaper on the calling thread than in a
            // parallel region. Same rows, same dots.
            let mut mine = Vec::new();
            range(0, total, &mut mine);
            vec![mine]
        } else if split_static() {
            crate::team::broadcast(|i, n| {
                let mut mine = Vec::new();
                range(total * i / n, total * (i + 1) / n, &mut mine);
                mine
            })
        } else {
            // Chunks of ~1/16 of a thread's share, taken in order from one counter: a thread
            // that is slowed (another process, an interrupt) takes fewer.
            let n = crate::team::threads();
            let chunk = (total / (n * 16)).max(256 << 10);
            let next = std::sync::atomic::AtomicUsize::new(0);
            crate::team::broadcast(|_, _| {
                let mut mine = Vec::new();
                loop {
                    let c = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let a = c.saturating_mul(chunk);
                    if a >= total {
                        break;
                    }
                    range(a, (a + chunk).min(total), &mut mine);
                }
                mine
            })
        };
        if shares.iter().filter(|m| !m.is_empty()).count() > 1 {
            PRODUCTS_SPLIT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for (j, r0, res) in shares.into_iter().flatten() {
            for (o, r) in jobs[j].out.iter_mut().zip(res) {
                o[r0..r0 + r.len()].copy_from_slice(&r);
            }
        }
    }

    /// Rows `r0..r1` of `m` against every `x`, on this thread: one row at a time, so the
    /// weights stream through memory in one sequential run (four interleaved rows measured 27%
    /// slower: `decode/examples/matvec_rate`, ledger row (h)); each row meets the tokens while it
    /// is in L1, four or two at a time ([`Isa::dots_with`]).
    ///
    /// A prompt's tokens are taken in blocks of about [`TOKEN_BLOCK_BYTES`]: every row of the
    /// share meets one block, then the next — so the block stays in L2 while the share's rows
    /// (a chunk of at most a few hundred KiB) pass through it, instead of every row reading every
    /// token from further away. Each output is still one canonical dot.
    ///
    /// A quantised row is dequantised into this thread's buffer (gguf-py's `f32` values) for
    /// each block, then meets the block's tokens through the `f32` dot.
    fn rows_into(self, job: &MatJob<'_, '_>, r0: usize, r1: usize, res: &mut [Vec<f32>]) {
        let (mut buf, mut up_buf) = (Vec::new(), Vec::new());
        let block = (TOKEN_BLOCK_BYTES / (job.m.cols.max(1) * 4)).max(4) / 4 * 4;
        let mut t0 = 0;
        while t0 < job.xs.len() {
            let t1 = (t0 + block).min(job.xs.len());
            let xs = &job.xs[t0..t1];
            // Two rows at once where they meet four tokens or more (a register tile); one
            // token's rows one at a time (decode: measured 1.2x slower in pairs).
            let pairs = xs.len() >= 4;
            let mut r = r0;
            while r < r1 {
                let row = job.m.row(r);
                dequantize_row(row, &mut buf);
                match job.up {
                    None if pairs && r + 1 < r1 => {
                        // Two rows at once (a register tile with four tokens).
                        let next = job.m.row(r + 1);
                        dequantize_row(next, &mut up_buf);
                        self.dots2_with([row, next], xs, [&buf, &up_buf], |i, t, v| {
                            res[t0 + t][r + i - r0] = v
                        });
                        r += 2;
                    }
                    None => {
                        self.dots_with(row, xs, &buf, |t, v| res[t0 + t][r - r0] = v);
                        r += 1;
                    }
                    Some(up) => {
                        let up_row = up.row(r);
                        dequantize_row(up_row, &mut up_buf);
                        // The gate's dot into the output, then the output the gate's SiLU times
                        // the up row's dot (row 0's values come before row 1's): the same two
                        // dots and product as one token at a time.
                        self.dots2_with([row, up_row], xs, [&buf, &up_buf], |i, t, v| {
                            let o = &mut res[t0 + t][r - r0];
                            *o = match (i, job.limit) {
                                (0, _) => v,
                                (_, None) => self.silu_mul_one(*o, v),
                                (_, Some(l)) => self.silu_mul_one(clamp_max(*o, l), clamp(v, l)),
                            };
                        });
                        r += 1;
                    }
                }
            }
            t0 = t1;
        }
    }
}

/// About how many bytes of a prompt's token vectors one block of [`Isa::rows_into`] holds.
const TOKEN_BLOCK_BYTES: usize = 32 << 10;

/// Products (calls of [`Isa::matmul_many`]) whose rows more than one thread computed.
static PRODUCTS_SPLIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many products so far in this process had their rows computed by more than one thread:
/// what lets a test of thread-count invariance see that the work was really divided (a product
/// under [`SERIAL_BYTES`], or one chunk, runs on one thread whatever the thread count).
pub fn products_split() -> u64 {
    PRODUCTS_SPLIT.load(std::sync::atomic::Ordering::Relaxed)
}

/// A thread's finished rows: job, first row, outputs per token.
type RowsDone = (usize, usize, Vec<Vec<f32>>);

/// Environment variable: `static` splits every product into one equal share per thread instead
/// of chunks taken from a counter (for measuring one against the other; the bits are the same).
pub const ENV_SPLIT: &str = "TARFA_SPLIT";

/// 0: not read yet; 1: chunks from a counter; 2: static shares.
static SPLIT_MODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

fn split_static() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match SPLIT_MODE.load(Relaxed) {
        0 => {
            let on = std::env::var(ENV_SPLIT).is_ok_and(|v| v == "static");
            // A mode set meanwhile by `set_static_split` stands.
            let _ = SPLIT_MODE.compare_exchange(0, if on { 2 } else { 1 }, Relaxed, Relaxed);
            SPLIT_MODE.load(Relaxed) == 2
        }
        m => m == 2,
    }
}

/// Split every product into one equal share per thread (`true`, as `TARFA_SPLIT=static`) or into
/// chunks taken from a counter (`false`, the default), from now on, for the whole process. The
/// bits are the same either way; a test sets `true` to know that every thread computes part of a
/// product that is over the serial threshold (with chunks, a thread that starts late may find
/// none left).
pub fn set_static_split(on: bool) {
    SPLIT_MODE.store(if on { 2 } else { 1 }, std::sync::atomic::Ordering::Relaxed);
}

/// Below this many bytes of weights, [`Isa::matmul_many`] runs on the calling thread. (At 1 MiB
/// the 0.5 MB router ran serially and cost more at 16 threads than a parallel region:
/// `bench-logs/h200-2026-12-01-decode-d.log`.)
const SERIAL_BYTES: usize = 64 << 10;

/// Bytes one output row of `job` reads (both matrices of a gate/up pair).
fn job_row_bytes(job: &MatJob<'_, '_>) -> usize {
    row_bytes(job.m) + job.up.map_or(0, row_bytes)
}

/// Bytes of one row of `m` as stored.
fn row_bytes(m: MatrixRef<'_>) -> usize {
    let (bytes, elems) = m.data.block_geometry();
    m.cols / elems.max(1) * bytes
}

/// `min(x, l)` as torch's `clamp(max=l)` computes it (a NaN stays NaN).
#[inline]
fn clamp_max(x: f32, l: f32) -> f32 {
    if x > l {
        l
    } else {
        x
    }
}

/// `x` clamped to `[-l, l]` as torch's `clamp(min=-l, max=l)` computes it (a NaN stays NaN).
#[inline]
fn clamp(x: f32, l: f32) -> f32 {
    if x < -l {
        -l
    } else {
        clamp_max(x, l)
    }
}

/// A quantised row's `f32` values into `buf` (other rows are used as they are).
fn dequantize_row(row: WeightSlice<'_>, buf: &mut Vec<f32>) {
    if let WeightSlice::Quant(q) = row {
        buf.resize(q.len(), 0.0);
        q.dequantize_into(buf);
    }
}

/// One product of [`Isa::matmul_many`]: `out[t] = m · xs[t]`, or, with `up`, the SwiGLU gate
/// `out[t][r] = silu(m[r]·xs[t]) · (up[r]·xs[t])` (each dot canonical, then one SiLU and one
/// product: the same bits as computing both products and the gate apart).
#[derive(Debug)]
pub struct MatJob<'m, 'o> {
    /// The matrix (the gate projection, with `up`).
    pub m: MatrixRef<'m>,
    /// The up projection, the same shape as `m`, for a fused SwiGLU gate.
    pub up: Option<MatrixRef<'m>>,
    /// A clamped SwiGLU's limit `L` (GLM-5.3-Flash): the gate's dot clamped above at `L` and
    /// the up dot to `[-L, L]` before the SiLU and the product.
    pub limit: Option<f32>,
    /// One input vector per token.
    pub xs: &'o [&'o [f32]],
    /// One output vector (of `m.rows`) per token.
    pub out: &'o mut [Vec<f32>],
}

impl<'m, 'o> MatJob<'m, 'o> {
    /// A plain product.
    pub fn new(m: MatrixRef<'m>, xs: &'o [&'o [f32]], out: &'o mut [Vec<f32>]) -> Self {
        MatJob {
            m,
            up: None,
            limit: None,
            xs,
            out,
        }
    }

    /// The SwiGLU gate `silu(gate·x) ⊙ (up·x)`.
    pub fn swiglu_gate(
        gate: MatrixRef<'m>,
        up: MatrixRef<'m>,
        xs: &'o [&'o [f32]],
        out: &'o mut [Vec<f32>],
    ) -> Self {
        MatJob {
            m: gate,
            up: Some(up),
            limit: None,
            xs,
            out,
        }
    }

    /// The SwiGLU gate with its dots clamped as `limit` says (`None`: [`MatJob::swiglu_gate`]).
    pub fn clamped(mut self, limit: Option<f32>) -> Self {
        self.limit = limit;
        self
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        })
    }
}

impl std::str::FromStr for Isa {
    type Err = IsaFault;
    fn from_str(s: &str) -> Result<Isa, IsaFault> {
        match s {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            _ => Err(IsaFault::Unknown { name: s.into() }),
        }
    }
}

#[cfg(test)]
mod isa_tests {
    use super::{Isa, IsaFault};

    #[test]
    fn an_unknown_or_unavailable_path_is_its_own_fault() {
        assert_eq!(
            "neon".parse::<Isa>(),
            Err(IsaFault::Unknown {
                name: "neon".into()
            })
        );
        for isa in Isa::ALL {
            let want = if isa.available() {
                Ok(isa)
            } else {
                Err(IsaFault::Unavailable { isa })
            };
            assert_eq!(isa.checked(), want);
        }
    }
}
