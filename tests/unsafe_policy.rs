//! Issue 13, finding 16: `unsafe` only where ARCHITECTURE.md says. Every crate root of the
//! workspace (the binary and each member) forbids or denies `unsafe_code` — none allows it
//! crate-wide — and an `allow(unsafe_code)` appears only in the files listed here, each with its
//! reason (the same list as ARCHITECTURE.md's).

use std::path::Path;

/// The files that may allow `unsafe_code` (module- or item-level), and why.
const ALLOWED: [(&str, &str); 14] = [
    (
        "runtime/src/pinned.rs",
        "the pinned ring handed to the kernel",
    ),
    (
        "runtime/src/mapped.rs",
        "the mmap backend's maps and SIGBUS handler",
    ),
    (
        "runtime/src/device_sink.rs",
        "host registration and host-to-device copies (the driver FFI)",
    ),
    ("cuda/src/gpu.rs", "the CUDA driver FFI: opening a device"),
    ("cuda/src/nvrtc.rs", "NVRTC's library probed"),
    ("cuda/src/device.rs", "the CUDA device of the engine"),
    ("cuda/src/offload.rs", "CUDA kernels launched"),
    (
        "cuda/src/hal.rs",
        "the declaration of the engine's unsafe launch contract",
    ),
    ("cuda/src/engine.rs", "the engine's launches"),
    (
        "cuda/src/engine/prompt.rs",
        "the engine's launches of a prompt pass",
    ),
    ("decode/src/kernels/x86.rs", "the one SIMD kernel module"),
    (
        "decode/src/team.rs",
        "the thread team: a phase's closure shared with the workers, disjoint &mut",
    ),
    (
        "cuda-emu/src/lib.rs",
        "test-only: the FFI into the CPU emulation",
    ),
    ("tests/unsafe_policy.rs", "this test names the attribute"),
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace members, read from the root Cargo.toml's `members = [...]` line.
fn members() -> Vec<String> {
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).expect("read Cargo.toml");
    let line = toml
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("a members line");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).expect("ls").flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn every_crate_root_forbids_or_denies_unsafe_code() {
    let mut roots = vec![root().join("src/main.rs")];
    for m in members() {
        let lib = root().join(&m).join("src/lib.rs");
        roots.push(if lib.exists() {
            lib
        } else {
            root().join(&m).join("src/main.rs")
        });
    }
    assert!(roots.len() >= 10, "{roots:?}");
    for r in roots {
        let text = std::fs::read_to_string(&r).expect("read a crate root");
        let strict =
            text.contains("#![forbid(unsafe_code)]") || text.contains("#![deny(unsafe_code)]");
        assert!(
            strict,
            "{}: neither forbids nor denies unsafe_code",
            r.display()
        );
        assert!(
            !text.contains("#![allow(unsafe_code)]"),
            "{}: allows unsafe_code crate-wide",
            r.display()
        );
    }
}

#[test]
fn unsafe_code_is_allowed_only_in_the_listed_files() {
    let mut files = Vec::new();
    for dir in ["src", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    for m in members() {
        for dir in ["src", "tests", "benches"] {
            let d = root().join(&m).join(dir);
            if d.is_dir() {
                rust_files(&d, &mut files);
            }
        }
    }
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        if !text.contains("allow(unsafe_code)") {
            continue;
        }
        let rel = f.strip_prefix(root()).expect("below the root");
        assert!(
            ALLOWED.iter().any(|(p, _)| Path::new(p) == rel),
            "{}: allows unsafe_code but is not one of the files ARCHITECTURE.md names",
            rel.display()
        );
    }
}
