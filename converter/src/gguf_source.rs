//! Reading a GGUF model (one file, or every part of a split set) as the same [`Checkpoint`] the
//! safetensors side builds, so planning, writing, resuming and verifying are shared. The header
//! checks are `tarfa_gguf`'s (hardened against hostile files); this module only maps the result:
//!
//! - each part is a [`Shard`] whose `rel` is its file name in the GGUF's directory and whose
//!   `header_sha256` is the SHA-256 of its bytes `0..data_start` (header and padding);
//! - each tensor is a [`SourceTensor`] with its ggml type, its row-major shape (`ne` reversed)
//!   and its absolute byte range in its part;
//! - `config` is every key/value of the first part except `split.*` (which describe the
//!   packaging), each as a typed JSON value ([`value_json`], spec §8.1).

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value as Json};
use sha2::Digest;
use tarfa_gguf::reader::{parse_split_name, split_name};
use tarfa_gguf::{parse_header, Array, GgufModel, HeaderParse, Value};

use crate::error::{ConvertError, SourceFault};
use crate::source::{Checkpoint, Shard, SourceTensor};

/// The GGUF magic, the first four bytes of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// Whether `path` is a GGUF file: a regular file named `*.gguf` or starting with the magic.
pub fn is_gguf(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    if path.extension().is_some_and(|e| e == "gguf") {
        return true;
    }
    let mut magic = [0u8; 4];
    tarfa_format::fsio::open_regular(path)
        .is_ok_and(|f| f.file.read_exact_at(&mut magic, 0).is_ok() && &magic == GGUF_MAGIC)
}

/// The files of the model `path` belongs to, in part order: `path` itself, or every
/// `NAME-0000k-of-0000N.gguf` beside it (the names [`GgufModel::open`] opens).
fn part_paths(path: &Path, parts: usize) -> Vec<PathBuf> {
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match parse_split_name(&file_name) {
        Some((prefix, _, n)) if parts > 1 => (1..=n)
            .map(|k| dir.join(split_name(prefix, k, n)))
            .collect(),
        _ => vec![path.to_path_buf()],
    }
}

/// Open the GGUF model at `path` (for a split set, any part).
pub fn open(path: &Path) -> Result<Checkpoint, ConvertError> {
    let model = GgufModel::open(path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let paths = part_paths(path, model.parts().len());
    if paths.len() != model.parts().len() {
        return Err(ConvertError::BadSource {
            path: path.to_path_buf(),
            fault: SourceFault::GgufPartCount {
                opened: model.parts().len(),
                named: paths.len(),
            },
        });
    }
    let mut shards = Vec::with_capacity(paths.len());
    let mut tensors = BTreeMap::new();
    let mut config = Map::new();
    for (i, (p, part)) in paths.iter().zip(model.parts()).enumerate() {
        let io = |op: &'static str| {
            let path = p.clone();
            move |source| ConvertError::Io { path, op, source }
        };
        // The bytes streamed later come from this descriptor; hash its header and re-parse it, so
        // the layout recorded is the one of the file actually read.
        let tarfa_format::fsio::RegularFile { file, len } = tarfa_format::fsio::open_regular(p)?;
        let h = part.header();
        let head_len = usize::try_from(h.data_start).map_err(|_| ConvertError::BadSource {
            path: p.clone(),
            fault: SourceFault::GgufHeaderTooLarge,
        })?;
        let mut head = vec![0u8; head_len];
        file.read_exact_at(&mut head, 0)
            .map_err(io("read header"))?;
        // Tensors and key/values are taken from this parse of the bytes hashed. (Headers are not
        // compared whole: a NaN key/value is not equal to itself.)
        let again = match parse_header(&head, len) {
            Ok(again) if len == h.file_len && again.tensors == h.tensors => again,
            Ok(_) | Err(HeaderParse::Invalid(_) | HeaderParse::NeedMore { .. }) => {
                return Err(ConvertError::BadSource {
                    path: p.clone(),
                    fault: SourceFault::ChangedWhileOpening,
                })
            }
        };
        let rel = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for t in &again.tensors {
            let range = t.data_range();
            tensors.insert(
                t.name.clone(),
                SourceTensor {
                    name: t.name.clone(),
                    shard: i,
                    dtype: t.dtype,
                    shape: t.shape(),
                    begin: range.start,
                    end: range.end,
                },
            );
        }
        if i == 0 {
            // gguf-split writes the model's key/values into the first part only.
            config = again
                .metadata
                .iter()
                .filter(|(k, _)| !k.starts_with("split."))
                .map(|(k, v)| (k.clone(), value_json(v)))
                .collect();
        }
        shards.push(Shard {
            rel,
            path: p.clone(),
            file,
            len,
            header_sha256: sha2::Sha256::digest(&head).into(),
        });
    }
    Ok(Checkpoint {
        dir,
        shards,
        tensors,
        config: Json::Object(config),
    })
}

