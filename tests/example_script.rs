//! `scripts/example.sh`, README's first command (issue 26, finding 15), run whole: it uses the
//! binary cargo reports (not `./target/release/tarfa`, missing when `CARGO_TARGET_DIR` or a cargo
//! config moves the target directory) and puts its model under cargo's target directory.
//!
//! `cargo` is a stand-in on `PATH` (the script puts `$HOME/.cargo/bin` first; `HOME` is a temp
//! directory here) that answers the script's two questions — the build's artifact messages and
//! `cargo metadata`'s target directory — as cargo does, naming this test build's `tarfa`; a
//! release build inside a test would take minutes. Everything else is the real script.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Write an executable script.
fn script(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A home whose `.cargo/bin/cargo` reports `exe` as the built `tarfa` and `target` as the
/// target directory.
fn home_with_cargo(home: &Path, exe: &Path, target: &Path) {
    let bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let artifact = serde_json::json!({
        "reason": "compiler-artifact",
        "target": {"name": "tarfa", "kind": ["bin"]},
        "executable": exe,
        "fresh": true,
    });
    let metadata = serde_json::json!({"target_directory": target, "packages": []});
    script(
        &bin.join("cargo"),
        &format!(
            "#!/usr/bin/env bash\ncase \"$1\" in\n  build) echo '{artifact}'; echo '{{\"reason\":\"build-finished\",\"success\":true}}';;\n  metadata) echo '{metadata}';;\n  *) echo \"stand-in cargo: $*\" >&2; exit 2;;\nesac\n"
        ),
    );
}

/// Run `scripts/example.sh` with `home` as `HOME`: exit code, stdout, stderr.
fn run_example(home: &Path) -> (i32, String, String) {
    let ok = Command::new("python3").arg("--version").output();
    assert!(
        ok.is_ok_and(|o| o.status.success()),
        "python3 is needed (scripts/example.sh and scripts/test.sh use it)"
    );
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("bash")
        .arg(root.join("scripts/example.sh"))
        .env("HOME", home)
        .env("CARGO_TARGET_DIR", home.join("elsewhere"))
        .output()
        .expect("run bash");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_example_runs_the_binary_cargo_reports() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let target: PathBuf = tmp.path().join("target-dir");
    home_with_cargo(tmp.path(), Path::new(env!("CARGO_BIN_EXE_tarfa")), &target);
    let (code, out, err) = run_example(tmp.path());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        target.join("example/qwen3_moe/manifest.json").is_file(),
        "the model is not under cargo's target directory:\n{out}\n{err}"
    );
}
