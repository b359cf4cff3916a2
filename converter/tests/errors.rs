//! Broken sources and full disks: each stops the conversion with its own error variant, naming the
//! file (and the tensor where there is one), never with a panic, and leaves nothing that looks
//! complete: no manifest, no layer file for the failing layer, no temporary file.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use safetensors::SafeTensors;
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{ConvertError, ExpertFault, SourceFault};
use tarfa_format::manifest::TRUNK_NAME;
use tarfa_format::safetensors::HeaderFault;

use common::{edit_header, header_entries, published_outputs, run, temp_files};

const LFS_POINTER: &str = "version https://git-lfs.github.com/spec/v1\n\
    oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n\
    size 123\n";

/// Convert `src` into `out`, expecting an error; a panic fails with its own message.
fn convert_err(src: &Path, out: &Path) -> ConvertError {
    match catch_unwind(AssertUnwindSafe(|| run(src, out, None))) {
        Ok(Ok(s)) => panic!("conversion of {} succeeded: {s:?}", src.display()),
        Ok(Err(e)) => e,
        Err(_) => panic!("the converter panicked on {}", src.display()),
    }
}

/// Nothing that looks complete was left in `out`.
fn assert_nothing_published(out: &Path) {
    assert!(
        published_outputs(out).is_empty(),
        "{:?}",
        published_outputs(out)
    );
    assert!(temp_files(out).is_empty(), "{:?}", temp_files(out));
}

fn small(root: &Path, spec: SynthSpec) -> PathBuf {
    let src = root.join("src");
    write_checkpoint(&src, &spec).expect("write checkpoint");
    src
}

fn sharded(root: &Path) -> PathBuf {
    small(
        root,
        SynthSpec {
            shards: 3,
            ..SynthSpec::small()
        },
    )
}

const SHARD_2: &str = "model-00002-of-00003.safetensors";
const SHARD_3: &str = "model-00003-of-00003.safetensors";

#[test]
fn missing_shard_is_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = sharded(dir.path());
    std::fs::remove_file(src.join(SHARD_2)).expect("delete shard");
    let out = dir.path().join("out");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::MissingShard { path, indexed: true } if path.ends_with(SHARD_2)),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(SHARD_2) && msg.contains("missing shard"),
        "{msg}"
    );
    assert_nothing_published(&out);
}

#[test]
fn truncated_shard_is_named_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = sharded(dir.path());
    let shard = src.join(SHARD_3);
    let len = std::fs::metadata(&shard).expect("stat").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shard)
        .expect("open");
    let out = dir.path().join("out");

    // Data cut short.
    f.set_len(len - 100).expect("truncate");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::BadShard { path, fault: HeaderFault::DataPastEnd { .. } } if path.ends_with(SHARD_3)),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(SHARD_3) && msg.contains("truncated"), "{msg}");
    assert_nothing_published(&out);

    // Cut inside the header itself.
    f.set_len(20).expect("truncate");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::BadShard { path, fault: HeaderFault::HeaderPastEnd { .. } } if path.ends_with(SHARD_3)),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(SHARD_3) && msg.contains("truncated"), "{msg}");
    assert_nothing_published(&out);
}

/// A one-file checkpoint whose header `lie` rewrites; the error must be `BadShard` naming the
/// file, with the fault `expected` accepts naming the tensor, and `words` in its message. The safetensors crate must refuse the same
/// file: the lie is a real one.
fn assert_header_lie_named(
    lie: impl FnOnce(&[(String, u64, u64)], &mut serde_json::Map<String, serde_json::Value>) -> String,
    expected: fn(&HeaderFault) -> bool,
    words: &str,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = small(dir.path(), SynthSpec::small());
    let shard = src.join("model.safetensors");
    let entries = header_entries(&shard);
    let mut named = String::new();
    edit_header(&shard, |h| named = lie(&entries, h));
    let bytes = std::fs::read(&shard).expect("read");
    assert!(
        SafeTensors::deserialize(&bytes).is_err(),
        "the safetensors crate accepts this header, so it does not lie"
    );
    let out = dir.path().join("out");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::BadShard { path, fault }
            if path.ends_with("model.safetensors") && fault.tensor() == Some(named.as_str()) && expected(fault)),
        "expected another fault of {named}: {err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains(&named) && msg.contains(words),
        "{msg}"
    );
    assert_nothing_published(&out);
}

