//! Issue 26, findings 4 and 5: a model's layer count is bounded by what its files hold and tied
//! to its config, at convert, verify and run. A GGUF's `block_count` of 2^64 − 1 converted and
//! then grew `run` until the OOM killer came; a `block_count` of 2 on a 3-block file, an
//! `nextn_predict_layers` of 1 on an ordinary block, or an HF config whose `num_hidden_layers`
//! is below its layers made the decoder skip a listed, checked layer — a different model,
//! computed quietly. Each is refused, naming the key, and nothing is written or computed.

mod common;

use std::path::{Path, PathBuf};

use common::{path, tarfa, tarfa_within};
use serde_json::json;
use tarfa_format::manifest::Manifest;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn gguf_source() -> PathBuf {
    root().join("fixtures/gguf/from_hf/qwen3_moe_b.gguf")
}

/// A copy of the fixture GGUF with `block_count` (a u32 key/value) set to `n`, in place.
fn with_block_count(dst: &Path, n: u32) {
    let mut b = std::fs::read(gguf_source()).expect("gguf");
    let key = b"qwen3moe.block_count";
    let at = b
        .windows(key.len())
        .position(|w| w == key)
        .expect("the fixture has block_count")
        + key.len();
    assert_eq!(b[at..at + 4], 4u32.to_le_bytes(), "a u32 key/value");
    b[at + 4..at + 8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(dst, b).expect("write");
}

fn convert_ok(src: &Path, out: &Path) {
    let (code, _, err) = tarfa(&["convert", path(src), "-o", path(out), "--quiet"]);
    assert_eq!(code, 0, "convert: {err}");
}

/// `convert` refuses `src` with exit 1, saying `says`, and writes no model.
fn convert_refused(src: &Path, out: &Path, says: &str) {
    let (code, _, err) = tarfa(&["convert", path(src), "-o", path(out), "--quiet"]);
    assert_eq!(code, 1, "{}: {err}", src.display());
    assert!(err.contains(says), "{}: {err}", src.display());
    assert!(!out.join("manifest.json").exists(), "a model was written");
}

/// `run` and `verify` of `model` are refused with exit 1 saying `says`, quickly, no token out.
fn run_and_verify_refuse(model: &Path, says: &str) {
    let (code, out, err) = tarfa_within(60, &["run", path(model), "--tokens", "1,2", "-n", "2"]);
    assert_eq!(code, 1, "run: {err}");
    assert!(out.trim().is_empty(), "{out}");
    assert!(err.contains(says), "run: {err}");
    let (code, out, err) = tarfa_within(60, &["verify", path(model), "--json"]);
    assert_eq!(code, 1, "verify: {err}");
    assert!(out.contains(says), "verify: {out}");
}

/// The manifest of `model` with its config edited by `f`, re-digested as a writer would.
fn edit_config(model: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut m = Manifest::load(model).expect("manifest");
    f(&mut m.architecture.config);
    m.publish(model).expect("publish");
}

#[test]
fn a_gguf_whose_block_count_is_not_its_blocks_is_refused_at_convert_run_and_verify() {
    let tmp = tempfile::tempdir().expect("tmp");
    // 2 on 3 blocks: blk.2 would be skipped.
    let two = tmp.path().join("two.gguf");
    with_block_count(&two, 2);
    convert_refused(
        &two,
        &tmp.path().join("two"),
        "the checkpoint has 3 layers (0..3) but its config declares 2 (qwen3moe.block_count): layer 2 would never run",
    );
    // 2^32 − 1: refused before anything is sized by it.
    let huge = tmp.path().join("huge.gguf");
    with_block_count(&huge, u32::MAX);
    convert_refused(
        &huge,
        &tmp.path().join("huge"),
        "qwen3moe.block_count is 4294967295: more layers than any model tarfa takes (at most 4096)",
    );

    // The same lies told by the manifest of a model converted from the good file.
    let model = tmp.path().join("m");
    convert_ok(&gguf_source(), &model);
    let set = |key: &str, v: serde_json::Value| {
        edit_config(&model, |c| {
            c[key] = json!({"type": "u64", "value": v});
        })
    };
    set("qwen3moe.block_count", json!(2));
    run_and_verify_refuse(&model, "layer 2 would never run");
    set("qwen3moe.block_count", json!(u64::MAX));
    run_and_verify_refuse(&model, "more layers than any model tarfa takes");
    // block_count 3 again, with the last block called an MTP layer.
    set("qwen3moe.block_count", json!(3));
    set("qwen3moe.nextn_predict_layers", json!(1));
    let (code, _, err) = tarfa(&["run", path(&model), "--tokens", "1,2", "-n", "2"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("qwen3moe.nextn_predict_layers")
            && err
                .contains("makes blk.2 an MTP (nextn) layer, but it holds no blk.2.nextn.* tensor"),
        "{err}"
    );
}

/// The GGUFs gguf-py writes with a key/value it cannot patch in place (a u64 block_count, an
/// added nextn_predict_layers): fixtures/gguf/set_kv.py, checked to copy a file byte for byte.
#[test]
fn a_gguf_written_with_a_lying_key_is_refused_at_convert() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let set_kv = |dst: &Path, sets: &[&str]| {
        let ok = std::process::Command::new("python3")
            .arg(root().join("fixtures/gguf/set_kv.py"))
            .arg(gguf_source())
            .arg(dst)
            .args(sets)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "set_kv.py {sets:?}");
    };
    let same = tmp.path().join("same.gguf");
    set_kv(&same, &[]);
    assert_eq!(
        std::fs::read(&same).expect("same"),
        std::fs::read(gguf_source()).expect("source"),
        "set_kv.py copies a GGUF byte for byte"
    );
    let big = tmp.path().join("big.gguf");
    set_kv(&big, &["qwen3moe.block_count=u64:18446744073709551615"]);
    convert_refused(
        &big,
        &tmp.path().join("big"),
        "qwen3moe.block_count is 18446744073709551615: more layers than any model tarfa takes",
    );
    let nextn = tmp.path().join("nextn.gguf");
    set_kv(&nextn, &["qwen3moe.nextn_predict_layers=u32:1"]);
    convert_refused(
        &nextn,
        &tmp.path().join("nextn"),
        "qwen3moe.nextn_predict_layers 1 makes blk.2 an MTP (nextn) layer, but it holds no blk.2.nextn.* tensor",
    );
}

