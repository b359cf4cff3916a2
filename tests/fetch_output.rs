//! `tarfa fetch -o` (review finding 24): a directory, or a filesystem without room, is refused
//! before anything is fetched or written, saying why.

mod common;

use std::path::{Path, PathBuf};

use common::{gguf_fixture, path, tarfa};

/// Every entry under `dir`, recursively.
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).expect("ls") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            all.extend(entries(&p));
        }
        all.push(p);
    }
    all
}

#[test]
fn fetch_to_a_directory_is_refused_before_anything_is_written() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = gguf_fixture("moe-model.gguf");
    let existing = tmp.path().join("out");
    std::fs::create_dir(&existing).expect("mkdir");
    let slash = |p: &Path| format!("{}/", path(p));
    for out in [
        path(&existing).to_string(),
        slash(&existing),
        slash(&tmp.path().join("new")),
    ] {
        let (code, stdout, err) = tarfa(&["fetch", path(&src), "--tensors", "*", "-q", "-o", &out]);
        assert_eq!(code, 2, "{out}: {stdout}{err}");
        assert!(err.contains("-o names a directory"), "{out}: {err}");
        assert_eq!(
            entries(tmp.path()),
            vec![existing.clone()],
            "{out}: nothing written"
        );
    }
}

#[test]
fn fetch_without_room_for_the_output_is_refused_before_fetching_naming_the_margin() {
    let tmp = tempfile::tempdir().expect("tempdir");
    // 8 MiB: room for the 380 KB output, not for it and the 16 MiB kept free.
    let Some(small) = tarfa_testtools::Tmpfs::mount(&tmp.path().join("small"), "8m") else {
        return;
    };
    let at = small.path();
    let src = gguf_fixture("moe-model.gguf");
    let out = at.join("all.gguf");
    let (code, stdout, err) = tarfa(&[
        "fetch",
        path(&src),
        "--tensors",
        "*",
        "-q",
        "-o",
        path(&out),
    ]);
    assert_eq!(code, 2, "{stdout}{err}");
    assert!(err.contains("not enough free space"), "{err}");
    assert!(
        err.contains("kept free so that the filesystem is never filled"),
        "{err}"
    );
    assert!(entries(at).is_empty(), "nothing written: {:?}", entries(at));
}