fn set_offsets(
    h: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    begin: u64,
    end: u64,
) {
    h[name]["data_offsets"] = serde_json::json!([begin, end]);
}

#[test]
fn header_whose_offsets_overlap_names_the_tensor() {
    assert_header_lie_named(
        |entries, h| {
            // Tensor 5 claims to start 2 bytes into tensor 4.
            let (a, b) = (&entries[4], &entries[5]);
            let len = b.2 - b.1;
            set_offsets(h, &b.0, a.1 + 2, a.1 + 2 + len);
            b.0.clone()
        },
        |f| matches!(f, HeaderFault::Overlap { .. }),
        "overlap",
    );
}

#[test]
fn header_whose_offsets_leave_a_hole_names_the_tensor() {
    assert_header_lie_named(
        |entries, h| {
            // The last tensor moves 8 bytes on: a hole before it, and it runs past the data.
            let z = entries.last().expect("tensors");
            set_offsets(h, &z.0, z.1 + 8, z.2 + 8);
            z.0.clone()
        },
        |f| matches!(f, HeaderFault::Hole { .. }),
        "leave a hole",
    );
}

#[test]
fn header_whose_offsets_disagree_with_the_shape_names_the_tensor() {
    assert_header_lie_named(
        |entries, h| {
            let t = &entries[3];
            let shape = h[&t.0]["shape"].as_array().expect("shape").clone();
            let mut wider: Vec<u64> = shape.iter().map(|d| d.as_u64().expect("dim")).collect();
            *wider.last_mut().expect("rank >= 1") += 1;
            h[&t.0]["shape"] = serde_json::json!(wider);
            t.0.clone()
        },
        |f| matches!(f, HeaderFault::LengthMismatch { .. }),
        "the header lies",
    );
}

#[test]
fn git_lfs_pointer_in_place_of_weights_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");

    // The single-file case.
    let src = small(dir.path(), SynthSpec::small());
    std::fs::write(src.join("model.safetensors"), LFS_POINTER).expect("write pointer");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::LfsPointer { path } if path.ends_with("model.safetensors")),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("Git LFS pointer"),
        "{msg}"
    );
    assert!(msg.contains("git lfs pull"), "says how to fix it: {msg}");
    assert_nothing_published(&out);

    // One shard of a sharded checkpoint.
    let dir2 = tempfile::tempdir().expect("tempdir");
    let src = sharded(dir2.path());
    std::fs::write(src.join(SHARD_2), LFS_POINTER).expect("write pointer");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::LfsPointer { path } if path.ends_with(SHARD_2)),
        "{err:?}"
    );
    assert_nothing_published(&out);

    // The index itself.
    std::fs::write(src.join("model.safetensors.index.json"), LFS_POINTER).expect("write");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::LfsPointer { path }
            if path.ends_with("model.safetensors.index.json")),
        "{err:?}"
    );
    assert_nothing_published(&out);
}

