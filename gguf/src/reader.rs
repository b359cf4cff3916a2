//! Opening GGUF files and split sets, and reading tensor bytes.

use std::io::{self, Read};
use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::error::{Error, ExpertSliceFault, Result, SplitFault, Violation};
use crate::header::{read_header, Header, TensorInfo};
use crate::source::{ByteSource, FileSource};
use crate::value::Value;

/// One GGUF file: its checked header and the source its bytes come from.
pub struct GgufFile {
    source: Box<dyn ByteSource>,
    header: Header,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("source", &self.source.name())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Open and check a local file.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let src = FileSource::open(path)?;
        GgufFile::from_source(Box::new(src))
    }

    /// Check the header of any byte source.
    pub fn from_source(source: Box<dyn ByteSource>) -> Result<GgufFile> {
        let header = read_header(source.as_ref())?;
        Ok(GgufFile { source, header })
    }

    /// The checked header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The source's name (path or URL).
    pub fn name(&self) -> String {
        self.source.name()
    }

    /// The byte source.
    pub fn source(&self) -> &dyn ByteSource {
        self.source.as_ref()
    }

    /// Read `range` of the file into memory.
    pub fn read_range(&self, range: Range<u64>) -> Result<Vec<u8>> {
        let len = range.end.saturating_sub(range.start);
        let io_err = |source| Error::Io {
            file: self.source.name(),
            offset: range.start,
            len,
            source,
        };
        let n = usize::try_from(len)
            .map_err(|_| io_err(io::Error::other("range larger than memory")))?;
        let mut buf = vec![0u8; n];
        self.source.read_at(range.start, &mut buf).map_err(io_err)?;
        Ok(buf)
    }

    /// A tensor's bytes, whole.
    pub fn tensor_bytes(&self, t: &TensorInfo) -> Result<Vec<u8>> {
        self.read_range(t.data_range())
    }

    /// A streaming reader over `range` of the file, in chunks of at most 1 MiB.
    pub fn range_reader(&self, range: Range<u64>) -> RangeReader<'_> {
        RangeReader {
            source: self.source.as_ref(),
            pos: range.start,
            end: range.end.max(range.start),
        }
    }
}

/// A [`Read`] over a byte range of a [`ByteSource`].
pub struct RangeReader<'a> {
    source: &'a dyn ByteSource,
    pos: u64,
    end: u64,
}

impl std::fmt::Debug for RangeReader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RangeReader")
            .field("pos", &self.pos)
            .field("end", &self.end)
            .finish()
    }
}

impl Read for RangeReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end - self.pos;
        let n = (buf.len() as u64).min(left).min(1 << 20) as usize;
        if n == 0 {
            return Ok(0);
        }
        self.source.read_at(self.pos, &mut buf[..n])?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The byte range (absolute, in the tensor's file) of expert `e` of a `[n_expert, rows, cols]`
/// (row-major; GGUF `ne = [cols, rows, n_expert]`) tensor: `[off + e*nb, off + (e+1)*nb)` with
/// `nb = byte_len([rows, cols])`. Exact for every quant type, since blocks never cross rows.
pub fn expert_range(t: &TensorInfo, e: u64) -> Result<Range<u64>, Violation> {
    let bad = |fault: ExpertSliceFault| Violation::ExpertSlice {
        tensor: t.name.clone(),
        fault,
    };
    let shape = t.shape();
    let [n_expert, rows, cols] = shape[..] else {
        return Err(bad(ExpertSliceFault::NotStacked { shape }));
    };
    if e >= n_expert {
        return Err(bad(ExpertSliceFault::NoSuchExpert {
            expert: e,
            n_expert,
        }));
    }
    // The header check proved the whole tensor's size, so these cannot overflow; stay checked.
    let nb = t
        .dtype
        .byte_len(&[rows, cols])
        .ok_or_else(|| bad(ExpertSliceFault::SizeOverflow { rows, cols }))?;
    let start = e
        .checked_mul(nb)
        .and_then(|o| o.checked_add(t.data_offset))
        .and_then(|s| s.checked_add(nb).map(|_| s))
        .ok_or_else(|| bad(ExpertSliceFault::OffsetOverflow { expert: e }))?;
    let end = start + nb;
    Ok(start..end)
}

/// The `split.*` keys of one part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitKeys {
    /// `split.no`: this part's 0-based index.
    pub no: u16,
    /// `split.count`: number of parts.
    pub count: u16,
    /// `split.tensors.count`: tensors across all parts.
    pub tensors_count: i32,
}

