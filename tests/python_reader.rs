//! The second reader (review finding 15): `tests/jnf_reader.py`, written in Python from
//! spec/JNF_V1.md alone, must accept every golden vector and every model tarfa converts from the
//! fixtures, compute the same root digests the manifest records, and refuse damaged files. Two
//! readers agreeing is the proof that the spec, not the Rust code, is the contract.
//!
//! python3 (with the `blake3` package, which scripts/test.sh installs) is required: without it the
//! test fails, unless `TARFA_ALLOW_NO_PYTHON=1`, when it says what it skipped.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gguf_fixture, golden, path, tarfa};
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jnf_reader.py")
}

/// Whether python3 with `blake3` is here; fails the test when it is not, unless allowed.
fn python_ready(test: &str) -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import blake3"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        let allowed = std::env::var("TARFA_ALLOW_NO_PYTHON").is_ok_and(|v| v == "1");
        assert!(
            allowed,
            "{test}: python3 with the `blake3` package is required to run the second JNF reader \
             (tests/jnf_reader.py); install them (`python3 -m pip install blake3`, as \
             scripts/test.sh does) or set TARFA_ALLOW_NO_PYTHON=1 to skip"
        );
        eprintln!("{test}: SKIPPED (TARFA_ALLOW_NO_PYTHON=1): no python3 with blake3");
    }
    ok
}

/// Run the Python reader on `paths`: its exit code and its per-path JSON results.
fn py_read(paths: &[&Path]) -> (i32, Vec<Value>, String) {
    let out = Command::new("python3")
        .arg(script())
        .arg("--json")
        .args(paths)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let v: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("reader output is not JSON ({e}): {stdout}{stderr}"));
    let results = v.as_array().expect("an array").clone();
    assert_eq!(results.len(), paths.len(), "{stdout}");
    (out.status.code().unwrap_or(-1), results, stderr)
}

/// The reader accepts the model directory `dir`, with BLAKE3 checked, and the root digests it
/// computed for each JNF file are the ones the manifest records.
fn assert_model_agrees(dir: &Path) {
    let (code, res, err) = py_read(&[dir]);
    let r = &res[0];
    assert_eq!(code, 0, "{}: {r}{err}", dir.display());
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["blake3_checked"], true, "{r}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).expect("read manifest"))
            .expect("manifest JSON");
    assert_eq!(r["manifest_digest"], manifest["digest"]);
    let mut jnf = 0;
    for entry in manifest["files"].as_array().expect("files") {
        if entry["kind"] == "aux" {
            continue;
        }
        let got = r["files"]
            .as_array()
            .expect("files")
            .iter()
            .find(|f| f["path"] == entry["path"])
            .unwrap_or_else(|| panic!("{} not read: {r}", entry["path"]));
        assert_eq!(got["root_sha256"], entry["sha256"], "{}", entry["path"]);
        assert_eq!(got["root_blake3"], entry["blake3"], "{}", entry["path"]);
        jnf += 1;
    }
    assert!(
        jnf >= 2,
        "{}: a trunk and at least one layer",
        dir.display()
    );
}

/// The reader refuses `p` with the named violation.
fn assert_refused(p: &Path, violation: &str) {
    let (code, res, err) = py_read(&[p]);
    assert_eq!(code, 1, "{}: {}{err}", p.display(), res[0]);
    assert_eq!(res[0]["ok"], false, "{}", res[0]);
    assert_eq!(
        res[0]["violation"],
        violation,
        "{}: {}",
        p.display(),
        res[0]
    );
}

#[test]
fn the_python_reader_accepts_every_golden_vector_with_the_spec_digests() {
    if !python_ready("golden") {
        return;
    }
    let files = ["hex-example.jnf", "edge-sizes.jnf", "fused-gate-up.jnf"].map(golden);
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let (code, res, err) = py_read(&refs);
    assert_eq!(code, 0, "{res:?}{err}");
    assert!(res.iter().all(|r| r["ok"] == true), "{res:?}");
    // §11: the worked example's root digest, as the spec prints it.
    assert_eq!(
        res[0]["root_sha256"],
        "f7887cff9cd397975c0c8797f016571b0c59dc8a322eee1cbc194eef6a2387b1"
    );
    assert_eq!(
        res[0]["root_blake3"],
        "5f7f75138621210910d0a0288cd47857d3a075c78a1007589403ac563dfdc85a"
    );
    assert_eq!(res[2]["experts"], 3);
    for dir in ["tiny-moe", "single-expert"] {
        assert_model_agrees(&golden(dir));
    }
}

