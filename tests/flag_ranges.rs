//! Issue 26, finding 9 (and 25): every numeric flag has a stated range, checked by the parser
//! before any work — a value outside it (zero where one is needed, a count that would wrap, a
//! size no machine holds, NaN, a negative or infinite float) is a usage error, exit 2, naming
//! the flag and the range, never a panic, an abort, a wrap or a figure printed as if measured.

mod common;

use common::tarfa;

/// `(command and flags, the flag the error must name)`: each is refused by the parser. The model
/// directory does not exist, so the only way to pass is to be refused before it is looked at.
const OUT_OF_RANGE: &[(&[&str], &str)] = &[
    (
        &["run", "/nonexistent", "--tokens", "1", "--threads", "0"],
        "--threads",
    ),
    (
        &[
            "run",
            "/nonexistent",
            "--tokens",
            "1",
            "--threads",
            "100000",
        ],
        "--threads",
    ),
    (
        &["run", "/nonexistent", "--tokens", "1", "--qd", "100000"],
        "--qd",
    ),
    (
        &[
            "run",
            "/nonexistent",
            "--tokens",
            "1",
            "--ring-slots",
            "10000000",
        ],
        "--ring-slots",
    ),
    (
        &["run", "/nonexistent", "--tokens", "1", "--cache-gib", "nan"],
        "--cache-gib",
    ),
    (
        &["run", "/nonexistent", "--tokens", "1", "--cache-gib=-1"],
        "--cache-gib",
    ),
    (
        &["run", "/nonexistent", "--tokens", "1", "--vram-gib", "inf"],
        "--vram-gib",
    ),
    (
        &[
            "run",
            "/nonexistent",
            "--tokens",
            "1",
            "--gpu-experts",
            "NaN",
        ],
        "--gpu-experts",
    ),
    (
        &[
            "run",
            "/nonexistent",
            "--tokens",
            "1",
            "--gpu-experts",
            "1.5",
        ],
        "--gpu-experts",
    ),
    (
        &["bench-decode", "/nonexistent", "--threads", "100000"],
        "--threads",
    ),
    (
        &["bench-decode", "/nonexistent", "--mem-gib", "1e30"],
        "--mem-gib",
    ),
    (
        &["bench-decode", "/nonexistent", "--mem-gib", "1000"],
        "--mem-gib",
    ),
    (
        &["bench-decode", "/nonexistent", "--mem-gib=-5"],
        "--mem-gib",
    ),
    (
        &["bench-decode", "/nonexistent", "--mem-gib", "nan"],
        "--mem-gib",
    ),
    (
        &[
            "bench-decode",
            "/nonexistent",
            "--prompt-tokens",
            "4294967301",
        ],
        "--prompt-tokens",
    ),
    (
        &["bench-decode", "/nonexistent", "--prompt-tokens", "0"],
        "--prompt-tokens",
    ),
    (&["bench-decode", "/nonexistent", "-n", "1"], "--max-tokens"),
    (&["bench-decode", "/nonexistent", "--runs", "0"], "--runs"),
    (
        &["bench-decode", "/nonexistent", "--fio-gib", "0"],
        "--fio-gib",
    ),
    (
        &["bench-decode", "/nonexistent", "--hbm-gbps=-1"],
        "--hbm-gbps",
    ),
    (
        &["bench-io", "/nonexistent", "--budget", "1e300"],
        "--budget",
    ),
    (&["bench-io", "/nonexistent", "--budget=-1"], "--budget"),
    (&["bench-io", "/nonexistent", "--runs", "0"], "--runs"),
    (&["bench-io", "/nonexistent", "--top-k", "0"], "--top-k"),
    (&["bench-io", "/nonexistent", "--gib", "0"], "--gib"),
    (&["bench-io", "/nonexistent", "--steps", "0"], "--steps"),
    (&["bench-io", "/nonexistent", "--slots", "0"], "--slots"),
    (
        &["bench-io", "/nonexistent", "--h2d-repeats", "0"],
        "--h2d-repeats",
    ),
    (&["fetch", "/nonexistent.gguf", "--jobs", "0"], "--jobs"),
    (
        &["fetch", "/nonexistent.gguf", "--jobs", "100000"],
        "--jobs",
    ),
    (
        &["fetch", "/nonexistent.gguf", "--timeout", "0"],
        "--timeout",
    ),
    (
        &["fetch", "/nonexistent.gguf", "--speed-time", "0"],
        "--speed-time",
    ),
    (
        &[
            "convert",
            "/nonexistent",
            "-o",
            "/nonexistent-out",
            "--jobs",
            "100000",
        ],
        "--jobs",
    ),
    (
        &["run", "/nonexistent", "--tokens", "1", "--batch", "0"],
        "--batch",
    ),
    (
        &["serve", "/nonexistent", "--max-connections", "0"],
        "--max-connections",
    ),
    (
        &["serve", "/nonexistent", "--read-timeout", "0"],
        "--read-timeout",
    ),
    (
        &["serve", "/nonexistent", "--read-timeout", "100000"],
        "--read-timeout",
    ),
];

#[test]
fn a_numeric_flag_outside_its_range_is_a_usage_error_naming_the_flag_and_range() {
    let mut wrong = Vec::new();
    for (args, flag) in OUT_OF_RANGE {
        let (code, out, err) = tarfa(args);
        let named = err.contains("invalid value") && err.contains(flag);
        // The parser's message says what is allowed: a range or a bound.
        let ranged = err.contains("..") || err.contains("at most") || err.contains("at least");
        if code != 2 || !named || !ranged || !out.is_empty() {
            wrong.push(format!("{args:?}: exit {code}, stderr: {err}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn each_range_is_stated_in_the_help() {
    for (cmd, flag, range) in [
        ("run", "--threads", "1..=1024"),
        ("run", "--qd", "0..=4096"),
        ("bench-decode", "--mem-gib", "above 0, at most 256"),
        ("bench-io", "--budget", "0..=1000000"),
        ("bench-io", "--gib", "at most 1024 unless --budget"),
        ("fetch", "--jobs", "1..=64"),
        ("serve", "--max-connections", "1..=65536"),
        ("serve", "--read-timeout", "1..=3600"),
    ] {
        let (code, out, err) = tarfa(&[cmd, "--help"]);
        assert_eq!(code, 0, "{err}");
        let para = out
            .split("\n\n")
            .find(|p| {
                let head = p.trim_start();
                head.starts_with(flag) || head.contains(&format!(", {flag}"))
            })
            .unwrap_or_else(|| panic!("{cmd} --help has no {flag}: {out}"));
        assert!(para.contains(range), "{cmd} {flag}: {para}");
    }
}

#[test]
fn values_inside_the_ranges_still_parse() {
    // Bounds themselves are in range: the error is then about the missing directory, not a flag.
    for args in [
        &[
            "run",
            "/nonexistent",
            "--tokens",
            "1",
            "--threads",
            "1024",
            "--qd",
            "4096",
        ][..],
        &[
            "bench-decode",
            "/nonexistent",
            "--mem-gib",
            "256",
            "--runs",
            "1",
            "--tokens",
            "2",
        ],
        &[
            "bench-io",
            "/nonexistent",
            "--budget",
            "0",
            "--gib",
            "1024",
            "--top-k",
            "1",
        ],
    ] {
        let (code, _, err) = tarfa(args);
        assert!(!err.contains("invalid value"), "{args:?}: {err}");
        assert_ne!(code, 0, "{args:?}");
        assert!(err.contains("/nonexistent"), "{args:?}: {err}");
    }
}
