//! safetensors headers read through a [`ByteSource`] (so by range over HTTP), checked by the
//! same rules as the converter's reader (`converter/src/source.rs`) and the safetensors crate:
//! an 8-byte little-endian length of at most 100 MB, UTF-8 JSON object, known dtypes, integer
//! shapes of rank ≤ 8, `data_offsets` whose length is exactly the shape's bytes, tensors
//! contiguous from 0 with neither overlaps nor holes, and the data ending exactly at the end of
//! the file. The writer ([`write_header`]) re-parses its own output with [`parse_header`].

use serde_json::{Map, Value};
use tarfa_gguf::{ByteSource, Dtype};

use crate::error::{FetchError, Result};

/// Largest header accepted (the safetensors crate's own limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// One tensor of a safetensors file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StTensor {
    /// Name.
    pub name: String,
    /// dtype as written (`BF16`, `F32`, …).
    pub dtype: String,
    /// Row-major shape.
    pub shape: Vec<u64>,
    /// Absolute offset of the first byte in the file.
    pub begin: u64,
    /// Absolute end (exclusive).
    pub end: u64,
}

/// A checked safetensors header.
#[derive(Clone, Debug, PartialEq)]
pub struct StHeader {
    /// Tensors, sorted by offset.
    pub tensors: Vec<StTensor>,
    /// `__metadata__`, if any.
    pub metadata: Option<Value>,
    /// `8 + n`: where data starts.
    pub data_start: u64,
}

fn dtype_of(name: &str) -> Option<Dtype> {
    Dtype::from_name(name).filter(|d| d.geometry().block_elems <= 4)
}

/// Read and check the header of `src` (two reads: the length, then the JSON).
pub fn read_header(src: &dyn ByteSource) -> Result<StHeader> {
    let file = src.name();
    let len = src.len();
    let mut head = vec![0u8; len.min(64) as usize];
    src.read_at(0, &mut head)
        .map_err(|e| FetchError::from_io(e, std::path::Path::new(&file), "read header"))?;
    if head.starts_with(crate::LFS_PREFIX) {
        return Err(FetchError::NotAModel {
            url: file,
            what: "a Git LFS pointer",
            hint: String::new(),
        });
    }
    if head.trim_ascii_start().starts_with(b"<") {
        return Err(FetchError::NotAModel {
            url: file,
            what: "an HTML page",
            hint: String::new(),
        });
    }
    let bad = |detail: String| FetchError::BadSafetensors {
        file: file.clone(),
        detail,
    };
    if len < 8 {
        return Err(bad(format!(
            "{len} bytes: too short for a safetensors header"
        )));
    }
    let n = u64::from_le_bytes(head[..8].try_into().unwrap_or([0; 8]));
    if n > MAX_HEADER_LEN {
        return Err(bad(format!(
            "header length {n} is over the {MAX_HEADER_LEN}-byte limit"
        )));
    }
    if 8 + n > len {
        return Err(bad(format!(
            "header length {n} runs past the end of the {len}-byte file (truncated?)"
        )));
    }
    let mut json = vec![0u8; n as usize];
    src.read_at(8, &mut json)
        .map_err(|e| FetchError::from_io(e, std::path::Path::new(&file), "read header"))?;
    parse_header(&json, len, &file)
}

