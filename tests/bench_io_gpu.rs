//! `tarfa bench-io --to-gpu` where CUDA is absent: a clear message and exit 2, before any work.

use std::process::Command;

#[test]
fn to_gpu_without_cuda_says_so_and_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .arg("bench-io")
        .arg(dir.path())
        .args(["--to-gpu", "--no-fio", "--no-drop-caches", "--quiet"])
        .output()
        .expect("run tarfa");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "cuda") && !stderr.contains("CUDA is absent") {
        eprintln!("skipping: a GPU is present here ({})", stderr.trim());
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("error: --to-gpu: CUDA is absent: "),
        "{stderr}"
    );
    if !cfg!(feature = "cuda") {
        assert!(stderr.contains("built without CUDA"), "{stderr}");
    }
}
