//! Shared by the decoder tests: fixtures converted to JNF once per test binary, and decoders
//! opened over them with chosen options.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tarfa_decode::{Decoder, DecoderOptions};
use tarfa_runtime::{probe_io_uring, BackendKind};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `fixtures/hf/NAME` converted into a temporary model directory (once per process).
pub fn model(name: &'static str) -> PathBuf {
    static DIRS: OnceLock<std::sync::Mutex<Vec<(&'static str, tempfile::TempDir)>>> =
        OnceLock::new();
    let dirs = DIRS.get_or_init(Default::default);
    let mut dirs = dirs.lock().expect("fixture lock");
    if let Some((_, d)) = dirs.iter().find(|(n, _)| *n == name) {
        return d.path().join("model");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("model");
    tarfa_converter::convert(
        &repo().join("fixtures/hf").join(name),
        &out,
        &tarfa_converter::Options {
            layers: None,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .expect("convert fixture");
    dirs.push((name, tmp));
    out
}

pub fn open(dir: &Path, opts: &DecoderOptions) -> Decoder {
    Decoder::open(dir, opts).expect("open decoder")
}

/// Logits of `n` greedy steps after `prompt`.
pub fn greedy(dec: &mut Decoder, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    dec.reset();
    let mut toks = Vec::new();
    let mut rows = Vec::new();
    dec.generate(prompt, n, |_, t, l| {
        toks.push(t);
        rows.push(l.to_vec());
        Ok(())
    })
    .expect("generate");
    (toks, rows)
}

/// Bit patterns of logits rows, for exact comparison (and readable failures).
pub fn bits(rows: &[Vec<f32>]) -> Vec<Vec<u32>> {
    rows.iter()
        .map(|r| r.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// The backends to test here; io_uring only where the kernel has it, unless CI requires it.
pub fn backends() -> Vec<BackendKind> {
    let mut v = vec![BackendKind::Pread, BackendKind::Mmap];
    match probe_io_uring() {
        Ok(_) => v.insert(0, BackendKind::IoUring),
        Err(why) => {
            assert!(
                !tarfa_runtime::source::require_io_uring_from_env(),
                "TARFA_REQUIRE_IO_URING is set but io_uring is unavailable: {why}"
            );
            eprintln!("note: io_uring backend not tested here: {why}");
        }
    }
    v
}

/// Reference prompts of `fixtures/reference/NAME/reference.json`.
pub struct RefPrompt {
    pub index: usize,
    pub text: String,
    pub prompt_ids: Vec<u32>,
    pub fp32_tokens: Vec<u32>,
    pub fp64_tokens: Vec<u32>,
}

pub fn reference(name: &str) -> Vec<RefPrompt> {
    let p = repo()
        .join("fixtures/reference")
        .join(name)
        .join("reference.json");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&p).expect("reference.json")).expect("json");
    let ids = |x: &serde_json::Value| -> Vec<u32> {
        x.as_array()
            .expect("id list")
            .iter()
            .map(|i| i.as_u64().expect("id") as u32)
            .collect()
    };
    v["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .enumerate()
        .map(|(i, p)| RefPrompt {
            index: i,
            text: p["text"].as_str().expect("text").to_string(),
            prompt_ids: ids(&p["prompt_ids"]),
            fp32_tokens: ids(&p["fp32_tokens"]),
            fp64_tokens: ids(&p["fp64_tokens"]),
        })
        .collect()
}