#[test]
fn source_that_is_not_a_directory_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let file = dir.path().join("model.safetensors");
    std::fs::write(&file, b"x").expect("write");
    let missing = dir.path().join("does-not-exist");
    let err = convert_err(&missing, &out);
    assert!(
        matches!(&err, ConvertError::Usage(m) if m.contains("no such file or directory")),
        "a missing source is a usage error (exit 2): {err:?}"
    );
    assert_nothing_published(&out);
    let src = file;
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::BadSource { path, fault: SourceFault::NotADirectory } if *path == src),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&*src.to_string_lossy()) && msg.contains("not a directory"),
        "{msg}"
    );
    assert_nothing_published(&out);
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    let err = convert_err(&empty, &out);
    assert!(
        matches!(
            err,
            ConvertError::BadSource {
                fault: SourceFault::NoWeights,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("no *.safetensors"), "{err}");
}

#[test]
fn header_that_is_not_json_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let src = dir.path().join("src");
    std::fs::create_dir(&src).expect("mkdir");
    type Is = fn(&HeaderFault) -> bool;
    let cases: [(&[u8], &str, Is); 3] = [
        (b"this is no json!", "not a JSON object", |f| {
            *f == HeaderFault::NotAnObject
        }),
        (b"{\"a\": [1, 2}   ", "not valid JSON", |f| {
            matches!(f, HeaderFault::NotJson { .. })
        }),
        (b"{\"\xff\xfe\": 1}   ", "not UTF-8", |f| {
            matches!(f, HeaderFault::NotUtf8(_))
        }),
    ];
    for (header, words, expected) in cases {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header);
        std::fs::write(src.join("model.safetensors"), &bytes).expect("write");
        assert!(SafeTensors::deserialize(&bytes).is_err());
        let err = convert_err(&src, &out);
        assert!(
            matches!(&err, ConvertError::BadShard { path, fault } if path.ends_with("model.safetensors") && expected(fault)),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("model.safetensors") && msg.contains(words),
            "{msg}"
        );
        assert_nothing_published(&out);
    }
}

#[test]
fn layer_missing_an_expert_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("src");
    common::write_mixtral_style(&src, 2, 4);
    // Rebuild shard 2 without expert 2 of layer 1: a grid with a gap.
    let shard = src.join("model-00002-of-00002.safetensors");
    let bytes = std::fs::read(&shard).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("valid");
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| !n.starts_with("model.layers.1.block_sparse_moe.experts.2."))
        .collect();
    assert!(kept.len() < st.len(), "expert 2 of layer 1 is in shard 2");
    let dropped: Vec<String> = st
        .names()
        .into_iter()
        .filter(|n| n.starts_with("model.layers.1.block_sparse_moe.experts.2."))
        .map(str::to_string)
        .collect();
    safetensors::serialize_to_file(kept, None, &shard).expect("rewrite shard");
    let index_path = src.join("model.safetensors.index.json");
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).expect("read")).expect("json");
    for n in &dropped {
        index["weight_map"].as_object_mut().expect("map").remove(n);
    }
    std::fs::write(&index_path, serde_json::to_vec(&index).expect("json")).expect("write");

    let out = dir.path().join("out");
    let err = convert_err(&src, &out);
    assert!(
        matches!(
            &err,
            ConvertError::BadExperts {
                layer: 1,
                fault: ExpertFault::Missing { expert: 2, .. }
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("expert 2 is missing"), "{err}");
    assert_nothing_published(&out);
}

#[test]
fn full_disk_stops_before_the_layer_that_does_not_fit_and_says_nothing_was_written() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Trunk ~0.5 MiB, each layer ~8 MiB; the converter keeps 16 MiB free beyond each file, so
    // on a 20 MiB disk the trunk fits and layer 0 does not.
    let src = small(
        dir.path(),
        SynthSpec {
            layers: 2,
            experts: 8,
            hidden: 512,
            inter: 256,
            vocab: 256,
            ..SynthSpec::small()
        },
    );
    let Some(disk) = tarfa_testtools::Tmpfs::mount(&dir.path().join("disk"), "20m") else {
        return;
    };
    let out = disk.path().join("out");
    let err = convert_err(&src, &out);
    assert!(
        matches!(&err, ConvertError::NoSpace { what, needed, available, .. }
            if what == "layer-00000.jnf" && needed > available),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("layer-00000.jnf") && msg.contains("nothing of it was written"),
        "{msg}"
    );
    assert!(
        msg.contains(&*out.to_string_lossy()),
        "names the directory: {msg}"
    );
    assert_eq!(
        published_outputs(&out),
        [TRUNK_NAME],
        "the trunk is complete; no layer file, no manifest"
    );
    assert!(temp_files(&out).is_empty(), "{:?}", temp_files(&out));
    tarfa_format::JnfReader::open(out.join(TRUNK_NAME))
        .expect("trunk")
        .verify_data()
        .expect("the trunk that was written is whole");
}

