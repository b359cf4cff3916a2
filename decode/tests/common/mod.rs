//! Shared by the decoder tests: fixtures converted to JNF once per test binary, and decoders
//! opened over them with chosen options.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tarfa_decode::{Decoder, DecoderOptions, Sequence};

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `src` (a checkpoint directory or a GGUF) converted to JNF in `out`, with the tests' options.
pub fn convert(src: &Path, out: &Path) {
    tarfa_converter::convert(
        src,
        out,
        &tarfa_converter::Options {
            layers: None,
            direct_io: false,
            jobs: 1,
        },
        &tarfa_converter::Quiet,
    )
    .unwrap_or_else(|e| panic!("convert {}: {e}", src.display()));
}

/// `src` (below the repository) converted into a temporary model directory, once per process.
pub fn converted(src: &str) -> PathBuf {
    static DIRS: OnceLock<std::sync::Mutex<Vec<(String, tempfile::TempDir)>>> = OnceLock::new();
    let dirs = DIRS.get_or_init(Default::default);
    let mut dirs = dirs.lock().expect("fixture lock");
    if let Some((_, d)) = dirs.iter().find(|(n, _)| n == src) {
        return d.path().join("model");
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("model");
    convert(&repo().join(src), &out);
    dirs.push((src.to_string(), tmp));
    out
}

/// `fixtures/hf/NAME` converted into a temporary model directory (once per process).
pub fn model(name: &'static str) -> PathBuf {
    converted(&format!("fixtures/hf/{name}"))
}

/// The quantised GGUF fixture (`fixtures/gguf/qwen3_moe_q.gguf`: F32, F16, BF16, Q8_0, Q4_0,
/// Q4_K, Q5_K, Q6_K) converted, once per process.
pub fn quantised_model() -> PathBuf {
    converted("fixtures/gguf/qwen3_moe_q.gguf")
}

pub fn open(dir: &Path, opts: &DecoderOptions) -> Decoder {
    Decoder::open(dir, opts).expect("open decoder")
}

/// Logits of `n` greedy steps after `prompt`.
pub fn greedy(dec: &mut Decoder, prompt: &[u32], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    dec.reset().expect("reset");
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

/// The glm5_next fixture cut to its two KDA layers (0, with a dense MLP; 3, with routed and
/// shared experts), renumbered 0 and 1, as a checkpoint of its own in `dir`: every part of
/// GLM-5.3-Flash the engine runs whole — hyper-connections, Kimi delta attention, the clamped
/// SwiGLU of dense, routed and shared MLPs, the sigmoid group router — without its DSA layers.
pub fn glm5_next_kda_layers(dir: &Path) -> PathBuf {
    let src = repo().join("fixtures/hf/glm5_next");
    let out = dir.join("glm5_next_kda");
    std::fs::create_dir_all(&out).expect("mkdir");
    for f in ["tokenizer.json", "generation_config.json"] {
        std::fs::copy(src.join(f), out.join(f)).expect("copy");
    }
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("config json");
    let t = &mut config["text_config"];
    t["num_hidden_layers"] = 2.into();
    t["layer_types"] = serde_json::json!(["linear_attention", "linear_attention"]);
    t["mlp_layer_types"] = serde_json::json!(["dense", "sparse"]);
    t["indexer_types"] = serde_json::json!(["full", "full"]);
    std::fs::write(out.join("config.json"), config.to_string()).expect("write config");
    // The safetensors file: the tensors of layers 0 and 3 (as 1) and all outside the layers.
    let bytes = std::fs::read(src.join("model.safetensors")).expect("safetensors");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).expect("header");
    let data = &bytes[8 + n..];
    let layer = "model.language_model.layers.";
    let mut kept: Vec<(String, &serde_json::Value)> = Vec::new();
    for (name, info) in &header {
        let new = match name.strip_prefix(layer) {
            Some(rest) if rest.starts_with("0.") => name.clone(),
            Some(rest) => match rest.strip_prefix("3.") {
                Some(r) => format!("{layer}1.{r}"),
                None => continue,
            },
            None if name == "__metadata__" => continue,
            None => name.clone(),
        };
        kept.push((new, info));
    }
    kept.sort_by(|a, b| a.0.cmp(&b.0));
    let mut new_header = serde_json::Map::new();
    let mut body = Vec::new();
    for (name, info) in kept {
        let range = info["data_offsets"].as_array().expect("offsets");
        let (b, e) = (
            range[0].as_u64().expect("b") as usize,
            range[1].as_u64().expect("e") as usize,
        );
        let mut info = info.clone();
        info["data_offsets"] = serde_json::json!([body.len(), body.len() + e - b]);
        body.extend_from_slice(&data[b..e]);
        new_header.insert(name, info);
    }
    let mut h = serde_json::Value::Object(new_header)
        .to_string()
        .into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut file = (h.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&h);
    file.extend_from_slice(&body);
    std::fs::write(out.join("model.safetensors"), file).expect("write safetensors");
    let jnf = dir.join("glm5_next_kda.jnf");
    convert(&out, &jnf);
    jnf
}

/// qwen3_moe_b with expert 0's up projections widened from BF16 to F32 (the same values, another
/// element type: gate and up of one expert differ in type), converted into `tmp/jnf`.
pub fn mixed_type_expert_model(tmp: &Path) -> PathBuf {
    let mut widened = 0;
    let out = rewritten_model(
        tmp,
        "qwen3_moe_b",
        |_| {},
        |name, dtype, _, b| {
            if name.ends_with(".mlp.experts.0.up_proj.weight") && *dtype == "BF16" {
                *b = b
                    .chunks_exact(2)
                    .flat_map(|c| (u32::from(u16::from_le_bytes([c[0], c[1]])) << 16).to_le_bytes())
                    .collect();
                *dtype = "F32".into();
                widened += 1;
            }
        },
    );
    assert!(widened > 0, "the fixture has expert 0 up projections");
    out
}

/// qwen3_5_moe_text with its shared expert twice as wide (`shared_expert_intermediate_size` 16 →
/// 32, gate and up rows 16..32 rows 0..16 reversed, down's columns 16..32 its columns 0..16
/// reversed), converted into `tmp/jnf`: a gated shared expert of another width than the routed
/// experts', which the GPU's engine runs in launches of its own (not folded into the routed ones).
pub fn wide_shared_expert_model(tmp: &Path) -> PathBuf {
    let mut wide = 0;
    let out = rewritten_model(
        tmp,
        "qwen3_5_moe_text",
        |config| {
            assert_eq!(config["shared_expert_intermediate_size"], 16);
            config["shared_expert_intermediate_size"] = 32.into();
        },
        |name, dtype, shape, b| {
            if !name.contains(".mlp.shared_expert.") {
                return;
            }
            *b = doubled(name, dtype, shape, b);
            wide += 1;
        },
    );
    assert!(wide > 0, "the fixture has shared experts");
    out
}

/// A BF16 SwiGLU matrix twice as wide: a gate or up matrix's rows followed by the same rows in
/// reverse order (its `shape[0]` doubled), a down matrix's columns followed by the same columns
/// reversed (its `shape[1]` doubled).
fn doubled(name: &str, dtype: &str, shape: &mut [u64], b: &[u8]) -> Vec<u8> {
    assert_eq!(dtype, "BF16", "{name}");
    let (rows, cols) = (shape[0] as usize, shape[1] as usize);
    let el = |r: usize, c: usize| &b[(r * cols + c) * 2..(r * cols + c) * 2 + 2];
    let mut w = Vec::with_capacity(b.len() * 2);
    if name.ends_with("down_proj.weight") {
        for r in 0..rows {
            (0..cols)
                .chain((0..cols).rev())
                .for_each(|c| w.extend_from_slice(el(r, c)));
        }
        shape[1] *= 2;
    } else {
        for r in (0..rows).chain((0..rows).rev()) {
            (0..cols).for_each(|c| w.extend_from_slice(el(r, c)));
        }
        shape[0] *= 2;
    }
    w
}

/// qwen3_moe with experts twice as wide and top-3 (`moe_intermediate_size` 16 → 32: gate and up rows
/// 16..32 are rows 0..16 of the same matrix in reverse order, down's columns 16..32 its columns
/// 0..16 reversed), converted into `tmp/jnf`: a model whose experts the GPU's tiled kernels take
/// (widths multiples of 32), which the fixtures' are not.
pub fn wide_expert_model(tmp: &Path) -> PathBuf {
    let mut wide = 0;
    let out = rewritten_model(
        tmp,
        "qwen3_moe",
        |config| {
            assert_eq!(config["moe_intermediate_size"], 16);
            config["moe_intermediate_size"] = 32.into();
            // Three of the four experts a token: the combine's order shows (two products add
            // the same either way round).
            config["num_experts_per_tok"] = 3.into();
        },
        |name, dtype, shape, b| {
            if !name.contains(".mlp.experts.") {
                return;
            }
            *b = doubled(name, dtype, shape, b);
            wide += 1;
        },
    );
    assert!(wide > 0, "the fixture has experts");
    out
}

/// The models the whole-model GPU pass takes, as (label, the fixture whose reference prompts
/// they run, directory): both qwen3_moe fixtures, and `wide_expert_model` in `tmp` — the one
/// whose experts reach the tiled experts' kernels.
pub fn whole_pass_models(tmp: &Path) -> [(&'static str, &'static str, PathBuf); 3] {
    [
        ("qwen3_moe", "qwen3_moe", model("qwen3_moe")),
        ("qwen3_moe_b", "qwen3_moe_b", model("qwen3_moe_b")),
        ("wide experts", "qwen3_moe", wide_expert_model(tmp)),
    ]
}

/// `fixtures/hf/SRC` with its config.json and each tensor (name, dtype, shape, bytes) edited,
/// converted into `tmp/jnf`.
pub fn rewritten_model(
    tmp: &Path,
    src: &str,
    config: impl FnOnce(&mut serde_json::Value),
    mut edit: impl FnMut(&str, &mut String, &mut Vec<u64>, &mut Vec<u8>),
) -> PathBuf {
    use tarfa_format::safetensors::{parse_safetensors_header, safetensors_header_len};
    let src = repo().join("fixtures/hf").join(src);
    let edited = tmp.join("edited");
    std::fs::create_dir_all(&edited).expect("mkdir");
    std::fs::copy(src.join("tokenizer.json"), edited.join("tokenizer.json")).expect("copy");
    let text = std::fs::read(src.join("config.json")).expect("read config");
    let mut cfg: serde_json::Value = serde_json::from_slice(&text).expect("config json");
    config(&mut cfg);
    std::fs::write(edited.join("config.json"), cfg.to_string()).expect("write config");
    let bytes = std::fs::read(src.join("model.safetensors")).expect("read");
    let n = safetensors_header_len(&bytes, bytes.len() as u64).expect("len") as usize;
    let h = parse_safetensors_header(&bytes[8..8 + n], bytes.len() as u64).expect("header");
    let mut json = serde_json::Map::new();
    let mut data = Vec::new();
    for t in &h.tensors {
        let mut b = bytes[t.begin as usize..t.end as usize].to_vec();
        let mut dtype = t.dtype_name.clone();
        let mut shape = t.shape.clone();
        edit(&t.name, &mut dtype, &mut shape, &mut b);
        json.insert(
            t.name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + b.len()]}),
        );
        data.extend_from_slice(&b);
    }
    write_safetensors(&edited.join("model.safetensors"), &json, &data);
    let out = tmp.join("jnf");
    convert(&edited, &out);
    out
}

