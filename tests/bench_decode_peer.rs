//! `tarfa bench-decode --peer FILE` (issue 24): llama-bench's own JSON beside tarfa's figures, as
//! ratios a reader can rerun — each mode against llama.cpp's tests on its device, refused before
//! any measuring when none of the file's tests is this run's.

mod common;

use common::{path, tarfa};
use std::path::Path;

fn peer(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/peer")
        .join(name)
}

#[test]
fn each_mode_is_a_ratio_to_llama_benchs_test_on_its_device() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = tmp.path().join("m");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let cpu = peer("llama-bench-cpu.json");
    let cuda = peer("llama-bench-cuda.json");
    let base = [
        "bench-decode",
        path(&m),
        "--modes",
        "resident",
        "--runs",
        "1",
        "--no-fio",
        "--mem-gib",
        "0.01",
    ];
    // Both files: the CPU mode takes the CPU build's tests (pp8 215.4, tg32 61.8), not CUDA's.
    let mut args = base.to_vec();
    args.extend(["--peer", path(&cuda), "--peer", path(&cpu), "--json"]);
    let (code, out, err) = tarfa(&args);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("json");
    let row = &v["modes"][0];
    let p = &row["peer"];
    assert_eq!(p["file"], path(&cpu), "{v}");
    assert_eq!(p["backends"], "CPU");
    assert_eq!(p["prompt_tokens_per_s"], 215.419218);
    assert_eq!(p["decode_tokens_per_s"], 61.799471);
    let ratio = |k: &str, of: &str, peer: f64| {
        let got = p[k].as_f64().expect("ratio");
        let want = row[of].as_f64().expect("figure") / peer;
        assert!((got - want).abs() <= want * 1e-12, "{k}: {got} vs {want}");
    };
    ratio("prompt_ratio", "prompt_tokens_per_s", 215.419218);
    ratio("decode_ratio", "decode_tokens_per_s", 61.799471);
    // The table says it too.
    let mut args = base.to_vec();
    args.extend(["--peer", path(&cpu)]);
    let (code, out, err) = tarfa(&args);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("| resident | CPU, 16 threads | 215.4 |"),
        "{out}"
    );
    // Tests of another device or length: refused before measuring, naming what the file has.
    for (extra, file) in [
        (&[][..], &cuda),
        (&["--prompt-tokens", "16", "-n", "16"][..], &cpu),
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        args.extend(["--peer", path(file)]);
        let (code, _, err) = tarfa(&args);
        assert_ne!(code, 0);
        assert!(
            err.contains("none of its tests") && err.contains("tg32"),
            "{err}"
        );
    }
    // Not llama-bench's JSON.
    let bad = tmp.path().join("bad.json");
    std::fs::write(&bad, "{\"a\": 1}").expect("write");
    let mut args = base.to_vec();
    args.extend(["--peer", path(&bad)]);
    let (code, _, err) = tarfa(&args);
    assert_ne!(code, 0);
    assert!(
        err.contains("not the JSON of `llama-bench -o json`"),
        "{err}"
    );
}
