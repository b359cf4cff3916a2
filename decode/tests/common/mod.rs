//! Shared by the decoder tests: fixtures converted to JNF once per test binary, and decoders
//! opened over them with chosen options.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tarfa_decode::{Decoder, DecoderOptions};

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

/// qwen3_moe_b with expert 0's up projections widened from BF16 to F32 (the same values, another
/// element type: gate and up of one expert differ in type), converted into `tmp/jnf`.
pub fn mixed_type_expert_model(tmp: &Path) -> PathBuf {
    use tarfa_format::safetensors::{parse_safetensors_header, safetensors_header_len};
    let src = repo().join("fixtures/hf/qwen3_moe_b");
    let mixed = tmp.join("mixed");
    std::fs::create_dir_all(&mixed).expect("mkdir");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), mixed.join(f)).expect("copy");
    }
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read");
    let n = safetensors_header_len(&bytes, bytes.len() as u64).expect("len") as usize;
    let h = parse_safetensors_header(&bytes[8..8 + n], bytes.len() as u64).expect("header");
    let mut json = serde_json::Map::new();
    let mut data = Vec::new();
    let mut widened = 0;
    for t in &h.tensors {
        let mut b = bytes[t.begin as usize..t.end as usize].to_vec();
        let mut dtype = t.dtype_name.clone();
        if t.name.ends_with(".mlp.experts.0.up_proj.weight") && dtype == "BF16" {
            b = b
                .chunks_exact(2)
                .flat_map(|c| (u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).to_le_bytes())
                .collect();
            dtype = "F32".into();
            widened += 1;
        }
        json.insert(
            t.name.clone(),
            serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [data.len(), data.len() + b.len()]}),
        );
        data.extend_from_slice(&b);
    }
    assert!(widened > 0, "the fixture has expert 0 up projections");
    let mut hdr = serde_json::to_vec(&json).expect("json");
    while !hdr.len().is_multiple_of(8) {
        hdr.push(b' ');
    }
    let mut file = (hdr.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&hdr);
    file.extend_from_slice(&data);
    std::fs::write(mixed.join("model.safetensors"), file).expect("write");
    let out = tmp.join("jnf");
    tarfa_converter::convert(
        &mixed,
        &out,
        &tarfa_converter::Options {
            layers: None,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .expect("convert");
    out
}
