//! Review finding 11: a file's result can never be lost on the way to the report, and a file
//! whose check fails is never a pass. Each file's scan is returned from the parallel map (no
//! shared list behind a lock that a panic could poison); a check that panics becomes an
//! `unchecked` fault of that file, and every other file's faults are still reported.
//!
//! The first version of this test only required the panic to reach the caller, which the
//! implementation it replaced (faults pushed into a mutex, dropped when poisoned) did as well:
//! it could not fail. This one requires the report itself to hold both the failing file and the
//! faults of another file, which a collector that drops a file's result, or all results after a
//! poisoning, cannot give. `check_each`'s unit test (src/lib.rs) holds the collector to the same
//! contract directly.

use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options as ConvertOptions, Quiet as ConvertQuiet};
use tarfa_format::JnfReader;
use tarfa_verifier::{verify, FaultKind, Options, Progress, Quiet};

/// Panics when one named file is done: a fault in the checking of that file.
struct PanicsOn(&'static str);
impl Progress for PanicsOn {
    fn file_done(&self, file: &str, _faults: usize) {
        assert_ne!(file, self.0, "injected panic while checking {file}");
    }
}

#[test]
fn a_panic_while_one_file_is_checked_is_that_files_fault_and_no_other_fault_is_lost() {
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

    // Damage one byte of a region of layer 1: a fault that must survive layer 2's failure.
    let layer1 = out.join("layer-00001.jnf");
    let at = {
        let r = JnfReader::open(&layer1).expect("open");
        r.regions()[0].offset
    };
    let mut bytes = std::fs::read(&layer1).expect("read");
    bytes[at as usize] ^= 0x40;
    std::fs::write(&layer1, &bytes).expect("write");

    let report = verify(&out, &opts, &PanicsOn("layer-00002.jnf"))
        .expect("a check that fails is a fault in the report, not a lost run");
    let of = |file: &str, kind: FaultKind| {
        report
            .faults
            .iter()
            .filter(|f| f.file == file && f.kind == kind)
            .count()
    };
    assert_eq!(
        of("layer-00002.jnf", FaultKind::Unchecked),
        1,
        "{:#?}",
        report.faults
    );
    assert!(
        of("layer-00001.jnf", FaultKind::RegionHash) >= 1,
        "layer 1's fault was lost: {:#?}",
        report.faults
    );
    let unchecked = report
        .faults
        .iter()
        .find(|f| f.kind == FaultKind::Unchecked)
        .expect("the unchecked fault");
    assert!(
        unchecked.detail.contains("not verified")
            && unchecked
                .detail
                .contains("injected panic while checking layer-00002.jnf"),
        "{}",
        unchecked.detail
    );
    // The other four files were read and counted.
    assert_eq!(report.files_read, 4);
}
