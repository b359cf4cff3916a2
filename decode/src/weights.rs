//! Weights as the checkpoint's bytes: BF16 stays BF16 (widened to `f32` at use, exactly), `f32`
//! stays `f32`, GGUF quantised types ([`crate::quant`]) stay quantised and are dequantised at
//! use, one row at a time, exactly as gguf-py dequantises them. F16 trunk and layer tensors are
//! widened to `f32` once at load (exact); F16 experts are widened a row at a time, like a
//! quantised type. Nothing is rounded, re-quantised or pre-multiplied.
//!
//! - [`WeightSlice`] / [`MatrixRef`]: borrowed views the kernels take, over resident tensors or
//!   an expert's bytes in its ring slot or cache entry.
//! - [`Tensor`]: an owned tensor of the trunk or of a layer (attention, norms, router).
//! - [`TensorStore`]: every non-expert tensor of a model directory, read once and hash-checked
//!   (both recorded hashes), each file first held to the manifest's root digest.

use std::collections::HashMap;
use std::path::Path;

use tarfa_format::manifest::{FileKind, Manifest};
use tarfa_format::{Dtype, JnfReader, Role};
use tarfa_runtime::ModelExperts;

use crate::canon::bf16_to_f32;
use crate::error::{DecodeError, ManifestMismatch, Result, TensorFault};
use crate::quant::{QuantType, MAX_BLOCK_ELEMS};

const _: () = assert!(
    cfg!(target_endian = "little"),
    "weights are viewed in place as little-endian"
);

/// Borrowed weights, in their stored element type.
#[derive(Clone, Copy, Debug)]
pub enum WeightSlice<'a> {
    /// BF16 bit patterns.
    Bf16(&'a [u16]),
    /// `f32` values.
    F32(&'a [f32]),
    /// Whole blocks of a GGUF element type, dequantised at use ([`crate::quant`]).
    Quant(QuantSlice<'a>),
}

/// Whole blocks of one [`QuantType`], as stored (any alignment).
#[derive(Clone, Copy, Debug)]
pub struct QuantSlice<'a> {
    ty: QuantType,
    bytes: &'a [u8],
}

impl<'a> QuantSlice<'a> {
    /// `bytes` as blocks of `ty`; `None` unless they are a whole number of blocks.
    pub fn new(ty: QuantType, bytes: &'a [u8]) -> Option<QuantSlice<'a>> {
        ty.elems_of(bytes.len())?;
        Some(QuantSlice { ty, bytes })
    }

    /// The element type.
    pub fn ty(self) -> QuantType {
        self.ty
    }

    /// The stored bytes.
    pub fn bytes(self) -> &'a [u8] {
        self.bytes
    }

    /// Number of elements.
    pub fn len(self) -> usize {
        self.bytes.len() / self.ty.block_bytes() * self.ty.block_elems()
    }

    /// Whether it has no elements.
    pub fn is_empty(self) -> bool {
        self.bytes.is_empty()
    }

    /// Elements `a..b`; both must be block boundaries (rows of a quantised matrix always are).
    pub fn slice(self, a: usize, b: usize) -> QuantSlice<'a> {
        let (be, bb) = (self.ty.block_elems(), self.ty.block_bytes());
        assert!(
            a.is_multiple_of(be) && b.is_multiple_of(be) && a <= b && b <= self.len(),
            "{}: elements {a}..{b} of {} are not whole blocks of {be}",
            self.ty,
            self.len()
        );
        QuantSlice {
            ty: self.ty,
            bytes: &self.bytes[a / be * bb..b / be * bb],
        }
    }

    /// Element `i`, dequantising its block.
    pub fn get(self, i: usize) -> f32 {
        let (be, bb) = (self.ty.block_elems(), self.ty.block_bytes());
        let b = i / be;
        let mut out = [0.0f32; MAX_BLOCK_ELEMS];
        self.ty
            .dequantize(&self.bytes[b * bb..(b + 1) * bb], &mut out[..be])
            .expect("one whole block");
        out[i % be]
    }

    /// Every element into `out` (of [`QuantSlice::len`] elements).
    pub fn dequantize_into(self, out: &mut [f32]) {
        self.ty
            .dequantize(self.bytes, out)
            .expect("whole blocks into their element count");
    }
}