/// Key of the part index (u16, 0-based).
pub const SPLIT_NO: &str = "split.no";
/// Key of the part count (u16).
pub const SPLIT_COUNT: &str = "split.count";
/// Key of the total tensor count (i32).
pub const SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The `split.*` keys of `h`: `None` when there are none, an error when some are missing or of
/// the wrong type (the types gguf-split writes).
pub fn split_keys(h: &Header) -> Result<Option<SplitKeys>, Violation> {
    let (no, count, total) = (
        h.get(SPLIT_NO),
        h.get(SPLIT_COUNT),
        h.get(SPLIT_TENSORS_COUNT),
    );
    if no.is_none() && count.is_none() && total.is_none() {
        return Ok(None);
    }
    let wrong = |key: &str, expected: &str, v: Option<&Value>| Violation::SplitKeyType {
        key: key.into(),
        expected: expected.into(),
        found: v.map_or("nothing", |v| v.value_type().name()).into(),
    };
    let no = match no {
        Some(Value::U16(v)) => *v,
        v => return Err(wrong(SPLIT_NO, "UINT16", v)),
    };
    let count = match count {
        Some(Value::U16(v)) => *v,
        v => return Err(wrong(SPLIT_COUNT, "UINT16", v)),
    };
    let tensors_count = match total {
        Some(Value::I32(v)) => *v,
        v => return Err(wrong(SPLIT_TENSORS_COUNT, "INT32", v)),
    };
    if count == 0 || no >= count {
        return Err(Violation::SplitMismatch(SplitFault::PartOutOfRange {
            no,
            count,
        }));
    }
    Ok(Some(SplitKeys {
        no,
        count,
        tensors_count,
    }))
}

/// Part `part` (from 1) of a set of `count`: its `split.no` must be `part - 1`, its
/// `split.count` `count` and its `split.tensors.count` the set's `tensors_count`.
pub fn check_part_keys(
    keys: SplitKeys,
    part: u32,
    count: u32,
    tensors_count: i32,
) -> Result<(), SplitFault> {
    let expected = part.saturating_sub(1);
    if u32::from(keys.no) != expected {
        return Err(SplitFault::PartIndex {
            part,
            count,
            no: keys.no,
            expected,
        });
    }
    if u32::from(keys.count) != count {
        return Err(SplitFault::PartCount {
            part,
            count,
            found: keys.count,
        });
    }
    if keys.tensors_count != tensors_count {
        return Err(SplitFault::TensorsCountDiffers {
            part,
            count,
            found: keys.tensors_count,
            expected: tensors_count,
        });
    }
    Ok(())
}

/// `NAME-0000k-of-0000N.gguf` split into `(NAME, k, N)` (k 1-based), if the name has that form.
pub fn parse_split_name(file_name: &str) -> Option<(&str, u32, u32)> {
    let stem = file_name.strip_suffix(".gguf")?;
    // "-00001-of-00003" is 15 bytes.
    let cut = stem.len().checked_sub(15)?;
    let (prefix, tail) = (stem.get(..cut)?, stem.get(cut..)?);
    let tail = tail.strip_prefix('-')?;
    let (k, n) = tail.split_once("-of-")?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(k) || !digits(n) {
        return None;
    }
    Some((prefix, k.parse().ok()?, n.parse().ok()?))
}

/// The file name of part `k` (1-based) of `n`.
pub fn split_name(prefix: &str, k: u32, n: u32) -> String {
    format!("{prefix}-{k:05}-of-{n:05}.gguf")
}

/// Where a tensor of a model lives.
#[derive(Clone, Copy, Debug)]
pub struct TensorRef<'a> {
    /// Index of the part in [`GgufModel::parts`].
    pub part: usize,
    /// The tensor's info (offsets relative to that part's file).
    pub info: &'a TensorInfo,
}

/// A model: one GGUF file, or every part of a split set, checked together.
#[derive(Debug)]
pub struct GgufModel {
    parts: Vec<GgufFile>,
    split: Option<SplitKeys>,
}