/// The manifest name of a GGUF value type.
fn type_name(v: tarfa_gguf::ValueType) -> &'static str {
    use tarfa_gguf::ValueType as T;
    match v {
        T::U8 => "u8",
        T::I8 => "i8",
        T::U16 => "u16",
        T::I16 => "i16",
        T::U32 => "u32",
        T::I32 => "i32",
        T::F32 => "f32",
        T::Bool => "bool",
        T::String => "string",
        T::Array => "array",
        T::U64 => "u64",
        T::I64 => "i64",
        T::F64 => "f64",
    }
}

/// A float as JSON: a number when finite (written exactly: shortest round-trip form of the
/// `f64`, which holds every `f32` exactly); `"inf"`, `"-inf"` or `"nan:0x…"` (the bit pattern, in
/// the float's own width) otherwise, since JSON has no such numbers.
fn float_json(x: f64, bits: String) -> Json {
    if x.is_finite() {
        json!(x)
    } else if x.is_nan() {
        json!(format!("nan:0x{bits}"))
    } else if x > 0.0 {
        json!("inf")
    } else {
        json!("-inf")
    }
}

/// One element of an array, bare: its type is the array's `elem`.
fn elem_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => float_json(f64::from(*x), format!("{:08x}", x.to_bits())),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => float_json(*x, format!("{:016x}", x.to_bits())),
    }
}

fn array_json(a: &Array) -> Json {
    let items: Vec<Json> = a.values().map(|v| elem_json(&v)).collect();
    json!({"type": "array", "elem": type_name(a.elem_type()), "value": items})
}

/// A GGUF value as typed JSON (spec §8.1): `{"type": "u32", "value": 5}`; an array is
/// `{"type": "array", "elem": "string", "value": [...]}` with bare elements, or, when its
/// elements are arrays, each element itself a typed array object.
pub fn value_json(v: &Value) -> Json {
    match v {
        Value::Array(a) => array_json(a),
        v => json!({"type": type_name(v.value_type()), "value": elem_json(v)}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_keep_their_gguf_type_and_floats_their_bits() {
        assert_eq!(
            value_json(&Value::U32(5)),
            json!({"type": "u32", "value": 5})
        );
        assert_eq!(
            value_json(&Value::I64(i64::MIN)),
            json!({"type": "i64", "value": i64::MIN})
        );
        assert_eq!(
            value_json(&Value::F32(0.1)),
            json!({"type": "f32", "value": f64::from(0.1f32)})
        );
        assert_eq!(
            value_json(&Value::F32(f32::NEG_INFINITY)),
            json!({"type": "f32", "value": "-inf"})
        );
        assert_eq!(
            value_json(&Value::F64(f64::NAN)),
            json!({"type": "f64", "value": format!("nan:0x{:016x}", f64::NAN.to_bits())})
        );
        let nested = Value::Array(Array::Array(vec![
            Array::U8(vec![1, 2]),
            Array::String(vec!["a".into()]),
        ]));
        assert_eq!(
            value_json(&nested),
            json!({"type": "array", "elem": "array", "value": [
                {"type": "array", "elem": "u8", "value": [1, 2]},
                {"type": "array", "elem": "string", "value": ["a"]},
            ]})
        );
    }

    #[test]
    fn an_f32_survives_the_json_round_trip_exactly() {
        for x in [0.1f32, -1e-38, 3.4028235e38, f32::MIN_POSITIVE, 1.0e-45] {
            let text = serde_json::to_string(&value_json(&Value::F32(x))).unwrap_or_default();
            let back: Json = serde_json::from_str(&text).unwrap_or_default();
            let y = back["value"].as_f64().map(|y| y as f32);
            assert_eq!(y.map(f32::to_bits), Some(x.to_bits()), "{text}");
        }
        for x in [0.1f64, -1e-300, 1e300, 2.2250738585072014e-308, 5e-324] {
            let text = serde_json::to_string(&value_json(&Value::F64(x))).unwrap_or_default();
            let back: Json = serde_json::from_str(&text).unwrap_or_default();
            assert_eq!(
                back["value"].as_f64().map(f64::to_bits),
                Some(x.to_bits()),
                "{text}"
            );
        }
    }
}
