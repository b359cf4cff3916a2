//! Sources of a few hundred bytes that claim an index no JNF file can hold (spec §6:
//! `MAX_REGIONS`, `288·R + 96·E ≤ MAX_INDEX_LEN`) are refused by a typed error naming the tensor
//! and the count, before anything is written, quickly, and in bounded memory: each conversion
//! runs in a child process (this test binary, re-run) under `ulimit -v`, and reports its peak RSS.
//! Before the bound, a 265-byte safetensors of 4,194,304 zero-size experts took 6–7 GB and aborted.

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use tarfa_converter::testkit::bounded::{report_peak_rss, run_bounded_child};
use tarfa_converter::{convert, ConvertError, Options, Quiet};
use tarfa_format::safetensors::HeaderFault;

/// Address space the child may use: far below what the unbounded plan allocated.
const CHILD_VMEM_KIB: u64 = 2 << 20;
/// Peak resident memory the child may reach.
const CHILD_PEAK_RSS_KIB: u64 = 256 << 10;

fn write_st(dir: &Path, json: &str) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    std::fs::write(dir.join("model.safetensors"), b).expect("write");
}

fn write_gguf(path: &Path, ne: Vec<u64>) {
    let mut w = tarfa_gguf::GgufWriter::new(32);
    w.add_kv(
        "general.architecture",
        tarfa_gguf::Value::String("x".into()),
    );
    w.add_tensor("blk.0.ffn_gate_exps.weight", tarfa_format::Dtype::F32, ne);
    let data: Vec<Box<dyn Read>> = vec![Box::new(std::io::empty())];
    w.write_file(path, data).expect("write gguf");
}

/// In the child: convert `case` and check the refusal; print the peak RSS.
fn child(case: &str) {
    if case == "header" {
        return big_header();
    }
    let t = tempfile::tempdir().expect("tempdir");
    let src = match case {
        "safetensors" => {
            let src = t.path().join("src");
            write_st(
                &src,
                r#"{"model.layers.0.mlp.experts.gate_up_proj":{"dtype":"BF16","shape":[4194304,0,32],"data_offsets":[0,0]}}"#,
            );
            src
        }
        _ => {
            let src = t.path().join("m.gguf");
            // ne is GGUF's reversed shape: [4194304, 0, 32].
            write_gguf(&src, vec![32, 0, 4_194_304]);
            src
        }
    };
    let out = t.path().join("out");
    let e = convert(&src, &out, &Options::default(), &Quiet).expect_err("refused");
    let want_tensor = if case == "safetensors" {
        "model.layers.0.mlp.experts.gate_up_proj"
    } else {
        "blk.0.ffn_gate_exps.weight"
    };
    assert!(
        matches!(&e, ConvertError::IndexTooLarge { file, tensor, experts: 4_194_304, regions: 4_194_304, .. }
            if file == "layer-00000.jnf" && tensor == want_tensor),
        "{e}"
    );
    assert!(!out.join("layer-00000.jnf").exists());
    assert!(!out.join("manifest.json").exists());
    report_peak_rss();
}

/// Entries of the big header, and the peak RSS its parse may reach: a JSON tree of the whole
/// header took 612 MB (about 1.2 KB per entry); checked entry by entry it peaks at 140 MB, the
/// 30 MB of JSON included.
const BIG_HEADER_ENTRIES: usize = 500_000;
const BIG_HEADER_PEAK_RSS_KIB: u64 = 256 << 10;

/// In the child: parse a header of [`BIG_HEADER_ENTRIES`] zero-size tensors (about 30 MB).
fn big_header() {
    let mut json = String::from("{");
    for i in 0..BIG_HEADER_ENTRIES {
        if i > 0 {
            json.push(',');
        }
        json.push_str(&format!(
            r#""t{i}":{{"dtype":"BF16","shape":[0],"data_offsets":[0,0]}}"#
        ));
    }
    json.push('}');
    let h =
        tarfa_format::safetensors::parse_safetensors_header(json.as_bytes(), 8 + json.len() as u64)
            .expect("parsed");
    assert_eq!(h.tensors.len(), BIG_HEADER_ENTRIES);
    report_peak_rss();
}

#[test]
#[ignore = "the child of the bounded-memory tests; run by them"]
fn child_entry() {
    if let Ok(case) = std::env::var("TARFA_HOSTILE_INDEX_CASE") {
        child(&case);
    }
}

/// Run `case` in a child under `ulimit -v`; it must pass, quickly, below `max_rss_kib`.
fn bounded(case: &str, max_rss_kib: u64) {
    let run = run_bounded_child(
        CHILD_VMEM_KIB,
        &[("TARFA_HOSTILE_INDEX_CASE", case.as_ref())],
    );
    let (peak, text) = (run.peak_kib, run.text);
    assert!(peak < max_rss_kib, "peak RSS {peak} KiB:\n{text}");
    assert!(
        run.elapsed < Duration::from_secs(10),
        "took {:?}",
        run.elapsed
    );
}

#[test]
fn a_265_byte_safetensors_of_4194304_zero_size_experts_is_refused_in_bounded_memory() {
    bounded("safetensors", CHILD_PEAK_RSS_KIB);
}

#[test]
fn a_tiny_gguf_of_4194304_zero_size_experts_is_refused_in_bounded_memory() {
    bounded("gguf", CHILD_PEAK_RSS_KIB);
}

#[test]
fn a_30_mb_header_of_half_a_million_tensors_is_parsed_without_a_json_tree() {
    bounded("header", BIG_HEADER_PEAK_RSS_KIB);
}

#[test]
fn the_bound_is_the_specs_record_bytes_not_the_expert_limit() {
    // 2,796,203 experts pass MAX_REGIONS but need 384 · 2,796,203 > 2^30 bytes of records.
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    write_st(
        &src,
        r#"{"model.layers.0.mlp.experts.down_proj":{"dtype":"BF16","shape":[2796203,0,8],"data_offsets":[0,0]}}"#,
    );
    let e = convert(&src, &t.path().join("out"), &Options::default(), &Quiet).expect_err("refused");
    assert!(
        matches!(
            &e,
            ConvertError::IndexTooLarge {
                experts: 2_796_203,
                regions: 2_796_203,
                bytes: 1_073_741_952,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_tensor_named_twice_in_a_header_is_refused_not_last_wins() {
    let t = tempfile::tempdir().expect("tempdir");
    let src = t.path().join("src");
    let json = r#"{"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[2,4]}}"#;
    std::fs::create_dir_all(&src).expect("mkdir");
    let mut b = (json.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(json.as_bytes());
    b.extend_from_slice(&[0; 4]);
    std::fs::write(src.join("model.safetensors"), b).expect("write");
    let e = convert(&src, &t.path().join("out"), &Options::default(), &Quiet).expect_err("refused");
    assert!(
        matches!(&e, ConvertError::BadShard { fault: HeaderFault::Duplicate { tensor }, .. } if tensor == "a"),
        "{e}"
    );
}
