//! Convert writes only into an empty directory or its own earlier output of this source, and
//! touches no file it did not write: a directory holding anything else is refused, naming the
//! file, with nothing created, changed or removed; a rerun into its own output still resumes.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{ConvertError, OutputFault};
use tarfa_format::manifest::layer_file_name;

use common::run;

fn checkpoint(root: &Path) -> PathBuf {
    let src = root.join("src");
    write_checkpoint(
        &src,
        &SynthSpec {
            layers: 2,
            ..SynthSpec::small()
        },
    )
    .expect("write checkpoint");
    src
}

/// Every entry under `dir`, recursively, links not followed: bytes, link target or `<dir>`.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("ls").flatten() {
        let p = e.path();
        let t = e.file_type().expect("file type");
        if t.is_symlink() {
            let target = std::fs::read_link(&p).expect("readlink");
            out.insert(p, target.into_os_string().into_encoded_bytes());
        } else if t.is_dir() {
            out.insert(p.clone(), b"<dir>".to_vec());
            out.extend(tree(&p));
        } else {
            out.insert(p.clone(), std::fs::read(&p).expect("read"));
        }
    }
    out
}

#[test]
fn a_directory_holding_anything_tarfa_did_not_write_is_refused_naming_it_and_left_untouched() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(root.path());
    let other = root.path().join("other");
    run(&src, &other, None).expect("a conversion to take a JNF file from");
    let jnf = std::fs::read(other.join(layer_file_name(0))).expect("read layer");

    type Plant = Box<dyn Fn(&Path)>;
    let write = |name: &'static str, bytes: Vec<u8>| -> Plant {
        Box::new(move |d: &Path| std::fs::write(d.join(name), &bytes).expect("plant"))
    };
    let src_config = src.join("config.json");
    let cases: Vec<(&str, Plant)> = vec![
        ("notes.txt", write("notes.txt", b"mine".to_vec())),
        (
            "manifest.json",
            write("manifest.json", br#"{"name": "someone else's"}"#.to_vec()),
        ),
        (
            "config.json",
            write("config.json", br#"{"foreign": true}"#.to_vec()),
        ),
        (
            ".notes.txt.tmp-123",
            write(".notes.txt.tmp-123", b"another tool's temp".to_vec()),
        ),
        (".hidden", write(".hidden", b"x".to_vec())),
        (
            "layer-00000.jnf",
            write("layer-00000.jnf", b"text".to_vec()),
        ),
        ("layer-00099.jnf", write("layer-00099.jnf", jnf.clone())),
        (
            "sub",
            Box::new(|d: &Path| {
                std::fs::create_dir(d.join("sub")).expect("mkdir");
                std::fs::write(d.join("sub/x"), b"x").expect("write");
            }),
        ),
        (
            // The right bytes, but a link: tarfa never wrote a link.
            "config.json",
            Box::new(move |d: &Path| {
                std::os::unix::fs::symlink(&src_config, d.join("config.json")).expect("symlink")
            }),
        ),
    ];
    for (i, (name, plant)) in cases.iter().enumerate() {
        let out = root.path().join(format!("out{i}"));
        std::fs::create_dir(&out).expect("mkdir");
        plant(&out);
        let before = tree(&out);
        let err = run(&src, &out, None).expect_err(name);
        assert!(
            matches!(
                err,
                ConvertError::BadOutput {
                    fault: OutputFault::Foreign { .. },
                    ..
                }
            ),
            "{name}: {err}"
        );
        assert!(
            matches!(&err, ConvertError::BadOutput { path, .. } if path == &out.join(name)),
            "{name}: the error must name the file: {err}"
        );
        assert!(err.to_string().contains("touches no other file"), "{err}");
        assert!(
            tree(&out) == before,
            "{name}: the directory was changed by a refused conversion"
        );
    }
}

#[test]
fn a_rerun_into_its_own_output_resumes_and_removes_only_its_own_leftovers() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(root.path());
    let out = root.path().join("out");
    run(&src, &out, None).expect("first run");
    let first = tree(&out);

    // A killed run's temporary file is tarfa's own: removed, and the rerun writes nothing.
    std::fs::write(out.join(".layer-00001.jnf.tmp-999999"), b"partial").expect("plant");
    let s = run(&src, &out, None).expect("rerun");
    assert!(s.layers_written.is_empty() && !s.trunk_written, "{s:?}");
    assert!(tree(&out) == first, "the rerun changed its own output");

    // An aux file the source changed since: the old copy is the one the manifest lists, so it
    // is tarfa's own and is refreshed.
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("read"))
            .expect("json");
    config["note"] = "edited".into();
    let edited = serde_json::to_vec_pretty(&config).expect("json");
    std::fs::write(src.join("config.json"), &edited).expect("write");
    run(&src, &out, None).expect("rerun after a config edit");
    assert_eq!(
        std::fs::read(out.join("config.json")).expect("read"),
        edited
    );

    // An aux copy the manifest does not list, with other bytes than the source's: not ours.
    std::fs::write(out.join("config.json"), b"{}").expect("write");
    let err = run(&src, &out, None).expect_err("a foreign config.json");
    assert!(err.to_string().contains("config.json"), "{err}");
    assert_eq!(std::fs::read(out.join("config.json")).expect("read"), b"{}");
}
