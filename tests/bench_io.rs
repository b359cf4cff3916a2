//! `tarfa bench-io` on a tiny model (review finding 10): absurd work sizes no longer panic (the
//! sets are made token by token, and a time budget ends a run), bad ones are refused, the
//! default work is bounded by the model's size and a time budget, progress comes with an ETA,
//! the page cache is talked about, and `--json` is one document.

mod common;

use std::path::{Path, PathBuf};

use common::{path, tarfa, tarfa_within};

fn tiny_model(tmp: &Path) -> PathBuf {
    let out = tmp.join("model");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let (code, stdout, err) = tarfa(&["convert", path(&src), "-o", path(&out), "-q"]);
    assert_eq!(code, 0, "{stdout}{err}");
    out
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout).unwrap_or_else(|e| panic!("not one JSON document: {e}\n{stdout}"))
}

#[test]
fn absurd_work_sizes_end_at_the_time_budget_instead_of_panicking() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    for work in [["--steps", "18446744073709551615"], ["--gib", "1e30"]] {
        let mut args = vec!["bench-io", path(&model)];
        args.extend(work);
        args.extend([
            "--budget",
            "2",
            "--backend",
            "pread",
            "--qd",
            "1",
            "--check",
            "off",
            "--runs",
            "1",
            "--no-fio",
            "--no-drop-caches",
            "--json",
        ]);
        let (code, stdout, err) = tarfa_within(60, &args);
        assert_eq!(code, 0, "{work:?}: {err}");
        assert!(err.contains("(cut at its time share)"), "{err}");
        let v = json(&stdout);
        assert_eq!(v["rows"][0]["cut_short"], true, "{stdout}");
    }
}

/// Issue 26, finding 25: work that cannot finish is refused unless a time budget ends it.
#[test]
fn absurd_work_sizes_without_a_budget_are_refused_before_any_work() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    for (work, budget) in [
        (["--gib", "1e30"], None),
        (["--gib", "1025"], Some("0")),
        (["--steps", "18446744073709551615"], None),
    ] {
        let mut args = vec!["bench-io", path(&model), "--no-fio", "--no-drop-caches"];
        args.extend(work);
        if let Some(b) = budget {
            args.extend(["--budget", b]);
        }
        let (code, out, err) = tarfa_within(30, &args);
        assert_eq!(code, 2, "{work:?}: {err}");
        assert!(
            err.contains(work[0]) && err.contains("--budget SECS"),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
}

#[test]
fn bad_work_sizes_are_refused() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    for bad in [
        ["--gib", "nan"],
        ["--gib", "-1"],
        ["--gib", "0"],
        ["--steps", "0"],
        ["--budget", "inf"],
    ] {
        let arg = format!("{}={}", bad[0], bad[1]);
        let args = [
            "bench-io",
            path(&model),
            "--no-fio",
            "--no-drop-caches",
            &arg,
        ];
        let (code, _, err) = tarfa_within(30, &args);
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(err.contains(bad[0]), "{err}");
    }
}

#[test]
fn the_default_work_is_bounded_by_the_model_and_reported_with_progress() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let model = tiny_model(tmp.path());
    // Every default but fio and the page-cache drop (root only; it would disturb the machine).
    let (code, stdout, err) = tarfa_within(
        120,
        &[
            "bench-io",
            path(&model),
            "--no-fio",
            "--no-drop-caches",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v = json(&stdout);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(
        rows.len(),
        3 * 4 * 2,
        "every backend, depth and BLAKE3 mode"
    );
    let model_bytes = v["model_expert_bytes"].as_u64().expect("model bytes");
    let block = v["block_bytes"].as_u64().expect("block");
    for r in rows {
        // At most the model's expert bytes per run, rounded up to one token's set.
        let bytes = r["bytes"].as_u64().expect("bytes");
        assert!(bytes <= model_bytes + block * 16, "{r}");
        assert!(r["from_cache"].is_boolean(), "{r}");
    }
    assert_eq!(v["page_cache_dropped"], false);
    assert!(
        rows.iter()
            .filter(|r| r["backend"] == "mmap")
            .all(|r| r["from_cache"] == true),
        "mmap reads through the page cache, which was not dropped"
    );
    assert!(err.contains("not dropping the page cache"), "{err}");
    assert!(err.contains("[72/72]") && err.contains("ETA"), "{err}");
}
