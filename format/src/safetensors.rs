//! The one safetensors header parser of tarfa, used by convert, verify and fetch: an 8-byte
//! little-endian length of at most [`MAX_HEADER_LEN`], then a UTF-8 JSON object checked as
//! strictly as the safetensors crate checks it (known dtypes, integer shapes of rank ≤ 8,
//! `data_offsets` whose length is exactly the shape's bytes, tensors contiguous from 0 with
//! neither overlaps nor holes, the data ending exactly at the end of the file), and stricter in
//! one place: a tensor named twice is refused (a JSON parser keeping the last copy, as serde's
//! maps do, would read other bytes than one keeping the first). The header is read entry by
//! entry, never as one JSON tree, so a 100 MB header costs its entries, not gigabytes.

use crate::Dtype;

/// Largest safetensors header accepted (the safetensors crate's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;
fn safetensors_dtype(name: &str) -> Option<Dtype> {
    // safetensors names match the table's names, except that ggml's I8..I64 and F64 carry the
    // same names too, so a plain lookup is right.
    Dtype::from_name(name).filter(|d| d.geometry().block_elems <= 4)
}

/// One tensor of a checked safetensors header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderTensor {
    /// Name in the header.
    pub name: String,
    /// dtype as written (`BF16`, `F32`, …).
    pub dtype_name: String,
    /// The same dtype in the table.
    pub dtype: Dtype,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Absolute byte offset of its first byte in the file.
    pub begin: u64,
    /// Absolute end offset (exclusive).
    pub end: u64,
}

/// A checked safetensors header.
#[derive(Clone, Debug, PartialEq)]
pub struct SafetensorsHeader {
    /// Tensors, sorted by offset.
    pub tensors: Vec<HeaderTensor>,
    /// `__metadata__`, if any.
    pub metadata: Option<serde_json::Value>,
    /// `8 + n`: where data starts.
    pub data_start: u64,
}

