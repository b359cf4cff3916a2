//! `-o` never replaces the source: an output that is, or links to, any file of the source
//! checkpoint (the part given, a sibling part of the split set, a safetensors shard, the index,
//! config.json) is refused before anything is written, and every source byte is left as it was.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::write_glm;
use tarfa_fetch::{FetchError, FetchOptions, Fetcher, Selection, Silent};

fn mtp() -> FetchOptions {
    FetchOptions {
        selection: Selection {
            mtp: true,
            globs: Vec::new(),
        },
        ..FetchOptions::default()
    }
}

/// Every file under `dir` (links not followed) with its bytes or link target.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("ls").flatten() {
        let p = e.path();
        let meta = std::fs::symlink_metadata(&p).expect("lstat");
        let v = if meta.file_type().is_symlink() {
            std::fs::read_link(&p)
                .expect("readlink")
                .into_os_string()
                .into_encoded_bytes()
        } else {
            std::fs::read(&p).expect("read")
        };
        out.insert(p, v);
    }
    out
}

fn assert_refused(source: &Path, out: &Path, input: &Path, dirs: &[&Path]) {
    let before: Vec<_> = dirs.iter().map(|d| snapshot(d)).collect();
    let f = Fetcher::new(mtp());
    let plan = f.plan(&source.display().to_string()).expect("plan");
    let e = f
        .fetch(&plan, out, &Silent)
        .expect_err("an output that is an input must be refused");
    match &e {
        FetchError::OutputIsInput { input: named, .. } => assert_eq!(
            std::fs::canonicalize(named).ok(),
            std::fs::canonicalize(input).ok(),
            "{e}"
        ),
        other => panic!("-o {}: expected OutputIsInput, got {other}", out.display()),
    }
    assert!(e.to_string().contains("never writes over its input"), "{e}");
    let after: Vec<_> = dirs.iter().map(|d| snapshot(d)).collect();
    assert!(
        before == after,
        "-o {}: a file was written or changed",
        out.display()
    );
}

#[test]
fn an_output_that_is_a_gguf_part_or_links_to_one_is_refused_and_nothing_is_touched() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let dirs = [root.path(), elsewhere.path()];
    let p = &model.parts;
    // The part given, the part holding the MTP blocks, and a part that holds none of them.
    for (source, out) in [(&p[0], &p[0]), (&p[0], &p[2]), (&p[2], &p[1])] {
        assert_refused(source, out, out, &dirs);
    }
    // The same file under another spelling, through a symlink and through a hard link.
    let dotted = root.path().join(".").join(p[2].file_name().expect("name"));
    assert_refused(&p[0], &dotted, &p[2], &dirs);
    let link = elsewhere.path().join("draft.gguf");
    std::os::unix::fs::symlink(&p[1], &link).expect("symlink");
    assert_refused(&p[0], &link, &p[1], &dirs);
    let hard = elsewhere.path().join("hard.gguf");
    std::fs::hard_link(&p[2], &hard).expect("hard link");
    assert_refused(&p[0], &hard, &p[2], &dirs);
    // An output whose partial file would be a part.
    let stem = elsewhere.path().join("x.gguf");
    std::os::unix::fs::symlink(&p[0], elsewhere.path().join("x.gguf.tarfa-partial"))
        .expect("symlink");
    assert_refused(&p[0], &stem, &p[0], &dirs);

    // A new path beside the parts is fine.
    let ok = root.path().join("draft.gguf");
    let f = Fetcher::new(mtp());
    let plan = f.plan(&p[0].display().to_string()).expect("plan");
    f.fetch(&plan, &ok, &Silent)
        .expect("fetch beside the source");
}

#[test]
fn an_output_that_is_any_file_of_a_safetensors_checkpoint_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path();
    let mut weight_map = serde_json::Map::new();
    for (i, name) in ["model.layers.0.w", "model.layers.1.w"].iter().enumerate() {
        let shard = format!("model-{:05}-of-00002.safetensors", i + 1);
        let (mut bytes, _, _) = tarfa_fetch::safetensors::write_header(
            &[(name.to_string(), "F32".into(), vec![4], 16)],
            None,
            "shard",
        )
        .expect("header");
        bytes.extend_from_slice(&[i as u8; 16]);
        std::fs::write(dir.join(&shard), bytes).expect("write shard");
        weight_map.insert(name.to_string(), shard.into());
    }
    let index = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    std::fs::write(dir.join("config.json"), r#"{"num_hidden_layers": 1}"#).expect("config");
    // The MTP layer (model.layers.1.*) is in the second shard; the first is read by no one.
    for (source, out) in [
        (
            dir.to_path_buf(),
            dir.join("model-00001-of-00002.safetensors"),
        ),
        (
            dir.to_path_buf(),
            dir.join("model-00002-of-00002.safetensors"),
        ),
        (
            dir.join("model-00002-of-00002.safetensors"),
            dir.join("model.safetensors.index.json"),
        ),
        (dir.to_path_buf(), dir.join("config.json")),
    ] {
        assert_refused(&source, &out, &out, &[dir]);
    }
}
