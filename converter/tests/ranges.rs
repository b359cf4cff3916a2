//! Layer ranges and resumption: converting in pieces gives the bytes of one run, a rerun writes
//! nothing, a damaged layer file is found and rewritten, and ranges or directories that make no
//! sense are refused with their own error.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{ConvertError, OutputFault};
use tarfa_format::layout::{align_up, FOOTER_LEN};
use tarfa_format::manifest::{layer_file_name, Manifest, MANIFEST_NAME, TRUNK_NAME};
use tarfa_format::JnfReader;

use common::{assert_same_files, published_outputs, run, snapshot};

/// Four transformer layers plus an MTP layer (layer 4), sharded in two: ranges cross a shard
/// boundary and include the MTP layer.
fn spec() -> SynthSpec {
    SynthSpec {
        layers: 4,
        shards: 2,
        mtp: true,
        ..SynthSpec::small()
    }
}

fn checkpoint(root: &Path) -> std::path::PathBuf {
    let src = root.join("src");
    write_checkpoint(&src, &spec()).expect("write checkpoint");
    src
}

/// Flip one byte inside the data of `region` of a JNF file.
fn flip_byte_in_region(path: &Path, region: &str) {
    let at = {
        let r = JnfReader::open(path).expect("open");
        let i = r.region_by_name(region).expect("region");
        let rec = &r.regions()[i as usize];
        rec.offset + rec.length / 2
    };
    let mut bytes = std::fs::read(path).expect("read");
    bytes[at as usize] ^= 0x40;
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn layers_0_1_then_2_n_give_the_bytes_of_one_full_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let last = spec().total_layers() - 1;

    let full = dir.path().join("full");
    run(&src, &full, None).expect("full run");

    let pieces = dir.path().join("pieces");
    let first = run(&src, &pieces, Some((0, 1))).expect("--layers 0-1");
    assert_eq!(first.layers_written, vec![0, 1]);
    assert!(first.trunk_written);
    let m = Manifest::load(&pieces).expect("manifest after the first piece");
    assert_eq!(
        m.layers,
        vec![0, 1],
        "the manifest lists only what is present"
    );
    let second = run(&src, &pieces, Some((2, last))).expect("--layers 2-N");
    assert_eq!(second.layers_written, (2..=last).collect::<Vec<_>>());
    assert!(
        !second.trunk_written,
        "the trunk of the first piece is kept"
    );
    assert_eq!(second.layers_present, (0..=last).collect::<Vec<_>>());

    assert_same_files(&snapshot(&pieces), &snapshot(&full), "0-1 then 2-N vs 0-N");
    assert!(snapshot(&full).contains_key(MANIFEST_NAME));
}

#[test]
fn rerun_of_a_full_conversion_writes_no_file_and_leaves_every_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    let first = run(&src, &out, None).expect("first run");
    let before = snapshot(&out);
    let inode = |name: &str| std::fs::metadata(out.join(name)).expect("stat").ino();
    let inodes: Vec<(String, u64)> = before
        .keys()
        .filter(|n| n.as_str() != MANIFEST_NAME)
        .map(|n| (n.clone(), inode(n)))
        .collect();

    let again = run(&src, &out, None).expect("rerun");
    assert!(
        again.layers_written.is_empty(),
        "{:?}",
        again.layers_written
    );
    assert_eq!(again.layers_skipped, first.layers_written);
    assert!(!again.trunk_written);
    assert_eq!(again.bytes_written, 0);
    assert_eq!(again.experts_written, 0);
    assert_same_files(&snapshot(&out), &before, "after a rerun");
    // Published files are replaced by rename, so an unchanged inode means not rewritten.
    for (name, ino) in inodes {
        assert_eq!(inode(&name), ino, "{name} was rewritten");
    }
}

#[test]
fn layer_file_corrupted_on_disk_is_found_on_rerun_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    run(&src, &out, None).expect("first run");
    let clean = snapshot(&out);

    // One flipped byte in an expert's data: the index still matches, only the hash can tell.
    let layer1 = out.join(layer_file_name(1));
    flip_byte_in_region(&layer1, "model.layers.1.mlp.experts.2.up_proj.weight");
    let found = JnfReader::open(&layer1).expect("still opens").verify_data();
    assert!(
        matches!(
            found.as_ref().map_err(|e| e.violation()),
            Err(Some(tarfa_format::Violation::RegionHashMismatch { .. }))
        ),
        "{found:?}"
    );

    let again = run(&src, &out, None).expect("rerun");
    assert_eq!(again.layers_written, vec![1]);
    assert_eq!(again.layers_skipped, vec![0, 2, 3, 4]);
    assert!(!again.trunk_written);
    assert_same_files(&snapshot(&out), &clean, "after repairing layer 1");
}