impl<'a> WeightSlice<'a> {
    /// Element `i` widened (or dequantised) to `f32`.
    #[inline]
    pub fn get(self, i: usize) -> f32 {
        match self {
            WeightSlice::Bf16(w) => bf16_to_f32(w[i]),
            WeightSlice::F32(w) => w[i],
            WeightSlice::Quant(q) => q.get(i),
        }
    }

    /// Number of elements.
    pub fn len(self) -> usize {
        match self {
            WeightSlice::Bf16(w) => w.len(),
            WeightSlice::F32(w) => w.len(),
            WeightSlice::Quant(q) => q.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Elements `a..b` (for a quantised slice, at block boundaries).
    pub fn slice(self, a: usize, b: usize) -> WeightSlice<'a> {
        match self {
            WeightSlice::Bf16(w) => WeightSlice::Bf16(&w[a..b]),
            WeightSlice::F32(w) => WeightSlice::F32(&w[a..b]),
            WeightSlice::Quant(q) => WeightSlice::Quant(q.slice(a, b)),
        }
    }

    /// Bytes one element takes as stored, as a fraction `(bytes, elements)` of a block.
    pub fn block_geometry(self) -> (usize, usize) {
        match self {
            WeightSlice::Bf16(_) => (2, 1),
            WeightSlice::F32(_) => (4, 1),
            WeightSlice::Quant(q) => (q.ty.block_bytes(), q.ty.block_elems()),
        }
    }

    /// View stored bytes of `dtype` in place: BF16 and F32 as themselves when aligned, every
    /// other type [`crate::quant`] supports (and unaligned BF16/F32) as quantised blocks. `None`
    /// for types this build does not compute with, or bytes that are not a whole number of
    /// blocks.
    pub fn from_bytes(dtype: Dtype, bytes: &'a [u8]) -> Option<WeightSlice<'a>> {
        if dtype == Dtype::BF16 {
            if let Ok(w) = bytemuck::try_cast_slice(bytes) {
                return Some(WeightSlice::Bf16(w));
            }
        } else if dtype == Dtype::F32 {
            if let Ok(w) = bytemuck::try_cast_slice(bytes) {
                return Some(WeightSlice::F32(w));
            }
        }
        QuantSlice::new(QuantType::from_dtype(dtype)?, bytes).map(WeightSlice::Quant)
    }
}

/// A row-major matrix `[rows, cols]` (an `nn.Linear` weight: `[out, in]`).
#[derive(Clone, Copy, Debug)]
pub struct MatrixRef<'a> {
    /// Tensor name, for errors.
    pub name: &'a str,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
    /// `rows × cols` elements.
    pub data: WeightSlice<'a>,
}

impl<'a> MatrixRef<'a> {
    /// Row `r`.
    #[inline]
    pub fn row(&self, r: usize) -> WeightSlice<'a> {
        self.data.slice(r * self.cols, (r + 1) * self.cols)
    }

    /// Row `r` of a BF16 matrix.
    #[inline]
    pub fn bf16_row(&self, r: usize) -> &'a [u16] {
        match self.data {
            WeightSlice::Bf16(w) => &w[r * self.cols..(r + 1) * self.cols],
            _ => panic!("{}: not BF16", self.name),
        }
    }

    /// Rows `a..b` as a matrix.
    pub fn rows(&self, a: usize, b: usize) -> MatrixRef<'a> {
        MatrixRef {
            name: self.name,
            rows: b - a,
            cols: self.cols,
            data: self.data.slice(a * self.cols, b * self.cols),
        }
    }
}

/// Owned elements of a tensor.
#[derive(Clone, Debug)]
enum TensorData {
    Bf16(Vec<u16>),
    F32(Vec<f32>),
    /// Whole blocks of a quantised type, as stored.
    Quant(QuantType, Vec<u8>),
}

