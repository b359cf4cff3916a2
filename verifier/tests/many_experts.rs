//! A valid model of many zero-byte experts (issue 13, finding 8: 1M of them took 3.7 GB to
//! convert and 5.4 GB to verify) is converted and verified in bounded memory: each run is a child
//! process (this test binary, re-run) under `ulimit -v`, and reports its peak RSS. Before the fix
//! (this test run against main's crates), the 200,000 experts here peaked at 0.73 GB to convert (a
//! plan item list per expert, the index held whole, two readers) and 1.08 GB to verify (every
//! region record held, a 2 KB hasher per region), and both tests failed; after it, 0.07 GB and
//! 0.06 GB. A re-run of convert over the complete output (every file checked and kept) peaked at
//! 0.17 GB while its resume check held a `JnfReader`; streamed (`scan_index`), 0.06 GB.
//!
//! `scripts/gen-many-experts.py` writes the same model at any size, for BENCHMARKS.md.

use std::path::Path;
use tarfa_converter::testkit::bounded::{report_peak_rss, run_bounded_child};

/// Experts of the model: two fused stacks of zero-byte rows, so 400,000 regions.
const EXPERTS: u64 = 200_000;
/// Address space the child may use.
const CHILD_VMEM_KIB: u64 = 4 << 20;
/// Peak resident memory a child may reach (320 MiB until a re-run of convert over complete output
/// was added: it peaked at 165 MB before its resume check streamed, and passes below this now).
const CHILD_PEAK_RSS_KIB: u64 = 128 << 10;

fn write_model(dir: &Path) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let p = "model.layers.0.mlp.experts";
    let json = format!(
        r#"{{"{p}.gate_up_proj":{{"dtype":"BF16","shape":[{EXPERTS},0,8],"data_offsets":[0,0]}},"{p}.down_proj":{{"dtype":"BF16","shape":[{EXPERTS},8,0],"data_offsets":[0,0]}}}}"#
    );
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    std::fs::write(dir.join("model.safetensors"), b).expect("write");
    std::fs::write(
        dir.join("config.json"),
        format!(r#"{{"model_type":"qwen3_moe","num_hidden_layers":1,"num_experts":{EXPERTS}}}"#),
    )
    .expect("config");
}

fn convert(src: &Path, out: &Path) {
    let s = tarfa_converter::convert(
        src,
        out,
        &tarfa_converter::Options::default(),
        &tarfa_converter::Quiet,
    )
    .expect("converted");
    assert_eq!(s.experts_written, EXPERTS);
}

/// In the child: convert (case `convert`), convert again over the parent's complete output
/// (case `reconvert`: every file is checked and kept), or verify the model converted by the parent.
fn child(case: &str, dir: &Path) {
    match case {
        "convert" => convert(&dir.join("src"), &dir.join("out")),
        "reconvert" => {
            let s = tarfa_converter::convert(
                &dir.join("src"),
                &dir.join("out"),
                &tarfa_converter::Options::default(),
                &tarfa_converter::Quiet,
            )
            .expect("converted again");
            assert_eq!(s.layers_skipped, [0]);
            assert!(s.layers_written.is_empty() && !s.trunk_written, "{s:?}");
        }
        _ => {
            let r = tarfa_verifier::verify(
                &dir.join("out"),
                &tarfa_verifier::Options::default(),
                &tarfa_verifier::Quiet,
            )
            .expect("verified");
            assert!(r.faults.is_empty(), "{:?}", r.faults);
            assert_eq!(r.experts_checked, EXPERTS);
        }
    }
    report_peak_rss();
}

#[test]
#[ignore = "the child of the bounded-memory tests; run by them"]
fn child_entry() {
    if let (Ok(case), Ok(dir)) = (
        std::env::var("TARFA_MANY_EXPERTS_CASE"),
        std::env::var("TARFA_MANY_EXPERTS_DIR"),
    ) {
        child(&case, Path::new(&dir));
    }
}

/// Run `case` in a child under `ulimit -v`; it must pass below [`CHILD_PEAK_RSS_KIB`].
fn bounded(case: &str, dir: &Path) {
    let run = run_bounded_child(
        CHILD_VMEM_KIB,
        &[
            ("TARFA_MANY_EXPERTS_CASE", case.as_ref()),
            ("TARFA_MANY_EXPERTS_DIR", dir.as_os_str()),
        ],
    );
    let (peak, text) = (run.peak_kib, run.text);
    eprintln!("{case}: peak RSS {peak} KiB");
    assert!(
        peak < CHILD_PEAK_RSS_KIB,
        "{case}: peak RSS {peak} KiB:\n{text}"
    );
}

#[test]
fn a_model_of_200000_zero_byte_experts_converts_in_bounded_memory() {
    let t = tempfile::tempdir().expect("tempdir");
    write_model(&t.path().join("src"));
    bounded("convert", t.path());
}

#[test]
fn a_model_of_200000_zero_byte_experts_converts_again_in_bounded_memory() {
    let t = tempfile::tempdir().expect("tempdir");
    write_model(&t.path().join("src"));
    convert(&t.path().join("src"), &t.path().join("out"));
    bounded("reconvert", t.path());
}

#[test]
fn a_model_of_200000_zero_byte_experts_verifies_in_bounded_memory() {
    let t = tempfile::tempdir().expect("tempdir");
    write_model(&t.path().join("src"));
    convert(&t.path().join("src"), &t.path().join("out"));
    bounded("verify", t.path());
}
