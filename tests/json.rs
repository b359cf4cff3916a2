//! `--json` (review finding 21): one JSON document per invocation, whatever the flags, each with
//! its `"schema"` (docs/json.md).

mod common;

use std::path::Path;

use common::{gguf_fixture, golden, path, tarfa};

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/hf")
        .join(name)
}

/// The whole of `stdout` as one JSON document (a second document after it is an error).
fn one_document(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout)
        .unwrap_or_else(|e| panic!("not one JSON document ({e}):\n{stdout}"))
}

#[test]
fn convert_json_verify_prints_one_document_with_the_verification_inside() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    let src = fixture("qwen3_moe");
    let (code, stdout, err) = tarfa(&[
        "convert",
        path(&src),
        "-o",
        path(&out),
        "--json",
        "--verify",
        "-q",
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    let doc = one_document(&stdout);
    assert_eq!(doc["schema"], "tarfa.convert/1", "{doc}");
    assert_eq!(doc["verify"]["schema"], "tarfa.verify/1", "{doc}");
    assert_eq!(doc["verify"]["faults"].as_array().map(Vec::len), Some(0));
    assert!(doc["seconds"].is_number(), "{doc}");

    let (code, stdout, _) = tarfa(&["convert", path(&src), "-o", path(&out), "--json", "-q"]);
    assert_eq!(code, 0);
    let doc = one_document(&stdout);
    assert_eq!(doc["schema"], "tarfa.convert/1");
    assert!(doc["verify"].is_null(), "no --verify: null, {doc}");

    let (code, stdout, _) = tarfa(&["verify", path(&out), "--json", "-q"]);
    assert_eq!(code, 0);
    assert_eq!(one_document(&stdout)["schema"], "tarfa.verify/1");
    let (code, stdout, _) = tarfa(&["inspect", path(&out), "--json"]);
    assert_eq!(code, 0);
    assert_eq!(one_document(&stdout)["schema"], "tarfa.inspect-model/1");
}

#[test]
fn every_inspect_and_fetch_document_names_its_schema() {
    let cases: [(Vec<String>, &str); 3] = [
        (
            vec![
                "inspect".into(),
                "--json".into(),
                path(&golden("edge-sizes.jnf")).into(),
            ],
            "tarfa.inspect-jnf/1",
        ),
        (
            vec![
                "inspect".into(),
                "--json".into(),
                path(&gguf_fixture("moe.gguf")).into(),
            ],
            "tarfa.inspect-gguf/1",
        ),
        (
            vec![
                "fetch".into(),
                path(&gguf_fixture("moe-model.gguf")).into(),
                "--tensors".into(),
                "*".into(),
                "--list".into(),
                "--json".into(),
            ],
            "tarfa.fetch-list/1",
        ),
    ];
    for (args, schema) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stdout, err) = tarfa(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert_eq!(one_document(&stdout)["schema"], schema, "{args:?}");
    }
}

/// The qwen3_moe fixture converted into `tmp/m`.
fn converted_fixture(tmp: &tempfile::TempDir) -> std::path::PathBuf {
    let model = tmp.path().join("m");
    let (code, _, err) = tarfa(&[
        "convert",
        path(&fixture("qwen3_moe")),
        "-o",
        path(&model),
        "-q",
    ]);
    assert_eq!(code, 0, "{err}");
    model
}

#[test]
fn bench_decode_prints_one_document_with_its_schema_and_documented_fields() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = converted_fixture(&tmp);
    let (code, stdout, err) = tarfa(&[
        "bench-decode",
        path(&model),
        "--modes",
        "resident",
        "--runs",
        "1",
        "-n",
        "2",
        "--mem-gib",
        "0.01",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc = one_document(&stdout);
    assert_eq!(doc["schema"], "tarfa.bench-decode/1", "{doc}");
    assert!(doc["memory_read_gb_per_s"].is_number(), "{doc}");
    let row = &doc["modes"][0];
    assert_eq!(row["mode"], "resident", "{doc}");
    for f in [
        "prompt_tokens_per_s",
        "decode_tokens_per_s",
        "bytes_per_token",
        "baseline_gb_per_s",
        "bound_tokens_per_s",
        "ratio_to_bound",
    ] {
        assert!(row[f].is_number(), "{f}: {doc}");
    }
}

/// `bench-decode --modes gpu-stream` (or `gpu`) in a build without CUDA fails at once with the
/// reason (exit 2, as `run --device cuda`), not after a disk probe, a panic or a silent CPU run;
/// an unknown mode is refused with the list of modes.
#[test]
fn bench_decode_gpu_stream_without_cuda_says_why_and_unknown_modes_are_listed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = converted_fixture(&tmp);
    let run = |mode: &str| {
        tarfa(&[
            "bench-decode",
            path(&model),
            "--modes",
            mode,
            "--runs",
            "1",
            "-n",
            "2",
            "--no-fio",
        ])
    };
    if !cfg!(feature = "cuda") {
        for mode in ["gpu-stream", "gpu", "stream,gpu-stream"] {
            let (code, _, err) = run(mode);
            assert_eq!(code, 2, "{mode}: {err}");
            assert!(err.contains("--features cuda"), "{mode}: {err}");
            // Refused before measuring anything: no disk probe ran.
            assert!(!err.contains("disk:"), "{mode}: {err}");
        }
    }
    let (code, _, err) = run("gpu-streamed");
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("unknown mode") && err.contains("gpu-stream"),
        "{err}"
    );
}