/// An owned tensor, in its stored element type (F16 widened to `f32`).
///
/// A quantised matrix keeps its stored bytes and is dequantised one row at a time when used: its
/// `f32` form would take 4–8 times the memory (an embedding or output matrix of a large
/// vocabulary is the biggest tensor of the trunk), and the values are the same either way. A
/// quantised tensor of rank 0 or 1 (a norm, a bias) is dequantised once at load into `f32` (the
/// same values, exactly gguf-py's), because it is read element by element.
#[derive(Clone, Debug)]
pub struct Tensor {
    name: String,
    shape: Vec<usize>,
    data: TensorData,
}

impl Tensor {
    /// Decode stored little-endian bytes of `dtype` (BF16, F16, F32 and the quantised types of
    /// [`crate::quant`]). Another type, or a byte length that is not exactly the shape's, is an
    /// error naming the tensor.
    pub fn from_bytes(name: &str, dtype: Dtype, shape: &[u64], bytes: &[u8]) -> Result<Tensor> {
        let bad = |fault: TensorFault| DecodeError::BadTensor {
            name: name.into(),
            fault,
        };
        let ty =
            QuantType::from_dtype(dtype).ok_or_else(|| bad(TensorFault::Unsupported { dtype }))?;
        let overflow = || {
            bad(TensorFault::ShapeOverflow {
                shape: shape.to_vec(),
            })
        };
        let shape_us: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| overflow()))
            .collect::<Result<_>>()?;
        let n = shape_us
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(overflow)?;
        let shape = shape_us;
        let want = dtype.byte_len(&shape.iter().map(|&d| d as u64).collect::<Vec<_>>());
        if want != Some(bytes.len() as u64) {
            return Err(bad(match want {
                Some(want) => TensorFault::ByteLength {
                    bytes: bytes.len(),
                    shape,
                    dtype,
                    want,
                },
                None => TensorFault::PartialBlock {
                    shape,
                    dtype,
                    block_elems: ty.block_elems(),
                },
            }));
        }
        let data = match ty {
            QuantType::BF16 => TensorData::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            ),
            QuantType::F32 => TensorData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            ),
            QuantType::F16 => TensorData::F32(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
            ),
            _ if shape.len() <= 1 => {
                let mut v = vec![0.0f32; n];
                ty.dequantize(bytes, &mut v)
                    .map_err(|e| bad(TensorFault::Quant(e)))?;
                TensorData::F32(v)
            }
            _ => TensorData::Quant(ty, bytes.to_vec()),
        };
        let t = Tensor {
            name: name.into(),
            shape,
            data,
        };
        if t.len() != n {
            return Err(bad(TensorFault::ElementCount {
                elems: t.len(),
                shape: t.shape,
            }));
        }
        Ok(t)
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The same elements under another shape of as many elements (a vector `[n]` as the matrix
    /// `[1, n]`), or `None` where the counts differ.
    pub fn reshaped(mut self, shape: &[usize]) -> Option<Tensor> {
        let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d))?;
        (n == self.len()).then(|| {
            self.shape = shape.to_vec();
            self
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::Bf16(v) => v.len(),
            TensorData::F32(v) => v.len(),
            TensorData::Quant(ty, b) => b.len() / ty.block_bytes() * ty.block_elems(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its elements.
    pub fn slice(&self) -> WeightSlice<'_> {
        match &self.data {
            TensorData::Bf16(v) => WeightSlice::Bf16(v),
            TensorData::F32(v) => WeightSlice::F32(v),
            TensorData::Quant(ty, b) => match QuantSlice::new(*ty, b) {
                Some(q) => WeightSlice::Quant(q),
                // Whole blocks by construction (`from_bytes` checked the length).
                None => WeightSlice::F32(&[]),
            },
        }
    }

    /// As a matrix `[rows, cols]`, its shape checked.
    pub fn matrix(&self, rows: usize, cols: usize) -> Result<MatrixRef<'_>> {
        if self.shape != [rows, cols] {
            return Err(DecodeError::BadTensor {
                name: self.name.clone(),
                fault: TensorFault::Shape {
                    shape: self.shape.clone(),
                    expected: vec![rows, cols],
                },
            });
        }
        Ok(MatrixRef {
            name: &self.name,
            rows,
            cols,
            data: self.slice(),
        })
    }

    /// Every element as `f32` (BF16 widened, quantised blocks dequantised: the same values).
    fn values(&self) -> Vec<f32> {
        match &self.data {
            TensorData::Bf16(v) => v.iter().map(|&b| bf16_to_f32(b)).collect(),
            TensorData::F32(v) => v.clone(),
            TensorData::Quant(..) => {
                let mut out = vec![0.0f32; self.len()];
                if let WeightSlice::Quant(q) = self.slice() {
                    q.dequantize_into(&mut out);
                }
                out
            }
        }
    }

    /// A matrix `name` of `rows` rows whose row `r` is row `row(r)` of `self` (a matrix, its
    /// first dimension the rows): whole rows copied in the stored type — a quantised row's blocks
    /// as they are, so a row-wise re-arrangement of a quantised matrix costs no widening —, every
    /// value unchanged. `None` where `self` is not a matrix or `row` leaves it.
    pub fn rows_of(&self, name: &str, rows: usize, row: impl Fn(usize) -> usize) -> Option<Tensor> {
        let (&src_rows, rest) = self.shape.split_first()?;
        if rest.len() != 1 || src_rows == 0 || (0..rows).any(|r| row(r) >= src_rows) {
            return None;
        }
        fn pick<T: Copy>(
            v: &[T],
            src_rows: usize,
            rows: usize,
            row: &dyn Fn(usize) -> usize,
        ) -> Vec<T> {
            let w = v.len() / src_rows;
            (0..rows)
                .flat_map(|r| v[row(r) * w..(row(r) + 1) * w].iter().copied())
                .collect()
        }
        let data = match &self.data {
            TensorData::Bf16(v) => TensorData::Bf16(pick(v, src_rows, rows, &row)),
            TensorData::F32(v) => TensorData::F32(pick(v, src_rows, rows, &row)),
            TensorData::Quant(ty, b) if b.len() % src_rows == 0 => {
                TensorData::Quant(*ty, pick(b, src_rows, rows, &row))
            }
            TensorData::Quant(..) => return None,
        };
        Some(Tensor {
            name: name.into(),
            shape: vec![rows, rest[0]],
            data,
        })
    }

    /// A tensor `name` of `shape` whose element `i` is element `at(i).1` of `sources[at(i).0]`:
    /// the sources' values re-arranged, none changed. BF16 when every source is BF16 (the bit
    /// patterns copied), else `f32` (BF16 widened, quantised blocks dequantised as gguf-py does:
    /// a canonical dot gives the same bits either way, spec/EXACTNESS.md). `at` must stay within
    /// the sources.
    pub fn gathered(
        name: &str,
        shape: &[usize],
        sources: &[&Tensor],
        at: impl Fn(usize) -> (usize, usize),
    ) -> Tensor {
        let n = shape.iter().product::<usize>();
        debug_assert!(
            (0..n).all(|i| {
                let (t, j) = at(i);
                t < sources.len() && j < sources[t].len()
            }),
            "{name}: an element outside the sources"
        );
        let all_bf16 = sources
            .iter()
            .all(|t| matches!(t.data, TensorData::Bf16(_)));
        let data = if all_bf16 {
            let src: Vec<&[u16]> = sources
                .iter()
                .map(|t| match &t.data {
                    TensorData::Bf16(v) => v.as_slice(),
                    _ => &[],
                })
                .collect();
            TensorData::Bf16(
                (0..n)
                    .map(|i| {
                        let (t, j) = at(i);
                        src[t][j]
                    })
                    .collect(),
            )
        } else {
            let src: Vec<Vec<f32>> = sources.iter().map(|t| t.values()).collect();
            TensorData::F32(
                (0..n)
                    .map(|i| {
                        let (t, j) = at(i);
                        src[t][j]
                    })
                    .collect(),
            )
        };
        Tensor {
            name: name.into(),
            shape: shape.to_vec(),
            data,
        }
    }

    /// As a vector of `n` elements, its shape checked.
    pub fn vector(&self, n: usize) -> Result<WeightSlice<'_>> {
        if self.shape != [n] {
            return Err(DecodeError::BadTensor {
                name: self.name.clone(),
                fault: TensorFault::Shape {
                    shape: self.shape.clone(),
                    expected: vec![n],
                },
            });
        }
        Ok(self.slice())
    }
}

