//! safetensors headers read through a [`ByteSource`] (so by range over HTTP), checked by tarfa's
//! one parser (`tarfa_format::safetensors`, which convert and verify use too), whose rules are
//! the safetensors crate's: an 8-byte little-endian length of at most 100 MB, UTF-8 JSON object,
//! known dtypes, integer shapes of rank ≤ 8, `data_offsets` whose length is exactly the shape's
//! bytes, tensors contiguous from 0 with neither overlaps nor holes, and the data ending exactly
//! at the end of the file. The writer ([`write_header`]) re-parses its own output with
//! [`parse_header`].

use serde_json::{Map, Value};
use tarfa_format::safetensors::{parse_safetensors_header, safetensors_header_len};
use tarfa_gguf::ByteSource;

use crate::error::{FetchError, Result};

pub use tarfa_format::safetensors::{
    HeaderTensor as StTensor, SafetensorsHeader as StHeader, MAX_HEADER_LEN,
};

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
            what: crate::error::NotModelKind::LfsPointer,
            hint: None,
        });
    }
    if head.trim_ascii_start().starts_with(b"<") {
        return Err(FetchError::NotAModel {
            url: file,
            what: crate::error::NotModelKind::HtmlPage,
            hint: None,
        });
    }
    let n = safetensors_header_len(&head, len).map_err(|fault| FetchError::BadHeader {
        file: file.clone(),
        fault,
    })?;
    let mut json = vec![0u8; n as usize];
    src.read_at(8, &mut json)
        .map_err(|e| FetchError::from_io(e, std::path::Path::new(&file), "read header"))?;
    parse_header(&json, len, &file)
}

/// Check the JSON header `json` of a file of `file_len` bytes (`tarfa_format::safetensors`' rules); errors
/// name `file`, and the tensor where there is one.
pub fn parse_header(json: &[u8], file_len: u64, file: &str) -> Result<StHeader> {
    parse_safetensors_header(json, file_len).map_err(|fault| FetchError::BadHeader {
        file: file.to_string(),
        fault,
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
    // Serialising a map of strings, numbers and arrays cannot fail; if it ever did, it would be
    // tarfa's failure, not the source's.
    let mut json = serde_json::to_vec(&Value::Object(map)).map_err(|e| FetchError::Io {
        path: file.into(),
        op: "serialise the safetensors header",
        source: e.into(),
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
        use tarfa_format::safetensors::HeaderFault as F;
        let fault = |r: Result<StHeader>| match r {
            Err(FetchError::BadHeader { file, fault }) if file == "x" => Some(fault),
            _ => None,
        };
        assert!(matches!(
            fault(parse_header(&bytes[8..], total - 1, "x")),
            Some(F::DataPastEnd { .. })
        ));
        let lie = br#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}}"#;
        assert!(matches!(
            fault(parse_header(lie, 8 + lie.len() as u64 + 12, "x")),
            Some(F::LengthMismatch { .. })
        ));
        let hole = br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
        assert!(matches!(
            fault(parse_header(hole, 8 + hole.len() as u64 + 8, "x")),
            Some(F::Hole { .. })
        ));
    }
}
