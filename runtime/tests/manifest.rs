//! The runtime streams only the files the model's manifest recorded: a valid JNF file put in a
//! layer file's place (another conversion's, another layer's) is refused when the model is
//! opened, before a byte of it is streamed.

mod common;

use common::{options, write_model, MODEL};
use tarfa_format::golden::TinyModel;
use tarfa_format::Dtype;
use tarfa_runtime::{BackendKind, ExpertSource, StreamError};

fn open_err(dir: &std::path::Path) -> StreamError {
    match ExpertSource::open(dir, &options(BackendKind::Pread, 1, 1)) {
        Ok(_) => panic!("a model whose layer file is not the manifest's was opened"),
        Err(e) => e,
    }
}

#[test]
fn a_valid_layer_file_of_another_conversion_is_refused() {
    let (model, other) = (
        tempfile::tempdir().expect("tmp"),
        tempfile::tempdir().expect("tmp"),
    );
    write_model(model.path());
    // Same names, shapes and size, other bytes: F16 experts instead of BF16.
    TinyModel {
        expert_dtype: Dtype::F16,
        ..MODEL
    }
    .write(other.path())
    .expect("other model");
    let (ours, theirs) = (
        model.path().join("layer-00001.jnf"),
        other.path().join("layer-00001.jnf"),
    );
    assert_eq!(
        std::fs::metadata(&ours).expect("stat").len(),
        std::fs::metadata(&theirs).expect("stat").len()
    );
    std::fs::copy(&theirs, &ours).expect("swap");
    let e = open_err(model.path());
    assert!(
        matches!(&e, StreamError::RootDigestMismatch { found, recorded, .. } if found != recorded),
        "{e}"
    );
}

#[test]
fn another_layer_in_a_layer_files_place_is_refused() {
    let model = tempfile::tempdir().expect("tmp");
    write_model(model.path());
    std::fs::copy(
        model.path().join("layer-00000.jnf"),
        model.path().join("layer-00002.jnf"),
    )
    .expect("copy");
    let e = open_err(model.path());
    // Another layer's file has another root digest: that is found first.
    assert!(matches!(e, StreamError::RootDigestMismatch { .. }), "{e}");
}
