//! The header parser: magic, version, key/values and tensor infos, with every rule of ggml's
//! `gguf_init_from_file_impl` and more.
//!
//! It parses a *window* — the first bytes of a file whose total length is known — and answers
//! [`HeaderParse::NeedMore`] when the header runs past the window but not past the file, so a
//! remote reader can fetch a larger range and try again. Every count and length is bounded by the
//! bytes left in the file before anything is allocated, and allocation is further capped by the
//! bytes actually in the window, so a hostile count never reserves memory that was not read.
//! The bytes left are only what the source *claims* (a sparse file, a server's Content-Range
//! total), so the header as a whole is also capped at [`MAX_HEADER_LEN`] and one string at
//! [`MAX_STRING_LEN`]: the window never grows past them, whatever the file's length.

use std::collections::HashSet;

use tarfa_format::Dtype;

use crate::error::{Error, Result, Violation};
use crate::source::ByteSource;
use crate::value::{Array, Value, ValueType};

/// `GGUF`, little-endian.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The version this crate writes.
pub const VERSION: u32 = 3;
/// Alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The key that sets the alignment (u32, a power of two).
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: u32 = 4;
/// Longest tensor name: ggml's `GGML_MAX_NAME` is 64 bytes including the NUL terminator.
pub const MAX_TENSOR_NAME: u64 = 63;
/// Deepest nesting of arrays (an array of arrays is depth 2). Bounds recursion, the DoS that a
/// deeply nested array causes in gguf-py.
pub const MAX_ARRAY_DEPTH: u32 = 8;

/// Smallest tensor info: empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO: u64 = 24;
/// Smallest key/value: empty key (8), type (4), a one-byte value.
const MIN_KV: u64 = 13;
/// How much of a source [`read_header`] reads first.
pub const INITIAL_WINDOW: u64 = 64 * 1024;
/// Longest header this reader reads: 1 GiB. A limit on memory, not a GGUF rule. Real headers are
/// dominated by the tokenizer arrays (tokens, scores, types, merges), about 20 bytes per token or
/// merge: roughly 5–10 MB for the 128–262 k vocabularies of Llama 3, Qwen3 and Gemma 3. The limit
/// leaves two orders of magnitude of headroom, while a sparse file or a lying Content-Range can
/// no longer make the reader allocate whatever the length it claims.
pub const MAX_HEADER_LEN: u64 = 1 << 30;
/// Longest single string (key, value, array element): 64 MiB. Real strings are names, tokens and
/// chat templates (kilobytes); this refuses a giant string before the window grows to hold it.
pub const MAX_STRING_LEN: u64 = 64 << 20;

/// One tensor's entry in the header, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name, at most 63 bytes.
    pub name: String,
    /// ggml type.
    pub dtype: Dtype,
    /// Dimensions in GGUF order: `ne[0]` is the innermost (fastest-varying).
    pub ne: Vec<u64>,
    /// Offset relative to the data section, as stored.
    pub offset: u64,
    /// Absolute offset of the first data byte in the file.
    pub data_offset: u64,
    /// Exact byte length from shape and type (padding excluded).
    pub byte_len: u64,
    /// Absolute offset of this tensor info in the header.
    pub info_offset: u64,
}

impl TensorInfo {
    /// Row-major shape (`ne` reversed): what [`Dtype::byte_len`] and safetensors use.
    pub fn shape(&self) -> Vec<u64> {
        self.ne.iter().rev().copied().collect()
    }

    /// Absolute byte range of the data in its file.
    pub fn data_range(&self) -> std::ops::Range<u64> {
        // The parser proved data_offset + byte_len <= file length.
        self.data_offset..self.data_offset + self.byte_len
    }
}

/// A parsed, checked GGUF header.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// 2 or 3.
    pub version: u32,
    /// Key/values in file order; keys are unique.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order; names unique, offsets the running padded sum.
    pub tensors: Vec<TensorInfo>,
    /// Tensor data alignment (`general.alignment`, or 32).
    pub alignment: u64,
    /// First byte after the tensor infos.
    pub header_len: u64,
    /// Absolute offset of the data section (`header_len` padded to the alignment).
    pub data_start: u64,
    /// Length of the file the header was read from.
    pub file_len: u64,
}

impl Header {
    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Sum of the tensors' exact byte lengths.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.byte_len).sum()
    }
}

