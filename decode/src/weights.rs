//! Weights as the checkpoint's bytes: BF16 stays BF16 (widened to `f32` at use, exactly), `f32`
//! stays `f32`. F16 is widened to `f32` once at load (exact). Nothing is rounded, re-quantised or
//! pre-multiplied.
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
use crate::error::{DecodeError, Result};

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
}

impl<'a> WeightSlice<'a> {
    /// Element `i` widened to `f32`.
    #[inline]
    pub fn get(self, i: usize) -> f32 {
        match self {
            WeightSlice::Bf16(w) => bf16_to_f32(w[i]),
            WeightSlice::F32(w) => w[i],
        }
    }

    /// Number of elements.
    pub fn len(self) -> usize {
        match self {
            WeightSlice::Bf16(w) => w.len(),
            WeightSlice::F32(w) => w.len(),
        }
    }

    /// Whether it has no elements.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Elements `a..b`.
    pub fn slice(self, a: usize, b: usize) -> WeightSlice<'a> {
        match self {
            WeightSlice::Bf16(w) => WeightSlice::Bf16(&w[a..b]),
            WeightSlice::F32(w) => WeightSlice::F32(&w[a..b]),
        }
    }

    /// View stored bytes of `dtype` in place (BF16, F32). `None` for other types or misaligned
    /// bytes.
    pub fn from_bytes(dtype: Dtype, bytes: &'a [u8]) -> Option<WeightSlice<'a>> {
        if dtype == Dtype::BF16 {
            bytemuck::try_cast_slice(bytes).ok().map(WeightSlice::Bf16)
        } else if dtype == Dtype::F32 {
            bytemuck::try_cast_slice(bytes).ok().map(WeightSlice::F32)
        } else {
            None
        }
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
            WeightSlice::F32(_) => panic!("{}: not BF16", self.name),
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
}

/// An owned tensor, in its stored element type (F16 widened to `f32`).
#[derive(Clone, Debug)]
pub struct Tensor {
    name: String,
    shape: Vec<usize>,
    data: TensorData,
}

impl Tensor {
    /// Decode stored little-endian bytes of `dtype` (BF16, F16, F32).
    pub fn from_bytes(name: &str, dtype: Dtype, shape: &[u64], bytes: &[u8]) -> Result<Tensor> {
        let bad = |detail: String| DecodeError::BadTensor {
            name: name.into(),
            detail,
        };
        let shape: Vec<usize> = shape.iter().map(|&d| d as usize).collect();
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        let data = if dtype == Dtype::BF16 {
            TensorData::Bf16(
                bytes
                    .chunks_exact(2)
                    .map(|b| u16::from_le_bytes([b[0], b[1]]))
                    .collect(),
            )
        } else if dtype == Dtype::F16 {
            TensorData::F32(
                bytes
                    .chunks_exact(2)
                    .map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                    .collect(),
            )
        } else if dtype == Dtype::F32 {
            TensorData::F32(
                bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
            )
        } else {
            return Err(bad(format!(
                "element type {dtype} is not decoded by this build (BF16, F16, F32 are)"
            )));
        };
        let t = Tensor {
            name: name.into(),
            shape,
            data,
        };
        if t.len() != n {
            return Err(bad(format!("{} elements for shape {:?}", t.len(), t.shape)));
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

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            TensorData::Bf16(v) => v.len(),
            TensorData::F32(v) => v.len(),
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
        }
    }

    /// As a matrix `[rows, cols]`, its shape checked.
    pub fn matrix(&self, rows: usize, cols: usize) -> Result<MatrixRef<'_>> {
        if self.shape != [rows, cols] {
            return Err(DecodeError::BadTensor {
                name: self.name.clone(),
                detail: format!("shape {:?}, expected [{rows}, {cols}]", self.shape),
            });
        }
        Ok(MatrixRef {
            name: &self.name,
            rows,
            cols,
            data: self.slice(),
        })
    }

    /// As a vector of `n` elements, its shape checked.
    pub fn vector(&self, n: usize) -> Result<WeightSlice<'_>> {
        if self.shape != [n] {
            return Err(DecodeError::BadTensor {
                name: self.name.clone(),
                detail: format!("shape {:?}, expected [{n}]", self.shape),
            });
        }
        Ok(self.slice())
    }
}

/// IEEE half to `f32` (exact: every half is an `f32`).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: value m · 2^-24, normalised.
            let shift = m.leading_zeros() - 21; // bring the top set bit to position 10
            let m = (m << shift) & 0x3ff;
            let e = 127 - 15 - shift + 1;
            sign | (e << 23) | (m << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
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
                    detail: format!(
                        "root digest {} differs from the manifest's {}",
                        hex::encode(root.sha256),
                        entry.sha256
                    ),
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
        for (i, r) in reader.regions().iter().enumerate() {
            if r.role != Role::Tensor.code() {
                continue;
            }
            let name = reader.name(i as u32);
            let dtype = r.dtype().ok_or_else(|| DecodeError::BadTensor {
                name: name.into(),
                detail: format!("unknown dtype code {}", r.dtype),
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
                    detail: format!("renamed to {new}, which {first} is renamed to as well"),
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
                assert!(got.is_nan());
            } else {
                assert_eq!(got as f64, want, "half {h:#06x}");
                assert_eq!(got.is_sign_negative(), h >> 15 == 1);
            }
        }
    }
}
