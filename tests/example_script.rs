//! `scripts/example.sh`, README's first command (issue 26, findings 15 and 16), run whole: it uses
//! the binary cargo reports (not `./target/release/tarfa`, missing when `CARGO_TARGET_DIR` or a
//! cargo config moves the target directory), puts its model under cargo's target directory, and
//! ends by checking the run's token ids against transformers' greedy tokens: "yes" and exit 0
//! when they are the same, "no" and a non-zero exit when not.
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
fn the_example_runs_the_binary_cargo_reports_and_matches_transformers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let target: PathBuf = tmp.path().join("target-dir");
    home_with_cargo(tmp.path(), Path::new(env!("CARGO_BIN_EXE_tarfa")), &target);
    let (code, out, err) = run_example(tmp.path());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        target.join("example/qwen3_moe/manifest.json").is_file(),
        "the model is not under cargo's target directory:\n{out}\n{err}"
    );
    assert!(out.contains("random weights"), "{out}");
    assert!(
        out.lines()
            .any(|l| l == "matches transformers' greedy tokens: yes"),
        "{out}\n{err}"
    );
}

#[test]
fn the_example_says_no_and_fails_when_the_tokens_differ() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // A tarfa whose `run --json` reports one more token than it generated.
    let wrapper = tmp.path().join("tarfa-wrong");
    script(
        &wrapper,
        &format!(
            "#!/usr/bin/env bash\nif [ \"$1\" = run ] && [[ \" $* \" == *' --json '* ]]; then\n  \"{real}\" \"$@\" | sed 's/\"tokens\": \\[/\"tokens\": [ 127,/'\n  exit \"${{PIPESTATUS[0]}}\"\nfi\nexec \"{real}\" \"$@\"\n",
            real = env!("CARGO_BIN_EXE_tarfa")
        ),
    );
    home_with_cargo(tmp.path(), &wrapper, &tmp.path().join("target-dir"));
    let (code, out, err) = run_example(tmp.path());
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        out.lines()
            .any(|l| l == "matches transformers' greedy tokens: no"),
        "{out}\n{err}"
    );
}