/// Why [`parse_header`] did not return a header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HeaderParse {
    /// The header continues past the window: supply at least this many bytes from the start.
    NeedMore {
        /// Window length that lets the parser get further (at most the file length).
        at_least: u64,
    },
    /// The bytes break a rule.
    Invalid(Violation),
}

impl From<Violation> for HeaderParse {
    fn from(v: Violation) -> Self {
        HeaderParse::Invalid(v)
    }
}

type Step<T> = std::result::Result<T, HeaderParse>;

/// `x` rounded up to a multiple of the power of two `align`, or `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    let mask = align.checked_sub(1)?;
    x.checked_add(mask).map(|v| v & !mask)
}

struct Cursor<'a> {
    window: &'a [u8],
    pos: u64,
    file_len: u64,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> u64 {
        self.file_len - self.pos
    }

    fn window_left(&self) -> u64 {
        (self.window.len() as u64).saturating_sub(self.pos)
    }

    /// `n` bytes at the cursor; an error past the file, a request for more past the window.
    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Step<&'a [u8]> {
        let end = match self.pos.checked_add(n) {
            Some(e) if e <= self.file_len => e,
            _ => {
                return Err(Violation::Truncated {
                    what: what(),
                    offset: self.pos,
                    need: n,
                    file_len: self.file_len,
                }
                .into())
            }
        };
        // Before asking for more: a window never has to grow past the limit, in any caller.
        if end > MAX_HEADER_LEN {
            return Err(Violation::LimitExceeded {
                what: format!("the header through {} at offset {}", what(), self.pos),
                len: end,
                limit: MAX_HEADER_LEN,
            }
            .into());
        }
        if end > self.window.len() as u64 {
            return Err(HeaderParse::NeedMore { at_least: end });
        }
        // end <= window.len(), so both casts are lossless.
        let s = &self.window[self.pos as usize..end as usize];
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Step<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Step<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Step<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 length bounded by the bytes left, then UTF-8 bytes.
    fn string(&mut self, what: &dyn Fn() -> String) -> Step<String> {
        let bytes = self.string_bytes(what)?;
        let start = self.pos - bytes.len() as u64;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(Violation::BadUtf8 {
                what: what(),
                offset: start,
            }
            .into()),
        }
    }

    fn string_bytes(&mut self, what: &dyn Fn() -> String) -> Step<&'a [u8]> {
        let at = self.pos;
        let len = self.u64(what)?;
        if len > self.left() {
            return Err(Violation::StringTooLong {
                what: what(),
                offset: at,
                len,
                bytes_left: self.left(),
            }
            .into());
        }
        if len > MAX_STRING_LEN {
            return Err(Violation::LimitExceeded {
                what: format!("{}: string at offset {at}", what()),
                len,
                limit: MAX_STRING_LEN,
            }
            .into());
        }
        self.take(len, what)
    }

    /// A count of items each at least `min_each` bytes, bounded by the bytes left.
    fn count(&mut self, min_each: u64, what: &dyn Fn() -> String) -> Step<u64> {
        let at = self.pos;
        let n = self.u64(what)?;
        check_count(n, min_each, self.left(), at, what)?;
        Ok(n)
    }

    /// How many items to reserve room for: never more than the window could hold.
    fn capacity(&self, n: u64, min_each: u64) -> usize {
        let fits = self.window_left() / min_each.max(1);
        usize::try_from(n.min(fits)).unwrap_or(0)
    }
}

fn check_count(
    n: u64,
    min_each: u64,
    bytes_left: u64,
    offset: u64,
    what: &dyn Fn() -> String,
) -> Step<()> {
    if n > bytes_left / min_each.max(1) {
        return Err(Violation::CountTooLarge {
            what: what(),
            offset,
            count: n,
            min_each,
            bytes_left,
        }
        .into());
    }
    Ok(())
}

/// Recognise the files that most often stand where a GGUF should: a Git LFS pointer and a saved
/// HTML page.
fn sniff_not_gguf(head: &[u8]) -> Violation {
    if head.starts_with(b"version https://git-lfs.github.com/spec/") {
        return Violation::LfsPointer;
    }
    let trimmed: Vec<u8> = head
        .strip_prefix(b"\xEF\xBB\xBF")
        .unwrap_or(head)
        .iter()
        .copied()
        .skip_while(|b| b.is_ascii_whitespace())
        .take(14)
        .map(|b| b.to_ascii_lowercase())
        .collect();
    if trimmed.starts_with(b"<!doctype html") || trimmed.starts_with(b"<html") {
        return Violation::HtmlPage;
    }
    Violation::BadMagic {
        found: head.iter().take(4).map(|b| format!("{b:02x}")).collect(),
    }
}