/// Check the JSON header `json` of a file of `file_len` bytes.
pub fn parse_header(json: &[u8], file_len: u64, file: &str) -> Result<StHeader> {
    let bad = |detail: String| FetchError::BadSafetensors {
        file: file.to_string(),
        detail,
    };
    let text = std::str::from_utf8(json).map_err(|e| bad(format!("header is not UTF-8: {e}")))?;
    if !text.trim_start().starts_with('{') {
        return Err(bad("header is not a JSON object".into()));
    }
    let entries: Map<String, Value> =
        serde_json::from_str(text).map_err(|e| bad(format!("header is not valid JSON: {e}")))?;
    let data_start = 8 + json.len() as u64;
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = None;
    for (name, v) in entries {
        if name == "__metadata__" {
            metadata = Some(v);
            continue;
        }
        let tbad = |detail: String| bad(format!("tensor {name}: {detail}"));
        let dtype = v
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| tbad("no dtype".into()))?
            .to_string();
        let dt = dtype_of(&dtype).ok_or_else(|| tbad(format!("unknown dtype {dtype:?}")))?;
        let shape: Vec<u64> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| tbad("no shape".into()))?
            .iter()
            .map(|d| {
                d.as_u64()
                    .ok_or_else(|| tbad("shape entries must be non-negative integers".into()))
            })
            .collect::<Result<_>>()?;
        if shape.len() > 8 {
            return Err(tbad(format!("rank {} is over 8", shape.len())));
        }
        let offs = v
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .filter(|o| o.len() == 2)
            .ok_or_else(|| tbad("data_offsets must be [begin, end]".into()))?;
        let (b, e) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => {
                return Err(tbad(
                    "data_offsets must be integers with begin <= end".into(),
                ))
            }
        };
        let want = dt
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
        tensors.push(StTensor {
            name,
            dtype,
            shape,
            begin,
            end,
        });
    }
    tensors.sort_by_key(|t| (t.begin, t.end));
    let mut at = data_start;
    for t in &tensors {
        if t.begin != at {
            return Err(bad(format!(
                "tensor {}: starts at data offset {} but the previous tensor ends at {}: the offsets {}",
                t.name,
                t.begin - data_start,
                at - data_start,
                if t.begin < at { "overlap" } else { "leave a hole" }
            )));
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
    Ok(StHeader {
        tensors,
        metadata,
        data_start,
    })
}

/// The header of a file holding `tensors` (name, dtype, shape, byte length) in this order:
/// the 8-byte length and the JSON padded with spaces to a multiple of 8. Returns the bytes, the
/// absolute offset of each tensor's data, and the file length; the bytes are re-parsed first.
pub fn write_header(
    tensors: &[(String, String, Vec<u64>, u64)],
    metadata: Option<&Value>,
    file: &str,
) -> Result<(Vec<u8>, Vec<u64>, u64)> {
    let mut map = Map::new();
    if let Some(m) = metadata {
        map.insert("__metadata__".into(), m.clone());
    }
    let mut off = 0u64;
    let mut rel = Vec::with_capacity(tensors.len());
    for (name, dtype, shape, len) in tensors {
        let mut e = Map::new();
        e.insert("dtype".into(), Value::from(dtype.as_str()));
        e.insert("shape".into(), Value::from(shape.clone()));
        e.insert("data_offsets".into(), Value::from(vec![off, off + len]));
        map.insert(name.clone(), Value::Object(e));
        rel.push(off);
        off += len;
    }
    let mut json =
        serde_json::to_vec(&Value::Object(map)).map_err(|e| FetchError::BadSafetensors {
            file: file.to_string(),
            detail: format!("serialising the header: {e}"),
        })?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let data_start = 8 + json.len() as u64;
    let total = data_start + off;
    // The writer is never laxer than the reader.
    parse_header(&json, total, file)?;
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    Ok((bytes, rel.iter().map(|r| data_start + r).collect(), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_headers_parse_back_and_lies_are_refused() {
        let t = vec![
            ("b".to_string(), "BF16".to_string(), vec![2, 3], 12),
            ("a".to_string(), "F32".to_string(), vec![4], 16),
        ];
        let (bytes, offs, total) = write_header(&t, None, "x").unwrap_or_default();
        assert_eq!(bytes.len() % 8, 0);
        assert_eq!(total, bytes.len() as u64 + 28);
        assert_eq!(offs, vec![bytes.len() as u64, bytes.len() as u64 + 12]);
        let h = parse_header(&bytes[8..], total, "x");
        assert!(h.is_ok());
        // One byte short of the data: truncated.
        assert!(parse_header(&bytes[8..], total - 1, "x").is_err());
        let lie = br#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#;
        assert!(parse_header(lie, 8 + lie.len() as u64 + 12, "x").is_err());
        let hole = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(parse_header(hole, 8 + hole.len() as u64 + 8, "x").is_err());
    }
}
