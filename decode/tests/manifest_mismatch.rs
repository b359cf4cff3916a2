//! A model directory that is not what its manifest records is refused with the
//! `ManifestMismatch` that names how (an aux file of another SHA-256 or size); one that lacks
//! layers is `Incomplete`, naming them.

use std::path::Path;

use tarfa_decode::error::ManifestMismatch;
use tarfa_decode::{DecodeError, Decoder, DecoderOptions};

fn convert(out: &Path, layers: Option<(u32, u32)>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/hf/qwen3_moe");
    tarfa_converter::convert(
        &src,
        out,
        &tarfa_converter::Options {
            layers,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .expect("convert fixture");
}

fn mismatch(e: DecodeError) -> ManifestMismatch {
    match e {
        DecodeError::NotInManifest { fault, .. } => fault,
        e => panic!("expected NotInManifest, got {e}"),
    }
}

#[test]
fn a_changed_or_resized_aux_file_is_named_by_its_fault() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    convert(&dir, None);
    let dec = Decoder::open(&dir, &DecoderOptions::default()).expect("open");
    let path = dir.join("tokenizer.json");
    let mut bytes = std::fs::read(&path).expect("read");
    let intact = dec.aux_file("tokenizer.json").expect("intact");
    assert_eq!(
        intact.map(|f| f.bytes),
        Some(bytes.clone()),
        "the checked bytes"
    );
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&path, &bytes).expect("write");
    let fault = mismatch(dec.aux_file("tokenizer.json").expect_err("changed"));
    assert!(
        matches!(&fault, ManifestMismatch::Sha256 { found, recorded } if found != recorded),
        "{fault}"
    );
    // Shorter: a longer one is refused by the bounded read, past its limit, before any hash.
    std::fs::write(&path, &bytes[..last]).expect("write");
    let fault = mismatch(dec.aux_file("tokenizer.json").expect_err("resized"));
    assert_eq!(
        fault,
        ManifestMismatch::Size {
            expected: bytes.len() as u64
        }
    );
}

#[test]
fn a_model_converted_for_part_of_its_depth_is_refused_naming_the_missing_layers() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    convert(&dir, Some((0, 0)));
    let Err(e) = Decoder::open(&dir, &DecoderOptions::default()) else {
        panic!("an incomplete model was opened");
    };
    assert!(e.to_string().contains("1 of 2 layers missing (1)"), "{e}");
    match e {
        DecodeError::Incomplete {
            missing, layers, ..
        } => assert_eq!((missing, layers), (vec![1], 2)),
        e => panic!("expected Incomplete, got {e}"),
    }
}
