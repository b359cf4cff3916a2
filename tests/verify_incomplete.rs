//! `tarfa verify` of a model that is a part (review finding 12), as a user meets it: exit 1 with
//! the missing layer named; a `--layers` that selects nothing is exit 2; `convert --layers …
//! --verify` checks the piece it wrote and exits 0.

mod common;

use std::path::Path;

use common::{path, tarfa};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hf")
        .join(name)
}

#[test]
fn a_model_of_one_of_two_layers_verifies_incomplete_and_a_piece_verifies_as_a_piece() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let src = fixture("qwen3_moe");
    let (code, stdout, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&out),
        "--layers",
        "0",
        "--verify",
        "-q",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("0 fault(s)"), "{stdout}");
    for args in [
        vec!["verify", path(&out)],
        vec!["verify", path(&out), "--source", path(&src)],
    ] {
        let (code, stdout, err) = tarfa(&args);
        assert_eq!(code, 1, "{stdout}{err}");
        assert!(
            stdout.contains("incomplete: the model is incomplete: 1 of 2 layers missing (1)"),
            "{stdout}"
        );
    }
    let (code, stdout, err) = tarfa(&["verify", path(&out), "--layers", "7-9"]);
    assert_eq!(code, 2, "{stdout}{err}");
    assert!(err.contains("--layers 7-9 selects no file"), "{err}");
}
