//! The GGUF v3 writer. It serialises the header, then parses its own output with the reader's
//! [`parse_header`] before writing a byte of data, so it can never emit a file the reader refuses:
//! the writer is never laxer than the reader.

use std::io::{self, BufWriter, Read, Write};
use std::path::Path;

use tarfa_format::publish::PendingFile;
use tarfa_format::Dtype;

use crate::error::{Error, Result, Violation};
use crate::header::{
    align_up, parse_header, Header, HeaderParse, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAGIC, VERSION,
};
use crate::value::{Array, Value};

/// A tensor to write: name, ggml type and GGUF-order dimensions (`ne[0]` innermost).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    /// Name, at most 63 bytes.
    pub name: String,
    /// ggml type (must have a ggml id).
    pub dtype: Dtype,
    /// Dimensions, GGUF order.
    pub ne: Vec<u64>,
}

/// Collects key/values and tensor specs, then writes a GGUF v3 file.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorSpec>,
}

impl GgufWriter {
    /// A writer whose tensor data is aligned to `alignment` (a power of two; written as
    /// `general.alignment` when not the default 32).
    pub fn new(alignment: u64) -> GgufWriter {
        GgufWriter {
            alignment,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Add a key/value (file order is call order). A `general.alignment` given here must be the
    /// u32 value of the writer's alignment.
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Add a tensor (file order is call order).
    pub fn add_tensor(&mut self, name: impl Into<String>, dtype: Dtype, ne: Vec<u64>) -> &mut Self {
        self.tensors.push(TensorSpec {
            name: name.into(),
            dtype,
            ne,
        });
        self
    }

    /// The tensors added so far.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    fn metadata_with_alignment(&self) -> std::result::Result<Vec<(String, Value)>, Violation> {
        let mut md = self.metadata.clone();
        let present = md.iter().find(|(k, _)| k == ALIGNMENT_KEY).map(|(_, v)| v);
        let want = u32::try_from(self.alignment)
            .ok()
            .filter(|a| a.is_power_of_two())
            .ok_or(Violation::BadAlignment {
                alignment: self.alignment,
            })?;
        match present {
            None if self.alignment != DEFAULT_ALIGNMENT => {
                md.push((ALIGNMENT_KEY.into(), Value::U32(want)));
            }
            None => {}
            Some(Value::U32(a)) if *a == want => {}
            Some(Value::U32(a)) => {
                return Err(Violation::BadAlignment {
                    alignment: u64::from(*a),
                })
            }
            Some(v) => {
                return Err(Violation::AlignmentType {
                    found: v.value_type().name().into(),
                })
            }
        }
        Ok(md)
    }

    /// The header bytes (padded to the data section) and the header the reader parses from
    /// them; any rule the reader enforces fails here, before data is written.
    pub fn header(&self) -> std::result::Result<(Vec<u8>, Header), Violation> {
        let md = self.metadata_with_alignment()?;
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(md.len() as u64).to_le_bytes());
        for (k, v) in &md {
            put_str(&mut b, k);
            b.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut b, v);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            let id = t
                .dtype
                .ggml_id()
                .ok_or_else(|| Violation::UnknownGgmlType {
                    tensor: t.name.clone(),
                    offset: b.len() as u64,
                    type_id: t.dtype.code(),
                })?;
            put_str(&mut b, &t.name);
            b.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            // A size the reader will refuse still needs an offset; keep going and let it refuse.
            let shape: Vec<u64> = t.ne.iter().rev().copied().collect();
            let padded = t
                .dtype
                .byte_len(&shape)
                .and_then(|n| align_up(n, self.alignment));
            offset = padded.and_then(|p| offset.checked_add(p)).unwrap_or(offset);
        }
        let header_len = b.len() as u64;
        let overflow = || Violation::SizeOverflow {
            what: "file length".into(),
        };
        let data_start = align_up(header_len, self.alignment).ok_or_else(overflow)?;
        let file_len = data_start.checked_add(offset).ok_or_else(overflow)?;
        b.resize(usize::try_from(data_start).map_err(|_| overflow())?, 0);
        match parse_header(&b, file_len) {
            Ok(h) => Ok((b, h)),
            Err(HeaderParse::Invalid(v)) => Err(v),
            // The whole header is in `b`; asking for more means a size the reader cannot hold.
            Err(HeaderParse::NeedMore { .. }) => Err(overflow()),
        }
    }

    /// Write the file to `out`, tensor data streamed from `data` (one reader per tensor, in
    /// order, each yielding exactly the tensor's byte length). Returns the header written.
    pub fn write_to<'r>(
        &self,
        out: &mut dyn Write,
        data: impl IntoIterator<Item = Box<dyn Read + 'r>>,
        file: &str,
    ) -> Result<Header> {
        let (bytes, header) = self
            .header()
            .map_err(|v| Error::invalid(file.to_owned(), v))?;
        let werr = |source: io::Error| Error::Write {
            file: file.to_owned(),
            source,
        };
        out.write_all(&bytes).map_err(werr)?;
        let mut data = data.into_iter();
        let zeros = [0u8; 4096];
        for t in &header.tensors {
            let short = |got| {
                Error::invalid(
                    file.to_owned(),
                    Violation::TensorDataLength {
                        tensor: t.name.clone(),
                        expected: t.byte_len,
                        got,
                    },
                )
            };
            let Some(r) = data.next() else {
                return Err(short(0));
            };
            let mut limited = r.take(t.byte_len.saturating_add(1));
            let got = io::copy(&mut limited, out).map_err(werr)?;
            if got != t.byte_len {
                return Err(short(got));
            }
            let mut pad = align_up(t.byte_len, header.alignment).unwrap_or(t.byte_len) - t.byte_len;
            while pad > 0 {
                let n = pad.min(zeros.len() as u64);
                out.write_all(&zeros[..n as usize]).map_err(werr)?;
                pad -= n;
            }
        }
        Ok(header)
    }

    /// Write the file to `dest` atomically: a temporary file beside it, fsync, rename, fsync of
    /// the directory. A failure leaves no file under `dest`.
    pub fn write_file<'r>(
        &self,
        dest: &Path,
        data: impl IntoIterator<Item = Box<dyn Read + 'r>>,
    ) -> Result<Header> {
        let name = dest.display().to_string();
        let pending = PendingFile::create(dest)?;
        let header = {
            let mut w = BufWriter::with_capacity(1 << 20, pending.file());
            let h = self.write_to(&mut w, data, &name)?;
            w.flush().map_err(|source| Error::Write {
                file: name.clone(),
                source,
            })?;
            h
        };
        pending.publish()?;
        Ok(header)
    }
}

fn put_str(b: &mut Vec<u8>, s: &str) {
    b.extend_from_slice(&(s.len() as u64).to_le_bytes());
    b.extend_from_slice(s.as_bytes());
}

fn put_value(b: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => b.push(*x),
        Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => b.push(u8::from(*x)),
        Value::String(s) => put_str(b, s),
        Value::Array(a) => put_array(b, a),
        Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(b: &mut Vec<u8>, a: &Array) {
    b.extend_from_slice(&a.elem_type().id().to_le_bytes());
    b.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! each {
        ($v:expr) => {
            for x in $v {
                b.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => b.extend_from_slice(v),
        Array::I8(v) => each!(v),
        Array::U16(v) => each!(v),
        Array::I16(v) => each!(v),
        Array::U32(v) => each!(v),
        Array::I32(v) => each!(v),
        Array::F32(v) => each!(v),
        Array::Bool(v) => b.extend(v.iter().map(|&x| u8::from(x))),
        Array::String(v) => v.iter().for_each(|s| put_str(b, s)),
        Array::Array(v) => v.iter().for_each(|x| put_array(b, x)),
        Array::U64(v) => each!(v),
        Array::I64(v) => each!(v),
        Array::F64(v) => each!(v),
    }
}