/// Bytes [`sniff_not_gguf`] looks at: always exactly these (or the whole file when shorter), so
/// the answer does not depend on how big a window the caller happened to supply.
const SNIFF_LEN: u64 = 512;

/// Parse the header from `window`, the first bytes of a file of `file_len` bytes.
pub fn parse_header(window: &[u8], file_len: u64) -> Step<Header> {
    let window = &window[..window
        .len()
        .min(usize::try_from(file_len).unwrap_or(usize::MAX))];
    let mut c = Cursor {
        window,
        pos: 0,
        file_len,
    };
    let magic_ok = file_len >= 4 && window.get(..4).is_some_and(|m| m == MAGIC);
    if !magic_ok {
        let want = file_len.min(SNIFF_LEN);
        if (window.len() as u64) < want {
            return Err(HeaderParse::NeedMore { at_least: want });
        }
        if file_len < 4 && MAGIC.starts_with(window) {
            c.take(4, &|| "magic".into())?;
        }
        // want <= window.len(), so the cast is lossless.
        return Err(sniff_not_gguf(&window[..want as usize]).into());
    }
    c.take(4, &|| "magic".into())?;
    let version = c.u32(&|| "version".into())?;
    if version != 0 && version & 0xFFFF == 0 {
        return Err(Violation::BigEndian { version }.into());
    }
    if version != 2 && version != 3 {
        return Err(Violation::UnsupportedVersion { version }.into());
    }
    let n_tensors_at = c.pos;
    let n_tensors = c.u64(&|| "tensor count".into())?;
    let n_kv = c.count(MIN_KV, &|| "key/value count".into())?;
    check_count(n_tensors, MIN_TENSOR_INFO, c.left(), n_tensors_at, &|| {
        "tensor count".into()
    })?;

    let mut metadata = Vec::with_capacity(c.capacity(n_kv, MIN_KV));
    let mut keys = HashSet::new();
    for _ in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(&|| "key".into())?;
        let type_at = c.pos;
        let type_id = c.u32(&|| format!("type of key '{key}'"))?;
        let vt = ValueType::from_id(type_id).ok_or_else(|| Violation::UnknownValueType {
            key: key.clone(),
            offset: type_at,
            type_id,
        })?;
        let value = read_value(&mut c, vt, &key)?;
        if !keys.insert(key.clone()) {
            return Err(Violation::DuplicateKey {
                key,
                offset: key_at,
            }
            .into());
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        Some((_, Value::U32(a))) => {
            if !a.is_power_of_two() {
                return Err(Violation::BadAlignment {
                    alignment: u64::from(*a),
                }
                .into());
            }
            u64::from(*a)
        }
        Some((_, v)) => {
            return Err(Violation::AlignmentType {
                found: v.value_type().name().into(),
            }
            .into())
        }
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(c.capacity(n_tensors, MIN_TENSOR_INFO));
    let mut names = HashSet::new();
    for _ in 0..n_tensors {
        let t = read_tensor_info(&mut c)?;
        if !names.insert(t.name.clone()) {
            return Err(Violation::DuplicateTensor {
                tensor: t.name,
                offset: t.info_offset,
            }
            .into());
        }
        tensors.push(t);
    }
    let header_len = c.pos;
    let data_start = align_up(header_len, alignment).ok_or_else(|| Violation::SizeOverflow {
        what: "data section start".into(),
    })?;
    // Writers pad to the data section even when there are no tensors; a data section that starts
    // past the end is a truncated file (and would make a rewrite pad to an alignment of 2^31).
    if data_start > file_len {
        return Err(Violation::Truncated {
            what: format!("padding to the data section (alignment {alignment})"),
            offset: header_len,
            need: data_start - header_len,
            file_len,
        }
        .into());
    }

    // ggml's strict layout: offsets are the running sum of padded sizes, in info order. All
    // offsets are checked before any end, as ggml does, so a size lie is reported as the layout
    // break it causes.
    let mut expected = 0u64;
    for t in &mut tensors {
        if t.offset != expected {
            return Err(Violation::TensorOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                expected,
            }
            .into());
        }
        expected = align_up(t.byte_len, alignment)
            .and_then(|p| expected.checked_add(p))
            .ok_or_else(|| Violation::SizeOverflow {
                what: format!("padded end of tensor '{}'", t.name),
            })?;
    }
    for t in &mut tensors {
        let overflow = || Violation::SizeOverflow {
            what: format!("end of tensor '{}'", t.name),
        };
        t.data_offset = data_start.checked_add(t.offset).ok_or_else(overflow)?;
        let end = t.data_offset.checked_add(t.byte_len).ok_or_else(overflow)?;
        if end > file_len {
            return Err(Violation::TensorPastEnd {
                tensor: t.name.clone(),
                end,
                file_len,
            }
            .into());
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        header_len,
        data_start,
        file_len,
    })
}

