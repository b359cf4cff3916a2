//! The fio driver against the real fio: a figure for files it can read (a ':' in a name
//! included), fio's own message for one it cannot. Where fio is not installed they skip, saying so,
//! or fail where tools are required (`tarfa_testtools`).

use std::path::PathBuf;

use tarfa_benchkit::fio::{randread_gb_per_s, FioError};

/// A fresh directory under the target directory (a disk filesystem, not tmpfs: fio reads with
/// `O_DIRECT`).
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("benchkit-fio-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch directory");
    dir
}

#[test]
fn fio_reads_every_file_given_even_with_a_colon_in_its_name() {
    if !tarfa_testtools::fio() {
        return;
    }
    let dir = scratch("read");
    let files: Vec<PathBuf> = ["layer-0.jnf", "layer:1.jnf"]
        .iter()
        .map(|n| {
            let p = dir.join(n);
            std::fs::write(&p, vec![7u8; 1 << 20]).expect("write file");
            p
        })
        .collect();
    let gbps = randread_gb_per_s(&files, 64 << 10, 4, 2 << 20, None).expect("fio runs");
    assert!(gbps.is_finite() && gbps > 0.0, "{gbps} GB/s");
}

#[test]
fn a_file_fio_cannot_read_is_an_error_with_fios_message() {
    if !tarfa_testtools::fio() {
        return;
    }
    let dir = scratch("missing");
    let err = randread_gb_per_s(&[dir.join("absent.jnf")], 4096, 1, 1 << 20, None)
        .expect_err("no such file");
    assert!(
        matches!(&err, FioError::Failed(msg) if !msg.is_empty()),
        "{err:?}"
    );
}
