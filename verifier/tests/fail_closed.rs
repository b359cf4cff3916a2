//! Review finding 11: a file's result can never be lost on the way to the report. Each file's
//! scan is returned from the parallel map (no shared list behind a lock that a panic could
//! poison), so a panic while one file is checked reaches the caller instead of leaving a report
//! without that file's faults, and every selected file is counted.

use std::panic::AssertUnwindSafe;

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_verifier::{verify, Options, Progress, Quiet};

/// Panics when one named file is done: a fault in the checking of that file.
struct PanicsOn(&'static str);
impl Progress for PanicsOn {
    fn file_done(&self, file: &str, _faults: usize) {
        assert_ne!(file, self.0, "injected panic while checking {file}");
    }
}

#[test]
fn a_panic_while_one_file_is_checked_is_never_a_passing_report() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let (src, out) = (tmp.path().join("src"), tmp.path().join("out"));
    let spec = SynthSpec {
        layers: 4,
        ..SynthSpec::small()
    };
    write_checkpoint(&src, &spec).expect("checkpoint");
    convert(&src, &out, &ConvertOptions::default(), &ConvertQuiet).expect("convert");
    let opts = Options::default();
    let clean = verify(&out, &opts, &Quiet).expect("runs");
    assert!(clean.faults.is_empty(), "{:#?}", clean.faults);
    // Every file of the directory is read and counted: trunk and four layers.
    assert_eq!(clean.files_read, 5);
    let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
        verify(&out, &opts, &PanicsOn("layer-00002.jnf"))
    }));
    assert!(
        r.is_err(),
        "verify returned a report although checking layer-00002.jnf failed: {r:?}"
    );
}
