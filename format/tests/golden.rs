//! The golden vectors in `fixtures/golden/` are what the generator writes today (regenerate with
//! `TARFA_BLESS=1 cargo test -p tarfa-format --test golden`), their expected hashes are recorded
//! in `SHA256SUMS`, and each vector reads back as the spec says.

use std::path::{Path, PathBuf};

use sha2::Digest;
use tarfa_format::golden::{self, region_bytes, SINGLE_EXPERT, TINY_MOE};
use tarfa_format::manifest::{FileKind, Manifest};
use tarfa_format::{Dtype, JnfReader, Role};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/golden")
}

fn sums(dir: &Path, files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|f| {
            let bytes = std::fs::read(dir.join(f)).expect("read vector");
            format!(
                "{}  {}\n",
                hex::encode(sha2::Sha256::digest(&bytes)),
                f.display()
            )
        })
        .collect()
}

#[test]
fn golden_vectors_match_the_generator_and_their_recorded_hashes() {
    let fresh = tempfile::tempdir().expect("tempdir");
    let files = golden::write_all(fresh.path()).expect("generate");
    let expected_sums = sums(fresh.path(), &files);
    let dir = golden_dir();
    if std::env::var_os("TARFA_BLESS").is_some() {
        let _ = std::fs::remove_dir_all(&dir);
        golden::write_all(&dir).expect("bless");
        std::fs::write(dir.join("SHA256SUMS"), &expected_sums).expect("write sums");
        return;
    }
    let recorded = std::fs::read_to_string(dir.join("SHA256SUMS"))
        .expect("fixtures/golden/SHA256SUMS exists (bless with TARFA_BLESS=1)");
    assert_eq!(
        recorded, expected_sums,
        "golden vectors are stale: the generator now writes other bytes; review, then bless"
    );
    for f in &files {
        let committed = std::fs::read(dir.join(f)).expect("committed vector exists");
        let generated = std::fs::read(fresh.path().join(f)).expect("generated");
        assert!(
            committed == generated,
            "{} differs from the generator's output",
            f.display()
        );
    }
}

fn open(rel: &str) -> JnfReader {
    let r = JnfReader::open(golden_dir().join(rel)).expect("golden vector opens");
    r.verify_data().expect("golden vector verifies");
    r
}

#[test]
fn edge_sizes_hold_regions_of_4095_4096_4097_and_zero_bytes_each_page_aligned() {
    let r = open("edge-sizes.jnf");
    let lens: Vec<(String, u64, u64)> = (0..r.regions().len() as u32)
        .map(|i| {
            let rec = &r.regions()[i as usize];
            (r.name(i).to_string(), rec.offset, rec.length)
        })
        .collect();
    assert_eq!(
        lens,
        vec![
            ("bytes_4095".to_string(), 4096, 4095),
            ("empty".to_string(), 8192, 0),
            ("bytes_4096".to_string(), 8192, 4096),
            ("bytes_4097".to_string(), 12288, 4097),
            ("scalar".to_string(), 20480, 4),
        ]
    );
    for i in 0..r.regions().len() as u32 {
        let want = region_bytes(
            r.name(i),
            r.regions()[i as usize].dtype().expect("dtype"),
            r.regions()[i as usize].length,
        );
        assert_eq!(r.read_region_verified(i).expect("read"), want);
    }
}

#[test]
fn last_expert_of_a_file_reads_back_exactly_through_pread_and_a_whole_file_read() {
    let r = open("tiny-moe/layer-00001.jnf");
    let (layer, expert) = (1, TINY_MOE.experts - 1);
    let e = r.expert(layer, expert).expect("last expert");
    let map = std::fs::read(r.path()).expect("read whole file");
    for role in [Role::Gate, Role::Up, Role::Down] {
        let i = r.projection(layer, expert, role).expect("projection");
        let want = TINY_MOE.projection_bytes(layer, expert, role);
        assert_eq!(r.read_region_verified(i).expect("pread"), want);
        assert_eq!(r.region_in(&map, i), &want[..]);
    }
    // The last expert's extent ends where the index begins.
    assert_eq!(e.extent_offset + e.extent_len, r.footer().index_offset);
    assert_eq!(r.expert(layer, TINY_MOE.experts), None);
    assert_eq!(r.expert(2, 0), None);
}

#[test]
fn model_directories_have_manifests_that_match_their_files() {
    for (dir, model) in [("tiny-moe", TINY_MOE), ("single-expert", SINGLE_EXPERT)] {
        let root = golden_dir().join(dir);
        let m = Manifest::load(&root).expect("manifest");
        assert_eq!(m.layers, (0..model.layers).collect::<Vec<_>>());
        for f in &m.files {
            let path = root.join(&f.path);
            assert_eq!(std::fs::metadata(&path).expect("stat").len(), f.size);
            let (sha, b3) = if f.kind == FileKind::Aux {
                let bytes = std::fs::read(&path).expect("read");
                (
                    hex::encode(sha2::Sha256::digest(&bytes)),
                    blake3::hash(&bytes).to_hex().to_string(),
                )
            } else {
                let r = JnfReader::open(&path).expect("open");
                r.verify_data().expect("verify");
                (hex::encode(r.root().sha256), hex::encode(r.root().blake3))
            };
            assert_eq!(
                (sha, b3),
                (f.sha256.clone(), f.blake3.clone()),
                "{}",
                f.path
            );
        }
    }
}