/// Why a safetensors header was refused: one variant per rule. The caller adds the file's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderFault {
    /// The file cannot hold even the 8-byte header length.
    #[error("{file_len} bytes: too short for a safetensors header")]
    FileTooShort {
        /// The file's length.
        file_len: u64,
    },
    /// The header length is over [`MAX_HEADER_LEN`].
    #[error("header length {len} is over the {MAX_HEADER_LEN}-byte limit")]
    HeaderTooLong {
        /// The length the file states.
        len: u64,
    },
    /// `8 + n` is past the end of the file.
    #[error("header length {len} runs past the end of the {file_len}-byte file (truncated?)")]
    HeaderPastEnd {
        /// The length the file states.
        len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not UTF-8.
    #[error("header is not UTF-8: {0}")]
    NotUtf8(std::str::Utf8Error),
    /// The header does not start with `{`.
    #[error("header is not a JSON object")]
    NotAnObject,
    /// The header is not valid JSON.
    #[error("header is not valid JSON: {detail}")]
    NotJson {
        /// The JSON parser's message (line and column).
        detail: String,
    },
    /// `__metadata__` appears twice.
    #[error("__metadata__ is named twice")]
    MetadataTwice,
    /// A tensor entry lacks a field (or is no JSON object at all).
    #[error("tensor '{tensor}': no {field}")]
    MissingField {
        /// The tensor.
        tensor: String,
        /// `dtype`, `shape` or `data_offsets`.
        field: &'static str,
    },
    /// `shape` or `data_offsets` holds something other than non-negative integers.
    #[error("tensor '{tensor}': {field} entries must be non-negative integers")]
    NotIntegers {
        /// The tensor.
        tensor: String,
        /// `shape` or `data_offsets`.
        field: &'static str,
    },
    /// A dtype safetensors does not define.
    #[error("tensor '{tensor}': unknown dtype {dtype:?}")]
    UnknownDtype {
        /// The tensor.
        tensor: String,
        /// The dtype as written.
        dtype: String,
    },
    /// A shape of more than 8 dimensions.
    #[error("tensor '{tensor}': rank {rank} is over 8")]
    RankOver8 {
        /// The tensor.
        tensor: String,
        /// Its rank.
        rank: usize,
    },
    /// `data_offsets` is not `[begin, end]` with `begin <= end`.
    #[error("tensor '{tensor}': data_offsets must be [begin, end] with begin <= end")]
    BadOffsets {
        /// The tensor.
        tensor: String,
    },
    /// The innermost dimension is not a whole number of the dtype's blocks (a sub-byte dtype).
    #[error("tensor '{tensor}': {dtype} {shape:?} is not a whole number of bytes")]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// The shape's byte count overflows `u64`.
    #[error("tensor '{tensor}': {dtype} {shape:?} has over 2^64 bytes")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// `data_offsets` hold another byte count than the shape needs.
    #[error("tensor '{tensor}': data_offsets [{begin}, {end}] hold {} bytes but {dtype} {shape:?} needs {want}: the header lies", end - begin)]
    LengthMismatch {
        /// The tensor.
        tensor: String,
        /// `data_offsets[0]`.
        begin: u64,
        /// `data_offsets[1]`.
        end: u64,
        /// Its dtype.
        dtype: Dtype,
        /// Its shape.
        shape: Vec<u64>,
        /// The bytes the shape needs.
        want: u64,
    },
    /// An absolute offset past `u64::MAX`.
    #[error("tensor '{tensor}': offset overflow")]
    OffsetOverflow {
        /// The tensor.
        tensor: String,
    },
    /// A tensor named twice.
    #[error("tensor '{tensor}': named twice in the header")]
    Duplicate {
        /// The tensor.
        tensor: String,
    },
    /// A tensor starts before the previous one (in offset order) ends.
    #[error("tensor '{tensor}': starts at data offset {begin} but the previous tensor ends at {prev_end}: the header's offsets overlap")]
    Overlap {
        /// The tensor.
        tensor: String,
        /// Its data offset.
        begin: u64,
        /// Where the previous tensor ends (data offset).
        prev_end: u64,
    },
    /// Bytes no tensor owns between two tensors (or before the first).
    #[error("tensor '{tensor}': starts at data offset {begin} but the previous tensor ends at {prev_end}: the header's offsets leave a hole")]
    Hole {
        /// The tensor.
        tensor: String,
        /// Its data offset.
        begin: u64,
        /// Where the previous tensor ends (data offset).
        prev_end: u64,
    },
    /// The data would end past the end of the file.
    #[error(
        "the header says the data ends at byte {end}, but the file has {file_len} bytes: truncated"
    )]
    DataPastEnd {
        /// Where the last tensor ends (absolute).
        end: u64,
        /// The file's length.
        file_len: u64,
    },
    /// Bytes after the last tensor's data.
    #[error("{extra} bytes after the last tensor's data")]
    TrailingBytes {
        /// How many.
        extra: u64,
    },
}

impl HeaderFault {
    /// The tensor whose entry broke a rule, if the fault is one tensor's.
    pub fn tensor(&self) -> Option<&str> {
        use HeaderFault as F;
        match self {
            F::MissingField { tensor, .. }
            | F::NotIntegers { tensor, .. }
            | F::UnknownDtype { tensor, .. }
            | F::RankOver8 { tensor, .. }
            | F::BadOffsets { tensor }
            | F::PartialBlock { tensor, .. }
            | F::ShapeOverflow { tensor, .. }
            | F::LengthMismatch { tensor, .. }
            | F::OffsetOverflow { tensor }
            | F::Duplicate { tensor }
            | F::Overlap { tensor, .. }
            | F::Hole { tensor, .. } => Some(tensor),
            F::FileTooShort { .. }
            | F::HeaderTooLong { .. }
            | F::HeaderPastEnd { .. }
            | F::NotUtf8(_)
            | F::NotAnObject
            | F::NotJson { .. }
            | F::MetadataTwice
            | F::DataPastEnd { .. }
            | F::TrailingBytes { .. } => None,
        }
    }
}