/// A safetensors file: `header` (each tensor's dtype, shape and offsets into `data`), padded with
/// spaces to a multiple of 8 bytes, then `data`.
fn write_safetensors(
    path: &Path,
    header: &serde_json::Map<String, serde_json::Value>,
    data: &[u8],
) {
    let mut hdr = serde_json::to_vec(header).expect("json");
    while !hdr.len().is_multiple_of(8) {
        hdr.push(b' ');
    }
    let mut file = (hdr.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(&hdr);
    file.extend_from_slice(data);
    std::fs::write(path, file).expect("write");
}

/// The logits of every position of `tokens`, run alone on a fresh CPU decoder of `name`.
pub fn alone(name: &'static str, tokens: &[u32]) -> Vec<Vec<u32>> {
    let mut dec = open(&model(name), &DecoderOptions::default());
    bits(&dec.feed(tokens, true).expect("feed"))
}

fn feed_bits(dec: &mut Decoder, seq: &mut Sequence, tokens: &[u32]) -> Vec<Vec<u32>> {
    bits(&dec.feed_in(seq, tokens, true).expect("feed"))
}

/// A prompt (the first three tokens of the fixture's first reference prompt: the emulated GPU
/// runs every step of these checks) and two continuations (ids within every fixture's
/// vocabulary).
pub fn sequence_prompts(name: &str) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let r = &reference(name)[0].prompt_ids;
    let p = r[..r.len().min(3)].to_vec();
    (p, vec![7, 3, 11], vec![2, 19])
}

