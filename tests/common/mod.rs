//! Shared by the binary's end-to-end tests: running `tarfa` as a user does, and the paths of the
//! checked-in fixtures.

// Each test file uses its own part of this module.
#![allow(dead_code)]

pub mod serve;

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

/// [`tarfa`], killed and failed if it has not exited within `secs` seconds (a read that blocks,
/// on a FIFO say, never returns).
pub fn tarfa_within(secs: u64, args: &[&str]) -> (i32, String, String) {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tarfa");
    // Drained while it runs, so a full pipe cannot stall it.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|o| Box::new(o) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|e| Box::new(e) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tarfa {args:?} still running after {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    (
        status.code().unwrap_or(-1),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
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
