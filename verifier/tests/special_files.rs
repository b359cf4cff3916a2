//! Review findings 6 and 7: a FIFO or a link to `/dev/zero` wherever verify reads a file — the
//! manifest, a layer file, the trunk, an aux file, a source shard — is a fault naming that file,
//! found at once, instead of a verification that blocks or spins forever.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_verifier::{verify, Options, Quiet, Report};

/// Run `f`, failing the test if it has not returned within 20 s.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what}: still blocked after 20 s"))
}

fn replace_with_fifo(path: &Path) {
    std::fs::remove_file(path).expect("remove");
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "mkfifo {}", path.display());
}

fn replace_with_dev_zero(path: &Path) {
    std::fs::remove_file(path).expect("remove");
    std::os::unix::fs::symlink("/dev/zero", path).expect("symlink");
}

/// A converted two-shard checkpoint with a tokenizer: (tempdir, src, out).
fn converted() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    let spec = SynthSpec {
        shards: 2,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    std::fs::write(src.join("tokenizer.json"), b"{\"model\": {}}").expect("tokenizer");
    convert(&src, &out, &ConvertOptions::default(), &ConvertQuiet).expect("convert");
    (tmp, src, out)
}

fn verify_in_time(out: PathBuf, src: PathBuf) -> Report {
    within(&format!("verify {}", out.display()), move || {
        let opts = Options {
            source: Some(src),
            direct_io: true,
            ..Options::default()
        };
        verify(&out, &opts, &Quiet).expect("verification runs")
    })
}

fn assert_fault_names(r: &Report, file: &str) {
    assert!(
        r.faults
            .iter()
            .any(|f| f.file == file && f.detail.contains("not a regular file")),
        "no fault naming {file} as not a regular file: {:#?}",
        r.faults
    );
}

#[test]
fn a_fifo_or_device_in_the_model_directory_is_a_fault_naming_it() {
    for name in [
        "manifest.json",
        "layer-00000.jnf",
        "trunk.jnf",
        "config.json",
        "tokenizer.json",
    ] {
        for replace in [replace_with_fifo, replace_with_dev_zero] {
            let (_tmp, src, out) = converted();
            replace(&out.join(name));
            let r = verify_in_time(out, src);
            assert_fault_names(&r, name);
        }
    }
}

#[test]
fn a_fifo_or_device_as_a_source_shard_is_a_fault_naming_it() {
    for replace in [replace_with_fifo, replace_with_dev_zero] {
        let (_tmp, src, out) = converted();
        let shard = "model-00002-of-00002.safetensors";
        replace(&src.join(shard));
        let r = verify_in_time(out, src);
        assert!(!r.faults.is_empty());
        assert!(
            r.faults
                .iter()
                .any(|f| f.detail.contains("not a regular file")
                    || f.actual
                        .as_deref()
                        .is_some_and(|a| a.contains("not a regular file"))),
            "{:#?}",
            r.faults
        );
    }
}