#[test]
fn the_python_reader_agrees_with_every_converted_fixture() {
    if !python_ready("converted") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let hf = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(&hf)
        .expect("fixtures/hf")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("config.json").is_file())
        .collect();
    sources.sort();
    assert!(sources.len() >= 5, "{sources:?}");
    // A GGUF source too: its manifest config holds typed floats, so the digest's number rule
    // is exercised.
    sources.push(gguf_fixture("moe-model.gguf"));
    for (i, src) in sources.iter().enumerate() {
        let out = tmp.path().join(format!("m{i}"));
        let (code, stdout, err) = tarfa(&["convert", path(src), "-o", path(&out), "-q"]);
        assert_eq!(code, 0, "convert {}: {stdout}{err}", src.display());
        assert_model_agrees(&out);
    }
}

#[test]
fn the_python_reader_refuses_damaged_files() {
    if !python_ready("damaged") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read(golden("tiny-moe/layer-00000.jnf")).expect("read");
    let footer = &good[good.len() - 160..];
    let index_offset = u64::from_le_bytes(footer[16..24].try_into().expect("8 bytes")) as usize;
    let write = |name: &str, bytes: &[u8]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    };
    let flip = |at: usize| {
        let mut b = good.clone();
        b[at] ^= 0x01;
        b
    };
    // Region 0's first byte, a padding byte after it, an index byte, the header, the footer.
    assert_refused(&write("data.jnf", &flip(4096)), "RegionHashMismatch");
    assert_refused(
        &write("index.jnf", &flip(index_offset + 3)),
        "IndexHashMismatch",
    );
    assert_refused(&write("header.jnf", &flip(33)), "HeaderHashMismatch");
    assert_refused(
        &write("footer.jnf", &flip(good.len() - 160 + 20)),
        "FooterHashMismatch",
    );
    let pad = index_offset - 1; // the last byte before the index is padding in this file
    assert_eq!(good[pad], 0);
    assert_refused(&write("pad.jnf", &flip(pad)), "NonZeroPadding");
    assert_refused(
        &write("truncated.jnf", &good[..good.len() - 4096]),
        "NoFooter",
    );
    assert_refused(&write("short.jnf", &good[..100]), "FileTooShort");

    // A model directory: a flipped byte of a layer file, of the manifest, an extra file.
    let model = |name: &str| {
        let d = tmp.path().join(name);
        std::fs::create_dir(&d).expect("mkdir");
        for e in std::fs::read_dir(golden("tiny-moe")).expect("tiny-moe") {
            let e = e.expect("entry");
            std::fs::copy(e.path(), d.join(e.file_name())).expect("copy");
        }
        d
    };
    let d = model("layer-flip");
    let mut layer = std::fs::read(d.join("layer-00001.jnf")).expect("read");
    layer[4096] ^= 0x80;
    std::fs::write(d.join("layer-00001.jnf"), layer).expect("write");
    assert_refused(&d, "RegionHashMismatch");
    let d = model("manifest-flip");
    let m = std::fs::read_to_string(d.join("manifest.json")).expect("manifest");
    let m2 = m.replacen("\"num_layers\": 2", "\"num_layers\": 3", 1);
    assert_ne!(m, m2);
    std::fs::write(d.join("manifest.json"), m2).expect("write");
    assert_refused(&d, "Manifest");
    let d = model("extra");
    std::fs::write(d.join(".hidden"), b"x").expect("write");
    assert_refused(&d, "ExtraFile");
}

