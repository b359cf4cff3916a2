//! Shared by the binary's end-to-end tests: running `tarfa` as a user does, and the paths of the
//! checked-in fixtures.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Run the `tarfa` binary with `args`: its exit code (-1 if killed by a signal), stdout, stderr.
pub fn tarfa(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(args)
        .output()
        .expect("run tarfa");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A file of `fixtures/gguf/`.
pub fn gguf_fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/gguf")
        .join(rel)
}

/// A file of `fixtures/golden/`.
pub fn golden(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/golden")
        .join(rel)
}

/// `p` as an argument (the fixtures' paths are UTF-8).
pub fn path(p: &Path) -> &str {
    p.to_str().expect("utf8")
}
