//! Issue 26, finding 3: the config `run` computes with (the manifest's copy) is tied to the
//! checkpoint. Edit top-k in the manifest and re-digest it: `run` refuses it, naming the key,
//! because the model directory's own `config.json` disagrees, and `verify` reports it; edit
//! both consistently (the aux file's hashes updated too): `verify --source` reports it against
//! the source's `config.json`. A GGUF's key/values (`expert_used_count`) likewise against the
//! GGUF.

mod common;

use std::path::Path;

use common::{path, tarfa};
use serde_json::json;
use tarfa_format::manifest::Manifest;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn edit_config(model: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut m = Manifest::load(model).expect("manifest");
    f(&mut m.architecture.config);
    m.publish(model).expect("publish");
}

/// `verify` of `model` (with `extra`): exit 1 and a `config` fault naming `key`.
fn verify_names(model: &Path, extra: &[&str], key: &str) {
    let mut args = vec!["verify", path(model), "--json", "-q"];
    args.extend_from_slice(extra);
    let (code, out, err) = tarfa(&args);
    assert_eq!(code, 1, "{extra:?}: {out}{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("json");
    let faults = doc["faults"].as_array().expect("faults");
    assert!(
        faults.iter().any(|f| f["kind"] == "config"
            && f["detail"].as_str().is_some_and(|d| d.contains(key))),
        "{extra:?}: {doc}"
    );
}

#[test]
fn a_config_edited_after_conversion_is_refused_by_run_and_reported_by_verify() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = root().join("fixtures/hf/qwen3_moe_b");
    let model = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tarfa(&["verify", path(&model), "--source", path(&src), "-q"]);
    assert_eq!(code, 0, "as converted: {err}");
    let logits = |name: &str| tmp.path().join(name);
    let run_to = |out: &Path| {
        tarfa(&[
            "run",
            path(&model),
            "--tokens",
            "5,17",
            "-n",
            "2",
            "--logits-out",
            path(out),
        ])
    };
    let run = || run_to(&logits("scratch.npy"));
    let (code, _, err) = run_to(&logits("before.npy"));
    assert_eq!(code, 0, "{err}");

    // The manifest's top-k edited and re-digested; config.json left alone.
    edit_config(&model, |c| c["num_experts_per_tok"] = json!(2));
    let (code, out, err) = run();
    assert_eq!(code, 1, "{err}");
    assert!(out.trim().is_empty(), "{out}");
    assert!(
        err.contains("the manifest's config differs from the model directory's config.json at num_experts_per_tok"),
        "{err}"
    );
    verify_names(&model, &[], "num_experts_per_tok");
    verify_names(&model, &["--source", path(&src)], "num_experts_per_tok");

    // config.json edited the same way, with its hashes in the manifest: run computes another
    // model (it has no other copy to hold it to), and verify --source says so.
    let cfg = model.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).expect("config")).expect("json");
    c["num_experts_per_tok"] = json!(2);
    let bytes = serde_json::to_vec_pretty(&c).expect("json");
    std::fs::write(&cfg, &bytes).expect("write");
    let h = tarfa_format::hash::dual_hash(&bytes);
    let mut m = Manifest::load(&model).expect("manifest");
    let e = m
        .files
        .iter_mut()
        .find(|f| f.path == "config.json")
        .expect("config.json is an aux file");
    e.size = bytes.len() as u64;
    e.sha256 = hex::encode(h.sha256);
    e.blake3 = hex::encode(h.blake3);
    m.publish(&model).expect("publish");
    let (code, _, err) = run_to(&logits("after.npy"));
    assert_eq!(code, 0, "{err}");
    assert_ne!(
        std::fs::read(logits("before.npy")).expect("before"),
        std::fs::read(logits("after.npy")).expect("after"),
        "top-k 2 is another model"
    );
    let (code, _, err) = tarfa(&["verify", path(&model), "-q"]);
    assert_eq!(code, 0, "consistent without the source: {err}");
    verify_names(&model, &["--source", path(&src)], "num_experts_per_tok");
}

#[test]
fn a_gguf_models_key_values_edited_after_conversion_are_reported_by_verify_source() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = root().join("fixtures/gguf/from_hf/qwen3_moe_b.gguf");
    let model = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&model), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = tarfa(&["verify", path(&model), "--source", path(&src), "-q"]);
    assert_eq!(code, 0, "as converted: {err}");
    edit_config(&model, |c| {
        c["qwen3moe.expert_used_count"] = json!({"type": "u32", "value": 2})
    });
    verify_names(
        &model,
        &["--source", path(&src)],
        "qwen3moe.expert_used_count",
    );
}