/// The manifest digest's canonical JSON (§8.1.2) is the same bytes in both readers for the
/// numbers and strings where JSON writers differ: exponents, `-0`, integers past 64 bits,
/// escapes, non-ASCII keys.
#[test]
fn the_python_reader_computes_the_manifest_digest_of_every_tricky_value_as_tarfa_does() {
    if !python_ready("digest") {
        return;
    }
    let texts = [
        r#"{"a": 1, "b": [1.0, 0.1, 100, 1e2, 1E2, -0, -0.0, 0, -1]}"#,
        r#"{"f": [1e300, 1e-7, 1.5e-7, 1e16, 1e15, 123456789012345678, 1e-5, 1e-6, 2.5e-5]}"#,
        r#"{"f": [5e-324, 1.7976931348623157e308, 3.3999999521443642e38, 9.999999747378752e-6]}"#,
        r#"{"i": [18446744073709551615, 18446744073709551616, -9223372036854775808, -9223372036854775809]}"#,
        r#"{"i": [0.30000000000000004, 1234567.125, 0.000123, 12345678901234567890.0]}"#,
        r#"{"s": "quote \" back \\ slash / tab \t nl \n \u0001 \u001f \u007f é 日本 😀 \ud83d\ude00"}"#,
        r#"{"é": 1, "z": 2, "a": {"y": null, "b": true, "B": false}, "日": [], "digest": "x"}"#,
        r#"{"nested": {"digest": "kept below the top level"}, "digest": "dropped"}"#,
    ];
    let mut child = Command::new("python3")
        .arg(script())
        .arg("--digest")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        for t in &texts {
            writeln!(stdin, "{t}").expect("write");
        }
    }
    let out = child.wait_with_output().expect("wait");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), texts.len(), "{lines:?}");
    for (t, py) in texts.iter().zip(&lines) {
        let mut v: Value = serde_json::from_str(t).expect("JSON");
        v.as_object_mut().expect("object").remove("digest");
        let rust = tarfa_format::manifest::content_digest(&v);
        assert_eq!(&rust, py, "{t}");
    }
    // A number that overflows to infinity is refused by both.
    assert!(serde_json::from_str::<Value>(r#"{"x": 1e400}"#).is_err());
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo '{{\"x\": 1e400}}' | python3 {} --digest",
            path(&script())
        ))
        .output()
        .expect("run");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("refused"),
        "{out:?}"
    );
}

/// The violation tarfa's reader reports for `p` (open, then every data byte), by variant name.
fn rust_violation(p: &Path) -> Option<String> {
    let err = tarfa_format::JnfReader::open(p)
        .and_then(|r| r.verify_data())
        .err()?;
    let v = format!("{:?}", err.violation().expect("a format violation"));
    Some(
        v.split(|c: char| !c.is_alphanumeric())
            .next()
            .unwrap_or("")
            .to_string(),
    )
}

/// §9.2: the two readers refuse the same damaged bytes with the same `Violation` variant. Every
/// 61st byte of two golden files (and every byte of each header field, footer and record
/// boundary region listed) is flipped in turn.
#[test]
fn the_two_readers_name_the_same_violation_for_every_flipped_byte() {
    if !python_ready("flips") {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    for name in ["fused-gate-up.jnf", "tiny-moe/layer-00001.jnf"] {
        let good = std::fs::read(golden(name)).expect("read");
        let n = good.len();
        let mut at: Vec<usize> = (0..n).step_by(61).collect();
        at.extend((0..96).chain(n - 160..n)); // header fields, the whole footer
        let mut paths = Vec::new();
        let mut want = Vec::new();
        for (k, &i) in at.iter().enumerate() {
            let mut b = good.clone();
            b[i] ^= 0x20;
            let p = tmp.path().join(format!("{k}.jnf"));
            std::fs::write(&p, &b).expect("write");
            want.push(rust_violation(&p));
            paths.push(p);
        }
        let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
        let (_, res, err) = py_read(&refs);
        for ((r, w), &i) in res.iter().zip(&want).zip(&at) {
            let py = (r["ok"] == false).then(|| r["violation"].as_str().unwrap_or("").to_string());
            assert_eq!(&py, w, "{name}: byte {i} flipped: python {r}{err}");
            checked += 1;
        }
    }
    assert!(checked > 400, "{checked}");
}
