//! Source names a JNF file cannot hold (spec §5.1: at most 4096 bytes, not empty, no NUL) are
//! the source's fault: refused by name as a `SourceFault` before any file is written, not left to
//! the JNF writer (which refused them as a misuse of itself, exit 2, or as a broken JNF rule with
//! the hint of a damaged JNF file).

use tarfa_converter::{convert, ConvertError, Options, Quiet, SourceFault};

/// A checkpoint whose tensor is called `name` (beside one layer tensor: a checkpoint without a
/// layer is refused as a model of nothing), converted into a fresh directory.
fn convert_named(name: &str) -> Result<(), ConvertError> {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let mut entry = serde_json::Map::new();
    entry.insert(
        name.to_string(),
        serde_json::json!({"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}),
    );
    entry.insert(
        "model.layers.0.input_layernorm.weight".to_string(),
        serde_json::json!({"dtype": "BF16", "shape": [1], "data_offsets": [2, 4]}),
    );
    let json = serde_json::to_vec(&entry).expect("json");
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&json);
    b.extend_from_slice(&[0; 4]);
    std::fs::write(src.join("model.safetensors"), b).expect("write");
    let out = t.path().join("out");
    let r = convert(&src, &out, &Options::default(), &Quiet);
    if r.is_err() {
        assert!(!out.join("manifest.json").exists());
        assert!(!out.join("trunk.jnf").exists());
    }
    r.map(|_| ())
}

#[test]
fn a_tensor_name_of_4097_bytes_is_the_sources_fault_and_4096_bytes_convert() {
    for len in [4095, 4096] {
        convert_named(&"w".repeat(len)).unwrap_or_else(|e| panic!("{len} bytes: {e}"));
    }
    let e = convert_named(&"w".repeat(4097)).expect_err("4097 bytes");
    assert!(
        matches!(&e, ConvertError::BadSource { path, fault: SourceFault::NameTooLong { len: 4097, prefix } }
            if path.ends_with("model.safetensors") && prefix.len() == 64),
        "{e:?}"
    );
    assert!(e.to_string().contains("4097 bytes"), "{e}");
}

#[test]
fn a_tensor_name_with_nul_is_the_sources_fault() {
    let e = convert_named("a\0b").expect_err("NUL");
    assert!(
        matches!(&e, ConvertError::BadSource { fault: SourceFault::BadName { name }, .. } if name == "a\0b"),
        "{e:?}"
    );
}

#[test]
fn a_shard_name_a_jnf_file_cannot_record_is_the_sources_fault() {
    // `a:b.safetensors` is a fine Linux file name, but spec §5.1 allows no `:` in a source path
    // (a drive letter or a stream name elsewhere): the writer refused it as a broken JNF rule.
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let json = br#"{"w":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json);
    b.extend_from_slice(&[0; 2]);
    std::fs::write(src.join("a:b.safetensors"), b).expect("write");
    let e = convert(&src, &t.path().join("out"), &Options::default(), &Quiet).expect_err(":");
    assert!(
        matches!(&e, ConvertError::BadSource { fault: SourceFault::UnrecordableFileName { name }, .. } if name == "a:b.safetensors"),
        "{e:?}"
    );
}