/// Make one byte of the zero padding after the first region that has some (after the index,
/// with `after_index`) of a JNF file non-zero.
fn dirty_padding(path: &Path, after_index: bool) {
    let at = {
        let r = JnfReader::open(path).expect("open");
        if after_index {
            let f = r.footer();
            let end = f.index_offset + f.index_len;
            assert!(
                end < f.file_len - FOOTER_LEN as u64,
                "no padding after the index"
            );
            end
        } else {
            r.regions()
                .iter()
                .map(|rec| rec.end())
                .find(|&end| align_up(end).expect("aligned") > end)
                .expect("a region with padding")
        }
    };
    let mut bytes = std::fs::read(path).expect("read");
    bytes[at as usize] = 0x01;
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn nonzero_padding_on_disk_is_found_on_rerun_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    run(&src, &out, None).expect("first run");
    let clean = snapshot(&out);

    // The index and every hash still match: only the padding check can tell.
    dirty_padding(&out.join(layer_file_name(2)), false);
    dirty_padding(&out.join(layer_file_name(3)), true);
    for l in [2, 3] {
        let found = JnfReader::open(out.join(layer_file_name(l)))
            .expect("still opens")
            .verify_data();
        assert!(
            matches!(
                found.as_ref().map_err(|e| e.violation()),
                Err(Some(tarfa_format::Violation::NonZeroPadding { .. }))
            ),
            "layer {l}: {found:?}"
        );
    }

    let again = run(&src, &out, None).expect("rerun");
    assert_eq!(again.layers_written, vec![2, 3]);
    assert_eq!(again.layers_replaced, vec![2, 3]);
    assert_eq!(again.layers_skipped, vec![0, 1, 4]);
    assert!(!again.trunk_written);
    assert_same_files(&snapshot(&out), &clean, "after repairing layers 2 and 3");
}

#[test]
fn trunk_corrupted_on_disk_is_found_on_rerun_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    run(&src, &out, None).expect("first run");
    let clean = snapshot(&out);

    flip_byte_in_region(&out.join(TRUNK_NAME), "lm_head.weight");
    let again = run(&src, &out, Some((3, 3))).expect("rerun of one layer");
    assert!(
        again.trunk_written,
        "a damaged trunk is rewritten by any range"
    );
    assert!(again.layers_written.is_empty());
    assert_same_files(&snapshot(&out), &clean, "after repairing the trunk");
}

#[test]
fn truncated_layer_file_is_found_on_rerun_and_rewritten() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    run(&src, &out, None).expect("first run");
    let clean = snapshot(&out);

    let layer2 = out.join(layer_file_name(2));
    let len = std::fs::metadata(&layer2).expect("stat").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&layer2)
        .expect("open")
        .set_len(len - 4096)
        .expect("truncate");
    let again = run(&src, &out, None).expect("rerun");
    assert_eq!(again.layers_written, vec![2]);
    assert_same_files(&snapshot(&out), &clean, "after repairing layer 2");
}

#[test]
fn range_that_selects_no_layer_is_a_usage_error_and_publishes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    let err = run(&src, &out, Some((7, 9))).expect_err("layers 7-9 of a 5-layer model");
    let msg = err.to_string();
    assert!(matches!(err, ConvertError::Usage(_)), "{err:?}");
    assert!(
        msg.contains("7-9") && msg.contains("selects no layer"),
        "{msg}"
    );
    assert!(
        msg.contains("[0, 1, 2, 3, 4]"),
        "names the layers there are: {msg}"
    );
    assert!(
        published_outputs(&out).is_empty(),
        "{:?}",
        published_outputs(&out)
    );

    let err = tarfa_converter::parse_layer_range("5-2").expect_err("reversed range");
    assert!(matches!(err, ConvertError::Usage(_)), "{err:?}");
    assert!(err.to_string().contains("5 > 2"), "{err}");
    let err = tarfa_converter::parse_layer_range("a-2").expect_err("not a number");
    assert!(matches!(err, ConvertError::Usage(_)), "{err:?}");
}

#[test]
fn converting_into_the_source_directory_is_refused_and_the_source_is_untouched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let before = snapshot(&src);
    // The same directory under another spelling must be recognised too.
    for out in [src.clone(), src.join("."), dir.path().join("./src")] {
        let err = run(&src, &out, None).expect_err("output = source");
        assert!(
            matches!(
                err,
                ConvertError::BadOutput {
                    fault: OutputFault::IsSourceDir,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("source directory"), "{err}");
        assert_same_files(&snapshot(&src), &before, "the source after a refusal");
    }
}

#[test]
fn output_holding_another_checkpoint_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let out = dir.path().join("out");
    run(&src, &out, None).expect("first conversion");
    let before = snapshot(&out);
    let other = dir.path().join("other");
    write_checkpoint(
        &other,
        &SynthSpec {
            fused: true,
            ..spec()
        },
    )
    .expect("write other checkpoint");
    let err = run(&other, &out, None).expect_err("another checkpoint into the same directory");
    assert!(
        matches!(
            err,
            ConvertError::BadOutput {
                fault: OutputFault::OtherCheckpoint,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("another checkpoint"), "{err}");
    assert_same_files(
        &snapshot(&out),
        &before,
        "the first conversion after a refusal",
    );
}

#[test]
fn any_number_of_parallel_jobs_writes_the_same_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(dir.path());
    let mut snapshots = Vec::new();
    for jobs in [1, 2, 5] {
        let out = dir.path().join(format!("jobs{jobs}"));
        let opts = tarfa_converter::Options {
            jobs,
            ..tarfa_converter::Options::default()
        };
        let s =
            tarfa_converter::convert(&src, &out, &opts, &tarfa_converter::Quiet).expect("convert");
        assert_eq!(
            s.layers_written,
            (0..spec().total_layers()).collect::<Vec<_>>()
        );
        snapshots.push(snapshot(&out));
    }
    assert_same_files(&snapshots[1], &snapshots[0], "2 jobs vs 1");
    assert_same_files(&snapshots[2], &snapshots[0], "5 jobs vs 1");
}
