//! End-to-end tests of `tarfa inspect` on GGUF files: what a user sees, and the exit codes.

mod common;

use common::{gguf_fixture, path, tarfa};

#[test]
fn inspect_gguf_prints_key_values_with_long_arrays_abbreviated_and_every_tensor() {
    let f = gguf_fixture("metadata.gguf");
    let (code, out, err) = tarfa(&["inspect", path(&f)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("GGUF v3"), "{out}");
    assert!(out.contains("alignment 32, 7 tensors"), "{out}");
    assert!(out.contains("test.f64"), "{out}");
    assert!(out.contains("-1e-300"), "{out}");
    assert!(
        out.contains(
            r#"string[47]     ["<unk>", "<s>", "</s>", "tok0", "tok1", "tok2", ... 41 more]"#
        ),
        "{out}"
    );
    assert!(
        out.contains("int32[2][3]    [[1, 2], [3], [4, 5, 6]]"),
        "{out}"
    );
    assert!(
        out.contains("BF16     [32, 4]                         256"),
        "{out}"
    );
    assert!(out.contains("token_embd.weight"), "{out}");
    assert!(err.is_empty(), "nothing on stderr: {err}");
}

#[test]
fn inspect_gguf_json_has_every_value_whole_and_tensor_offsets() {
    let f = gguf_fixture("moe.gguf");
    let (code, out, _) = tarfa(&["inspect", "--json", path(&f)]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["format"], "gguf");
    assert_eq!(v["parts"][0]["alignment"], 64);
    let gate = &v["tensors"][0];
    assert_eq!(gate["name"], "blk.0.ffn_gate_exps.weight");
    assert_eq!(gate["type"], "Q4_K");
    assert_eq!(gate["ne"], serde_json::json!([256, 8, 4]));
    assert_eq!(gate["shape"], serde_json::json!([4, 8, 256]));
    assert_eq!(gate["size"], 4 * 8 * 144);
    // Absolute offsets agree with gguf-py's data_offset in the committed dump.
    let dump: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(gguf_fixture("moe.json")).expect("dump"))
            .expect("json");
    for (ours, theirs) in v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .zip(dump["tensors"].as_array().expect("tensors"))
    {
        assert_eq!(ours["offset"], theirs["offset"]);
        assert_eq!(ours["size"], theirs["n_bytes"]);
    }

    let (_, out, _) = tarfa(&["inspect", "--json", path(&gguf_fixture("metadata.gguf"))]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let tokens = v["metadata"]
        .as_array()
        .expect("metadata")
        .iter()
        .find(|kv| kv["key"] == "tokenizer.ggml.tokens")
        .expect("tokens");
    assert_eq!(
        tokens["value"].as_array().expect("array").len(),
        47,
        "whole in JSON"
    );
}

#[test]
fn inspect_gguf_split_set_lists_its_parts_and_where_each_tensor_lives() {
    let (code, out, err) = tarfa(&["inspect", path(&gguf_fixture("split-00002-of-00003.gguf"))]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("split set: 3 parts, split.tensors.count 5"),
        "{out}"
    );
    assert!(out.contains("part 3: "), "{out}");
    let (_, out, _) = tarfa(&[
        "inspect",
        "--json",
        path(&gguf_fixture("split-00001-of-00003.gguf")),
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["split"]["count"], 3);
    let parts: Vec<u64> = v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| t["part"].as_u64().expect("part"))
        .collect();
    assert_eq!(parts, [0, 0, 1, 1, 2]);
}

#[test]
fn inspect_gguf_invalid_files_exit_1_naming_what_they_are() {
    for (name, says) in [
        ("lfs-pointer", "Git LFS pointer"),
        ("html-page", "HTML page"),
        ("huge-string-length", "string length 9223372036854775808"),
        (
            "overlapping-offsets",
            "tensor 'b' has offset 0, expected 64",
        ),
        ("version-1", "version 1 is not supported"),
    ] {
        let f = gguf_fixture(&format!("hostile/{name}.gguf"));
        let (code, out, err) = tarfa(&["inspect", path(&f)]);
        assert_eq!(code, 1, "{name}: {err}");
        assert!(out.is_empty(), "{name}: nothing on stdout");
        assert!(err.contains(says) && err.contains(name), "{name}: {err}");
    }
}

#[test]
fn inspect_gguf_missing_file_exits_2() {
    let (code, _, err) = tarfa(&["inspect", "/nonexistent/model.gguf"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn inspect_of_a_model_converted_from_gguf_names_its_architecture_in_plain_words() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("m");
    let src = gguf_fixture("moe-model.gguf");
    let (code, o, e) = tarfa(&[
        "convert",
        src.to_str().expect("utf8"),
        "-o",
        out.to_str().expect("utf8"),
        "-q",
    ]);
    assert_eq!(code, 0, "{o}{e}");
    let (code, o, e) = tarfa(&["inspect", out.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{e}");
    assert!(o.contains("JNF model 1.0, glm4moe (gguf)"), "{o}");
    // No Rust syntax: ranges in words, not `..=` or `(layer, expert)` tuples.
    assert!(!o.contains("..") && !o.contains("(0, 0)"), "{o}");
    assert!(
        o.contains("experts: layer 1 expert 0 to layer 1 expert"),
        "{o}"
    );
}