#[test]
fn an_hf_config_declaring_fewer_layers_than_the_checkpoint_is_refused_at_convert_run_and_verify() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    let fixture = root().join("fixtures/hf/qwen3_moe_b");
    for e in std::fs::read_dir(&fixture).expect("fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), src.join(e.file_name())).expect("copy");
    }
    let cfg = src.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg).expect("config")).expect("json");
    c["num_hidden_layers"] = json!(2);
    std::fs::write(&cfg, serde_json::to_vec(&c).expect("json")).expect("write");
    convert_refused(
        &src,
        &tmp.path().join("out"),
        "the checkpoint has 3 layers (0..3) but its config declares 2 (num_hidden_layers): layer 2 would never run",
    );

    let model = tmp.path().join("m");
    convert_ok(&fixture, &model);
    edit_config(&model, |c| c["num_hidden_layers"] = json!(2));
    run_and_verify_refuse(&model, "layer 2 would never run");
    edit_config(&model, |c| c["num_hidden_layers"] = json!(1u64 << 40));
    run_and_verify_refuse(&model, "more layers than any model tarfa takes");
}

/// An MTP (nextn) block the key/values declare may be left out of a GGUF, as an HF checkpoint
/// may leave out its MTP layers: the model converts, verifies and runs its decoder layers (it
/// was refused as incomplete, with a `--layers` hint that could not work).
#[test]
fn a_gguf_without_its_declared_mtp_block_converts_and_runs() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("glm.gguf");
    let ok = std::process::Command::new("python3")
        .arg(root().join("fixtures/gguf/set_kv.py"))
        .arg(root().join("fixtures/gguf/from_hf/glm4_moe.gguf"))
        .arg(&src)
        .args([
            "glm4moe.block_count=u32:4",
            "glm4moe.nextn_predict_layers=u32:1",
        ])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "set_kv.py");
    let model = tmp.path().join("m");
    convert_ok(&src, &model);
    let (code, _, err) = tarfa(&["verify", path(&model), "-q"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = tarfa(&["run", path(&model), "--tokens", "1,2", "-n", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.split_whitespace().count(), 3, "{out}");
}
