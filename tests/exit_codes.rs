//! Issue 13, finding 18: invalid input is exit 1 whatever rule it breaks, a source's fault never
//! gets the hint of a damaged JNF file, and an OS error is printed once.

mod common;

use common::{path, tarfa};

/// A directory holding one safetensors file `file` with one BF16 tensor called `name`.
fn checkpoint(dir: &std::path::Path, file: &str, name: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut entry = serde_json::Map::new();
    entry.insert(
        name.to_string(),
        serde_json::json!({"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}),
    );
    let json = serde_json::to_vec(&entry).expect("json");
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(&json);
    b.extend_from_slice(&[0; 2]);
    std::fs::write(dir.join(file), b).expect("write");
}

const JNF_DAMAGED: &str = "was damaged since";

#[test]
fn a_tensor_name_of_4097_bytes_is_invalid_input_exit_1_with_a_source_hint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    checkpoint(&src, "model.safetensors", &"w".repeat(4097));
    let out = tmp.path().join("out");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&out), "--quiet"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("4097 bytes") && err.contains("model.safetensors"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("hint: ") && l.contains("rename it in the source")),
        "{err}"
    );
    assert!(!err.contains(JNF_DAMAGED), "{err}");
    assert!(!out.join("manifest.json").exists());
}

#[test]
fn a_source_file_name_a_jnf_file_cannot_record_gets_no_damaged_jnf_hint() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    checkpoint(&src, "a:b.safetensors", "w");
    let (code, _, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&tmp.path().join("out")),
        "--quiet",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("a:b.safetensors"), "{err}");
    assert!(
        !err.contains(JNF_DAMAGED),
        "a source's fault, not a JNF file's: {err}"
    );
}

#[test]
fn a_broken_safetensors_header_is_exit_1_naming_the_rule() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let json = br#"{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,2]}}"#;
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json);
    b.extend_from_slice(&[0; 2]);
    std::fs::write(src.join("model.safetensors"), b).expect("write");
    let (code, _, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&tmp.path().join("out")),
        "--quiet",
    ]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("tensor 'w'") && err.contains("the header lies"),
        "{err}"
    );
    assert!(!err.contains(JNF_DAMAGED), "{err}");
}

#[test]
fn an_os_error_is_printed_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("missing.jnf");
    let gguf = tmp.path().join("missing.gguf");
    let out = tmp.path().join("out.gguf");
    for args in [
        vec!["inspect", path(&missing)],
        vec!["fetch", path(&gguf), "--tensors", "*", "-o", path(&out)],
    ] {
        let (code, _, err) = tarfa(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.matches("(os error").count(), 1, "{args:?}: {err}");
        assert_eq!(
            err.matches("No such file or directory").count(),
            1,
            "{args:?}: {err}"
        );
    }
}

/// A switch set to a value its reader does not take is a bad argument before any command runs
/// (exit 2, naming it and its values), not its default taken quietly; a `TARFA_*` name nothing
/// reads is a warning and the command runs.
#[test]
fn a_bad_tarfa_switch_is_exit_2_and_an_unknown_one_a_warning() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (var, value) in [
        ("TARFA_CUDA_NORM_FUSE", "false"),
        ("TARFA_CUDA_PDL", "off"),
        ("TARFA_PROFILE", "yes"),
        ("TARFA_SPLIT", "dynamic"),
        ("TARFA_ISA", "foo"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tarfa"))
            .args(["inspect", path(tmp.path())])
            .env(var, value)
            .output()
            .expect("run tarfa");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}: {err}");
        assert!(
            err.starts_with(&format!("error: {var}=\"{value}\" is not ")),
            "{err}"
        );
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(["completions", "bash"])
        .env("TARFA_CUDA_NORM_FUSED", "0")
        .output()
        .expect("run tarfa");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.starts_with("warning: TARFA_CUDA_NORM_FUSED is not a variable tarfa reads"),
        "{err}"
    );
}

/// A bad value in an environment variable is a bad argument, as a bad `--backend` is: exit 2
/// (README "Exit codes"), naming the variable and the value.
#[test]
fn an_unknown_io_backend_in_the_environment_is_a_bad_argument_exit_2_naming_it() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(["run", path(tmp.path()), "--tokens", "1"])
        .env("TARFA_IO_BACKEND", "aio")
        .output()
        .expect("run tarfa");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("TARFA_IO_BACKEND=\"aio\" is not an I/O backend"),
        "{err}"
    );
    assert!(!err.contains("hint:"), "{err}");
}