/// IEEE half to `f32` (exact: every half is an `f32`). A NaN keeps its payload in the top
/// mantissa bits, unquieted, as numpy's `astype(float32)` does.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let rest = (h & 0x7fff) as u32;
    // Infinities and NaNs: all-ones exponent, the mantissa moved up.
    let special = 0x7f80_0000 | ((rest & 0x3ff) << 13);
    // Finite: exponent and mantissa moved into place make an `f32` of 2^-112 times the half's
    // magnitude (a subnormal half lands on an `f32` subnormal); scaled by 2^112, exact.
    let finite = (f32::from_bits(rest << 13) * f32::from_bits((127 + 112) << 23)).to_bits();
    f32::from_bits(sign | if rest >= 0x7c00 { special } else { finite })
}

/// Every non-expert tensor of a model directory, by name.
#[derive(Debug)]
pub struct TensorStore {
    tensors: HashMap<String, Tensor>,
    stored: HashMap<String, u64>,
    bytes: u64,
}

impl TensorStore {
    /// Read every non-expert region of the trunk file and of each layer file of `experts`
    /// (already held to the manifest), checking each region's SHA-256 and BLAKE3 as it is read.
    pub fn load(dir: &Path, manifest: &Manifest, experts: &ModelExperts) -> Result<TensorStore> {
        let mut store = TensorStore {
            tensors: HashMap::new(),
            stored: HashMap::new(),
            bytes: 0,
        };
        for entry in manifest.files.iter().filter(|f| f.kind == FileKind::Trunk) {
            let path = dir.join(&entry.path);
            let reader = JnfReader::open(&path)?;
            let root = reader.root();
            if hex::encode(root.sha256) != entry.sha256 || hex::encode(root.blake3) != entry.blake3
            {
                return Err(DecodeError::NotInManifest {
                    path,
                    fault: ManifestMismatch::RootDigest {
                        found: hex::encode(root.sha256),
                        recorded: entry.sha256.clone(),
                    },
                });
            }
            store.take_tensors(&reader)?;
        }
        for f in 0..experts.file_count() as u32 {
            store.take_tensors(experts.reader(f))?;
        }
        Ok(store)
    }

