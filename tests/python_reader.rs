//! The second reader (review finding 15): `tests/jnf_reader.py`, written in Python from
//! spec/JNF_V1.md alone, must accept every golden vector and every model tarfa converts from the
//! fixtures, compute the same root digests the manifest records, and refuse damaged files. Two
//! readers agreeing is the proof that the spec, not the Rust code, is the contract.
//!
//! python3 with the `blake3` package (scripts/test.sh installs it) is needed: without it the tests
//! skip, saying so, or fail where tools are required (`tarfa_testtools`: `TARFA_REQUIRE_TOOLS=1`,
//! as `.ci/run` sets, or `CI`).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{gguf_fixture, golden, path, tarfa};
use serde_json::Value;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jnf_reader.py")
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
        // §8.1 files[].sources[].tensors_blake3, computed by the second reader from the regions.
        if let Some(reads) = entry["sources"].as_array() {
            for r in reads {
                let path = r["path"].as_str().expect("path");
                assert_eq!(
                    got["tensors_blake3"][path], r["tensors_blake3"],
                    "{} {path}",
                    entry["path"]
                );
            }
            assert_eq!(
                got["tensors_blake3"].as_object().map(|o| o.len()),
                Some(reads.len()),
                "{}",
                entry["path"]
            );
        }
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
    if !tarfa_testtools::python_blake3() {
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
    if !tarfa_testtools::python_blake3() {
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

/// Rewrite `dir`'s manifest through `edit`, its digest recomputed (§8.1.2).
fn reseal_manifest(dir: &Path, edit: impl FnOnce(&mut Value)) {
    let path = dir.join("manifest.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("json");
    v.as_object_mut().expect("object").remove("digest");
    edit(&mut v);
    let d = tarfa_format::manifest::content_digest(&v);
    v.as_object_mut()
        .expect("object")
        .insert("digest".into(), Value::String(d));
    std::fs::write(&path, serde_json::to_vec_pretty(&v).expect("json")).expect("write");
}

/// `fixtures/hf/qwen3_moe` converted into `tmp/m`: the model directory and its manifest's bytes.
fn converted_qwen3_moe(tmp: &Path) -> (PathBuf, Vec<u8>) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let out = tmp.join("m");
    let (code, stdout, err) = tarfa(&["convert", path(&src), "-o", path(&out), "-q"]);
    assert_eq!(code, 0, "{stdout}{err}");
    let clean = std::fs::read(out.join("manifest.json")).expect("read");
    (out, clean)
}

/// §8.2 (issue 13, item 5): a manifest whose layers record two identities of one source file,
/// or a tensors digest that is not the file's, is refused by the second reader as `tarfa
/// verify` reports it.
#[test]
fn the_python_reader_refuses_mixed_source_generations_and_a_wrong_tensors_digest() {
    if !tarfa_testtools::python_blake3() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let (out, clean) = converted_qwen3_moe(tmp.path());
    let layer1 = |v: &Value| -> usize {
        v["files"]
            .as_array()
            .expect("files")
            .iter()
            .position(|f| f["path"] == "layer-00001.jnf")
            .expect("layer 1")
    };
    reseal_manifest(&out, |v| {
        let i = layer1(v);
        let t = v["files"][i]["sources"][0]["ctime_ns"]
            .as_i64()
            .expect("ctime_ns");
        v["files"][i]["sources"][0]["ctime_ns"] = Value::from(t + 1);
    });
    assert_refused(&out, "MixedSources");
    let (code, stdout, _) = tarfa(&["verify", path(&out)]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("mixed sources"), "{stdout}");

    std::fs::write(out.join("manifest.json"), &clean).expect("restore");
    reseal_manifest(&out, |v| {
        let i = layer1(v);
        v["files"][i]["sources"][0]["tensors_blake3"] = Value::String("0".repeat(64));
    });
    assert_refused(&out, "SourceRecordMismatch");
}

/// Review finding 14: a manifest's source path obeys the rule a region's `src_file` obeys
/// (§5.1): `a\..\b`, `C:x`, a NUL and a `.` component are refused by both readers, the paths
/// renamed everywhere the manifest names them so that nothing but the rule can refuse them.
#[test]
fn both_readers_refuse_a_manifest_source_path_that_breaks_the_src_file_rule() {
    if !tarfa_testtools::python_blake3() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let (out, clean) = converted_qwen3_moe(tmp.path());
    for bad in ["a\\..\\b", "C:x", "a\0b", "a/./model.safetensors"] {
        std::fs::write(out.join("manifest.json"), &clean).expect("restore");
        reseal_manifest(&out, |v| {
            let old = v["conversion"]["sources"][0]["path"].clone();
            v["conversion"]["sources"][0]["path"] = Value::from(bad);
            for f in v["files"].as_array_mut().expect("files") {
                for r in f["sources"].as_array_mut().into_iter().flatten() {
                    if r["path"] == old {
                        r["path"] = Value::from(bad);
                    }
                }
            }
        });
        let (_, res, err) = py_read(&[&out]);
        assert_eq!(res[0]["violation"], "Manifest", "{bad:?}: {}{err}", res[0]);
        let detail = res[0]["detail"].as_str().unwrap_or("");
        assert!(detail.contains("source path"), "{bad:?}: {detail}");
        let (code, stdout, err) = tarfa(&["verify", path(&out)]);
        assert_eq!(code, 1, "{bad:?}: {stdout}{err}");
        assert!(
            format!("{stdout}{err}").contains("is not a plain relative path"),
            "{bad:?}: {stdout}{err}"
        );
    }
}

#[test]
fn the_python_reader_refuses_damaged_files() {
    if !tarfa_testtools::python_blake3() {
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
    if !tarfa_testtools::python_blake3() {
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
        r#"{"ties": [1424953923781206.25, 333333333.33333329, 9.999999999999997e22, 1e21, 1e20]}"#,
        r#"{"\ufb33": 1, "\ud83d\ude00": 2, "\ue000": 3, "\uffff": 4, "\u0080": 5, "": 6}"#,
        r#"{"i": [9007199254740993, 9007199254740993.0, -9223372036854775809, 1e-7, 1e-6]}"#,
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

/// The manifest golden vector (§8.1.2, review finding 13): the second reader accepts its
/// directory with the digest it records, and writes the same canonical bytes as the committed
/// `manifest-jcs.canonical.json` (which tarfa's own test holds its canonical form to).
#[test]
fn the_python_reader_writes_the_manifest_golden_vector_s_canonical_bytes() {
    if !tarfa_testtools::python_blake3() {
        return;
    }
    let dir = golden("manifest-jcs");
    let (code, res, err) = py_read(&[&dir]);
    assert_eq!(code, 0, "{res:?}{err}");
    assert_eq!(
        res[0]["manifest_digest"],
        "3e768bb93e04359483622e7a69ba266f0a141cbfbf14a520c9a807a931cd195b"
    );
    let out = Command::new("python3")
        .arg(script())
        .arg("--canonical")
        .arg(dir.join("manifest.json"))
        .output()
        .expect("run python3");
    assert!(out.status.success(), "{out:?}");
    let want = std::fs::read(golden("manifest-jcs.canonical.json")).expect("read");
    assert!(
        out.stdout == want,
        "python canonical form differs:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&want)
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
    if !tarfa_testtools::python_blake3() {
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

/// Writes damaged copies of SRC into OUT, each *resealed* (header, index and footer hashes
/// recomputed) so the damage reaches the rule it breaks, and prints their names.
const RESEAL: &str = r#"
import struct, sys, blake3, hashlib
src, out = sys.argv[1], sys.argv[2]
good = open(src, "rb").read()
n = len(good)
F = n - 160
io, il = struct.unpack_from("<QQ", good, F + 16)
R, E = struct.unpack_from("<II", good, F + 32)
T = io + 288 * R + 96 * E  # string table
def reseal(b):
    b[48:80] = blake3.blake3(bytes(b[:48])).digest()
    io, il = struct.unpack_from("<QQ", b, F + 16)
    if io + il <= F:
        ix = bytes(b[io:io + il])
        b[F + 40:F + 72] = blake3.blake3(ix).digest()
        b[F + 72:F + 104] = hashlib.sha256(ix).digest()
    b[F + 128:F + 160] = blake3.blake3(bytes(b[:4096]) + bytes(b[F:F + 128])).digest()
def put(fmt, at, v):
    return lambda b: struct.pack_into(fmt, b, at, v)
def add(fmt, at, d):
    m = 1 << (8 * struct.calcsize(fmt))
    return lambda b: struct.pack_into(fmt, b, at, (struct.unpack_from(fmt, b, at)[0] + d) % m)
r0, r1, e0 = io, io + 288, io + 288 * R
cases = {
  "minor1_reserved": lambda b: (put("<H", 10, 1)(b), put("<B", 100, 7)(b)),
  "header_reserved": put("<B", 12, 1), "required_flag": put("<Q", 16, 1),
  "major2": put("<H", 8, 2), "no_layers": put("<I", 36, 0), "layer_first_max": put("<I", 32, 0xFFFFFFFE),
  "footer_reserved": put("<B", F + 110, 1), "file_len": add("<Q", F + 8, 4096),
  "index_offset": add("<Q", F + 16, 4096), "index_offset_odd": add("<Q", F + 16, 8),
  "index_len_big": put("<Q", F + 24, 1 << 31), "index_len_more": add("<Q", F + 24, 1),
  "region_count": add("<I", F + 32, 1), "expert_count": add("<I", F + 36, -1),
  "r0_offset": add("<Q", r0, 4096), "r1_offset": add("<Q", r1, -4096), "r0_length": add("<Q", r0 + 8, 1),
  "r0_dtype": put("<I", r0 + 16, 4), "r0_dtype_u8": put("<I", r0 + 16, 0x10001), "r0_ndim": put("<I", r0 + 20, 9),
  "r0_shape_tail": put("<Q", r0 + 24 + 7 * 8, 1), "r0_shape": add("<Q", r0 + 24, 1),
  "r0_layer": put("<I", r0 + 88, 7), "r0_expert": put("<I", r0 + 92, 0), "r0_role": put("<I", r0 + 96, 9),
  "r0_name_len": put("<I", r0 + 104, 0), "r0_name_off": add("<I", r0 + 100, 1), "r0_name_big": put("<I", r0 + 104, 5000),
  "r0_src_dtype": put("<I", r0 + 124, 0), "r0_src_ndim": put("<I", r0 + 128, 9), "r0_reserved": put("<B", r0 + 133, 1),
  "r0_src_begin": add("<Q", r0 + 136, 1), "r0_src_end": put("<Q", r0 + 144, 0),
  "r0_tail": put("<B", r0 + 281, 1), "r0_hash": lambda b: b.__setitem__(r0 + 216, b[r0 + 216] ^ 1),
  "str_utf8": put("<B", T, 0xFF), "str_nul": put("<B", T, 0), "str_backslash": put("<B", T + 1, 0x5C),
  "str_colon": put("<B", T + 1, 0x3A), "str_slash": put("<B", T, 0x2F),
  "last_string_byte": lambda b: None,
}
if E:
  cases.update({
    "e0_layer": add("<I", e0, 1), "e0_expert": add("<I", e0 + 4, 1), "e0_first": add("<I", e0 + 8, 1),
    "e0_count0": put("<I", e0 + 12, 0), "e0_count9": put("<I", e0 + 12, 9), "e0_count_more": add("<I", e0 + 12, 1),
    "e0_extent_off": add("<Q", e0 + 16, 4096), "e0_extent_len": add("<Q", e0 + 24, 4096),
    "e0_sha": lambda b: b.__setitem__(e0 + 40, b[e0 + 40] ^ 1), "e0_b3": lambda b: b.__setitem__(e0 + 70, b[e0 + 70] ^ 1),
    "e1_first": put("<I", e0 + 96 + 8, 0), "last_region_role": put("<I", io + 288 * (R - 1) + 96, 0),
  })
so, sl = struct.unpack_from("<II", good, r0 + 108)  # region 0's src_file
def at_src(text):
    return lambda b: b.__setitem__(slice(T + so, T + so + len(text)), text)
if sl > 3:  # '\' separates and '.', '..', ':' are refused (§5.1)
  cases.update({"src_colon": at_src(b"C:"), "src_dot": at_src(b"./"), "src_dotdot_bs": at_src(b"..\\"),
                "src_bs": at_src(b"a\\"), "src_abs": at_src(b"/"), "src_empty_comp": at_src(b"a//")})
for k, f in cases.items():
    b = bytearray(good)
    f(b)
    reseal(b)
    open(f"{out}/{k}.jnf", "wb").write(b)
    print(k)
"#;

/// §9.2 at the level of each rule: damage resealed so it reaches the rule (a header field, a
/// footer field, a region record, an expert record, the string table) is refused by both readers
/// with the same `Violation` variant, and what one accepts the other accepts.
#[test]
fn the_two_readers_name_the_same_violation_for_every_resealed_rule_breach() {
    if !tarfa_testtools::python_blake3() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut refused = 0;
    for (i, name) in [
        "fused-gate-up.jnf",
        "tiny-moe/layer-00001.jnf",
        "edge-sizes.jnf",
    ]
    .iter()
    .enumerate()
    {
        let dir = tmp.path().join(format!("{i}"));
        std::fs::create_dir(&dir).expect("mkdir");
        let out = Command::new("python3")
            .args(["-c", RESEAL, path(&golden(name)), path(&dir)])
            .output()
            .expect("run python3");
        assert!(out.status.success(), "{out:?}");
        let cases: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|k| dir.join(format!("{k}.jnf")))
            .collect();
        let refs: Vec<&Path> = cases.iter().map(|p| p.as_path()).collect();
        let (_, res, err) = py_read(&refs);
        for (r, p) in res.iter().zip(&cases) {
            let py = (r["ok"] == false).then(|| r["violation"].as_str().unwrap_or("").to_string());
            let rust = rust_violation(p);
            assert_eq!(py, rust, "{name}: {}: python {r}{err}", p.display());
            refused += usize::from(rust.is_some());
        }
    }
    assert!(refused > 100, "{refused}");
}
