//! `tarfa run` on a GGUF-sourced model: `fixtures/gguf/from_hf/qwen3_moe_b.gguf` (the
//! qwen3_moe_b fixture's weights in llama.cpp's naming, fixtures/gguf/make_from_hf.py) converted
//! and run with `--prompt`: the tokenizer is rebuilt from the GGUF's tokenizer.ggml.* keys, and
//! the ids and text are transformers' greedy output for the safetensors checkpoint.

mod common;

use std::path::Path;

use common::{path, tarfa};

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("list")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

#[test]
fn a_gguf_model_runs_text_prompts_with_its_rebuilt_tokenizer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    let src = root.join("fixtures/gguf/from_hf/qwen3_moe_b.gguf");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
    let r: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("fixtures/reference/qwen3_moe_b/reference.json"))
            .expect("reference.json"),
    )
    .expect("json");
    for p in r["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("text");
        let (code, out, err) =
            tarfa(&["run", path(&model), "--prompt", text, "-n", "32", "--json"]);
        assert_eq!(code, 0, "{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).expect("one JSON document");
        assert_eq!(
            ids(&doc["prompt_tokens"]),
            ids(&p["prompt_ids"]),
            "{text:?}"
        );
        assert_eq!(ids(&doc["tokens"]), ids(&p["fp32_tokens"]), "{text:?}");
        let (code, out, err) = tarfa(&["run", path(&model), "--prompt", text, "-n", "32"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            out.trim_end_matches('\n'),
            p["fp32_text"].as_str().expect("fp32_text")
        );
    }
}

#[test]
fn a_gguf_model_missing_a_key_the_decoder_needs_is_invalid_input_exit_1() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    let src = root.join("fixtures/gguf/from_hf/qwen3_moe_b.gguf");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
    // The GGUF's key/values are kept in the manifest: drop one the decoder needs, re-digested
    // as a conforming writer would have written it (a GGUF without the key).
    let key = "qwen3moe.attention.layer_norm_rms_epsilon";
    let mut m = tarfa_format::manifest::Manifest::load(&model).expect("manifest");
    let kv = m.architecture.config.as_object_mut().expect("key/values");
    assert!(kv.remove(key).is_some(), "the fixture has {key}");
    m.publish(&model).expect("publish");
    let (code, out, err) = tarfa(&["run", path(&model), "--tokens", "1", "-n", "1"]);
    assert_eq!(code, 1, "{err}");
    assert!(out.trim().is_empty(), "{out}");
    assert!(err.contains(key) && err.contains("missing"), "{err}");
    assert!(!err.contains("damaged"), "{err}");
}