fn read_tensor_info(c: &mut Cursor<'_>) -> Step<TensorInfo> {
    let info_offset = c.pos;
    let name_bytes = c.string_bytes(&|| "tensor name".into())?;
    if name_bytes.len() as u64 > MAX_TENSOR_NAME {
        return Err(Violation::TensorNameTooLong {
            tensor: String::from_utf8_lossy(name_bytes).into_owned(),
            offset: info_offset,
            len: name_bytes.len() as u64,
        }
        .into());
    }
    let name = std::str::from_utf8(name_bytes)
        .map_err(|_| Violation::BadUtf8 {
            what: "tensor name".into(),
            offset: info_offset + 8,
        })?
        .to_owned();
    let dims_at = c.pos;
    let n_dims = c.u32(&|| format!("n_dims of tensor '{name}'"))?;
    if n_dims > MAX_DIMS {
        return Err(Violation::TooManyDims {
            tensor: name,
            offset: dims_at,
            n_dims,
        }
        .into());
    }
    let mut ne = Vec::with_capacity(n_dims as usize);
    let mut elems: i64 = 1;
    for dim in 0..n_dims as usize {
        let v = c.u64(&|| format!("ne[{dim}] of tensor '{name}'"))?;
        let Ok(vi) = i64::try_from(v) else {
            return Err(Violation::DimTooLarge {
                tensor: name,
                dim,
                value: v,
            }
            .into());
        };
        ne.push(v);
        match elems.checked_mul(vi) {
            Some(e) => elems = e,
            None => {
                // Read the remaining dims so the error shows the whole shape.
                for d in ne.len()..n_dims as usize {
                    ne.push(c.u64(&|| format!("ne[{d}] of tensor '{name}'"))?);
                }
                return Err(Violation::ElementCountOverflow { tensor: name, ne }.into());
            }
        }
    }
    let type_at = c.pos;
    let type_id = c.u32(&|| format!("type of tensor '{name}'"))?;
    let dtype = Dtype::from_ggml_id(type_id).ok_or_else(|| Violation::UnknownGgmlType {
        tensor: name.clone(),
        offset: type_at,
        type_id,
    })?;
    let block = dtype.geometry().block_elems;
    let ne0 = ne.first().copied().unwrap_or(1);
    if ne0 % block != 0 {
        return Err(Violation::RowNotWholeBlocks {
            tensor: name,
            dtype: dtype.name().into(),
            ne0,
            block,
        }
        .into());
    }
    let shape: Vec<u64> = ne.iter().rev().copied().collect();
    let byte_len = dtype
        .byte_len(&shape)
        .ok_or_else(|| Violation::SizeOverflow {
            what: format!("byte size of tensor '{name}'"),
        })?;
    let offset = c.u64(&|| format!("offset of tensor '{name}'"))?;
    Ok(TensorInfo {
        name,
        dtype,
        ne,
        offset,
        data_offset: 0,
        byte_len,
        info_offset,
    })
}

