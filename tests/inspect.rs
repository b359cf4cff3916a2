//! End-to-end tests of `tarfa inspect`: what a user sees, and the exit codes of README.md.

mod common;

use std::path::Path;

use common::{golden, tarfa, tarfa_within};

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("ls") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, to.join(p.file_name().expect("name"))).expect("copy");
    }
}

#[test]
fn inspect_of_a_file_prints_layout_hashes_and_every_region() {
    let f = golden("fused-gate-up.jnf");
    let (code, out, err) = tarfa(&["inspect", f.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("JNF 1.0"), "{out}");
    assert!(out.contains("layer 5, 3 experts/layer"), "{out}");
    assert!(out.contains("6 regions, 3 experts"), "{out}");
    assert!(
        out.contains("model.layers.5.mlp.experts.2.down_proj"),
        "{out}"
    );
    assert!(
        out.contains("<- model.safetensors 'model.layers.5.mlp.experts.down_proj'"),
        "{out}"
    );
    assert!(err.is_empty(), "nothing on stderr: {err}");
}

#[test]
fn inspect_json_is_machine_readable_and_matches_the_file() {
    let f = golden("edge-sizes.jnf");
    let (code, out, _) = tarfa(&["inspect", "--json", f.to_str().expect("utf8")]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    let regions = v["regions"].as_array().expect("regions");
    let lengths: Vec<u64> = regions
        .iter()
        .map(|r| r["length"].as_u64().expect("len"))
        .collect();
    assert_eq!(lengths, vec![4095, 0, 4096, 4097, 4]);
    assert_eq!(
        v["file_len"].as_u64(),
        Some(std::fs::metadata(&f).expect("stat").len())
    );
    assert_eq!(
        v["dtypes"]["U8"]["bytes"].as_u64(),
        Some(4095 + 4096 + 4097)
    );
}

#[test]
fn inspect_of_a_model_directory_checks_it_against_its_manifest() {
    let d = golden("tiny-moe");
    let (code, out, err) = tarfa(&["inspect", d.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("qwen3_moe (synthetic), 2 of 2 layers present"),
        "{out}"
    );
    assert!(out.contains("all files match the manifest"), "{out}");
    let (code, out, _) = tarfa(&["inspect", "--json", d.to_str().expect("utf8")]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("valid JSON");
    assert_eq!(v["files"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["manifest"]["layers"], serde_json::json!([0, 1]));
}

#[test]
fn a_layer_file_swapped_under_the_manifest_exits_1_and_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    copy_dir(&golden("tiny-moe"), tmp.path());
    // Same size, valid on its own, but not the file the manifest recorded.
    std::fs::copy(
        golden("tiny-moe/layer-00000.jnf"),
        tmp.path().join("layer-00001.jnf"),
    )
    .expect("swap");
    let (code, out, _) = tarfa(&["inspect", tmp.path().to_str().expect("utf8")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("MISMATCH layer-00001.jnf"), "{out}");
}

#[test]
fn a_damaged_file_exits_1_naming_the_rule() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let p = tmp.path().join("x.jnf");
    let mut b = std::fs::read(golden("hex-example.jnf")).expect("read");
    b.truncate(8192);
    std::fs::write(&p, b).expect("write");
    let (code, out, err) = tarfa(&["inspect", p.to_str().expect("utf8")]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.contains("does not end in a JNF footer: truncated"),
        "{err}"
    );
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn a_missing_path_exits_2() {
    let (code, _, err) = tarfa(&["inspect", "/nonexistent/x.jnf"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent/x.jnf: open"), "{err}");
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

#[test]
fn a_fifo_or_device_given_or_in_a_model_directory_exits_1_naming_it_without_blocking() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fifo = tmp.path().join("x.jnf");
    mkfifo(&fifo);
    let zero = tmp.path().join("zero.gguf");
    std::os::unix::fs::symlink("/dev/zero", &zero).expect("symlink");
    for (p, kind) in [(&fifo, "a FIFO"), (&zero, "a character device")] {
        let (code, _, err) = tarfa_within(20, &["inspect", p.to_str().expect("utf8")]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("{}: {kind}, not a regular file", p.display())),
            "{err}"
        );
    }
    for name in ["manifest.json", "layer-00001.jnf"] {
        let d = tmp.path().join(format!("model-{name}"));
        copy_dir(&golden("tiny-moe"), &d);
        mkfifo(&d.join(name));
        let (code, _, err) = tarfa_within(20, &["inspect", d.to_str().expect("utf8")]);
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains(&format!("{name}: a FIFO, not a regular file")),
            "{err}"
        );
    }
}
