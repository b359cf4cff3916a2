//! `tarfa inspect model.gguf`: key/values, tensors (type, shape, size, offset) and split parts of
//! a GGUF file or split set, for people or as JSON.

use std::fmt::Write as _;

use indicatif::HumanBytes;
use serde_json::{json, Value as Json};
use tarfa_gguf::{Array, GgufModel, Value};

use crate::cli::InspectArgs;

/// How many elements of an array the readable output shows.
const ARRAY_PREVIEW: usize = 6;
/// Longest string shown whole in the readable output.
const STRING_PREVIEW: usize = 80;

/// Open (and check) the GGUF file or split set at `args.path` and print it.
pub fn run(args: &InspectArgs) -> anyhow::Result<bool> {
    let m = GgufModel::open(&args.path)?;
    if args.json {
        crate::json::print(&crate::json::document("tarfa.inspect-gguf/1", to_json(&m))?)?;
    } else {
        print!("{}", render(&m));
    }
    Ok(true)
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::F32(x) => crate::json::float(f64::from(*x)),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => Json::Array(a.values().map(|v| value_json(&v)).collect()),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F64(x) => crate::json::float(*x),
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Array(a) => array_type(a),
        v => v.value_type().name().to_ascii_lowercase(),
    }
}

fn array_type(a: &Array) -> String {
    let inner = match a {
        Array::Array(v) => v.first().map_or("array".into(), array_type),
        a => a.elem_type().name().to_ascii_lowercase(),
    };
    format!("{inner}[{}]", a.len())
}

/// The machine-readable form: every value whole.
pub fn to_json(m: &GgufModel) -> Json {
    let parts: Vec<Json> = m
        .parts()
        .iter()
        .map(|p| {
            let h = p.header();
            json!({
                "path": p.name(),
                "file_len": h.file_len,
                "version": h.version,
                "alignment": h.alignment,
                "header_len": h.header_len,
                "data_start": h.data_start,
                "kv_count": h.metadata.len(),
                "tensor_count": h.tensors.len(),
            })
        })
        .collect();
    let metadata: Vec<Json> = m
        .metadata()
        .iter()
        .map(|(k, v)| json!({"key": k, "type": type_name(v), "value": value_json(v)}))
        .collect();
    let tensors: Vec<Json> = m
        .tensors()
        .map(|t| {
            json!({
                "name": t.info.name,
                "type": t.info.dtype.name(),
                "ne": t.info.ne,
                "shape": t.info.shape(),
                "size": t.info.byte_len,
                "part": t.part,
                "offset": t.info.data_offset,
                "relative_offset": t.info.offset,
            })
        })
        .collect();
    let split = m
        .split()
        .map(|s| json!({"count": s.count, "tensors_count": s.tensors_count}));
    json!({
        "format": "gguf",
        "path": m.parts().first().map(|p| p.name()),
        "split": split,
        "parts": parts,
        "metadata": metadata,
        "tensors": tensors,
    })
}

fn short_value(v: &Value) -> String {
    match v {
        Value::String(s) => short_string(s),
        Value::Array(a) => {
            let shown: Vec<String> = a
                .values()
                .take(ARRAY_PREVIEW)
                .map(|v| short_value(&v))
                .collect();
            let more = if a.len() > ARRAY_PREVIEW {
                format!(", ... {} more", a.len() - ARRAY_PREVIEW)
            } else {
                String::new()
            };
            format!("[{}{more}]", shown.join(", "))
        }
        Value::F32(x) => format!("{x:?}"),
        Value::F64(x) => format!("{x:?}"),
        v => value_json(v).to_string(),
    }
}

fn short_string(s: &str) -> String {
    if s.chars().count() <= STRING_PREVIEW {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(STRING_PREVIEW).collect();
    format!("{head:?}... ({} bytes)", s.len())
}

/// The readable summary: arrays abbreviated to a count and their first elements.
pub fn render(m: &GgufModel) -> String {
    let mut s = String::new();
    let first = m.parts().first();
    let total_len: u64 = m.parts().iter().map(|p| p.header().file_len).sum();
    let n_tensors = m.tensors().count();
    let tensor_bytes: u64 = m.tensors().map(|t| t.info.byte_len).sum();
    let _ = writeln!(
        s,
        "{}: GGUF v{}, {} ({} bytes), alignment {}, {} tensors ({}), {} key/values",
        first.map(|p| p.name()).unwrap_or_default(),
        first.map_or(0, |p| p.header().version),
        HumanBytes(total_len),
        total_len,
        first.map_or(0, |p| p.header().alignment),
        n_tensors,
        HumanBytes(tensor_bytes),
        m.metadata().len(),
    );
    if let Some(split) = m.split() {
        let _ = writeln!(
            s,
            "  split set: {} parts, split.tensors.count {}",
            split.count, split.tensors_count
        );
        for (i, p) in m.parts().iter().enumerate() {
            let h = p.header();
            let _ = writeln!(
                s,
                "    part {}: {} ({} bytes), {} tensors, data at {}",
                i + 1,
                p.name(),
                h.file_len,
                h.tensors.len(),
                h.data_start
            );
        }
    }
    let _ = writeln!(s, "  metadata:");
    let key_w = m.metadata().iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in m.metadata() {
        let _ = writeln!(
            s,
            "    {k:<key_w$}  {:<14} {}",
            type_name(v),
            short_value(v)
        );
    }
    let _ = writeln!(s, "  tensors:");
    let _ = writeln!(
        s,
        "    {:>4} {:>4} {:<8} {:<22} {:>12} {:>12}  name",
        "#", "part", "type", "ne", "size", "offset"
    );
    for (i, t) in m.tensors().enumerate() {
        let _ = writeln!(
            s,
            "    {:>4} {:>4} {:<8} {:<22} {:>12} {:>12}  {}",
            i,
            t.part + 1,
            t.info.dtype.name(),
            format!("{:?}", t.info.ne),
            t.info.byte_len,
            t.info.data_offset,
            t.info.name
        );
    }
    s
}

/// A GGUF by its magic, or by its `.gguf` name (so an LFS pointer or HTML page saved as
/// `model.gguf` is reported as such by the GGUF reader, not as a bad JNF magic).
pub fn is_gguf(path: &std::path::Path) -> bool {
    if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        return true;
    }
    use std::os::unix::fs::FileExt;
    let mut magic = [0u8; 4];
    tarfa_format::fsio::open_regular(path)
        .is_ok_and(|f| f.file.read_exact_at(&mut magic, 0).is_ok() && magic == *b"GGUF")
}
