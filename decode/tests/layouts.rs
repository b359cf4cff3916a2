//! The same weights in either checkpoint layout give the same bits: each fixture rewritten with
//! its per-expert tensors (`mlp.experts.E.{gate,up,down}_proj.weight`, Mixtral's
//! `block_sparse_moe.experts.E.{w1,w3,w2}.weight`) fused into transformers 5's 3-D
//! `mlp.experts.gate_up_proj [E, 2I, H]` and `mlp.experts.down_proj [E, H, I]` (Mixtral's router
//! moved to `mlp.gate.weight`, as transformers 5 names it in memory), converted and decoded,
//! gives logits bit-identical to the per-expert checkpoint's at every greedy step. And the
//! Qwen3.5 text fixture rewritten as a `qwen3_5_moe` (vision-language) checkpoint — its config
//! nested under `text_config`, its tensors under `model.language_model.`, a vision tower beside
//! them — decodes to the text checkpoint's bits.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use tarfa_decode::DecoderOptions;
use tarfa_format::safetensors::{parse_safetensors_header, safetensors_header_len};

/// (layer, expert, projection) of a per-expert tensor name, projection 0 gate, 1 up, 2 down.
fn per_expert(name: &str) -> Option<(String, usize, usize)> {
    let (prefix, rest) = name
        .split_once(".mlp.experts.")
        .or_else(|| name.split_once(".block_sparse_moe.experts."))?;
    let (e, proj) = rest.split_once('.')?;
    let p = match proj {
        "gate_proj.weight" | "w1.weight" => 0,
        "up_proj.weight" | "w3.weight" => 1,
        "down_proj.weight" | "w2.weight" => 2,
        _ => return None,
    };
    Some((prefix.to_string(), e.parse().ok()?, p))
}

/// Tensors of a safetensors file by name: (dtype name, shape, bytes), in name order.
type Tensors = BTreeMap<String, (String, Vec<u64>, Vec<u8>)>;

fn write_safetensors(path: &Path, out: &Tensors) {
    let mut json = serde_json::Map::new();
    let mut at = 0usize;
    for (name, (dtype, shape, b)) in out {
        json.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [at, at + b.len()]}),
        );
        at += b.len();
    }
    let mut h = serde_json::to_vec(&json).expect("json");
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    for (_, _, b) in out.values() {
        file.extend_from_slice(b);
    }
    std::fs::write(path, file).expect("write");
}

fn read_safetensors(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).expect("read");
    let n = safetensors_header_len(&bytes, bytes.len() as u64).expect("header len") as usize;
    let header = parse_safetensors_header(&bytes[8..8 + n], bytes.len() as u64).expect("header");
    header
        .tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                (
                    t.dtype_name.clone(),
                    t.shape.clone(),
                    bytes[t.begin as usize..t.end as usize].to_vec(),
                ),
            )
        })
        .collect()
}

