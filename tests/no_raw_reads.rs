//! Issue 13, findings 6 and 7: every read of a file named by a path goes through
//! `format/src/fsio.rs` (regular files only, bounded by a stated limit), so a FIFO or a link to
//! `/dev/zero` can neither block tarfa nor fill its memory. This test reads the shipped source
//! (the binary's `src/` and each workspace member's `src/`, up to its `#[cfg(test)] mod`) and
//! fails on a call that opens or reads a path another way. A method on a handle already opened
//! (`.read_to_string(&mut s)` on a file from `fsio::open_regular`) is not a path-named read.

use std::path::{Path, PathBuf};

/// Calls that open or read a file by its path.
const RAW: [&str; 4] = [
    "fs::read(",
    "fs::read_to_string(",
    "File::open(",
    "from_file(",
];

/// The sites that may: (file, call, why). Keep it short and each reason true.
const ALLOWED: [(&str, &str, &str); 6] = [
    (
        "format/src/fsio.rs",
        "",
        "the one bounded regular-file reader itself",
    ),
    (
        "format/src/publish.rs",
        "File::open(",
        "opens the output's parent directory to fsync it; reads no bytes",
    ),
    (
        "benchkit/src/lib.rs",
        "fs::read_to_string(",
        "the kernel's /proc files (status, loadavg, cpuinfo, meminfo), never a user's file",
    ),
    (
        "benchkit/src/checkpoint.rs",
        "fs::read_to_string(",
        "the marker the benchmark wrote into the checkpoint it generated",
    ),
    (
        "src/run_cmd.rs",
        "File::open(",
        "--prompt-file of a pipe or character device (<(…), /dev/stdin): read as a stream, bounded",
    ),
    (
        "converter/src/testkit.rs",
        "fs::read_to_string(",
        "/proc/self/status of a test child (testkit feature, tests only)",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `src/` directories of the binary and of every workspace member.
fn source_dirs() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    let mut dirs = vec![root().join("src")];
    dirs.extend(
        members
            .split('"')
            .skip(1)
            .step_by(2)
            .map(|m| root().join(m).join("src")),
    );
    dirs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The shipped part of a file: up to its test module (clippy's `items_after_test_module` keeps
/// that last), comment lines left out.
fn shipped_lines(text: &str) -> Vec<(usize, &str)> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod "))
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, *l))
        .collect()
}

/// Whether `line` calls `call` (not a longer name ending in it: `GgufFile::open(` is not
/// `File::open(`).
fn calls(line: &str, call: &str) -> bool {
    line.match_indices(call).any(|(i, _)| {
        !line[..i]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

#[test]
fn no_shipped_code_reads_a_path_but_through_the_bounded_regular_file_helper() {
    let mut files = Vec::new();
    for d in source_dirs() {
        rust_files(&d, &mut files);
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut raw = Vec::new();
    let mut used = vec![false; ALLOWED.len()];
    for f in &files {
        let rel = f
            .strip_prefix(root())
            .expect("under the root")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(f).expect("read source");
        for (n, line) in shipped_lines(&text) {
            for call in RAW {
                if !calls(line, call) {
                    continue;
                }
                match ALLOWED
                    .iter()
                    .position(|(file, c, _)| *file == rel && (c.is_empty() || *c == call))
                {
                    Some(i) => used[i] = true,
                    None => raw.push(format!("{rel}:{n}: {}", line.trim())),
                }
            }
        }
    }
    assert!(
        raw.is_empty(),
        "read through tarfa_format::fsio (read_regular / open_regular) instead:\n{}",
        raw.join("\n")
    );
    // An entry whose site is gone is a stale exemption: take it out.
    let stale: Vec<&str> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|((file, _, _), u)| !**u && *file != "format/src/fsio.rs")
        .map(|((file, call, _), _)| if call.is_empty() { *file } else { *call })
        .collect();
    assert!(stale.is_empty(), "allowed sites no longer there: {stale:?}");
}

#[test]
fn the_scan_sees_a_raw_read_and_not_a_longer_name() {
    assert!(calls("let b = std::fs::read(&p)?;", "fs::read("));
    assert!(calls("Tokenizer::from_file(&p)", "from_file("));
    assert!(!calls("GgufFile::open(path)?", "File::open("));
    assert!(!calls("fs::read_dir(d)", "fs::read("));
    let text = "fn a() { std::fs::read(p); }\n#[cfg(test)]\nmod tests {\n std::fs::read(q);\n}\n";
    assert_eq!(shipped_lines(text).len(), 1);
}
