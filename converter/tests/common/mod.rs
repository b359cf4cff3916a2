//! Shared by the converter's integration tests: the independent reading of a source checkpoint
//! (the safetensors crate, never tarfa's own reader), directory snapshots, generated checkpoints
//! in layouts the testkit does not write, and header surgery.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;
use tarfa_converter::{convert, ConvertError, Options, Quiet, Summary};

/// A checkpoint of `fixtures/hf/`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/hf")
        .join(name)
}

/// Names of the five transformers-made fixtures.
pub const FIXTURES: [&str; 5] = [
    "qwen3_moe",
    "qwen3_moe_b",
    "qwen3_5_moe_text",
    "glm4_moe",
    "mixtral",
];

/// Convert with the options the CLI uses by default (`O_DIRECT` where allowed), no progress.
pub fn run(src: &Path, out: &Path, layers: Option<(u32, u32)>) -> Result<Summary, ConvertError> {
    let opts = Options {
        layers,
        direct_io: true,
        ..Options::default()
    };
    convert(src, out, &opts, &Quiet)
}

/// Every file of a directory (it has no subdirectories), by name.
pub fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("list directory") {
        let e = e.expect("directory entry");
        assert!(
            e.file_type().expect("file type").is_file(),
            "{}: only plain files expected",
            e.path().display()
        );
        let name = e.file_name().to_string_lossy().into_owned();
        files.insert(name, std::fs::read(e.path()).expect("read file"));
    }
    files
}

/// Assert two snapshots hold the same file names and the same bytes, naming the first difference.
pub fn assert_same_files(
    got: &BTreeMap<String, Vec<u8>>,
    want: &BTreeMap<String, Vec<u8>>,
    what: &str,
) {
    let names = |s: &BTreeMap<String, Vec<u8>>| s.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(got), names(want), "{what}: file sets differ");
    for (name, bytes) in want {
        let g = &got[name];
        if g != bytes {
            let at = g.iter().zip(bytes).position(|(a, b)| a != b);
            panic!(
                "{what}: {name} differs ({} vs {} bytes, first differing byte {at:?})",
                g.len(),
                bytes.len()
            );
        }
    }
}

/// The JNF and manifest files of an output directory: what must not exist after a failure.
pub fn published_outputs(out: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".jnf") || n == "manifest.json")
        .collect();
    names.sort();
    names
}

/// Temporary files left in a directory (`.NAME.tmp-PID`).
pub fn temp_files(out: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(out) else {
        return Vec::new();
    };
    rd.map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect()
}

/// One source shard as the safetensors crate reads it.
#[derive(Debug)]
pub struct SourceShard {
    /// Name relative to the checkpoint directory.
    pub rel: String,
    /// The whole file.
    pub bytes: Vec<u8>,
}

impl SourceShard {
    /// The safetensors crate's view of the file.
    pub fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes)
            .unwrap_or_else(|e| panic!("{}: safetensors refuses it: {e}", self.rel))
    }

    /// Absolute `[begin, end)` of a tensor's bytes in the file, from the crate's header reading.
    pub fn span(&self, tensor: &str) -> (u64, u64) {
        let (n, meta) = SafeTensors::read_metadata(&self.bytes).expect("header");
        let info = meta.info(tensor).expect("tensor in header");
        let base = 8 + n as u64;
        (
            base + info.data_offsets.0 as u64,
            base + info.data_offsets.1 as u64,
        )
    }
}

/// The shards of a checkpoint, found the way Hugging Face finds them: the index's weight map,
/// else every `*.safetensors` file.
pub fn source_shards(dir: &Path) -> Vec<SourceShard> {
    let index = dir.join("model.safetensors.index.json");
    let mut names: Vec<String> = if index.exists() {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&index).expect("read index")).expect("JSON");
        v["weight_map"]
            .as_object()
            .expect("weight_map")
            .values()
            .map(|s| s.as_str().expect("shard name").to_string())
            .collect()
    } else {
        std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect()
    };
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|rel| SourceShard {
            bytes: std::fs::read(dir.join(&rel)).expect("read shard"),
            rel,
        })
        .collect()
}

/// Deterministic bytes for a generated tensor (the testkit's generator).
pub fn tensor_bytes(name: &str, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    tarfa_converter::testkit::fill(name, &mut b, 0);
    b
}

/// A tensor to generate: name, dtype, shape.
pub type TensorDef = (String, Dtype, Vec<usize>);

fn byte_len(dtype: Dtype, shape: &[usize]) -> usize {
    shape.iter().product::<usize>() * dtype.bitsize() / 8
}