#[test]
fn a_qwen3_5_moe_vision_language_checkpoint_decodes_as_its_text_model() {
    let name = "qwen3_5_moe_text";
    let src = common::repo().join("fixtures/hf").join(name);
    let tmp = tempfile::tempdir().expect("tmp");
    let vl = tmp.path().join("vl");
    std::fs::create_dir_all(&vl).expect("mkdir");
    std::fs::copy(src.join("tokenizer.json"), vl.join("tokenizer.json")).expect("copy");
    let text: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("json");
    let config = serde_json::json!({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "vision_config": {"depth": 1, "hidden_size": 16},
        "tie_word_embeddings": false,
    });
    std::fs::write(
        vl.join("config.json"),
        serde_json::to_vec_pretty(&config).expect("json"),
    )
    .expect("write");
    let mut out = Tensors::new();
    for (n, t) in read_safetensors(&src.join("model.safetensors")) {
        let n = match n.strip_prefix("model.") {
            Some(rest) => format!("model.language_model.{rest}"),
            None => n, // lm_head.weight stays top-level
        };
        out.insert(n, t);
    }
    // A vision tower the text decoder never reads.
    out.insert(
        "model.visual.patch_embed.proj.weight".into(),
        ("BF16".into(), vec![16, 8], vec![0u8; 256]),
    );
    write_safetensors(&vl.join("model.safetensors"), &out);
    let jnf = tmp.path().join("vl-jnf");
    tarfa_converter::convert(
        &vl,
        &jnf,
        &tarfa_converter::Options {
            layers: None,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .expect("convert the VL checkpoint");
    let mut a = common::open(&common::model(name), &DecoderOptions::default());
    let mut b = common::open(&jnf, &DecoderOptions::default());
    for p in common::reference(name) {
        let (ta, la) = common::greedy(&mut a, &p.prompt_ids, 16);
        let (tb, lb) = common::greedy(&mut b, &p.prompt_ids, 16);
        assert_eq!(ta, tb, "prompt {}", p.index);
        assert_eq!(common::bits(&la), common::bits(&lb), "prompt {}", p.index);
    }
}

/// Rewrite `src`'s model.safetensors into `dst` with fused expert tensors; other files copied.
fn fuse(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).expect("mkdir");
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dst.join(f)).expect("copy");
    }
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read");
    let n = safetensors_header_len(&bytes, bytes.len() as u64).expect("header len") as usize;
    let header = parse_safetensors_header(&bytes[8..8 + n], bytes.len() as u64).expect("header");
    let data =
        |t: &tarfa_format::safetensors::HeaderTensor| &bytes[t.begin as usize..t.end as usize];
    // Output tensors in name order: (dtype name, shape, bytes).
    let mut out = Tensors::new();
    // layer prefix → expert → [gate, up, down]
    let mut experts: BTreeMap<String, BTreeMap<usize, [Option<usize>; 3]>> = BTreeMap::new();
    for (i, t) in header.tensors.iter().enumerate() {
        match per_expert(&t.name) {
            Some((prefix, e, p)) => {
                experts.entry(prefix).or_default().entry(e).or_default()[p] = Some(i);
            }
            None => {
                let name = t.name.replace(".block_sparse_moe.gate.", ".mlp.gate.");
                out.insert(
                    name,
                    (t.dtype_name.clone(), t.shape.clone(), data(t).to_vec()),
                );
            }
        }
    }
    assert!(
        !experts.is_empty(),
        "{}: no per-expert tensors",
        src.display()
    );
    for (prefix, by_e) in experts {
        let (mut gu, mut dn) = (Vec::new(), Vec::new());
        let (mut gu_shape, mut dn_shape) = (Vec::new(), Vec::new());
        let mut dtype = String::new();
        for (k, (e, parts)) in by_e.iter().enumerate() {
            assert_eq!(k, *e, "experts numbered from 0");
            let [g, u, d] = parts.map(|p| &header.tensors[p.expect("gate, up and down")]);
            gu.extend_from_slice(data(g));
            gu.extend_from_slice(data(u));
            dn.extend_from_slice(data(d));
            gu_shape = vec![by_e.len() as u64, g.shape[0] + u.shape[0], g.shape[1]];
            dn_shape = vec![by_e.len() as u64, d.shape[0], d.shape[1]];
            dtype = g.dtype_name.clone();
        }
        out.insert(
            format!("{prefix}.mlp.experts.gate_up_proj"),
            (dtype.clone(), gu_shape, gu),
        );
        out.insert(
            format!("{prefix}.mlp.experts.down_proj"),
            (dtype, dn_shape, dn),
        );
    }
    write_safetensors(&dst.join("model.safetensors"), &out);
}

#[test]
fn fused_and_per_expert_checkpoints_give_the_same_logits_bits() {
    for name in [
        "qwen3_moe_b",
        "mixtral",
        "glm4_moe_b",
        "qwen3_5_moe_text",
        "qwen3_next",
        "mimo_v2_flash",
        "deepseek_v3",
        "deepseek_v3_b",
        "glm5_next",
        "glm5_next_b",
    ] {
        let tmp = tempfile::tempdir().expect("tmp");
        let src = common::repo().join("fixtures/hf").join(name);
        fuse(&src, &tmp.path().join("fused"));
        let jnf = tmp.path().join("fused-jnf");
        tarfa_converter::convert(
            &tmp.path().join("fused"),
            &jnf,
            &tarfa_converter::Options {
                layers: None,
                direct_io: false,
                jobs: 1,
            },
            &tarfa_converter::Quiet,
        )
        .expect("convert fused");
        let mut fused = common::open(&jnf, &DecoderOptions::default());
        let mut plain = common::open(&common::model(name), &DecoderOptions::default());
        for p in common::reference(name) {
            let (ta, a) = common::greedy(&mut plain, &p.prompt_ids, 16);
            let (tb, b) = common::greedy(&mut fused, &p.prompt_ids, 16);
            assert_eq!(ta, tb, "{name} prompt {}", p.index);
            assert_eq!(
                common::bits(&a),
                common::bits(&b),
                "{name} prompt {}",
                p.index
            );
        }
    }
}

/// An expert whose gate is BF16 and whose up is F32 (the same values) decodes to the all-BF16
/// checkpoint's bits: the element type a weight is stored in never changes a result.
#[test]
fn an_expert_of_mixed_element_types_gives_the_same_bits() {
    let tmp = tempfile::tempdir().expect("tmp");
    let mixed = common::mixed_type_expert_model(tmp.path());
    let mut a = common::open(&mixed, &DecoderOptions::default());
    let mut b = common::open(&common::model("qwen3_moe_b"), &DecoderOptions::default());
    for p in common::reference("qwen3_moe_b") {
        let (ta, la) = common::greedy(&mut a, &p.prompt_ids, 12);
        let (tb, lb) = common::greedy(&mut b, &p.prompt_ids, 12);
        assert_eq!(ta, tb, "prompt {}", p.index);
        assert_eq!(common::bits(&la), common::bits(&lb), "prompt {}", p.index);
    }
}