#[test]
fn the_no_space_message_explains_the_margin_it_adds() {
    let e = ConvertError::NoSpace {
        dir: "out".into(),
        what: "layer-00000.jnf".into(),
        needed: 3 + 5 + (16 << 20),
        file: 3,
        held: 5,
        margin: 16 << 20,
        available: 7,
    };
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("needs {} bytes (3 for the file at most, 5 promised to files being written beside it, and {} kept free", 8 + (16 << 20), 16 << 20)),
        "{msg}"
    );
}

/// Truncates a source shard to its header once the conversion has planned (after every header
/// was read and checked): the tensors' bytes are then unreadable while their JNF files are written.
struct TruncateAtStart {
    shard: PathBuf,
    keep: u64,
}

impl tarfa_converter::Progress for TruncateAtStart {
    fn start(&self, _bytes: u64, _files: usize) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.shard)
            .expect("open shard");
        f.set_len(self.keep).expect("truncate shard");
    }
}

#[test]
fn a_source_unreadable_while_converting_is_named_as_the_source_not_the_jnf_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = small(tmp.path(), SynthSpec::small());
    let shard = src.join("model.safetensors");
    let header = 8 + u64::from_le_bytes(
        std::fs::read(&shard).expect("read shard")[..8]
            .try_into()
            .expect("8 bytes"),
    );
    let out = tmp.path().join("out");
    let progress = TruncateAtStart {
        shard: shard.clone(),
        keep: header,
    };
    let err = tarfa_converter::convert(&src, &out, &tarfa_converter::Options::default(), &progress)
        .expect_err("the source's bytes are gone");
    assert!(
        matches!(&err, ConvertError::SourceRead { path, .. } if path == &shard),
        "not the source's fault: {err:?}"
    );
    let text = err.to_string();
    assert!(text.starts_with(&shard.display().to_string()), "{text}");
    assert!(!text.contains(".jnf"), "names a JNF file: {text}");
    assert_nothing_published(&out);
}

#[test]
fn a_checkpoint_without_tensors_or_without_layers_is_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = small(tmp.path(), SynthSpec::small());
    let shard = src.join("model.safetensors");
    // The same shard with no tensors, then with only a trunk tensor.
    let bytes = std::fs::read(&shard).expect("read shard");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let write = |entries: serde_json::Map<String, serde_json::Value>, data: &[u8]| {
        let mut h = serde_json::to_vec(&entries).expect("json");
        h.resize(h.len().div_ceil(8) * 8, b' ');
        let mut f = (h.len() as u64).to_le_bytes().to_vec();
        f.extend_from_slice(&h);
        f.extend_from_slice(data);
        std::fs::write(&shard, f).expect("write shard");
    };
    write(serde_json::Map::new(), &[]);
    let err = convert_err(&src, &tmp.path().join("out1"));
    assert!(
        matches!(
            &err,
            ConvertError::BadSource {
                fault: SourceFault::NoTensors,
                ..
            }
        ),
        "{err:?}"
    );
    assert_nothing_published(&tmp.path().join("out1"));
    let (name, entry) = header
        .iter()
        .find(|(k, _)| k.as_str() == "model.embed_tokens.weight")
        .expect("an embedding");
    let range = entry["data_offsets"].as_array().expect("offsets");
    let (a, b) = (
        range[0].as_u64().expect("u64") as usize,
        range[1].as_u64().expect("u64") as usize,
    );
    let mut only = serde_json::Map::new();
    let mut e = entry.clone();
    e["data_offsets"] = serde_json::json!([0, b - a]);
    only.insert(name.clone(), e);
    write(only, &bytes[8 + n + a..8 + n + b]);
    let err = convert_err(&src, &tmp.path().join("out2"));
    assert!(
        matches!(
            &err,
            ConvertError::BadSource {
                fault: SourceFault::NoLayers,
                ..
            }
        ),
        "{err:?}"
    );
    assert_nothing_published(&tmp.path().join("out2"));
}
