//! Shared by the integration tests: fixture paths, and the JSON form of a header that
//! `fixtures/gguf/gguf_dump.py` writes from gguf-py's view of a file.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::{json, Value as Json};
use sha2::{Digest, Sha256};
use tarfa_gguf::{Array, GgufFile, Header, Value};

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf")
}

fn plain(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => json!(x.to_bits()),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_tree(a),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => json!(x.to_bits()),
    }
}

fn array_tree(a: &Array) -> Json {
    let items: Vec<Json> = a.values().map(|v| plain(&v)).collect();
    json!({"t": "ARRAY", "elem": a.elem_type().name(), "v": items})
}

/// The dump form of `h`, with tensor hashes from `file`.
pub fn dump(h: &Header, file: &GgufFile) -> Json {
    let kv: Vec<Json> = h
        .metadata
        .iter()
        .map(|(k, v)| match v {
            Value::Array(a) => {
                let mut t = array_tree(a);
                t["key"] = json!(k);
                t
            }
            v => json!({"key": k, "t": v.value_type().name(), "v": plain(v)}),
        })
        .collect();
    let tensors: Vec<Json> = h
        .tensors
        .iter()
        .map(|t| {
            let bytes = file.tensor_bytes(t).expect("tensor bytes");
            json!({
                "name": t.name,
                "type": t.dtype.name(),
                "ne": t.ne,
                "offset": t.data_offset,
                "n_bytes": t.byte_len,
                "sha256": hex::encode(Sha256::digest(&bytes)),
            })
        })
        .collect();
    json!({"alignment": h.alignment, "data_offset": h.data_start, "kv": kv, "tensors": tensors})
}