/// One tensor's entry from its JSON object (one entry's tree at a time, never the header's),
/// checked: a known dtype, an integer shape of rank ≤ 8, `data_offsets` `[begin, end]` holding
/// exactly the shape's bytes. Unknown fields are ignored, as the safetensors crate ignores them.
fn check_entry(
    name: String,
    v: &serde_json::Value,
    data_start: u64,
) -> Result<HeaderTensor, HeaderFault> {
    let tensor = || name.clone();
    let ints = |field: &'static str| -> Result<Vec<u64>, HeaderFault> {
        v.get(field)
            .and_then(|s| s.as_array())
            .ok_or_else(|| HeaderFault::MissingField {
                tensor: tensor(),
                field,
            })?
            .iter()
            .map(|d| {
                d.as_u64().ok_or_else(|| HeaderFault::NotIntegers {
                    tensor: tensor(),
                    field,
                })
            })
            .collect()
    };
    let dtype_name = v
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| HeaderFault::MissingField {
            tensor: tensor(),
            field: "dtype",
        })?
        .to_string();
    let shape = ints("shape")?;
    let offs = ints("data_offsets")?;
    let Some(dtype) = safetensors_dtype(&dtype_name) else {
        return Err(HeaderFault::UnknownDtype {
            tensor: tensor(),
            dtype: dtype_name,
        });
    };
    if shape.len() > 8 {
        return Err(HeaderFault::RankOver8 {
            tensor: tensor(),
            rank: shape.len(),
        });
    }
    let (b, e) = match offs[..] {
        [b, e] if b <= e => (b, e),
        _ => return Err(HeaderFault::BadOffsets { tensor: tensor() }),
    };
    let Some(want) = dtype.byte_len(&shape) else {
        let row = shape.last().copied().unwrap_or(1);
        let (tensor, dtype, shape) = (tensor(), dtype, shape);
        return Err(if row % dtype.geometry().block_elems != 0 {
            HeaderFault::PartialBlock {
                tensor,
                dtype,
                shape,
            }
        } else {
            HeaderFault::ShapeOverflow {
                tensor,
                dtype,
                shape,
            }
        });
    };
    if e - b != want {
        return Err(HeaderFault::LengthMismatch {
            tensor: tensor(),
            begin: b,
            end: e,
            dtype,
            shape,
            want,
        });
    }
    let (Some(begin), Some(end)) = (data_start.checked_add(b), data_start.checked_add(e)) else {
        return Err(HeaderFault::OffsetOverflow { tensor: tensor() });
    };
    Ok(HeaderTensor {
        name,
        dtype_name,
        dtype,
        shape,
        begin,
        end,
    })
}

/// The header's tensors in file order and its `__metadata__`, each entry checked as it is read:
/// no JSON tree of the whole header is built (a 100 MB header of small entries costs its
/// tensors, not gigabytes of `Value`s).
struct Entries {
    tensors: Vec<HeaderTensor>,
    metadata: Option<serde_json::Value>,
}

/// Reads [`Entries`]; an entry's fault is left in `fault`, naming its tensor.
struct EntriesVisitor<'a> {
    data_start: u64,
    fault: &'a mut Option<HeaderFault>,
}

impl<'de> serde::de::Visitor<'de> for EntriesVisitor<'_> {
    type Value = Entries;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut tensors = Vec::new();
        let mut metadata = None;
        while let Some(key) = map.next_key::<String>()? {
            let v = map.next_value::<serde_json::Value>()?;
            if key == "__metadata__" {
                if metadata.is_some() {
                    *self.fault = Some(HeaderFault::MetadataTwice);
                    return Err(serde::de::Error::custom("duplicate __metadata__"));
                }
                metadata = Some(v);
                continue;
            }
            match check_entry(key, &v, self.data_start) {
                Ok(t) => tensors.push(t),
                Err(fault) => {
                    *self.fault = Some(fault);
                    return Err(serde::de::Error::custom("bad entry"));
                }
            }
        }
        Ok(Entries { tensors, metadata })
    }
}

