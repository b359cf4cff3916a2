//! Review finding 12: verify does not pass what is incomplete. A model with some of its layers,
//! a manifest re-digested after a layer or the trunk was dropped from it, or one whose layer
//! count was lowered too, is reported incomplete (exit 1), naming what is missing; with a
//! source, every source tensor must be in some region. A selection that selects nothing is an
//! error, and hidden files in the directory are reported, except the conversion's lock.

use std::path::{Path, PathBuf};

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_format::manifest::{layer_file_name, Manifest, TRUNK_NAME};
use tarfa_verifier::{verify, Fault, FaultKind, Options, Quiet, Report, VerifyError};

fn checkpoint(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    // Fused experts: each source stack is cut into per-expert regions, so "every source byte in
    // some region" is a union of slices.
    let spec = SynthSpec {
        layers: 2,
        shards: 2,
        fused: true,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    src
}

fn converted(layers: Option<(u32, u32)>) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let src = checkpoint(tmp.path());
    let out = tmp.path().join("out");
    let opts = ConvertOptions {
        layers,
        ..ConvertOptions::default()
    };
    convert(&src, &out, &opts, &ConvertQuiet).expect("convert");
    (tmp, src, out)
}

fn run(out: &Path, source: Option<&Path>) -> Report {
    let opts = Options {
        source: source.map(Path::to_path_buf),
        ..Options::default()
    };
    verify(out, &opts, &Quiet).expect("verification runs")
}

fn incomplete(r: &Report) -> Vec<&Fault> {
    r.faults
        .iter()
        .filter(|f| f.kind == FaultKind::Incomplete)
        .collect()
}

/// Drop `name` from the directory and from the manifest, and publish it re-digested: every
/// remaining hash checks.
fn drop_and_redigest(out: &Path, name: &str, edit: impl FnOnce(&mut Manifest)) {
    redigest(out, |m| {
        m.files.retain(|f| f.path != name);
        m.layers.retain(|&l| layer_file_name(l) != name);
        edit(m);
    });
    std::fs::remove_file(out.join(name)).expect("remove");
}

/// Edit the manifest and publish it re-digested.
fn redigest(out: &Path, edit: impl FnOnce(&mut Manifest)) {
    let mut m = Manifest::load(out).expect("manifest");
    edit(&mut m);
    m.publish(out).expect("re-digest");
}

#[test]
fn a_model_with_one_of_two_layers_is_incomplete_naming_the_missing_layer() {
    let (_tmp, src, out) = converted(Some((0, 0)));
    for source in [None, Some(src.as_path())] {
        let r = run(&out, source);
        assert_eq!(r.missing_layers, vec![1]);
        let f = incomplete(&r);
        assert!(
            f.iter()
                .any(|f| f.detail.contains("1 of 2 layers missing (1)")),
            "{:#?}",
            r.faults
        );
        if source.is_some() {
            // The tensors of layer 1 are in no region.
            assert!(
                f.iter().any(|f| f.detail.contains("model.layers.1.")),
                "{:#?}",
                r.faults
            );
        }
    }
    // The piece `convert --layers 0-0 --verify` checks is whole as a piece.
    let opts = Options {
        source: Some(src),
        layers: Some((0, 0)),
        partial: true,
        ..Options::default()
    };
    let r = verify(&out, &opts, &Quiet).expect("runs");
    assert!(r.faults.is_empty(), "{:#?}", r.faults);
}

#[test]
fn a_manifest_redigested_after_dropping_a_layer_or_the_trunk_is_incomplete() {
    let (_tmp, src, out) = converted(None);
    assert!(run(&out, Some(&src)).faults.is_empty());
    drop_and_redigest(&out, &layer_file_name(1), |_| {});
    let r = run(&out, None);
    assert_eq!(r.missing_layers, vec![1]);
    assert_eq!(incomplete(&r).len(), 1, "{:#?}", r.faults);

    let (_tmp, src, out) = converted(None);
    drop_and_redigest(&out, TRUNK_NAME, |_| {});
    for source in [None, Some(src.as_path())] {
        let r = run(&out, source);
        assert!(
            incomplete(&r)
                .iter()
                .any(|f| f.detail.contains("no trunk file")),
            "{:#?}",
            r.faults
        );
    }
}

#[test]
fn a_lowered_layer_count_is_caught_by_the_config_and_by_the_source() {
    let (_tmp, src, out) = converted(None);
    drop_and_redigest(&out, &layer_file_name(1), |m| m.architecture.num_layers = 1);
    let r = run(&out, None);
    assert!(r.missing_layers.is_empty());
    assert!(
        incomplete(&r).iter().any(|f| f
            .detail
            .contains("below the layer count its config declares")),
        "{:#?}",
        r.faults
    );
    // The config edited to agree too: only the source can tell.
    redigest(&out, |m| {
        m.architecture.config["num_hidden_layers"] = 1.into();
    });
    assert!(incomplete(&run(&out, None)).is_empty());
    let r = run(&out, Some(&src));
    let f = incomplete(&r);
    assert!(
        f.iter().any(|f| f.detail.contains("model.layers.1.")),
        "{:#?}",
        r.faults
    );
}

#[test]
fn a_selection_that_selects_nothing_is_an_error() {
    let (_tmp, _src, out) = converted(None);
    for (layers, sample) in [(Some((7, 9)), None), (None, Some((5, 5)))] {
        let opts = Options {
            layers,
            sample,
            ..Options::default()
        };
        match verify(&out, &opts, &Quiet) {
            Err(VerifyError::Usage(msg)) => {
                assert!(msg.contains("selects no file"), "{msg}")
            }
            other => panic!("{layers:?} {sample:?}: {other:?}"),
        }
    }
}

#[test]
fn hidden_files_are_reported_but_the_conversion_lock_is_not() {
    let (_tmp, src, out) = converted(None);
    assert!(out.join(".tarfa-convert.lock").exists());
    std::fs::write(out.join(".layer-00001.jnf.tmp-77"), b"leftover").expect("write");
    std::fs::write(out.join(".notes"), b"x").expect("write");
    let r = run(&out, Some(&src));
    let extra: Vec<&str> = r
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::ExtraFile)
        .map(|f| f.file.as_str())
        .collect();
    assert_eq!(
        extra,
        [".layer-00001.jnf.tmp-77", ".notes"],
        "{:#?}",
        r.faults
    );
    assert_eq!(r.faults.len(), 2, "{:#?}", r.faults);
}
