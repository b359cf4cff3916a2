//! Issue 13, item 5: a model directory whose files were checked against two versions of one
//! source file (two generations presented as one model) is reported as `mixed_sources`, with or
//! without `--source`, naming the layer; a manifest whose record of the source tensors a file
//! holds (`files[].sources[].tensors_blake3`) is not the file's is a `file_hash` fault; with
//! `--source`, layers whose bytes the source no longer has are `source_mismatch` faults.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_format::manifest::{content_digest, DIGEST_KEY, MANIFEST_NAME};
use tarfa_verifier::{verify, FaultKind, Options, Quiet, Report};

fn converted(root: &Path) -> (PathBuf, PathBuf) {
    let (src, out) = (root.join("src"), root.join("out"));
    let spec = SynthSpec {
        layers: 3,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    convert(&src, &out, &ConvertOptions::default(), &ConvertQuiet).expect("convert");
    (src, out)
}

/// Edit the manifest's JSON and write it back with its digest recomputed (so that only the
/// edited content, not a broken digest, can be what verify reports).
fn edit_manifest(out: &Path, edit: impl FnOnce(&mut Value)) {
    let path = out.join(MANIFEST_NAME);
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    let o = v.as_object_mut().expect("object");
    o.remove(DIGEST_KEY);
    edit(&mut v);
    let d = content_digest(&v);
    v.as_object_mut()
        .expect("object")
        .insert(DIGEST_KEY.into(), Value::String(d));
    let mut bytes = serde_json::to_vec_pretty(&v).expect("json");
    bytes.push(b'\n');
    std::fs::write(&path, bytes).expect("write");
}

/// The `sources[0]` object of the manifest entry of `file`.
fn read_of<'v>(v: &'v mut Value, file: &str) -> &'v mut Value {
    v["files"]
        .as_array_mut()
        .expect("files")
        .iter_mut()
        .find(|f| f["path"] == file)
        .expect("entry")
        .get_mut("sources")
        .expect("sources recorded")
        .get_mut(0)
        .expect("one source")
}

fn check(out: &Path, source: Option<&Path>) -> Report {
    let opts = Options {
        source: source.map(Path::to_path_buf),
        ..Options::default()
    };
    verify(out, &opts, &Quiet).expect("verify runs")
}

#[test]
fn a_clean_conversion_records_one_identity_per_source_and_verifies_clean() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, out) = converted(tmp.path());
    let m = tarfa_format::manifest::Manifest::load(&out).expect("manifest");
    assert!(m.conversion.sources[0].mtime_ns.is_some());
    for r in [check(&out, None), check(&out, Some(&src))] {
        assert!(r.faults.is_empty(), "{:#?}", r.faults);
    }
}

#[test]
fn a_manifest_recording_two_identities_of_one_shard_is_reported_as_mixed_sources() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, out) = converted(tmp.path());
    edit_manifest(&out, |v| {
        let r = read_of(v, "layer-00001.jnf");
        let t = r["mtime_ns"].as_i64().expect("mtime_ns");
        r["mtime_ns"] = Value::from(t - 1_000_000_000);
    });
    for source in [None, Some(src.as_path())] {
        let r = check(&out, source);
        assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
        let f = &r.faults[0];
        assert_eq!(f.kind, FaultKind::MixedSources);
        assert_eq!(f.file, "layer-00001.jnf");
        assert_eq!(f.layer, Some(1));
        assert!(f.detail.contains("model.safetensors"), "{}", f.detail);
        assert!(f.detail.contains("layers 0, 2 agree"), "{}", f.detail);
        assert_ne!(f.expected, f.actual);
        let json = serde_json::to_value(f).expect("json");
        assert_eq!(json["kind"], "mixed_sources");
    }
}

#[test]
fn a_recorded_tensors_digest_that_is_not_the_files_is_a_file_hash_fault() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_src, out) = converted(tmp.path());
    edit_manifest(&out, |v| {
        read_of(v, "layer-00002.jnf")["tensors_blake3"] = Value::String("ab".repeat(32));
    });
    let r = check(&out, None);
    assert_eq!(r.faults.len(), 1, "{:#?}", r.faults);
    assert_eq!(r.faults[0].kind, FaultKind::FileHash);
    assert_eq!(r.faults[0].layer, Some(2));
    assert!(r.faults[0].detail.contains("files[].sources"));
}

#[test]
fn with_the_source_a_layer_whose_bytes_the_source_no_longer_has_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, out) = converted(tmp.path());
    let at = {
        let r = tarfa_format::JnfReader::open(out.join("layer-00000.jnf")).expect("open");
        r.regions()[0].src_begin + 1
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(src.join("model.safetensors"))
        .expect("open");
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).expect("read");
    f.write_all_at(&[b[0] ^ 0x80], at).expect("write");
    let r = check(&out, Some(&src));
    assert!(!r.faults.is_empty());
    assert!(
        r.faults
            .iter()
            .all(|f| f.kind == FaultKind::SourceMismatch && f.layer == Some(0)),
        "{:#?}",
        r.faults
    );
}