/// The JSON length `n` from the first bytes of a file of `file_len` bytes: at most
/// [`MAX_HEADER_LEN`], and `8 + n` inside the file.
pub fn safetensors_header_len(prefix: &[u8], file_len: u64) -> Result<u64, HeaderFault> {
    if file_len < 8 {
        return Err(HeaderFault::FileTooShort { file_len });
    }
    let n = u64::from_le_bytes(
        prefix
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 8]),
    );
    if n > MAX_HEADER_LEN {
        return Err(HeaderFault::HeaderTooLong { len: n });
    }
    if 8 + n > file_len {
        return Err(HeaderFault::HeaderPastEnd { len: n, file_len });
    }
    Ok(n)
}

/// Check the JSON header `json` of a safetensors file of `file_len` bytes: a UTF-8 JSON object,
/// known dtypes, integer shapes of rank ≤ 8, `data_offsets` whose length is exactly the shape's
/// bytes, tensors contiguous from 0 with neither overlaps nor holes, and the data ending exactly
/// at the end of the file.
pub fn parse_safetensors_header(
    json: &[u8],
    file_len: u64,
) -> Result<SafetensorsHeader, HeaderFault> {
    let text = std::str::from_utf8(json).map_err(HeaderFault::NotUtf8)?;
    if !text.trim_start().starts_with('{') {
        return Err(HeaderFault::NotAnObject);
    }
    let data_start = 8 + json.len() as u64;
    let mut fault = None;
    let Entries {
        mut tensors,
        metadata,
    } = {
        let mut de = serde_json::Deserializer::from_str(text);
        let visitor = EntriesVisitor {
            data_start,
            fault: &mut fault,
        };
        let parsed = serde::Deserializer::deserialize_map(&mut de, visitor)
            .and_then(|v| de.end().map(|()| v));
        parsed.map_err(|e| {
            fault.take().unwrap_or_else(|| HeaderFault::NotJson {
                detail: e.to_string(),
            })
        })?
    };
    // One entry per name: JSON allows a key twice, and a parser that kept the last copy would
    // read other bytes than one that kept the first.
    {
        let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(HeaderFault::Duplicate {
                tensor: w[0].to_string(),
            });
        }
    }
    // The byte buffer is entirely indexed: sorted by offset, tensors are contiguous from 0 and the
    // last one ends at the end of the file.
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = data_start;
    for t in &tensors {
        if t.begin != at {
            let (tensor, begin, prev_end) = (t.name.clone(), t.begin - data_start, at - data_start);
            return Err(if t.begin < at {
                HeaderFault::Overlap {
                    tensor,
                    begin,
                    prev_end,
                }
            } else {
                HeaderFault::Hole {
                    tensor,
                    begin,
                    prev_end,
                }
            });
        }
        at = t.end;
    }
    if at != file_len {
        return Err(if at > file_len {
            HeaderFault::DataPastEnd { end: at, file_len }
        } else {
            HeaderFault::TrailingBytes {
                extra: file_len - at,
            }
        });
    }
    Ok(SafetensorsHeader {
        tensors,
        metadata,
        data_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str, data: u64) -> Result<SafetensorsHeader, HeaderFault> {
        parse_safetensors_header(json.as_bytes(), 8 + json.len() as u64 + data)
    }

    #[test]
    fn a_name_twice_is_refused_whichever_copy_would_win() {
        let twice = r#"{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}"#;
        assert!(matches!(parse(twice, 4), Err(HeaderFault::Duplicate { tensor }) if tensor == "a"));
        let meta = r#"{"__metadata__":{},"__metadata__":{},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#;
        assert_eq!(parse(meta, 2), Err(HeaderFault::MetadataTwice));
        let once =
            r#"{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#;
        assert!(parse(once, 2).is_ok_and(|h| h.tensors.len() == 1 && h.metadata.is_some()));
    }

    #[test]
    fn an_entry_fault_names_its_tensor_and_a_syntax_fault_the_header() {
        let no_dtype = r#"{"w":{"shape":[1],"data_offsets":[0,2]}}"#;
        assert!(matches!(
            parse(no_dtype, 2),
            Err(HeaderFault::MissingField { tensor, field: "dtype" }) if tensor == "w"
        ));
        // An entry written as an array is no object (a derived struct would take it as a tuple).
        let tuple = r#"{"w":["BF16",[1],[0,2]]}"#;
        assert!(matches!(
            parse(tuple, 2),
            Err(HeaderFault::MissingField { tensor, .. }) if tensor == "w"
        ));
        let cut = r#"{"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}"#;
        let fault = parse(cut, 2).expect_err("cut");
        assert!(matches!(fault, HeaderFault::NotJson { .. }), "{fault:?}");
        assert_eq!(fault.tensor(), None);
    }

    /// Each rule of the header, broken alone on literal bytes, gives its own variant.
    #[test]
    fn each_broken_rule_has_its_own_variant() {
        use HeaderFault as F;
        let e = |json: &str, data: u64| parse(json, data).expect_err(json);
        let w = |v: &str| format!(r#"{{"w":{v}}}"#);
        assert!(matches!(
            parse_safetensors_header(b"{\xff}", 12),
            Err(F::NotUtf8(_))
        ));
        assert_eq!(e("[1]", 0), F::NotAnObject);
        assert!(matches!(
            e(
                &w(r#"{"dtype":"BF16","shape":[-1],"data_offsets":[0,2]}"#),
                2
            ),
            F::NotIntegers { field: "shape", .. }
        ));
        assert!(matches!(
            e(
                &w(r#"{"dtype":"BF16","shape":[1],"data_offsets":[0,"2"]}"#),
                2
            ),
            F::NotIntegers {
                field: "data_offsets",
                ..
            }
        ));
        assert!(matches!(
            e(&w(r#"{"dtype":"Q4","shape":[1],"data_offsets":[0,2]}"#), 2),
            F::UnknownDtype { dtype, .. } if dtype == "Q4"
        ));
        assert!(matches!(
            e(
                &w(r#"{"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]}"#),
                1
            ),
            F::RankOver8 { rank: 9, .. }
        ));
        assert!(matches!(
            e(&w(r#"{"dtype":"U8","shape":[1],"data_offsets":[1,0]}"#), 1),
            F::BadOffsets { .. }
        ));
        assert!(matches!(
            e(
                &w(r#"{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}"#),
                4
            ),
            F::ShapeOverflow { .. }
        ));
        assert!(matches!(
            e(&w(r#"{"dtype":"F4","shape":[3],"data_offsets":[0,2]}"#), 2),
            F::PartialBlock { .. }
        ));
        assert!(matches!(
            e(
                &w(r#"{"dtype":"BF16","shape":[2],"data_offsets":[0,2]}"#),
                2
            ),
            F::LengthMismatch { want: 4, .. }
        ));
        let two = |a: &str, b: &str| {
            format!(
                r#"{{"a":{{"dtype":"U8","shape":[2],"data_offsets":{a}}},"b":{{"dtype":"U8","shape":[2],"data_offsets":{b}}}}}"#
            )
        };
        assert!(matches!(
            e(&two("[0,2]", "[1,3]"), 3),
            F::Overlap {
                begin: 1,
                prev_end: 2,
                ..
            }
        ));
        assert!(matches!(
            e(&two("[0,2]", "[3,5]"), 5),
            F::Hole {
                begin: 3,
                prev_end: 2,
                ..
            }
        ));
        let one = w(r#"{"dtype":"U8","shape":[2],"data_offsets":[0,2]}"#);
        assert!(matches!(e(&one, 1), F::DataPastEnd { .. }));
        assert_eq!(e(&one, 3), F::TrailingBytes { extra: 1 });
        assert_eq!(
            safetensors_header_len(&[0; 4], 4),
            Err(F::FileTooShort { file_len: 4 })
        );
        let huge = (MAX_HEADER_LEN + 1).to_le_bytes();
        assert!(matches!(
            safetensors_header_len(&huge, 1 << 40),
            Err(F::HeaderTooLong { .. })
        ));
        assert_eq!(
            safetensors_header_len(&16u64.to_le_bytes(), 20),
            Err(F::HeaderPastEnd {
                len: 16,
                file_len: 20
            })
        );
    }
}