impl GgufModel {
    /// Open `path`; when it is a part of a split set (by name or by its `split.*` keys), open and
    /// check every part.
    pub fn open(path: &Path) -> Result<GgufModel> {
        let first = GgufFile::open(path)?;
        let keys = split_keys(first.header())
            .map_err(|v| Error::invalid(path.display().to_string(), v))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let named = parse_split_name(&file_name);
        let Some(keys) = keys else {
            if let Some((_, _, n)) = named.filter(|&(_, _, n)| n > 1) {
                return Err(Error::invalid(
                    path.display().to_string(),
                    Violation::SplitMismatch(SplitFault::NameWithoutKeys { count: n }),
                ));
            }
            return GgufModel::from_parts(vec![first], None);
        };
        let invalid = |fault: SplitFault| {
            Error::invalid(path.display().to_string(), Violation::SplitMismatch(fault))
        };
        let Some((prefix, k, n)) = named else {
            if keys.count == 1 {
                return GgufModel::from_parts(vec![first], Some(keys));
            }
            return Err(invalid(SplitFault::KeysWithoutName { count: keys.count }));
        };
        if u32::from(keys.no) + 1 != k || u32::from(keys.count) != n {
            return Err(invalid(SplitFault::NameDisagrees {
                name_part: k,
                name_count: n,
                key_part: u32::from(keys.no) + 1,
                key_count: keys.count,
            }));
        }
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut parts = Vec::with_capacity(usize::from(keys.count));
        let mut given = Some(first);
        for i in 1..=n {
            if i == k {
                if let Some(f) = given.take() {
                    parts.push(f);
                }
                continue;
            }
            let p: PathBuf = dir.join(split_name(prefix, i, n));
            if !p.exists() {
                return Err(Error::invalid(
                    p.display().to_string(),
                    Violation::SplitMismatch(SplitFault::MissingPart { part: i, count: n }),
                ));
            }
            parts.push(GgufFile::open(&p)?);
        }
        GgufModel::from_parts(parts, Some(keys))
    }

    /// Check a set of already-opened parts (in order) against each other and against `split`,
    /// the set's keys (`None`: the first part's, when there are several parts).
    pub fn from_parts(parts: Vec<GgufFile>, split: Option<SplitKeys>) -> Result<GgufModel> {
        let n = parts.len();
        let count = u32::try_from(n).unwrap_or(u32::MAX);
        // The set's keys: those given, else (parts opened by a caller) the first part's.
        let mut set = split;
        let mut seen = std::collections::HashMap::new();
        let mut total: u64 = 0;
        for (i, p) in parts.iter().enumerate() {
            let name = p.name();
            let keys = split_keys(p.header()).map_err(|v| Error::invalid(name.clone(), v))?;
            if n > 1 {
                let part = u32::try_from(i + 1).unwrap_or(u32::MAX);
                let checked = keys
                    .ok_or(SplitFault::PartWithoutKeys { part, count })
                    .and_then(|k| {
                        let expected = set.get_or_insert(k).tensors_count;
                        check_part_keys(k, part, count, expected)
                    });
                if let Err(fault) = checked {
                    return Err(Error::invalid(name, Violation::SplitMismatch(fault)));
                }
            }
            for t in &p.header().tensors {
                if let Some(prev) = seen.insert(t.name.as_str(), i) {
                    return Err(Error::invalid(
                        name,
                        Violation::DuplicateTensor {
                            tensor: format!("{} (also in part {})", t.name, prev + 1),
                            offset: t.info_offset,
                        },
                    ));
                }
            }
            total += p.header().tensors.len() as u64;
        }
        if let Some(s) = set {
            if u64::try_from(s.tensors_count).ok() != Some(total) {
                return Err(Error::invalid(
                    parts.first().map(GgufFile::name).unwrap_or_default(),
                    Violation::SplitMismatch(SplitFault::TensorCountSum {
                        declared: s.tensors_count,
                        held: total,
                    }),
                ));
            }
        }
        Ok(GgufModel { parts, split })
    }

    /// The parts, in order (one for a single file).
    pub fn parts(&self) -> &[GgufFile] {
        &self.parts
    }

    /// The split keys of the first part, if the model is a split set.
    pub fn split(&self) -> Option<SplitKeys> {
        self.split
    }

    /// The model's key/values: those of the first part (gguf-split writes them only there).
    pub fn metadata(&self) -> &[(String, Value)] {
        self.parts
            .first()
            .map(|p| p.header().metadata.as_slice())
            .unwrap_or(&[])
    }

    /// Every tensor, part by part, in file order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorRef<'_>> {
        self.parts.iter().enumerate().flat_map(|(part, f)| {
            f.header()
                .tensors
                .iter()
                .map(move |info| TensorRef { part, info })
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<TensorRef<'_>> {
        self.tensors().find(|t| t.info.name == name)
    }

    /// A tensor's bytes.
    pub fn tensor_bytes(&self, t: TensorRef<'_>) -> Result<Vec<u8>> {
        self.parts[t.part].tensor_bytes(t.info)
    }
}