    fn take_tensors(&mut self, reader: &JnfReader) -> Result<()> {
        // Refuse an element type this build does not compute with before reading anything.
        for (i, r) in reader.regions().iter().enumerate() {
            if r.role != Role::Tensor.code() {
                continue;
            }
            if let Some(dtype) = r.dtype().filter(|d| !crate::quant::is_supported(*d)) {
                return Err(DecodeError::BadTensor {
                    name: reader.name(i as u32).into(),
                    fault: TensorFault::Unsupported { dtype },
                });
            }
        }
        for (i, r) in reader.regions().iter().enumerate() {
            if r.role != Role::Tensor.code() {
                continue;
            }
            let name = reader.name(i as u32);
            let dtype = r.dtype().ok_or_else(|| DecodeError::BadTensor {
                name: name.into(),
                fault: TensorFault::UnknownDtype { code: r.dtype },
            })?;
            let bytes = reader.read_region_verified(i as u32)?;
            self.bytes += bytes.len() as u64;
            self.stored.insert(name.to_string(), bytes.len() as u64);
            let t = Tensor::from_bytes(name, dtype, r.shape(), &bytes)?;
            self.tensors.insert(name.to_string(), t);
        }
        Ok(())
    }

    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors
            .get(name)
            .ok_or_else(|| DecodeError::MissingTensor { name: name.into() })
    }

    /// The tensor `name`, if present.
    pub fn find(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Bytes of tensor `name` as stored on disk (0 if absent).
    pub fn stored_bytes(&self, name: &str) -> u64 {
        self.stored.get(name).copied().unwrap_or(0)
    }

    /// Bytes of all resident tensors as stored on disk.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Renaming, for a model whose tensors are stored under another naming than the family reads
/// (a GGUF source: llama.cpp's names, `crate::gguf_model`).
impl TensorStore {
    /// Take tensor `name` out of the store.
    pub fn remove(&mut self, name: &str) -> Option<(Tensor, u64)> {
        let t = self.tensors.remove(name)?;
        Some((t, self.stored.remove(name).unwrap_or(0)))
    }

    /// Hold `t` under its name, counted as `stored` bytes on disk; a name already held is
    /// refused.
    pub fn insert(&mut self, t: Tensor, stored: u64) -> Result<()> {
        if self.tensors.contains_key(&t.name) {
            return Err(DecodeError::BadTensor {
                name: t.name.clone(),
                fault: TensorFault::RenameClash {
                    new: t.name.clone(),
                    first: t.name,
                },
            });
        }
        self.stored.insert(t.name.clone(), stored);
        self.tensors.insert(t.name.clone(), t);
        Ok(())
    }

    /// Names of the tensors held (any order).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Store each tensor under `rename(name)` (`Ok(None)`: keep its name); an error from
    /// `rename` stops with nothing changed, and two tensors given one name are refused.
    pub fn rename_with(
        &mut self,
        mut rename: impl FnMut(&str) -> Result<Option<String>>,
    ) -> Result<()> {
        let mut names: Vec<&String> = self.tensors.keys().collect();
        names.sort();
        let mut plan: Vec<(String, String)> = Vec::with_capacity(names.len());
        for old in names {
            let new = rename(old)?.unwrap_or_else(|| old.clone());
            plan.push((old.clone(), new));
        }
        let mut seen: HashMap<&str, &str> = HashMap::with_capacity(plan.len());
        for (old, new) in &plan {
            if let Some(first) = seen.insert(new, old) {
                return Err(DecodeError::BadTensor {
                    name: old.clone(),
                    fault: TensorFault::RenameClash {
                        new: new.clone(),
                        first: first.to_string(),
                    },
                });
            }
        }
        let mut tensors = HashMap::with_capacity(plan.len());
        let mut stored = HashMap::with_capacity(plan.len());
        for (old, new) in plan {
            let Some(mut t) = self.tensors.remove(&old) else {
                continue;
            };
            t.name = new.clone();
            if let Some(b) = self.stored.remove(&old) {
                stored.insert(new.clone(), b);
            }
            tensors.insert(new, t);
        }
        self.tensors = tensors;
        self.stored = stored;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::TensorFault;

    fn tensor_fault(r: Result<Tensor>) -> TensorFault {
        match r {
            Err(DecodeError::BadTensor { name, fault }) if name == "t" => fault,
            Err(e) => panic!("expected BadTensor of t, got {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    /// `rows_of` moves whole rows in the stored type (a Q8_0 row's blocks as they are) with
    /// every value unchanged, and refuses rows outside the matrix.
    #[test]
    fn rows_of_moves_rows_in_their_stored_type() {
        // Three Q8_0 rows of 32: each a block of scale (f16) and 32 int8s, row r all r+1.
        let mut bytes = Vec::new();
        for r in 0..3u8 {
            bytes.extend_from_slice(&0x3c00u16.to_le_bytes()); // scale 1.0
            bytes.extend(std::iter::repeat_n(r + 1, 32));
        }
        let t = Tensor::from_bytes("t", Dtype::Q8_0, &[3, 32], &bytes).expect("q8_0");
        let u = t.rows_of("u", 2, |r| 2 - r).expect("rows in range");
        assert_eq!((u.name(), u.shape()), ("u", &[2usize, 32][..]));
        assert!(matches!(u.data, TensorData::Quant(..)));
        assert_eq!(u.slice().get(0), 3.0);
        assert_eq!(u.slice().get(32 + 31), 2.0);
        assert!(t.rows_of("u", 1, |_| 3).is_none());
        let f = Tensor::from_bytes(
            "f",
            Dtype::F32,
            &[2, 2],
            &[1f32, 2., 3., 4.].map(f32::to_le_bytes).concat(),
        )
        .expect("f32");
        let g = f.rows_of("g", 3, |r| r % 2).expect("rows in range");
        let v: Vec<f32> = (0..6).map(|i| g.slice().get(i)).collect();
        assert_eq!(v, [1., 2., 3., 4., 1., 2.]);
        let vector = Tensor::from_bytes("v", Dtype::F32, &[2], &[0; 8]).expect("vector");
        assert!(vector.rows_of("w", 1, |_| 0).is_none());
    }

    #[test]
    fn each_tensor_fault_is_its_own_variant() {
        assert_eq!(
            tensor_fault(Tensor::from_bytes("t", Dtype::F32, &[3], &[0; 8])),
            TensorFault::ByteLength {
                bytes: 8,
                shape: vec![3],
                dtype: Dtype::F32,
                want: 12
            }
        );
        assert_eq!(
            tensor_fault(Tensor::from_bytes("t", Dtype::Q8_0, &[2, 31], &[0; 68])),
            TensorFault::PartialBlock {
                shape: vec![2, 31],
                dtype: Dtype::Q8_0,
                block_elems: 32
            }
        );
        assert_eq!(
            tensor_fault(Tensor::from_bytes("t", Dtype::F32, &[u64::MAX, 4], &[])),
            TensorFault::ShapeOverflow {
                shape: vec![u64::MAX, 4]
            }
        );
        let t = Tensor::from_bytes("t", Dtype::F32, &[2, 3], &[0; 24]).expect("2x3");
        assert_eq!(
            tensor_fault(t.matrix(3, 2).map(|_| t.clone())),
            TensorFault::Shape {
                shape: vec![2, 3],
                expected: vec![3, 2]
            }
        );
        assert_eq!(
            tensor_fault(t.vector(6).map(|_| t.clone())),
            TensorFault::Shape {
                shape: vec![2, 3],
                expected: vec![6]
            }
        );
    }

    #[test]
    fn two_tensors_renamed_to_one_name_are_refused() {
        let t = |n: &str| Tensor::from_bytes(n, Dtype::F32, &[1], &[0; 4]).expect("tensor");
        let mut store = TensorStore {
            tensors: HashMap::from([("a".to_string(), t("a")), ("b".to_string(), t("b"))]),
            stored: HashMap::new(),
            bytes: 0,
        };
        let e = store
            .rename_with(|_| Ok(Some("c".into())))
            .expect_err("clash");
        assert!(
            matches!(
                &e,
                DecodeError::BadTensor {
                    name,
                    fault: TensorFault::RenameClash { new, first }
                } if name == "b" && new == "c" && first == "a"
            ),
            "{e}"
        );
    }

    #[test]
    fn f16_widening_is_exact_for_every_half() {
        for h in 0..=u16::MAX {
            let got = f16_to_f32(h);
            // Reference: decode by the definition.
            let sign = if h >> 15 == 1 { -1.0f64 } else { 1.0 };
            let e = ((h >> 10) & 0x1f) as i32;
            let m = (h & 0x3ff) as f64;
            let want = match e {
                0 => sign * m * 2f64.powi(-24),
                0x1f if m == 0.0 => sign * f64::INFINITY,
                0x1f => f64::NAN,
                _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
            };
            if want.is_nan() {
                // Payload kept, unquieted (numpy's astype; gguf-py's F16 dequantisation).
                let payload = ((h & 0x3ff) as u32) << 13;
                let sign = ((h >> 15) as u32) << 31;
                assert_eq!(got.to_bits(), sign | 0x7f80_0000 | payload, "half {h:#06x}");
            } else {
                assert_eq!(got as f64, want, "half {h:#06x}");
                assert_eq!(got.is_sign_negative(), h >> 15 == 1);
            }
        }
    }
}
