//! `O_DIRECT` is used, not only asked for (review finding 19): where the output's filesystem
//! takes `O_DIRECT`, convert's summary and verify's report say every file was written and read
//! with it; where it refuses `O_DIRECT`, they say the page cache was used (the writer and the
//! reader fall back); with `--buffered` (`direct_io: false`), they say so. Each claim is held to
//! a probe: opening a new file in the same directory with `O_DIRECT`.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_verifier::{verify, Options, Quiet};

/// Whether `dir`'s filesystem lets a file be created and opened with `O_DIRECT`.
fn takes_o_direct(dir: &Path) -> bool {
    let probe = dir.join("o_direct.probe");
    let ok = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// Convert a small checkpoint into `root/out` and verify it against its source, both with
/// `direct_io`: what the summary and the report say of `O_DIRECT`.
fn convert_and_verify(root: &Path, direct_io: bool) -> (bool, bool) {
    let (src, out) = (root.join("src"), root.join("out"));
    let spec = SynthSpec {
        layers: 2,
        shards: 1,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    let copts = ConvertOptions {
        direct_io,
        ..ConvertOptions::default()
    };
    let summary = convert(&src, &out, &copts, &ConvertQuiet).expect("convert");
    assert_eq!(summary.layers_written, [0, 1]);
    let vopts = Options {
        source: Some(src),
        direct_io,
        ..Options::default()
    };
    let report = verify(&out, &vopts, &Quiet).expect("verify");
    assert!(report.faults.is_empty(), "{:?}", report.faults);
    assert_eq!(report.files_read, 3, "trunk and two layers read in full");
    (summary.direct_io, report.direct_io)
}

#[test]
fn convert_and_verify_use_o_direct_exactly_where_the_build_disk_takes_it() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let allowed = takes_o_direct(root.path());
    if !allowed {
        eprintln!(
            "note: {} refuses O_DIRECT: the fallback is what is checked here",
            root.path().display()
        );
    }
    let (wrote, read) = convert_and_verify(root.path(), true);
    assert_eq!(
        wrote, allowed,
        "convert's summary: O_DIRECT used {wrote}, the filesystem takes it {allowed}"
    );
    assert_eq!(
        read, allowed,
        "verify's report: O_DIRECT used {read}, the filesystem takes it {allowed}"
    );
}

#[test]
fn buffered_convert_and_verify_say_they_used_the_page_cache() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    assert_eq!(convert_and_verify(root.path(), false), (false, false));
}

/// tmpfs took `O_DIRECT` only from Linux 6.6; either way the reports must match the probe.
#[test]
fn on_tmpfs_convert_and_verify_report_o_direct_as_the_kernel_allows_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let Some(tmpfs) = tarfa_testtools::Tmpfs::mount(&root.path().join("tmpfs"), "64m") else {
        return;
    };
    let allowed = takes_o_direct(tmpfs.path());
    let (wrote, read) = convert_and_verify(tmpfs.path(), true);
    assert_eq!(
        (wrote, read),
        (allowed, allowed),
        "tmpfs takes O_DIRECT: {allowed}; (convert, verify) used it: ({wrote}, {read})"
    );
}