/// Sequences apart from the model, on `dec` (a decoder of fixture `name`, on any device): every
/// position has the bits a fresh CPU decoder gives it running that sequence alone —
/// - two sequences run token by token, alternating, with the decoder's own sequence stepped
///   between them (no state shared, none leaking);
/// - a fork of a prompt, run before the original continues (each its own continuation);
/// - a sequence truncated to its prompt, then continued otherwise (attention only: a recurrent
///   state refuses, and stands where it stood), and truncated to 0 and run again.
pub fn sequences_hold(name: &'static str, dec: &mut Decoder) {
    let (p, x, y) = sequence_prompts(name);
    let px = [p.clone(), x.clone()].concat();
    let py = [p.clone(), y.clone()].concat();
    let (want_px, want_py) = (alone(name, &px), alone(name, &py));

    let xyp = [x.clone(), y.clone(), p.clone()].concat();
    let mut a = dec.new_sequence().expect("sequence a");
    let mut b = dec.new_sequence().expect("sequence b");
    let (mut ra, mut rb) = (Vec::new(), Vec::new());
    for i in 0..px.len().max(xyp.len()) {
        if let Some(&t) = px.get(i) {
            ra.extend(feed_bits(dec, &mut a, &[t]));
        }
        dec.feed(&[1], false).expect("the decoder's own sequence");
        if let Some(&t) = xyp.get(i) {
            rb.extend(feed_bits(dec, &mut b, &[t]));
        }
    }
    assert_eq!(a.len(), Some(px.len()), "{name}");
    assert_eq!(ra, want_px, "{name}: interleaved sequence a");
    assert_eq!(rb, alone(name, &xyp), "{name}: interleaved sequence b");
    drop(b);

    let mut c = dec.new_sequence().expect("sequence c");
    feed_bits(dec, &mut c, &p);
    let mut f = dec.fork(&c).expect("fork");
    assert_eq!(f.len(), Some(p.len()), "{name}");
    // The fork runs first: the original's state must not move with it.
    assert_eq!(
        feed_bits(dec, &mut f, &y),
        want_py[p.len()..],
        "{name}: the fork"
    );
    assert_eq!(
        feed_bits(dec, &mut c, &x),
        want_px[p.len()..],
        "{name}: the original, after its fork ran"
    );

    if c.is_recurrent() {
        let e = dec.truncate(&mut c, p.len()).expect_err("rewound");
        assert!(
            matches!(
                e,
                tarfa_decode::DecodeError::Sequence(
                    tarfa_decode::error::SequenceFault::CannotRewind { .. }
                )
            ),
            "{name}: {e}"
        );
        assert_eq!(c.len(), Some(px.len()), "{name}: refused, it stands");
    } else {
        dec.truncate(&mut c, p.len()).expect("truncate");
        assert_eq!(c.len(), Some(p.len()), "{name}");
        assert_eq!(
            feed_bits(dec, &mut c, &y),
            want_py[p.len()..],
            "{name}: truncated to the prompt"
        );
    }
    dec.truncate(&mut c, 0).expect("truncate to 0");
    assert!(c.is_empty(), "{name}");
    assert_eq!(
        feed_bits(dec, &mut c, &py),
        want_py,
        "{name}: truncated to 0"
    );
}

