//! Convert writes only into an empty directory or its own earlier output of this source, and
//! touches no file it did not write: a directory holding anything else is refused, naming the
//! file, with nothing created, changed or removed; a rerun into its own output still resumes.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{ConvertError, ForeignFile, OutputFault};
use tarfa_format::manifest::layer_file_name;

use common::run;

/// The id of a process that has exited (reaped): no running process has it (until the id is
/// reused, which takes a full turn of the pid space).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let pid = child.id();
    child.wait().expect("reap");
    pid
}

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
    let layer = std::fs::read(out.join(layer_file_name(1))).expect("read layer");
    std::fs::write(
        out.join(format!(".layer-00001.jnf.tmp-{}", dead_pid())),
        &layer[..4096],
    )
    .expect("plant");
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

/// Review finding 3: a temporary file `.NAME.tmp-PID` is removed only when a killed conversion
/// left it — PID no running process and the content what tarfa writes under NAME. Another
/// program's `.config.json.tmp-PID` survives a rerun, even with bytes tarfa might have written,
/// and the refusal names it; one of a dead process with other bytes is refused too.
#[test]
fn a_temporary_file_of_a_running_process_or_with_foreign_bytes_survives_a_rerun() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(root.path());
    let out = root.path().join("out");
    run(&src, &out, None).expect("first run");
    let config = std::fs::read(src.join("config.json")).expect("read config");
    // The test runner's parent (cargo, or a shell) runs for as long as this test does.
    let live = std::os::unix::process::parent_id();
    let dead = dead_pid();

    let cases = [
        (live, config.clone(), ForeignFile::LiveWriter { pid: live }),
        (
            dead,
            br#"{"editor": "unsaved"}"#.to_vec(),
            ForeignFile::NotOurTemp,
        ),
    ];
    for (pid, bytes, why) in cases {
        let temp = out.join(format!(".config.json.tmp-{pid}"));
        std::fs::write(&temp, &bytes).expect("plant");
        let before = tree(&out);
        let err = run(&src, &out, None).expect_err("a foreign temporary file");
        assert!(
            matches!(&err, ConvertError::BadOutput { path, fault: OutputFault::Foreign { why: w } }
                if path == &temp && *w == why),
            "{pid}: {err}"
        );
        assert!(
            err.to_string().contains(&format!(".config.json.tmp-{pid}")),
            "{err}"
        );
        assert!(
            tree(&out) == before,
            "{pid}: the refused rerun changed the directory"
        );
        std::fs::remove_file(&temp).expect("clean up");
    }

    // A dead process's partial copy of the source's config.json is a killed run's: removed.
    let temp = out.join(format!(".config.json.tmp-{dead}"));
    std::fs::write(&temp, &config[..config.len() / 2]).expect("plant");
    run(&src, &out, None).expect("rerun");
    assert!(!temp.exists(), "a killed run's leftover stays");
}

/// A running conversion's temporary file, in a directory whose lock another conversion holds, is
/// reported as the directory being in use ("another tarfa convert is writing"), not as a foreign
/// file; nothing is touched. Once the lock is free, the same file is a live writer's, named.
#[test]
fn a_live_writers_temporary_file_under_a_held_lock_says_another_conversion_is_writing() {
    let root = tempfile::tempdir().expect("tempdir");
    let src = checkpoint(root.path());
    let out = root.path().join("out");
    run(&src, &out, None).expect("first run");
    // The test runner's parent runs for as long as this test does: a live writer's PID.
    let live = std::os::unix::process::parent_id();
    let temp = out.join(format!(".config.json.tmp-{live}"));
    std::fs::write(&temp, b"").expect("plant");
    // Another conversion's lock: an exclusive flock on its own open file description.
    let lock = std::fs::File::open(out.join(tarfa_format::manifest::CONVERT_LOCK_NAME))
        .expect("the first run's lock file");
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .expect("take the lock");
    let before = tree(&out);
    let err = run(&src, &out, None).expect_err("a directory in use");
    assert!(
        matches!(&err, ConvertError::BadOutput { path, fault: OutputFault::Locked } if path == &out),
        "{err}"
    );
    assert!(
        err.to_string().contains("another tarfa convert is writing"),
        "{err}"
    );
    assert!(
        tree(&out) == before,
        "the refused run changed the directory"
    );
    drop(lock);
    let err = run(&src, &out, None).expect_err("a live writer's file");
    assert!(
        matches!(&err, ConvertError::BadOutput { fault: OutputFault::Foreign { why }, .. }
            if *why == ForeignFile::LiveWriter { pid: live }),
        "{err}"
    );
    assert!(temp.exists(), "a live writer's file was removed");
}
