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

/// Why a safetensors header was refused. The caller adds the file's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderFault {
    /// The header as a whole (its length, its JSON, the file's length).
    #[error("{0}")]
    Header(String),
    /// One tensor's entry.
    #[error("tensor {tensor}: {detail}")]
    Tensor {
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
}

/// One tensor's entry from its JSON object (one entry's tree at a time, never the header's),
/// checked: a known dtype, an integer shape of rank ≤ 8, `data_offsets` `[begin, end]` holding
/// exactly the shape's bytes. Unknown fields are ignored, as the safetensors crate ignores them.
fn check_entry(
    name: String,
    v: &serde_json::Value,
    data_start: u64,
) -> Result<HeaderTensor, HeaderFault> {
    let tbad = |detail: String| HeaderFault::Tensor {
        tensor: name.clone(),
        detail,
    };
    let ints = |field: &str, what: &str| -> Result<Vec<u64>, HeaderFault> {
        v.get(field)
            .and_then(|s| s.as_array())
            .ok_or_else(|| tbad(format!("no {field}")))?
            .iter()
            .map(|d| d.as_u64().ok_or_else(|| tbad(what.to_string())))
            .collect()
    };
    let dtype_name = v
        .get("dtype")
        .and_then(|d| d.as_str())
        .ok_or_else(|| tbad("no dtype".into()))?
        .to_string();
    let shape = ints("shape", "shape entries must be non-negative integers")?;
    let offs = ints("data_offsets", "data_offsets must be non-negative integers")?;
    let dtype = safetensors_dtype(&dtype_name)
        .ok_or_else(|| tbad(format!("unknown dtype {dtype_name:?}")))?;
    if shape.len() > 8 {
        return Err(tbad(format!("rank {} is over 8", shape.len())));
    }
    let (b, e) = match offs[..] {
        [b, e] if b <= e => (b, e),
        _ => {
            return Err(tbad(
                "data_offsets must be [begin, end] with begin <= end".into(),
            ))
        }
    };
    let want = dtype
        .byte_len(&shape)
        .ok_or_else(|| tbad(format!("{dtype} {shape:?} is not a whole number of bytes")))?;
    if e - b != want {
        return Err(tbad(format!(
            "data_offsets [{b}, {e}] hold {} bytes but {dtype} {shape:?} needs {want}: the header lies",
            e - b
        )));
    }
    let begin = data_start
        .checked_add(b)
        .ok_or_else(|| tbad("offset overflow".into()))?;
    let end = data_start
        .checked_add(e)
        .ok_or_else(|| tbad("offset overflow".into()))?;
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
                    *self.fault = Some(HeaderFault::Header("__metadata__ is named twice".into()));
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
    let bad = |detail: String| Err(HeaderFault::Header(detail));
    if file_len < 8 {
        return bad(format!(
            "{file_len} bytes: too short for a safetensors header"
        ));
    }
    let n = u64::from_le_bytes(
        prefix
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0; 8]),
    );
    if n > MAX_HEADER_LEN {
        return bad(format!(
            "header length {n} is over the {MAX_HEADER_LEN}-byte limit"
        ));
    }
    if 8 + n > file_len {
        return bad(format!(
            "header length {n} runs past the end of the {file_len}-byte file (truncated?)"
        ));
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
    let bad = HeaderFault::Header;
    let text = std::str::from_utf8(json).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
    if !text.trim_start().starts_with('{') {
        return Err(bad("header is not a JSON object".into()));
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
            fault
                .take()
                .unwrap_or_else(|| bad(format!("header is not valid JSON: {e}")))
        })?
    };
    // One entry per name: JSON allows a key twice, and a parser that kept the last copy would
    // read other bytes than one that kept the first.
    {
        let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(HeaderFault::Tensor {
                tensor: w[0].to_string(),
                detail: "named twice in the header".into(),
            });
        }
    }
    // The byte buffer is entirely indexed: sorted by offset, tensors are contiguous from 0 and the
    // last one ends at the end of the file.
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = data_start;
    for t in &tensors {
        if t.begin != at {
            return Err(HeaderFault::Tensor {
                tensor: t.name.clone(),
                detail: format!(
                    "starts at data offset {} but the previous tensor ends at {}: the header's offsets {}",
                    t.begin - data_start,
                    at - data_start,
                    if t.begin < at { "overlap" } else { "leave a hole" }
                ),
            });
        }
        at = t.end;
    }
    if at != file_len {
        return Err(bad(if at > file_len {
            format!("the header says the data ends at byte {at}, but the file has {file_len} bytes: truncated")
        } else {
            format!("{} bytes after the last tensor's data", file_len - at)
        }));
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
        assert!(
            matches!(parse(twice, 4), Err(HeaderFault::Tensor { tensor, .. }) if tensor == "a")
        );
        let meta = r#"{"__metadata__":{},"__metadata__":{},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#;
        assert!(matches!(parse(meta, 2), Err(HeaderFault::Header(_))));
        let once =
            r#"{"__metadata__":{"k":"v"},"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#;
        assert!(parse(once, 2).is_ok_and(|h| h.tensors.len() == 1 && h.metadata.is_some()));
    }

    #[test]
    fn an_entry_fault_names_its_tensor_and_a_syntax_fault_the_header() {
        let no_dtype = r#"{"w":{"shape":[1],"data_offsets":[0,2]}}"#;
        assert!(
            matches!(parse(no_dtype, 2), Err(HeaderFault::Tensor { tensor, .. }) if tensor == "w")
        );
        // An entry written as an array is no object (a derived struct would take it as a tuple).
        let tuple = r#"{"w":["BF16",[1],[0,2]]}"#;
        assert!(
            matches!(parse(tuple, 2), Err(HeaderFault::Tensor { tensor, .. }) if tensor == "w")
        );
        let cut = r#"{"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}"#;
        assert!(matches!(parse(cut, 2), Err(HeaderFault::Header(_))));
    }
}
