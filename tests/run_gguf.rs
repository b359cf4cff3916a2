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

/// Issue 26, finding 19, for a GGUF-sourced model: llama.cpp's end-of-generation ids
/// (`tokenizer.ggml.eos_token_id`, `eot_token_id`, `eom_token_id`) end a run, and
/// `tokenizer.ggml.add_bos_token` puts the BOS id before a text prompt, as llama.cpp does. The
/// key/values are set in the manifest, re-digested as a GGUF holding them would have converted.
#[test]
fn a_gguf_models_end_of_generation_ids_stop_a_run_and_its_bos_leads_a_prompt() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    let src = root.join("fixtures/gguf/from_hf/qwen3_moe_b.gguf");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", path(&model), "-n", "8", "--json"];
        args.extend_from_slice(extra);
        let (code, out, err) = tarfa(&args);
        assert_eq!(code, 0, "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("json")
    };
    let full = run(&["--tokens", "5,17"]);
    assert_eq!(full["finish_reason"], "length", "{full}");
    let all = ids(&full["tokens"]);
    assert_eq!(all.len(), 8);
    let set = |key: &str, ty: &str, v: serde_json::Value| {
        let mut m = tarfa_format::manifest::Manifest::load(&model).expect("manifest");
        m.architecture.config[key] = serde_json::json!({"type": ty, "value": v});
        m.publish(&model).expect("publish");
    };
    for key in ["eos_token_id", "eot_token_id"] {
        // The fourth greedy token as the end of generation: the run ends at its first place.
        let stop = all[3];
        let first = all.iter().position(|&t| t == stop).expect("in it");
        set(
            &format!("tokenizer.ggml.{key}"),
            "u32",
            serde_json::json!(stop),
        );
        let stopped = run(&["--tokens", "5,17"]);
        assert_eq!(ids(&stopped["tokens"]), all[..=first], "{key}: {stopped}");
        assert_eq!(stopped["finish_reason"], "stop", "{key}: {stopped}");
        assert_eq!(
            ids(&run(&["--tokens", "5,17", "--ignore-eos"])["tokens"]),
            all
        );
        // An id outside the vocabulary is refused by name.
        set(
            &format!("tokenizer.ggml.{key}"),
            "u32",
            serde_json::json!(5000),
        );
        let (code, _, err) = tarfa(&["run", path(&model), "--tokens", "5", "-n", "1"]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains(&format!("tokenizer.ggml.{key}")), "{err}");
        let mut m = tarfa_format::manifest::Manifest::load(&model).expect("manifest");
        m.architecture
            .config
            .as_object_mut()
            .expect("kv")
            .remove(&format!("tokenizer.ggml.{key}"));
        m.publish(&model).expect("publish");
    }
    let plain = ids(&run(&["-p", "hi"])["prompt_tokens"]);
    set("tokenizer.ggml.bos_token_id", "u32", serde_json::json!(7));
    set(
        "tokenizer.ggml.add_bos_token",
        "bool",
        serde_json::json!(true),
    );
    let with_bos = ids(&run(&["-p", "hi"])["prompt_tokens"]);
    assert_eq!(with_bos[0], 7, "{with_bos:?}");
    assert_eq!(with_bos[1..], plain[..], "{with_bos:?} {plain:?}");
}

/// Issue 26, finding 13: a GGUF whose token list gives two ids one string prints both ids' text
/// (the rebuilt tokenizer's vocabulary holds the string once, under the first id, and its decode
/// dropped the later id from the printed text); each id decodes to its own string, as llama.cpp.
#[test]
fn a_gguf_token_string_shared_by_two_ids_is_printed_for_both() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("m");
    let src = root.join("fixtures/gguf/from_hf/qwen3_moe_b.gguf");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
    let run = || {
        let (code, out, err) = tarfa(&[
            "run",
            path(&model),
            "--tokens",
            "5,17",
            "-n",
            "8",
            "--json",
            "--ignore-eos",
        ]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).expect("json")
    };
    let base = run();
    let generated = ids(&base["tokens"]);
    let text = base["text"].as_str().expect("text").to_string();
    let mut m = tarfa_format::manifest::Manifest::load(&model).expect("manifest");
    let strings: Vec<String> = m.architecture.config["tokenizer.ggml.tokens"]["value"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|s| s.as_str().expect("string").to_string())
        .collect();
    // The later id: the largest generated; the string it takes: a one-letter token of a
    // smaller id that the text does not hold.
    let later = *generated.iter().max().expect("tokens") as usize;
    let (first, letter) = strings[..later]
        .iter()
        .enumerate()
        .find(|(_, s)| {
            s.len() == 1 && s.chars().all(|c| c.is_ascii_alphabetic()) && !text.contains(s.as_str())
        })
        .map(|(i, s)| (i, s.clone()))
        .expect("a letter the text lacks");
    m.architecture.config["tokenizer.ggml.tokens"]["value"][later] = serde_json::json!(letter);
    m.publish(&model).expect("publish");
    let dup = run();
    assert_eq!(dup["tokens"], base["tokens"], "the same computation");
    let shown = dup["text"].as_str().expect("text");
    let times = generated.iter().filter(|&&t| t as usize == later).count();
    assert_eq!(
        shown.matches(letter.as_str()).count(),
        times,
        "id {later} now shares {letter:?} with id {first}: {shown:?} (was {text:?})"
    );
}