/// A generated qwen3_moe whose products are large enough that any thread count really divides
/// them (`tarfa_decode::kernels::products_split` counts those that were): hidden 512, 8 query and
/// 2 key/value heads of 64, 8 experts of 256 (top-2), 2 layers, a vocabulary of 4096 — the
/// router is 8 KiB, the attention's q/k/v 768 KiB, a token's selected experts 1.5 MiB and the
/// lm_head 4 MiB of BF16, against the kernels' 64 KiB serial threshold and 256 KiB chunk. Weights
/// are deterministic (splitmix64 of the tensor's name and index, uniform in ±1/√cols, BF16), norm
/// weights 1. The fixture tokenizer's ids (< 128) are the prompts'. Converted once per process.
pub fn split_model() -> PathBuf {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().expect("tempdir");
        let src = tmp.path().join("src");
        std::fs::create_dir_all(&src).expect("mkdir");
        let fixture = repo().join("fixtures/hf/qwen3_moe");
        std::fs::copy(fixture.join("tokenizer.json"), src.join("tokenizer.json")).expect("copy");
        let (hidden, heads, kv, hd, experts, inter, layers, vocab) =
            (512u64, 8u64, 2u64, 64u64, 8u64, 256u64, 2u64, 4096u64);
        let mut cfg: serde_json::Value = serde_json::from_slice(
            &std::fs::read(fixture.join("config.json")).expect("config"),
        )
        .expect("json");
        for (k, v) in [
            ("hidden_size", hidden),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv),
            ("head_dim", hd),
            ("num_local_experts", experts),
            ("num_experts_per_tok", 2),
            ("moe_intermediate_size", inter),
            ("intermediate_size", 1024),
            ("num_hidden_layers", layers),
            ("vocab_size", vocab),
        ] {
            cfg[k] = v.into();
        }
        std::fs::write(src.join("config.json"), cfg.to_string()).expect("write config");
        let mut tensors: Vec<(String, Vec<u64>)> = vec![
            ("model.embed_tokens.weight".into(), vec![vocab, hidden]),
            ("lm_head.weight".into(), vec![vocab, hidden]),
            ("model.norm.weight".into(), vec![hidden]),
        ];
        for l in 0..layers {
            let p = format!("model.layers.{l}.");
            for (n, shape) in [
                ("input_layernorm.weight", vec![hidden]),
                ("post_attention_layernorm.weight", vec![hidden]),
                ("self_attn.q_proj.weight", vec![heads * hd, hidden]),
                ("self_attn.k_proj.weight", vec![kv * hd, hidden]),
                ("self_attn.v_proj.weight", vec![kv * hd, hidden]),
                ("self_attn.o_proj.weight", vec![hidden, heads * hd]),
                ("self_attn.q_norm.weight", vec![hd]),
                ("self_attn.k_norm.weight", vec![hd]),
                ("mlp.gate.weight", vec![experts, hidden]),
            ] {
                tensors.push((format!("{p}{n}"), shape));
            }
            for e in 0..experts {
                for (n, shape) in [
                    ("gate_proj.weight", vec![inter, hidden]),
                    ("up_proj.weight", vec![inter, hidden]),
                    ("down_proj.weight", vec![hidden, inter]),
                ] {
                    tensors.push((format!("{p}mlp.experts.{e}.{n}"), shape));
                }
            }
        }
        let mut header = serde_json::Map::new();
        let mut data: Vec<u8> = Vec::new();
        for (name, shape) in &tensors {
            let n: u64 = shape.iter().product();
            let start = data.len();
            if shape.len() == 1 {
                (0..n).for_each(|_| data.extend_from_slice(&0x3F80u16.to_le_bytes()));
            } else {
                let scale = 1.0 / (shape[1] as f32).sqrt();
                let seed = name
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
                for i in 0..n {
                    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    z ^= z >> 31;
                    let u = (z >> 40) as f32 / (1u64 << 24) as f32;
                    let v = (2.0 * u - 1.0) * scale;
                    data.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
                }
            }
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
            );
        }
        write_safetensors(&src.join("model.safetensors"), &header, &data);
        let out = tmp.path().join("model");
        convert(&src, &out);
        (tmp, out)
    })
    .1
    .clone()
}