/// Write `tensors` as shards named `model-0000K-of-0000N.safetensors` (one run of tensors per
/// shard, in the given order) with the safetensors crate, plus an index when `shards > 1`
/// (else a single `model.safetensors`), and `config.json`.
pub fn write_with_safetensors(
    dir: &Path,
    tensors: &[TensorDef],
    shards: usize,
    config: &serde_json::Value,
) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let per = tensors.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (k, run) in tensors.chunks(per).enumerate() {
        let file = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, shards)
        };
        let data: Vec<Vec<u8>> = run
            .iter()
            .map(|(n, d, s)| tensor_bytes(n, byte_len(*d, s)))
            .collect();
        let views: Vec<(String, TensorView<'_>)> = run
            .iter()
            .zip(&data)
            .map(|((n, d, s), b)| {
                (
                    n.clone(),
                    TensorView::new(*d, s.clone(), b).expect("tensor view"),
                )
            })
            .collect();
        let meta = Some(
            [("format".to_string(), "pt".to_string())]
                .into_iter()
                .collect(),
        );
        safetensors::serialize_to_file(views, meta, &dir.join(&file)).expect("serialize");
        for (n, _, _) in run {
            weight_map.insert(n.clone(), file.clone().into());
        }
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index).expect("json"),
        )
        .expect("write index");
    }
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_vec_pretty(config).expect("json"),
    )
    .expect("write config");
}

fn attention(p: &str, h: usize) -> Vec<TensorDef> {
    let bf = Dtype::BF16;
    vec![
        (format!("{p}.input_layernorm.weight"), bf, vec![h]),
        (format!("{p}.self_attn.q_proj.weight"), bf, vec![h, h]),
        (format!("{p}.self_attn.k_proj.weight"), bf, vec![h / 2, h]),
        (format!("{p}.self_attn.v_proj.weight"), bf, vec![h / 2, h]),
        (format!("{p}.self_attn.o_proj.weight"), bf, vec![h, h]),
        (format!("{p}.post_attention_layernorm.weight"), bf, vec![h]),
    ]
}

fn trunk(h: usize, vocab: usize) -> Vec<TensorDef> {
    vec![
        (
            "model.embed_tokens.weight".into(),
            Dtype::BF16,
            vec![vocab, h],
        ),
        ("model.norm.weight".into(), Dtype::BF16, vec![h]),
        ("lm_head.weight".into(), Dtype::BF16, vec![vocab, h]),
    ]
}

/// A Mixtral-shaped checkpoint (`block_sparse_moe.experts.E.w1/w3/w2`), sharded in two with an
/// index: the testkit writes only Qwen3-MoE names.
pub fn write_mixtral_style(dir: &Path, layers: usize, experts: usize) {
    let (h, i) = (64, 32);
    let mut t = trunk(h, 96);
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        t.extend(attention(&p, h));
        t.push((
            format!("{p}.block_sparse_moe.gate.weight"),
            Dtype::BF16,
            vec![experts, h],
        ));
        for e in 0..experts {
            let x = format!("{p}.block_sparse_moe.experts.{e}");
            t.push((format!("{x}.w1.weight"), Dtype::BF16, vec![i, h]));
            t.push((format!("{x}.w2.weight"), Dtype::BF16, vec![h, i]));
            t.push((format!("{x}.w3.weight"), Dtype::BF16, vec![i, h]));
        }
    }
    let config = serde_json::json!({
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "num_hidden_layers": layers,
        "num_local_experts": experts,
    });
    write_with_safetensors(dir, &t, 2, &config);
}

/// A fused checkpoint in the other dimension order, GPT-OSS style: `gate_up_proj` [E, H, 2I]
/// with an F32 bias [E, 2I], `down_proj` [E, I, H] with a bias [E, H], and an F32 router bias.
pub fn write_fused_transposed(dir: &Path, layers: usize, experts: usize) {
    let (h, i) = (64, 32);
    let mut t = trunk(h, 96);
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        t.extend(attention(&p, h));
        let x = format!("{p}.mlp.experts");
        t.push((
            format!("{p}.mlp.router.weight"),
            Dtype::BF16,
            vec![experts, h],
        ));
        t.push((format!("{p}.mlp.router.bias"), Dtype::F32, vec![experts]));
        t.push((
            format!("{x}.gate_up_proj"),
            Dtype::BF16,
            vec![experts, h, 2 * i],
        ));
        t.push((
            format!("{x}.gate_up_proj_bias"),
            Dtype::F32,
            vec![experts, 2 * i],
        ));
        t.push((format!("{x}.down_proj"), Dtype::BF16, vec![experts, i, h]));
        t.push((format!("{x}.down_proj_bias"), Dtype::F32, vec![experts, h]));
    }
    let config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "num_hidden_layers": layers,
        "num_local_experts": experts,
    });
    write_with_safetensors(dir, &t, 1, &config);
}

/// Rewrite one shard's JSON header with `edit` and keep its data bytes as they are (the file is
/// re-laid out with a correct header length).
pub fn edit_header(
    path: &Path,
    edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>),
) {
    let bytes = std::fs::read(path).expect("read shard");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).expect("header JSON");
    edit(&mut header);
    let mut json = serde_json::to_vec(&header).expect("json");
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).expect("write shard");
}

/// Tensors of a header in data order: (name, begin, end) relative to the data area.
pub fn header_entries(path: &Path) -> Vec<(String, u64, u64)> {
    let bytes = std::fs::read(path).expect("read shard");
    let (_, meta) = SafeTensors::read_metadata(&bytes).expect("header");
    let mut v: Vec<(String, u64, u64)> = meta
        .tensors()
        .into_iter()
        .map(|(n, i)| (n, i.data_offsets.0 as u64, i.data_offsets.1 as u64))
        .collect();
    v.sort_by_key(|e| e.1);
    v
}