fn read_value(c: &mut Cursor<'_>, vt: ValueType, key: &str) -> Step<Value> {
    let what = || format!("value of key '{key}'");
    Ok(match vt {
        ValueType::U8 => Value::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(i8::from_le_bytes(c.array::<1>(&what)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => {
            let at = c.pos;
            Value::Bool(read_bools(c, 1, key, at)?.first().copied().unwrap_or(false))
        }
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
    })
}

fn read_bools(c: &mut Cursor<'_>, n: u64, key: &str, at: u64) -> Step<Vec<bool>> {
    let bytes = c.take(n, &|| format!("value of key '{key}'"))?;
    let mut out = Vec::with_capacity(bytes.len());
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            0 => out.push(false),
            1 => out.push(true),
            value => {
                return Err(Violation::InvalidBool {
                    key: key.into(),
                    offset: at + i as u64,
                    value,
                }
                .into())
            }
        }
    }
    Ok(out)
}

/// Fixed-width elements: one bounds check and one slice for the whole array, not one per element.
fn read_fixed<T, const N: usize>(
    c: &mut Cursor<'_>,
    n: u64,
    key: &str,
    conv: fn([u8; N]) -> T,
) -> Step<Vec<T>> {
    // n was bounded by bytes_left / N, so n * N cannot overflow.
    let bytes = c.take(n * N as u64, &|| format!("array of key '{key}'"))?;
    Ok(bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: u32) -> Step<Array> {
    let at = c.pos;
    if depth > MAX_ARRAY_DEPTH {
        return Err(Violation::ArrayTooDeep {
            key: key.into(),
            offset: at,
            max: MAX_ARRAY_DEPTH,
        }
        .into());
    }
    let type_id = c.u32(&|| format!("array element type of key '{key}'"))?;
    let et = ValueType::from_id(type_id).ok_or_else(|| Violation::UnknownValueType {
        key: key.into(),
        offset: at,
        type_id,
    })?;
    let min = et.min_encoded_len();
    let n = c.count(min, &|| format!("array length of key '{key}'"))?;
    Ok(match et {
        ValueType::U8 => Array::U8(read_fixed(c, n, key, |a: [u8; 1]| a[0])?),
        ValueType::I8 => Array::I8(read_fixed(c, n, key, i8::from_le_bytes)?),
        ValueType::U16 => Array::U16(read_fixed(c, n, key, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(read_fixed(c, n, key, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(read_fixed(c, n, key, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(read_fixed(c, n, key, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(read_fixed(c, n, key, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(read_fixed(c, n, key, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(read_fixed(c, n, key, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(read_fixed(c, n, key, f64::from_le_bytes)?),
        ValueType::Bool => {
            let at = c.pos;
            Array::Bool(read_bools(c, n, key, at)?)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(c.capacity(n, min));
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of key '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(c.capacity(n, min));
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}

/// Read and check the header of `src`, fetching a growing prefix until it parses.
pub fn read_header(src: &dyn ByteSource) -> Result<Header> {
    read_header_from(src, INITIAL_WINDOW)
}

/// [`read_header`] starting with a window of `initial` bytes.
pub fn read_header_from(src: &dyn ByteSource, initial: u64) -> Result<Header> {
    let file_len = src.len();
    let mut window: Vec<u8> = Vec::new();
    let mut want = initial.max(1).min(file_len).min(MAX_HEADER_LEN);
    loop {
        let have = window.len() as u64;
        if want > have {
            let grow = usize::try_from(want - have).map_err(|_| Error::Io {
                file: src.name(),
                offset: have,
                len: want - have,
                source: std::io::Error::other("header window larger than memory"),
            })?;
            window.resize(window.len() + grow, 0);
            src.read_at(have, &mut window[have as usize..])
                .map_err(|source| Error::Io {
                    file: src.name(),
                    offset: have,
                    len: want - have,
                    source,
                })?;
        }
        match parse_header(&window, file_len) {
            Ok(h) => return Ok(h),
            Err(HeaderParse::Invalid(v)) => return Err(Error::invalid(src.name(), v)),
            Err(HeaderParse::NeedMore { at_least }) => {
                let have = window.len() as u64;
                // The parser refuses (LimitExceeded) a header past MAX_HEADER_LEN before asking.
                if at_least <= have || at_least > file_len.min(MAX_HEADER_LEN) {
                    // The parser never asks for bytes it has or the file lacks; refuse to loop.
                    return Err(Error::invalid(
                        src.name(),
                        Violation::Truncated {
                            what: "header".into(),
                            offset: have,
                            need: at_least.saturating_sub(have),
                            file_len,
                        },
                    ));
                }
                want = at_least
                    .max(have.saturating_mul(2))
                    .min(file_len)
                    .min(MAX_HEADER_LEN);
            }
        }
    }
}
