//! The claim scripts of `bench/` fail on a mismatch (issue 26, finding 24): they ran
//! `cmp A B && echo "logits: … byte for byte"` without `set -e`, so differing logits still ended
//! "== done" with exit 0. Every claim now goes through `bench/claims.sh`, whose `same_bytes` and
//! `claim_failed` record a failure that `end_claims` turns into exit 1.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bench_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bench")
}

/// Run `body` in bash after sourcing bench/claims.sh, without `set -e` as the scripts run.
fn with_claims(body: &str) -> (i32, String) {
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -uo pipefail\nsource '{}'\n{body}",
            bench_dir().join("claims.sh").display()
        ))
        .output()
        .expect("run bash");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn differing_logits_fail_the_script_and_equal_ones_end_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (a, b, c) = (
        tmp.path().join("a.npy"),
        tmp.path().join("b.npy"),
        tmp.path().join("c.npy"),
    );
    std::fs::write(&a, b"\x93NUMPY one").expect("write");
    std::fs::write(&b, b"\x93NUMPY two").expect("write");
    std::fs::write(&c, b"\x93NUMPY one").expect("write");
    let (a, b, c) = (a.display(), b.display(), c.display());
    let (code, out) = with_claims(&format!(
        "same_bytes '{a}' '{b}' 'gpu == cpu'\necho after\nend_claims\necho not reached"
    ));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("LOGITS DIFFER: gpu == cpu"), "{out}");
    assert!(out.contains("after"), "a failed claim stops nothing: {out}");
    assert!(
        !out.contains("not reached") && !out.contains("byte for byte"),
        "{out}"
    );
    let (code, out) = with_claims(&format!(
        "same_bytes '{a}' '{}/missing.npy' 'missing == cpu'\nend_claims",
        tmp.path().display()
    ));
    assert_eq!(code, 1, "a missing file is no match: {out}");
    let (code, out) = with_claims(&format!("same_bytes '{a}' '{c}' 'gpu == cpu'\nend_claims"));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("logits: gpu == cpu, byte for byte"), "{out}");
    assert!(out.lines().any(|l| l == "== done"), "{out}");
    let (code, out) = with_claims("claim_failed 'the GPU tests'\nend_claims");
    assert_eq!(code, 1, "{out}");
}

#[test]
fn every_bench_script_claims_through_claims_sh_and_ends_with_end_claims() {
    let mut checked = 0;
    for entry in std::fs::read_dir(bench_dir()).expect("read bench/") {
        let path = entry.expect("entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.ends_with(".sh") || name == "claims.sh" {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read script");
        let code: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(
            !code.iter().any(|l| l.contains("cmp ")),
            "{name}: a bare cmp claims nothing on a mismatch; use same_bytes (bench/claims.sh)"
        );
        let claims = code
            .iter()
            .any(|l| l.contains("same_bytes ") || l.contains("claim_failed "));
        if claims {
            assert!(
                code.iter()
                    .any(|l| l.contains("source \"$(dirname \"$0\")/claims.sh\"")),
                "{name}: claims without sourcing bench/claims.sh"
            );
            assert_eq!(
                code.last().copied(),
                Some("end_claims"),
                "{name}: a claim script ends with end_claims (its exit status)"
            );
            checked += 1;
        }
    }
    assert!(checked >= 7, "only {checked} claim scripts found in bench/");
}