#[test]
fn single_expert_model_keeps_its_quantized_q8_0_bytes() {
    let r = open("single-expert/layer-00000.jnf");
    assert_eq!(r.header().experts_per_layer, 1);
    let i = r.projection(0, 0, Role::Down).expect("down");
    let rec = &r.regions()[i as usize];
    assert_eq!(rec.dtype(), Some(Dtype::Q8_0));
    assert_eq!(rec.shape(), &[32, 64]);
    assert_eq!(rec.length, 32 * 2 * 34);
    assert_eq!(
        r.read_region(i).expect("read"),
        SINGLE_EXPERT.projection_bytes(0, 0, Role::Down)
    );
}

#[test]
fn fused_experts_record_where_each_slice_lies_in_the_source_tensor() {
    let r = open("fused-gate-up.jnf");
    let i = r.projection(5, 2, Role::GateUp).expect("gate_up");
    let rec = &r.regions()[i as usize];
    let idx = r.index();
    assert_eq!(idx.str(rec.src_file), "model.safetensors");
    assert_eq!(
        idx.str(rec.src_tensor),
        "model.layers.5.mlp.experts.gate_up_proj"
    );
    assert_eq!(rec.src_shape(), &[3, 32, 8]);
    assert_eq!(rec.src_begin, 1000 + 2 * rec.length);
    assert_eq!(rec.src_end - rec.src_begin, rec.length);
}

/// The hex dump in spec §11 is the golden `hex-example.jnf`, byte for byte: every listed line
/// matches, every line the dump leaves out (`*`) is zero, and the dump covers the whole file.
#[test]
fn the_spec_worked_example_is_the_golden_file() {
    let spec = std::fs::read_to_string(golden_dir().join("../../spec/JNF_V1.md")).expect("spec");
    let section = spec.split("## 11.").nth(1).expect("spec has §11");
    let dump = section.split("```").nth(1).expect("§11 has a code block");
    let file = std::fs::read(golden_dir().join("hex-example.jnf")).expect("vector");
    let mut expect = vec![0u8; file.len()];
    let mut listed = 0;
    for line in dump
        .lines()
        .filter(|l| l.len() > 10 && l.as_bytes()[8] == b':')
    {
        let off = usize::from_str_radix(&line[..8], 16).expect("offset");
        let hex: String = line[10..49].split_whitespace().collect();
        let bytes = hex::decode(&hex).expect("hex");
        expect[off..off + bytes.len()].copy_from_slice(&bytes);
        listed += 1;
    }
    assert!(listed > 10, "the dump lists the file's non-zero lines");
    assert!(
        expect == file,
        "spec §11 disagrees with fixtures/golden/hex-example.jnf"
    );
}

/// The manifest golden vector (spec §8.1.2, review finding 13): `manifest-jcs/manifest.json`
/// loads (digest and rules), its content's canonical JSON is `manifest-jcs.canonical.json` byte
/// for byte — RFC 8785 (JCS) as ECMAScript writes it (checked against node's `JSON.stringify`
/// when it was made), integers exact — and its digest is that file's SHA-256, recorded here so
/// that a change of the canonical form cannot pass unnoticed.
#[test]
fn manifest_golden_vector_is_rfc8785_canonical_json_with_exact_integers() {
    const DIGEST: &str = "3e768bb93e04359483622e7a69ba266f0a141cbfbf14a520c9a807a931cd195b";
    let dir = golden_dir().join("manifest-jcs");
    let m = Manifest::load(&dir).expect("the manifest golden vector loads");
    assert_eq!(m.conversion.sources[0].size, u64::MAX);
    let text = std::fs::read(dir.join("manifest.json")).expect("read");
    let mut v: serde_json::Value = serde_json::from_slice(&text).expect("JSON");
    let recorded = v
        .as_object_mut()
        .and_then(|o| o.remove("digest"))
        .expect("digest");
    let canonical = std::fs::read(golden_dir().join("manifest-jcs.canonical.json")).expect("read");
    assert!(tarfa_format::jcs::to_vec(&v) == canonical);
    assert_eq!(hex::encode(sha2::Sha256::digest(&canonical)), DIGEST);
    assert_eq!(recorded, DIGEST);
    assert_eq!(tarfa_format::manifest::content_digest(&v), DIGEST);
    let c = String::from_utf8(canonical).expect("UTF-8");
    for part in [
        "\"floats\":[1e+300,1e-7,1.5e-7,0.000001,0,0,0,0.1,5e-324,-5e-324,1.7976931348623157e+308,\
         1e+21,100000000000000000000,100,100,4.5,0.002,333333333.3333333,1424953923781206.2,",
        "\"integers\":[0,-1,9007199254740992,9007199254740993,18446744073709551615,\
         -9223372036854775808,1764547200123456789]",
        "\"past_64_bits\":[18446744073709552000,-9223372036854776000,1.2345678901234568e+29,\
         9007199254740992]",
        "\"\\u0000\\u001f\\b\\t\\n\\f\\r\\u000b\",\"\\\" \\\\ / /\"",
        // UTF-16 order: the emoji (D83D DE00) before U+E000 before U+FB33.
        "\"\u{1f600}\":\"Emoji: Grinning Face\",\"\u{e000}\":\"Private Use U+E000\",\"\u{fb33}\":",
        "{\"\":\"the empty key\",\"\\r\":\"Carriage Return\",\"1\":\"One\",\"A\":",
    ] {
        assert!(c.contains(part), "{part} not in {c}");
    }
}
