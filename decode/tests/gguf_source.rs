//! The same weights through two formats give the same bits. `fixtures/gguf/from_hf/NAME.gguf`
//! (written by `fixtures/gguf/make_from_hf.py` with gguf-py, in llama.cpp's tensor naming and
//! key/values, from `fixtures/hf/NAME/model.safetensors`) and the safetensors fixture itself are
//! both converted to JNF and run: every greedy step's logits are the same `f32` bits and the
//! tokens equal. The GGUF-sourced model's synthesised config, renamed tensors and rebuilt
//! tokenizer are checked against the safetensors side; hostile key/values are refused by name.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;
use tarfa_decode::error::GgufFault;
use tarfa_decode::{gguf_model, DecodeError, Decoder, DecoderOptions, TensorStore};
use tarfa_format::manifest::Manifest;
use tarfa_runtime::ModelExperts;

const STEPS: usize = 16;

/// `fixtures/gguf/from_hf/FILE.gguf` converted into a temporary model directory (once per
/// process). FILE is a fixture name (every tensor in its safetensors dtype) or
/// `NAME.f32-small` (1-D tensors, norms and router F32, as llama.cpp's converter writes them).
fn gguf_model_dir(name: &'static str) -> PathBuf {
    common::converted(&format!("fixtures/gguf/from_hf/{name}.gguf"))
}

fn store(dir: &Path) -> (Manifest, TensorStore) {
    let m = Manifest::load(dir).expect("manifest");
    let experts = ModelExperts::open(dir).expect("experts");
    let t = TensorStore::load(dir, &m, &experts).expect("tensors");
    (m, t)
}

fn hf_config(name: &str) -> Value {
    let p = common::repo()
        .join("fixtures/hf")
        .join(name)
        .join("config.json");
    serde_json::from_slice(&std::fs::read(p).expect("config.json")).expect("json")
}

/// The GGUF side, renamed and with its synthesised config; every non-expert tensor equals the
/// safetensors side's by name, shape and bits; the config agrees with config.json on `keys`.
fn check_mapping(name: &'static str, file: &'static str, keys: &[&str]) -> Value {
    let (gm, mut gt) = store(&gguf_model_dir(file));
    assert_eq!(gm.architecture.source_format, "gguf");
    let cfg = gguf_model::adapt(&gm.architecture.config, &mut gt).expect("adapt");
    let (_, st) = store(&common::model(name));
    let hf = hf_config(name);
    for k in keys {
        let (a, b) = (&cfg[*k], &hf[*k]);
        let same = match (a.as_f64(), b.as_f64()) {
            // rms_norm_eps: GGUF holds it as f32, which the family rounds to anyway.
            (Some(x), Some(y)) if *k == "rms_norm_eps" => x as f32 == y as f32,
            _ => a == b,
        };
        assert!(same, "{name}: {k}: synthesised {a}, config.json {b}");
    }
    // One RoPE (MiMo's per-kind RoPEs are its own test's to check).
    if let Some(hf_theta) = hf["rope_parameters"]["rope_theta"].as_f64() {
        assert_eq!(
            cfg["rope_parameters"]["rope_theta"].as_f64(),
            Some(hf_theta)
        );
    }
    // Every tensor of a decoder layer or the trunk: same name, shape and bits.
    let bits = |t: &tarfa_decode::weights::Tensor| -> Vec<u32> {
        let s = t.slice();
        (0..s.len()).map(|i| s.get(i).to_bits()).collect()
    };
    let mut n = 0;
    for name_hf in st.names() {
        let a = st.get(name_hf).expect("safetensors tensor");
        let b = gt
            .get(name_hf)
            .unwrap_or_else(|e| panic!("{name}: GGUF side: {e}"));
        assert_eq!(a.shape(), b.shape(), "{name}: {name_hf}: shape");
        assert_eq!(bits(a), bits(b), "{name}: {name_hf}: values");
        n += 1;
    }
    assert_eq!(
        n,
        gt.names().count(),
        "{name}: the GGUF side has other tensors"
    );
    assert!(n > 10);
    cfg
}

#[test]
fn qwen3_moe_b_gguf_maps_onto_the_safetensors_names_config_and_bits() {
    for file in ["qwen3_moe_b", "qwen3_moe_b.f32-small"] {
        qwen3_mapping(file);
    }
}

fn qwen3_mapping(file: &'static str) {
    let cfg = check_mapping(
        "qwen3_moe_b",
        file,
        &[
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "vocab_size",
            "tie_word_embeddings",
            "attention_bias",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "norm_topk_prob",
            "mlp_only_layers",
            "decoder_sparse_step",
            "max_position_embeddings",
            "use_sliding_window",
        ],
    );
    assert_eq!(
        cfg["num_experts"],
        hf_config("qwen3_moe_b")["num_local_experts"]
    );
}

#[test]
fn glm4_moe_gguf_maps_onto_the_safetensors_names_config_and_bits() {
    for file in ["glm4_moe", "glm4_moe.f32-small"] {
        glm4_mapping(file);
    }
}

fn glm4_mapping(file: &'static str) {
    let cfg = check_mapping(
        "glm4_moe",
        file,
        &[
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "rms_norm_eps",
            "vocab_size",
            "tie_word_embeddings",
            "attention_bias",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "n_routed_experts",
            "n_shared_experts",
            "routed_scaling_factor",
            "n_group",
            "topk_group",
            "first_k_dense_replace",
            "norm_topk_prob",
            "partial_rotary_factor",
            "use_qk_norm",
            "max_position_embeddings",
        ],
    );
    // The fixture's transformers save holds no MTP tensors, so its GGUF is a --no-mtp one.
    assert_eq!(cfg["num_nextn_predict_layers"], 0);
    assert_eq!(
        cfg["rope_parameters"]["partial_rotary_factor"],
        hf_config("glm4_moe")["rope_parameters"]["partial_rotary_factor"]
    );
}

/// The largest difference between two runs' logits.
fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

/// Greedy runs of both models on the reference prompts: logits bit-identical at every step.
fn same_bits_both_ways(name: &'static str, file: &'static str) {
    let opts = DecoderOptions::default();
    let mut st = common::open(&common::model(name), &opts);
    let mut gg = common::open(&gguf_model_dir(file), &opts);
    assert_eq!(st.vocab_size(), gg.vocab_size());
    let prompts = common::reference(name);
    assert!(!prompts.is_empty());
    for p in prompts {
        let (ta, la) = common::greedy(&mut st, &p.prompt_ids, STEPS);
        let (tb, lb) = common::greedy(&mut gg, &p.prompt_ids, STEPS);
        assert_eq!(la.len(), STEPS);
        assert_eq!(ta, tb, "{file} prompt {}: greedy tokens", p.index);
        // And transformers' fp32 greedy tokens for the safetensors checkpoint.
        assert_eq!(tb[..], p.fp32_tokens[..STEPS], "{file} prompt {}", p.index);
        for (s, (a, b)) in common::bits(&la).iter().zip(common::bits(&lb)).enumerate() {
            assert!(
                *a == b,
                "{file} prompt {} step {s}: logits differ in bits",
                p.index
            );
        }
        eprintln!(
            "{file} p{}: {STEPS} steps, {} logits each, bit-identical through safetensors and GGUF; tokens {:?}",
            p.index,
            la[0].len(),
            ta
        );
    }
}

#[test]
fn qwen3_moe_b_gguf_and_safetensors_give_the_same_logit_bits() {
    same_bits_both_ways("qwen3_moe_b", "qwen3_moe_b");
    same_bits_both_ways("qwen3_moe_b", "qwen3_moe_b.f32-small");
}

/// The comparison can fail: the same GGUF with one key changed (RoPE base) gives other bits.
#[test]
fn a_changed_key_changes_the_bits() {
    let d = edited("qwen3_moe_b", |c| {
        c.insert(
            "qwen3moe.rope.freq_base".into(),
            serde_json::json!({"type": "f32", "value": 10000.0}),
        );
    });
    let opts = DecoderOptions::default();
    let mut st = common::open(&common::model("qwen3_moe_b"), &opts);
    let mut gg = common::open(d.path(), &opts);
    let p = &common::reference("qwen3_moe_b")[0];
    let (_, la) = common::greedy(&mut st, &p.prompt_ids, 2);
    let (_, lb) = common::greedy(&mut gg, &p.prompt_ids, 2);
    assert_ne!(common::bits(&la), common::bits(&lb));
}

#[test]
fn glm4_moe_gguf_and_safetensors_give_the_same_logit_bits() {
    same_bits_both_ways("glm4_moe", "glm4_moe");
    same_bits_both_ways("glm4_moe", "glm4_moe.f32-small");
}

/// The tokenizer rebuilt from `tokenizer.ggml.*` gives the fixture tokenizer.json's ids on the
/// reference prompts (and decodes them back to the text).
fn same_ids(name: &'static str) {
    let gg = common::open(&gguf_model_dir(name), &DecoderOptions::default());
    let json = gg
        .gguf_tokenizer_json()
        .expect("a GGUF source")
        .expect("tokenizer rebuilt");
    let ours: tokenizers::Tokenizer = serde_json::to_string(&json)
        .expect("json")
        .parse()
        .expect("tokenizers accepts it");
    let theirs = tokenizers::Tokenizer::from_file(
        common::repo()
            .join("fixtures/hf")
            .join(name)
            .join("tokenizer.json"),
    )
    .expect("fixture tokenizer");
    let mut texts: Vec<String> = common::reference(name)
        .into_iter()
        .map(|p| p.text)
        .collect();
    texts.push("The router picks the top experts, and the model adds their outputs.".into());
    texts.push("hello there, said the fox to the dog.".into());
    for t in &texts {
        let a = ours
            .encode(t.as_str(), false)
            .expect("encode")
            .get_ids()
            .to_vec();
        let b = theirs
            .encode(t.as_str(), false)
            .expect("encode")
            .get_ids()
            .to_vec();
        assert_eq!(a, b, "{name}: {t:?}");
        assert_eq!(
            ours.decode(&a, false).expect("decode"),
            *t,
            "{name}: round trip"
        );
    }
    for p in common::reference(name) {
        let a = ours
            .encode(p.text.as_str(), false)
            .expect("encode")
            .get_ids()
            .to_vec();
        assert_eq!(a, p.prompt_ids, "{name}: reference prompt {}", p.index);
    }
}

#[test]
fn qwen3_moe_b_gguf_tokenizer_gives_the_fixture_ids() {
    same_ids("qwen3_moe_b");
}

#[test]
fn glm4_moe_gguf_tokenizer_rebuilds_from_the_key_values() {
    // No decoder needed: the tokenizer comes from the manifest's key/values alone.
    let m = Manifest::load(&gguf_model_dir("glm4_moe")).expect("manifest");
    let json = gguf_model::tokenizer_json(&m.architecture.config).expect("rebuilt");
    let ours: tokenizers::Tokenizer = serde_json::to_string(&json)
        .expect("json")
        .parse()
        .expect("tokenizers accepts it");
    let theirs = tokenizers::Tokenizer::from_file(
        common::repo().join("fixtures/hf/glm4_moe/tokenizer.json"),
    )
    .expect("fixture tokenizer");
    for p in common::reference("glm4_moe") {
        let a = ours
            .encode(p.text.as_str(), false)
            .expect("encode")
            .get_ids()
            .to_vec();
        let b = theirs
            .encode(p.text.as_str(), false)
            .expect("encode")
            .get_ids()
            .to_vec();
        assert_eq!(a, b, "glm4_moe: {:?}", p.text);
        assert_eq!(a, p.prompt_ids);
    }
}

/// A copy of the GGUF-sourced `name` model whose manifest key/values were changed by `edit`
/// (and re-published with a correct digest: the decoder, not the manifest check, must refuse).
fn edited(
    name: &'static str,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> tempfile::TempDir {
    edited_dir(&gguf_model_dir(name), edit)
}

/// A copy of the model directory `src` whose manifest's config was changed by `edit`.
fn edited_dir(
    src: &Path,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    for e in std::fs::read_dir(src).expect("read_dir") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), tmp.path().join(e.file_name())).expect("copy");
    }
    let mut m = Manifest::load(tmp.path()).expect("manifest");
    edit(m.architecture.config.as_object_mut().expect("object"));
    // A safetensors-sourced model keeps config.json beside the manifest, which must agree.
    let cj = tmp.path().join("config.json");
    if cj.exists() {
        use sha2::Digest;
        let text = serde_json::to_vec_pretty(&m.architecture.config).expect("json");
        std::fs::write(&cj, &text).expect("config.json");
        let f = m
            .files
            .iter_mut()
            .find(|f| f.path == "config.json")
            .expect("config.json listed");
        f.size = text.len() as u64;
        f.sha256 = hex::encode(sha2::Sha256::digest(&text));
        f.blake3 = blake3::hash(&text).to_hex().to_string();
    }
    m.publish(tmp.path()).expect("publish");
    tmp
}

fn open_err(dir: &Path) -> DecodeError {
    match Decoder::open(dir, &DecoderOptions::default()) {
        Ok(_) => panic!("{}: opened", dir.display()),
        Err(e) => e,
    }
}

/// The key and fault of a GGUF key/value refusal, its text naming the key.
fn gguf_fault(e: DecodeError) -> (String, GgufFault) {
    match e {
        DecodeError::Gguf { key, fault } => {
            let text = DecodeError::Gguf {
                key: key.clone(),
                fault: fault.clone(),
            }
            .to_string();
            assert!(text.contains(&key), "{text}");
            (key, fault)
        }
        e => panic!("expected a GGUF key fault, got {e}"),
    }
}

#[test]
fn a_missing_key_is_refused_by_name() {
    for key in [
        "qwen3moe.expert_count",
        "qwen3moe.embedding_length",
        "qwen3moe.attention.layer_norm_rms_epsilon",
        "qwen3moe.block_count",
    ] {
        let d = edited("qwen3_moe_b", |c| {
            c.remove(key).expect("key present");
        });
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, key);
        let want = if key.ends_with("epsilon") {
            GgufFault::Missing
        } else {
            GgufFault::MissingNoDefault
        };
        assert_eq!(fault, want, "{key}");
    }
    // qwen3moe's dense layer needs the dense width.
    let d = edited("qwen3_moe_b", |c| {
        c.remove("qwen3moe.feed_forward_length");
    });
    assert_eq!(
        gguf_fault(open_err(d.path())),
        (
            "qwen3moe.feed_forward_length".into(),
            GgufFault::DenseWithoutWidth { dense: vec![1] }
        )
    );
}

#[test]
fn an_unknown_architecture_is_refused_by_name() {
    let d = edited("qwen3_moe_b", |c| {
        c.insert(
            "general.architecture".into(),
            serde_json::json!({"type": "string", "value": "llama"}),
        );
    });
    let e = open_err(d.path());
    let text = e.to_string();
    assert!(
        text.contains("\"llama\"") && text.contains("qwen3moe") && text.contains("glm4moe"),
        "{text}"
    );
    assert_eq!(
        gguf_fault(e),
        (
            "general.architecture".into(),
            GgufFault::UnsupportedArch {
                arch: "llama".into()
            }
        )
    );
}

#[test]
fn contradictions_with_llama_cpp_semantics_are_refused() {
    // qwen3moe always renormalises in llama.cpp: a file that says otherwise is not guessed at.
    let d = edited("qwen3_moe_b", |c| {
        c.insert(
            "qwen3moe.expert_weights_norm".into(),
            serde_json::json!({"type": "bool", "value": false}),
        );
    });
    assert_eq!(
        gguf_fault(open_err(d.path())),
        (
            "qwen3moe.expert_weights_norm".into(),
            GgufFault::NoRenormalisation
        )
    );
    // A scaling factor without a type is linear scaling to llama.cpp: refused.
    let d = edited("qwen3_moe_b", |c| {
        c.insert(
            "qwen3moe.rope.scaling.factor".into(),
            serde_json::json!({"type": "f32", "value": 2.0}),
        );
    });
    assert!(matches!(
        gguf_fault(open_err(d.path())),
        (k, GgufFault::NoEquivalent { .. }) if k == "qwen3moe.rope.scaling.factor"
    ));
    // RoPE scaling is not decoded.
    let d = edited("qwen3_moe_b", |c| {
        c.insert(
            "qwen3moe.rope.scaling.type".into(),
            serde_json::json!({"type": "string", "value": "yarn"}),
        );
    });
    assert_eq!(
        gguf_fault(open_err(d.path())),
        (
            "qwen3moe.rope.scaling.type".into(),
            GgufFault::RopeScaling {
                kind: "yarn".into()
            }
        )
    );
    // glm4moe routes by sigmoid only.
    let (gm, mut gt) = store(&gguf_model_dir("glm4_moe"));
    let mut c = gm.architecture.config.clone();
    c["glm4moe.expert_gating_func"] = serde_json::json!({"type": "u32", "value": 1});
    assert_eq!(
        gguf_fault(gguf_model::adapt(&c, &mut gt).expect_err("refused")),
        (
            "glm4moe.expert_gating_func".into(),
            GgufFault::NotSigmoid { found: 1 }
        )
    );
    // llama.cpp's build_moe_ffn scales by expert_weights_scale only when it is neither 0 (its
    // default when absent) nor 1.
    for v in [None, Some(0.0)] {
        let mut c = gm.architecture.config.clone();
        let o = c.as_object_mut().expect("object");
        match v {
            None => {
                o.remove("glm4moe.expert_weights_scale");
            }
            Some(x) => {
                o.insert(
                    "glm4moe.expert_weights_scale".into(),
                    serde_json::json!({"type": "f32", "value": x}),
                );
            }
        }
        let (_, mut gt) = store(&gguf_model_dir("glm4_moe"));
        let cfg = gguf_model::adapt(&c, &mut gt).expect("adapted");
        assert_eq!(
            cfg["routed_scaling_factor"],
            serde_json::json!(1.0),
            "{v:?}"
        );
    }
}

#[test]
fn a_tensor_the_family_would_not_read_is_refused_not_dropped() {
    // A glm4moe-only tensor name under qwen3moe: ffn_norm is qwen's, post_attention_norm is GLM's.
    let (gm, mut gt) = store(&gguf_model_dir("glm4_moe"));
    let mut c = gm.architecture.config.clone();
    c["general.architecture"] = serde_json::json!({"type": "string", "value": "qwen3moe"});
    for (k, v) in gm.architecture.config.as_object().expect("object") {
        if let Some(rest) = k.strip_prefix("glm4moe.") {
            c[format!("qwen3moe.{rest}")] = v.clone();
        }
    }
    let e = gguf_model::adapt(&c, &mut gt).expect_err("refused");
    assert!(
        matches!(
            &e,
            tarfa_decode::DecodeError::BadTensor {
                name,
                fault: tarfa_decode::error::TensorFault::NoMeaning {
                    model_type: "qwen3_moe",
                    gguf_arch: "qwen3moe"
                }
            } if name.starts_with("blk.")
        ),
        "{e}"
    );
}

#[test]
fn tokens_work_without_a_tokenizer() {
    // --tokens needs no tokenizer: a GGUF without tokenizer.ggml.* still runs ids.
    let d = edited("qwen3_moe_b", |c| {
        c.retain(|k, _| !k.starts_with("tokenizer."));
    });
    let mut dec = common::open(d.path(), &DecoderOptions::default());
    let e = dec
        .gguf_tokenizer_json()
        .expect("a GGUF source")
        .expect_err("no tokenizer");
    assert_eq!(
        gguf_fault(e),
        ("tokenizer.ggml.model".into(), GgufFault::NoTokenizer)
    );
    let (toks, _) = common::greedy(&mut dec, &[5, 6, 7], 4);
    assert_eq!(toks.len(), 4);
}

#[test]
fn the_committed_ggufs_are_what_make_from_hf_writes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = std::process::Command::new("python3")
        .arg(common::repo().join("fixtures/gguf/make_from_hf.py"))
        .arg("--out")
        .arg(tmp.path())
        .output()
        .expect("run python3 (scripts/test.sh installs gguf and numpy)");
    assert!(
        out.status.success(),
        "make_from_hf.py failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "qwen3_moe_b.gguf",
        "qwen3_moe_b.f32-small.gguf",
        "glm4_moe.gguf",
        "glm4_moe.f32-small.gguf",
        "deepseek_v3.gguf",
        "deepseek_v3.f32-small.gguf",
        "deepseek_v3.kv-b.gguf",
        "glm5_next.gguf",
        "glm5_next.f32-small.gguf",
        "qwen3_next_b.gguf",
        "qwen3_next_b.ssm-in.gguf",
        "qwen3_5_moe_text.gguf",
        "mimo_v2_flash_b.gguf",
    ] {
        let committed =
            std::fs::read(common::repo().join("fixtures/gguf/from_hf").join(f)).expect(f);
        let written = std::fs::read(tmp.path().join(f)).expect(f);
        assert!(
            committed == written,
            "{f}: the committed file is not what the script writes"
        );
    }
}

#[test]
fn glm4moe_absent_keys_take_llama_cpp_defaults_or_are_refused() {
    let dir = gguf_model_dir("glm4_moe");
    let base = Manifest::load(&dir).expect("manifest").architecture.config;
    let adapt_without = |key: &str| {
        let mut c = base.clone();
        c.as_object_mut().expect("object").remove(key).expect(key);
        let (_, mut t) = store(&dir);
        gguf_model::adapt(&c, &mut t)
    };
    // Sigmoid when absent, as llama.cpp.
    let c = adapt_without("glm4moe.expert_gating_func").expect("sigmoid by default");
    assert_eq!(c["model_type"], "glm4_moe");
    // No renormalisation when absent, as llama.cpp (transformers' class default is true).
    let c = adapt_without("glm4moe.expert_weights_norm").expect("false by default");
    assert_eq!(c["norm_topk_prob"], false);
    // No rotary-dims key: the whole head rotates, as llama.cpp.
    let c = adapt_without("glm4moe.rope.dimension_count").expect("head dim by default");
    assert_eq!(c["partial_rotary_factor"], 1.0);
    // llama.cpp's 0 leading dense layers contradicts layer 0 having no router: named.
    assert_eq!(
        gguf_fault(adapt_without("glm4moe.leading_dense_block_count").expect_err("refused")),
        (
            "glm4moe.leading_dense_block_count".into(),
            GgufFault::DenseLayers {
                lead: 0,
                dense: vec![0]
            }
        )
    );
    for key in [
        "glm4moe.expert_shared_count",
        "glm4moe.expert_feed_forward_length",
        "glm4moe.expert_count",
        "glm4moe.expert_used_count",
    ] {
        assert_eq!(
            gguf_fault(adapt_without(key).expect_err(key)),
            (key.into(), GgufFault::MissingNoDefault)
        );
    }
}

#[test]
fn renaming_two_tensors_to_one_name_is_refused_and_changes_nothing() {
    let (_, mut t) = store(&gguf_model_dir("qwen3_moe_b"));
    let before: std::collections::BTreeSet<String> = t.names().map(String::from).collect();
    let e = t
        .rename_with(|n| {
            Ok(Some(if n.ends_with("_norm.weight") {
                "same".to_string()
            } else {
                n.to_string()
            }))
        })
        .expect_err("refused");
    assert!(
        matches!(
            &e,
            DecodeError::BadTensor {
                fault: tarfa_decode::error::TensorFault::RenameClash { new, .. },
                ..
            } if new == "same"
        ),
        "{e}"
    );
    let after: std::collections::BTreeSet<String> = t.names().map(String::from).collect();
    assert_eq!(before, after);
}

/// The deepseek2 GGUFs: llama.cpp's MLA form (`attn_k_b` transposed, `attn_v_b`), with small
/// tensors F32, and the older whole `attn_kv_b`.
const DEEPSEEK_FILES: [&str; 3] = ["deepseek_v3", "deepseek_v3.f32-small", "deepseek_v3.kv-b"];

#[test]
fn deepseek_v3_gguf_maps_onto_the_safetensors_names_config_and_bits() {
    for file in DEEPSEEK_FILES {
        // kv_b_proj, assembled from the two halves, is compared bit for bit with the
        // safetensors one like every other tensor.
        let cfg = check_mapping(
            "deepseek_v3",
            file,
            &[
                "model_type",
                "num_hidden_layers",
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "rms_norm_eps",
                "vocab_size",
                "tie_word_embeddings",
                "attention_bias",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "n_routed_experts",
                "n_shared_experts",
                "routed_scaling_factor",
                "n_group",
                "topk_group",
                "first_k_dense_replace",
                "norm_topk_prob",
                "q_lora_rank",
                "kv_lora_rank",
                "qk_nope_head_dim",
                "qk_rope_head_dim",
                "v_head_dim",
                "rope_interleave",
                "head_dim",
                "max_position_embeddings",
            ],
        );
        assert_eq!(cfg["rope_parameters"]["rope_type"], "default", "{file}");
    }
}

#[test]
fn deepseek_v3_gguf_and_safetensors_give_the_same_logit_bits() {
    for file in DEEPSEEK_FILES {
        same_bits_both_ways("deepseek_v3", file);
    }
}

#[test]
fn deepseek_v3_gguf_tokenizer_gives_the_fixture_ids() {
    // The deepseek-v3 pre-tokenizer: three regexes in turn.
    same_ids("deepseek_v3");
    // Where it differs from the others: digits in threes, CJK runs apart, a punctuation mark
    // joined to the letters after it.
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let m = Manifest::load(&gguf_model_dir("deepseek_v3")).expect("manifest");
    let json = gguf_model::tokenizer_json(&m.architecture.config).expect("rebuilt");
    let tok: tokenizers::Tokenizer = serde_json::to_string(&json)
        .expect("json")
        .parse()
        .expect("tokenizers accepts it");
    let text = "x 12345日本語です.Hi";
    let mut pts = PreTokenizedString::from(text);
    tok.get_pre_tokenizer()
        .expect("a pre-tokenizer")
        .pre_tokenize(&mut pts)
        .expect("pre-tokenize");
    let pieces: Vec<&str> = pts
        .get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, (a, b), _)| &text[a..b])
        .collect();
    assert_eq!(pieces, ["x", " ", "123", "45", "日本語です", ".Hi"]);
}

/// YaRN as a DeepSeek-V3 GGUF carries it (`rope.scaling.*`, `yarn_log_multiplier` = 0.1 ·
/// mscale_all_dim) gives the bits of the same weights with YaRN in config.json (mscale =
/// mscale_all_dim = 1, DeepSeek-V3's and Kimi-K2's), and other bits than without it.
#[test]
fn deepseek2_yarn_keys_give_the_bits_of_the_config_json_yarn() {
    use serde_json::json;
    let st = edited_dir(&common::model("deepseek_v3"), |c| {
        c.insert(
            "rope_parameters".into(),
            json!({"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                   "original_max_position_embeddings": 32, "mscale": 1.0,
                   "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0}),
        );
    });
    let gg = edited("deepseek_v3", |c| {
        let f32v = |v: f64| json!({"type": "f32", "value": v});
        c.insert(
            "deepseek2.rope.scaling.type".into(),
            json!({"type": "string", "value": "yarn"}),
        );
        c.insert("deepseek2.rope.scaling.factor".into(), f32v(8.0));
        c.insert(
            "deepseek2.rope.scaling.original_context_length".into(),
            json!({"type": "u32", "value": 32}),
        );
        // What gguf-py stores for the converter's `0.1 * 1.0`.
        c.insert(
            "deepseek2.rope.scaling.yarn_log_multiplier".into(),
            f32v(f64::from(0.1f32)),
        );
        c.insert("deepseek2.rope.scaling.yarn_beta_fast".into(), f32v(32.0));
    });
    let opts = DecoderOptions::default();
    let p = &common::reference("deepseek_v3")[0];
    let run = |dir: &Path| {
        let mut d = common::open(dir, &opts);
        common::bits(&common::greedy(&mut d, &p.prompt_ids, 8).1)
    };
    let (a, b) = (run(st.path()), run(gg.path()));
    assert_eq!(a, b, "YaRN through config.json and through the GGUF keys");
    assert_ne!(
        a,
        run(&common::model("deepseek_v3")),
        "YaRN changed nothing"
    );
}

/// A copy of the deepseek2 GGUF's key/values with `edit` applied, adapted.
fn deepseek_adapt(
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> tarfa_decode::Result<Value> {
    let (gm, mut gt) = store(&gguf_model_dir("deepseek_v3"));
    let mut c = gm.architecture.config.clone();
    edit(c.as_object_mut().expect("object"));
    gguf_model::adapt(&c, &mut gt)
}

/// The refusal of a deepseek2 YaRN without a usable `yarn_log_multiplier`.
const NO_LOG_MUL: &str = "without it (or at 0) llama.cpp's deepseek2 scales both cos/sin and the scores by YaRN's mscale, which no transformers config does";

/// An edit of a GGUF's key/values.
type KvEdit<'a> = Box<dyn FnOnce(&mut serde_json::Map<String, Value>) + 'a>;

#[test]
fn deepseek2_key_values_without_a_transformers_equivalent_are_refused_by_name() {
    use serde_json::json;
    let u32v = |v: u64| json!({"type": "u32", "value": v});
    let f32v = |v: f64| json!({"type": "f32", "value": v});
    let yarn = |c: &mut serde_json::Map<String, Value>| {
        c.insert(
            "deepseek2.rope.scaling.type".into(),
            json!({"type": "string", "value": "yarn"}),
        );
        c.insert("deepseek2.rope.scaling.factor".into(), f32v(8.0));
        c.insert(
            "deepseek2.rope.scaling.yarn_log_multiplier".into(),
            f32v(0.1),
        );
    };
    let k = |s: &str| format!("deepseek2.{s}");
    let cases: Vec<(KvEdit<'_>, String, GgufFault)> = vec![
        (
            // Absent, llama.cpp's deepseek2 routes by softmax (DeepSeek-V2).
            Box::new(|c| {
                c.remove("deepseek2.expert_gating_func");
            }),
            k("expert_gating_func"),
            GgufFault::SoftmaxByDefault,
        ),
        (
            Box::new(|c| {
                c.insert("deepseek2.expert_gating_func".into(), u32v(1));
            }),
            k("expert_gating_func"),
            GgufFault::NotSigmoid { found: 1 },
        ),
        (
            Box::new(|c| {
                c.insert("deepseek2.attention.key_length".into(), u32v(12));
            }),
            k("attention.key_length"),
            GgufFault::MlaWidth {
                found: 12,
                rule: "kv_lora_rank + rope.dimension_count",
                expected: 20,
            },
        ),
        (
            Box::new(|c| {
                c.insert("deepseek2.attention.head_count_kv".into(), u32v(4));
            }),
            k("attention.head_count_kv"),
            GgufFault::MlaWidth {
                found: 4,
                rule: "one latent",
                expected: 1,
            },
        ),
        (
            Box::new(|c| {
                c.remove("deepseek2.attention.value_length_mla");
            }),
            k("attention.key_length_mla"),
            GgufFault::MlaHalf {
                other: "attention.value_length_mla",
            },
        ),
        (
            Box::new(|c| {
                c.insert("deepseek2.rope.dimension_count".into(), u32v(12));
            }),
            k("attention.key_length"),
            GgufFault::MlaWidth {
                found: 20,
                rule: "kv_lora_rank + rope.dimension_count",
                expected: 28,
            },
        ),
        (
            Box::new(|c| {
                c.insert(
                    "deepseek2.rope.scaling.type".into(),
                    json!({"type": "string", "value": "linear"}),
                );
            }),
            k("rope.scaling.type"),
            GgufFault::RopeScaling {
                kind: "linear".into(),
            },
        ),
        (
            Box::new(move |c| {
                yarn(c);
                c.remove("deepseek2.rope.scaling.yarn_log_multiplier");
            }),
            k("rope.scaling.yarn_log_multiplier"),
            GgufFault::NoEquivalent {
                value: "missing".into(),
                why: NO_LOG_MUL,
            },
        ),
        (
            // llama.cpp takes 0 as no multiplier.
            Box::new(move |c| {
                yarn(c);
                c.insert(
                    "deepseek2.rope.scaling.yarn_log_multiplier".into(),
                    f32v(0.0),
                );
            }),
            k("rope.scaling.yarn_log_multiplier"),
            GgufFault::NoEquivalent {
                value: "0".into(),
                why: NO_LOG_MUL,
            },
        ),
        (
            Box::new(move |c| {
                yarn(c);
                c.insert("deepseek2.rope.scaling.factor".into(), f32v(0.5));
            }),
            k("rope.scaling.factor"),
            GgufFault::NoEquivalent {
                value: "0.5".into(),
                why: "below 1 llama.cpp's deepseek2 scales the scores by 1 + 0.1·mscale·ln(factor), unclamped; transformers' YaRN by 1",
            },
        ),
        (
            // No type: llama.cpp scales linearly.
            Box::new(move |c| {
                c.insert("deepseek2.rope.scaling.factor".into(), f32v(4.0));
            }),
            k("rope.scaling.factor"),
            GgufFault::NoEquivalent {
                value: "4".into(),
                why: "without rope.scaling.type llama.cpp scales RoPE linearly by it, which this family's transformers config cannot say",
            },
        ),
        (
            Box::new(move |c| {
                c.insert(
                    "deepseek2.attention.temperature_scale".into(),
                    f32v(0.5),
                );
            }),
            k("attention.temperature_scale"),
            GgufFault::NoEquivalent {
                value: "0.5".into(),
                why: "llama.cpp's deepseek2 scales the queries by it past attention.temperature_length, which no transformers DeepSeek-V3 config does",
            },
        ),
        (
            // A width that would overflow the sums made from it.
            Box::new(|c| {
                c.insert(
                    "deepseek2.attention.kv_lora_rank".into(),
                    json!({"type": "u64", "value": u64::MAX}),
                );
            }),
            k("attention.kv_lora_rank"),
            GgufFault::TooLarge {
                value: u64::MAX,
                max: tarfa_decode::config::limits::MAX_DIM as u64,
            },
        ),
        (
            Box::new(move |c| {
                yarn(c);
                c.insert("deepseek2.rope.scaling.yarn_beta_slow".into(), f32v(2.0));
            }),
            k("rope.scaling.yarn_beta_slow"),
            GgufFault::NoEquivalent {
                value: "2".into(),
                why: "llama.cpp's deepseek2 does not read it and computes with beta_fast 32, beta_slow 1",
            },
        ),
        (
            Box::new(move |c| {
                yarn(c);
                c.insert("deepseek2.rope.scaling.attn_factor".into(), f32v(0.5));
            }),
            k("rope.scaling.attn_factor"),
            GgufFault::NoEquivalent {
                value: "0.5".into(),
                why: "llama.cpp's deepseek2 scales cos, sin and the scores by it, which no transformers config does",
            },
        ),
        (
            Box::new(|c| {
                c.insert("deepseek2.leading_dense_block_count".into(), u32v(2));
            }),
            k("leading_dense_block_count"),
            GgufFault::DenseLayers {
                lead: 2,
                dense: vec![0],
            },
        ),
    ];
    for (edit, key, fault) in cases {
        let e = deepseek_adapt(edit).expect_err(&key);
        assert_eq!(gguf_fault(e), (key.clone(), fault), "{key}");
    }
    // Absent keys with llama.cpp's meaning: no routed scale (1), no renormalisation, no groups.
    let c = deepseek_adapt(|c| {
        for key in [
            "expert_weights_scale",
            "expert_weights_norm",
            "expert_group_count",
            "expert_group_used_count",
        ] {
            c.remove(&format!("deepseek2.{key}")).expect(key);
        }
    })
    .expect("adapted");
    assert_eq!(
        (
            &c["routed_scaling_factor"],
            &c["norm_topk_prob"],
            &c["n_group"],
            &c["topk_group"]
        ),
        (&json!(1.0), &json!(false), &json!(1), &json!(1))
    );
}

#[test]
fn deepseek2_kv_b_halves_are_checked_before_assembly() {
    use tarfa_decode::error::TensorFault;
    let dir = gguf_model_dir("deepseek_v3");
    let config = Manifest::load(&dir).expect("manifest").architecture.config;
    let adapt_with = |change: &dyn Fn(&mut TensorStore)| {
        let (_, mut t) = store(&dir);
        change(&mut t);
        gguf_model::adapt(&config, &mut t).expect_err("refused")
    };
    let tensor = |e: DecodeError| match e {
        DecodeError::BadTensor { name, fault } => (name, fault),
        e => panic!("expected a tensor fault, got {e}"),
    };
    // One half without the other.
    let e = adapt_with(&|t| {
        t.remove("blk.1.attn_v_b.weight").expect("present");
    });
    assert_eq!(
        tensor(e),
        (
            "blk.1.attn_k_b.weight".into(),
            TensorFault::Unpaired {
                missing: "blk.1.attn_v_b.weight".into()
            }
        )
    );
    // Both forms in one layer.
    let e = adapt_with(&|t| {
        let (v, n) = t.remove("blk.2.attn_v_b.weight").expect("present");
        let whole = tarfa_decode::weights::Tensor::gathered(
            "blk.2.attn_kv_b.weight",
            &[56, 16],
            &[&v],
            |i| (0, i % v.len()),
        );
        t.insert(v, n).expect("back");
        t.insert(whole, 0).expect("new");
    });
    assert_eq!(
        tensor(e),
        (
            "blk.2.attn_kv_b.weight".into(),
            TensorFault::BothForms {
                other: "blk.2.attn_k_b.weight".into()
            }
        )
    );
    // attn_k_b not transposed ([heads, nope, rank]: what kv_b's key rows are) is refused.
    let e = adapt_with(&|t| {
        let (k, n) = t.remove("blk.0.attn_k_b.weight").expect("present");
        let flat = tarfa_decode::weights::Tensor::gathered(
            "blk.0.attn_k_b.weight",
            &[4, 8, 16],
            &[&k],
            |i| (0, i),
        );
        t.insert(flat, n).expect("back");
    });
    assert_eq!(
        tensor(e),
        (
            "blk.0.attn_k_b.weight".into(),
            TensorFault::Shape {
                shape: vec![4, 8, 16],
                expected: vec![4, 16, 8]
            }
        )
    );
    // MLA has no per-head keys: an attn_k is a tensor with no meaning, not left out.
    let e = adapt_with(&|t| {
        let (q, n) = t.remove("blk.0.attn_q_a.weight").expect("present");
        let k =
            tarfa_decode::weights::Tensor::gathered("blk.0.attn_k.weight", q.shape(), &[&q], |i| {
                (0, i)
            });
        t.insert(q, n).expect("back");
        t.insert(k, 0).expect("new");
    });
    assert!(matches!(
        tensor(e),
        (name, TensorFault::NoMeaning { model_type: "deepseek_v3", gguf_arch: "deepseek2" })
            if name == "blk.0.attn_k.weight"
    ));
}

/// A GGUF key/value of a random type and value: the kinds of damage a hostile or broken file
/// carries.
fn nasty_kv(rng: &mut fastrand::Rng) -> Value {
    use serde_json::json;
    let ints = [
        0u64,
        1,
        2,
        3,
        4,
        7,
        16,
        20,
        65_536,
        u32::MAX as u64,
        u64::MAX,
    ];
    let floats = [0.0, -1.0, 0.1, 1e-30, 1e30, 3.5];
    match rng.u8(0..7) {
        0 => json!({"type": "u32", "value": ints[rng.usize(..ints.len())]}),
        1 => json!({"type": "i32", "value": -(rng.i64(1..5))}),
        2 => json!({"type": "f32", "value": floats[rng.usize(..floats.len())]}),
        3 => {
            let s = ["yarn", "none", "linear", ""][rng.usize(..4)];
            json!({"type": "string", "value": s})
        }
        4 => json!({"type": "bool", "value": rng.bool()}),
        5 => json!({"type": "array", "elem": "u32", "value": [1, 2]}),
        _ => json!({"type": "f32", "value": "inf"}),
    }
}

/// Damaged key/values of every GGUF architecture are mapped or refused with an error, never a
/// panic; and what maps, the family opens or refuses with an error.
#[test]
fn mutated_gguf_key_values_adapt_or_fail_with_an_error_never_a_panic() {
    let mut rng = fastrand::Rng::with_seed(27);
    let (mut adapted, mut refused) = (0, 0);
    for name in [
        "qwen3_moe_b",
        "glm4_moe",
        "deepseek_v3",
        "qwen3_next_b",
        "qwen3_5_moe_text",
        "mimo_v2_flash_b",
    ] {
        let dir = gguf_model_dir(name);
        let mut base = Manifest::load(&dir).expect("manifest").architecture.config;
        if name == "deepseek_v3" {
            // YaRN's keys too, so that their branch is fuzzed.
            let o = base.as_object_mut().expect("object");
            for (k, v) in [
                (
                    "type",
                    serde_json::json!({"type": "string", "value": "yarn"}),
                ),
                ("factor", serde_json::json!({"type": "f32", "value": 4.0})),
                (
                    "original_context_length",
                    serde_json::json!({"type": "u32", "value": 64}),
                ),
                (
                    "yarn_log_multiplier",
                    serde_json::json!({"type": "f32", "value": 0.1}),
                ),
            ] {
                o.insert(format!("deepseek2.rope.scaling.{k}"), v);
            }
        }
        let keys: Vec<String> = base
            .as_object()
            .expect("object")
            .keys()
            .filter(|k| !k.starts_with("tokenizer."))
            .cloned()
            .collect();
        for _ in 0..150 {
            let mut c = base.clone();
            let o = c.as_object_mut().expect("object");
            for _ in 0..rng.usize(1..4) {
                let k = &keys[rng.usize(..keys.len())];
                match rng.bool() {
                    true => {
                        o.remove(k);
                    }
                    false => {
                        o.insert(k.clone(), nasty_kv(&mut rng));
                    }
                }
            }
            let (_, mut t) = store(&dir);
            match gguf_model::adapt(&c, &mut t) {
                Ok(cfg) => {
                    adapted += 1;
                    let _ = tarfa_decode::family::prepare(&cfg, &mut t)
                        .and_then(|()| tarfa_decode::family::open(&cfg, &t));
                }
                Err(_) => refused += 1,
            }
        }
    }
    assert!(
        adapted > 20 && refused > 100,
        "{adapted} adapted, {refused} refused"
    );
}

const GLM5_FILES: [&str; 2] = ["glm5_next", "glm5_next.f32-small"];

/// glm5-next's GGUF (what llama.cpp's `Glm5NextModel` converter writes, `make_from_hf.py`) maps
/// onto the safetensors checkpoint's text model: every tensor the same values under the
/// transformers name (`kv_b_proj` put back together; the convolutions `[1, channels, 1, kernel]`
/// as llama.cpp holds them), except the decay rates: `ssm_a` is the converter's `−exp(A_log)`,
/// within an ulp of tarfa's own exponential; and the synthesised config says what config.json
/// says.
#[test]
fn glm5_next_gguf_maps_onto_the_safetensors_text_model() {
    let (_, st) = store(&common::model("glm5_next"));
    let text = hf_config("glm5_next")["text_config"].clone();
    let bits = |t: &tarfa_decode::weights::Tensor| -> Vec<u32> {
        let s = t.slice();
        (0..s.len()).map(|i| s.get(i).to_bits()).collect()
    };
    for file in GLM5_FILES {
        let (gm, mut gt) = store(&gguf_model_dir(file));
        let cfg = gguf_model::adapt(&gm.architecture.config, &mut gt).expect("adapt");
        for k in [
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "vocab_size",
            "num_experts_per_tok",
            "n_routed_experts",
            "n_shared_experts",
            "n_group",
            "topk_group",
            "norm_topk_prob",
            "q_lora_rank",
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "layer_types",
            "indexer_types",
            "mlp_layer_types",
            "index_topk",
            "index_kpool",
            "index_n_heads",
            "index_head_dim",
            "index_kpool_always_select_tail",
            "linear_num_heads",
            "linear_head_dim",
            "linear_conv_kernel_dim",
            "hc_mult",
            "hc_sinkhorn_iters",
        ] {
            assert_eq!(cfg[k], text[k], "{file}: {k}");
        }
        for k in [
            "rms_norm_eps",
            "hc_eps",
            "swiglu_limit",
            "routed_scaling_factor",
            "linear_lower_bound",
        ] {
            let (a, b) = (cfg[k].as_f64().expect(k), text[k].as_f64().expect(k));
            assert_eq!(a as f32, b as f32, "{file}: {k}");
        }
        let mut n = 0;
        for hf in st.names() {
            let Some(rest) = hf.strip_prefix("model.language_model.") else {
                // The vision tower (an mmproj file to llama.cpp) and the head.
                if hf == "lm_head.weight" {
                    assert_eq!(
                        bits(st.get(hf).expect("head")),
                        bits(gt.get(hf).expect("head"))
                    );
                    n += 1;
                }
                continue;
            };
            let a = st.get(hf).expect("safetensors tensor");
            n += 1;
            if let Some(layer) = rest.strip_suffix(".self_attn.A_log") {
                let neg = gt
                    .get(&format!("model.{layer}.self_attn.neg_exp_A_log"))
                    .expect("ssm_a");
                for i in 0..a.slice().len() {
                    let ours = tarfa_decode::canon::exp(a.slice().get(i));
                    let theirs = -neg.slice().get(i);
                    let ulps = (ours.to_bits() as i64 - theirs.to_bits() as i64).abs();
                    assert!(ulps <= 1, "{file}: {hf}[{i}]: {ours} and {theirs}");
                }
                continue;
            }
            let b = gt
                .get(&format!("model.{rest}"))
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            if hf.ends_with("_conv1d.weight") {
                assert_eq!(
                    b.shape(),
                    [&[1usize][..], &[a.shape()[0], 1, a.shape()[2]]].concat()
                );
            } else {
                assert_eq!(a.shape(), b.shape(), "{file}: {hf}");
            }
            assert_eq!(bits(a), bits(b), "{file}: {hf}");
        }
        assert_eq!(
            n,
            gt.names().count(),
            "{file}: the GGUF side has other tensors"
        );
    }
}

/// The GGUF gives the safetensors checkpoint's greedy tokens (transformers fp32's) and logits
/// within 2e-6 of its bits — the converter's rounding of `exp(A_log)`, which differs from
/// tarfa's in 3 of the fixture's 12 decay rates by an ulp, is all that differs —, and both its
/// element-type variants give the same bits.
#[test]
fn glm5_next_gguf_gives_the_safetensors_tokens_and_its_variants_the_same_bits() {
    let opts = DecoderOptions::default();
    let mut st = common::open(&common::model("glm5_next"), &opts);
    let mut plain = common::open(&gguf_model_dir("glm5_next"), &opts);
    let mut small = common::open(&gguf_model_dir("glm5_next.f32-small"), &opts);
    for p in common::reference("glm5_next") {
        let (ta, la) = common::greedy(&mut st, &p.prompt_ids, STEPS);
        let (tb, lb) = common::greedy(&mut plain, &p.prompt_ids, STEPS);
        let (tc, lc) = common::greedy(&mut small, &p.prompt_ids, STEPS);
        assert_eq!(ta, tb, "prompt {}", p.index);
        assert_eq!(tb, tc, "prompt {}", p.index);
        assert_eq!(tb[..], p.fp32_tokens[..STEPS], "prompt {}", p.index);
        assert_eq!(common::bits(&lb), common::bits(&lc), "prompt {}", p.index);
        let d = max_diff(&la, &lb);
        assert!(d <= 2e-6, "prompt {}: {d}", p.index);
        eprintln!("glm5_next p{}: GGUF {d:.2e} from safetensors", p.index);
    }
}

#[test]
fn glm5_next_gguf_tokenizer_gives_the_fixture_ids() {
    same_ids("glm5_next");
}

/// glm5-next key/values llama.cpp computes with in a way no transformers GLM-5.3-Flash config
/// can say are refused by name; an absent `kda.gate_lower_bound` is llama.cpp's −∞ (the softplus
/// gate), not transformers' default −5: the bits change.
#[test]
fn glm5_next_gguf_keys_without_a_transformers_equivalent_are_refused() {
    let set = |k: &'static str, v: Value| {
        move |c: &mut serde_json::Map<String, Value>| {
            c.insert(format!("glm5-next.{k}"), v);
        }
    };
    let f32s = |v: &[f64]| serde_json::json!({"type": "array", "elem": "f32", "value": v});
    for (key, edit) in [
        (
            "rope.dimension_count",
            Box::new(set(
                "rope.dimension_count",
                serde_json::json!({"type": "u32", "value": 4}),
            )) as Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>,
        ),
        (
            "swiglu_clamp_exp",
            Box::new(set(
                "swiglu_clamp_exp",
                f32s(&[0.25, 0.25, 0.25, 0.5, 0.25, 0.25]),
            )),
        ),
        (
            "swiglu_clamp_exp",
            Box::new(set("swiglu_clamp_shexp", f32s(&[0.5; 6]))),
        ),
        (
            "swiglu_clamp_exp",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("glm5-next.swiglu_clamp_exp");
                c.remove("glm5-next.swiglu_clamp_shexp");
            }),
        ),
        (
            "expert_gating_func",
            Box::new(set(
                "expert_gating_func",
                serde_json::json!({"type": "u32", "value": 1}),
            )),
        ),
        (
            "attention.layer_norm_epsilon",
            Box::new(set(
                "attention.layer_norm_epsilon",
                serde_json::json!({"type": "f32", "value": 1e-5}),
            )),
        ),
        (
            "attention.head_count_kv",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("glm5-next.attention.head_count_kv");
            }),
        ),
        (
            "hyper_connection.epsilon",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("glm5-next.hyper_connection.epsilon");
            }),
        ),
        // Absent, llama.cpp's indexer LayerNorm has epsilon 0.
        (
            "attention.layer_norm_epsilon",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("glm5-next.attention.layer_norm_epsilon");
            }),
        ),
        (
            "attention.indexer.types",
            Box::new(set(
                "attention.indexer.types",
                serde_json::json!({"type": "array", "elem": "bool", "value": [true, true]}),
            )),
        ),
    ] {
        let d = edited("glm5_next", edit);
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, format!("glm5-next.{key}"), "{fault:?}");
    }
    let d = edited("glm5_next", |c| {
        c.remove("glm5-next.kda.gate_lower_bound");
    });
    let opts = DecoderOptions::default();
    let mut a = common::open(&gguf_model_dir("glm5_next"), &opts);
    let mut b = common::open(d.path(), &opts);
    let p = &common::reference("glm5_next")[0];
    let (_, la) = common::greedy(&mut a, &p.prompt_ids, 2);
    let (_, lb) = common::greedy(&mut b, &p.prompt_ids, 2);
    assert_ne!(common::bits(&la), common::bits(&lb));
}

/// llama.cpp's DeltaNet GGUFs written from a fixture: qwen3next's (the split `attn_qkv`/
/// `attn_gate` form and the fused `ssm_in` one) and qwen35moe's (value heads tiled).
const DELTANET_GGUFS: [(&str, &[&str]); 2] = [
    ("qwen3_next_b", &["qwen3_next_b", "qwen3_next_b.ssm-in"]),
    ("qwen3_5_moe_text", &["qwen3_5_moe_text"]),
];

/// llama.cpp's DeltaNet GGUFs (what its `Qwen3NextModel` and `Qwen3_5MoeTextModel` converters
/// write, `make_from_hf.py`) map onto the safetensors checkpoint: after each side's preparation
/// (the fused projections split; qwen35moe's tiled value heads put back in transformers' order),
/// every tensor the same values under the transformers name, except what the converter computes
/// — the zero-centred norms hold `1 + w` (the bits of tarfa's own `1.0 + w`), `ssm_a` the
/// converter's `−exp(A_log)` (within an ulp of tarfa's exponential) — and the convolution
/// `[channels, kernel]`; the synthesised config says what config.json says.
#[test]
fn deltanet_ggufs_map_onto_the_safetensors_model() {
    use tarfa_decode::family;
    let bits = |t: &tarfa_decode::weights::Tensor| -> Vec<u32> {
        let s = t.slice();
        (0..s.len()).map(|i| s.get(i).to_bits()).collect()
    };
    for (name, files) in DELTANET_GGUFS {
        let (_, mut st) = store(&common::model(name));
        let hf = hf_config(name);
        family::prepare(&hf, &mut st).expect("prepare the safetensors side");
        for &file in files {
            let (gm, mut gt) = store(&gguf_model_dir(file));
            let cfg = gguf_model::adapt(&gm.architecture.config, &mut gt).expect("adapt");
            family::prepare(&cfg, &mut gt).expect("prepare the GGUF side");
            let mut keys = vec![
                "model_type",
                "num_hidden_layers",
                "hidden_size",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "vocab_size",
                "tie_word_embeddings",
                "attention_bias",
                "num_experts",
                "num_experts_per_tok",
                "layer_types",
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
                "max_position_embeddings",
            ];
            if name == "qwen3_next_b" {
                keys.extend(["intermediate_size", "norm_topk_prob"]);
            }
            for k in keys {
                assert_eq!(cfg[k], hf[k], "{file}: {k}");
            }
            let eps = |c: &Value| c["rms_norm_eps"].as_f64().map(|e| e as f32);
            assert_eq!(eps(&cfg), eps(&hf), "{file}");
            for k in ["rope_theta", "partial_rotary_factor"] {
                assert_eq!(
                    cfg["rope_parameters"][k], hf["rope_parameters"][k],
                    "{file}: {k}"
                );
            }
            let mut n = 0;
            for hf_name in st.names() {
                let a = st.get(hf_name).expect("safetensors tensor");
                n += 1;
                if let Some(layer) = hf_name.strip_suffix(".A_log") {
                    let neg = gt
                        .get(&format!("{layer}.neg_exp_A_log"))
                        .unwrap_or_else(|e| panic!("{file}: {e}"));
                    for i in 0..a.slice().len() {
                        let ours = tarfa_decode::canon::exp(a.slice().get(i));
                        let theirs = -neg.slice().get(i);
                        let ulps = (ours.to_bits() as i64 - theirs.to_bits() as i64).abs();
                        assert!(ulps <= 1, "{file}: {hf_name}[{i}]: {ours} and {theirs}");
                    }
                    continue;
                }
                let b = gt.get(hf_name).unwrap_or_else(|e| panic!("{file}: {e}"));
                let zero_centred =
                    hf_name.ends_with("norm.weight") && !hf_name.contains("linear_attn");
                if zero_centred {
                    let s = a.slice();
                    let want: Vec<u32> = (0..s.len()).map(|i| (1.0 + s.get(i)).to_bits()).collect();
                    assert_eq!(want, bits(b), "{file}: {hf_name}: not 1 + w");
                    continue;
                }
                if hf_name.ends_with("conv1d.weight") {
                    assert_eq!(b.shape(), [a.shape()[0], a.shape()[2]], "{file}");
                } else {
                    assert_eq!(a.shape(), b.shape(), "{file}: {hf_name}");
                }
                assert_eq!(bits(a), bits(b), "{file}: {hf_name}");
            }
            assert_eq!(
                n,
                gt.names().count(),
                "{file}: the GGUF side has other tensors"
            );
            assert!(n > 40);
        }
    }
}

/// The GGUFs give the safetensors checkpoint's greedy tokens (transformers fp32's) and logits
/// within 1e-6 of its bits — the converter's exponential of `A_log`, an ulp from tarfa's in some
/// of the decay rates, is all that differs (the norms' `1 + w` are tarfa's bits) —, and
/// qwen3next's split and fused (`ssm_in`) forms the same bits.
#[test]
fn deltanet_ggufs_give_the_safetensors_tokens_and_their_forms_the_same_bits() {
    let opts = DecoderOptions::default();
    for (name, files) in DELTANET_GGUFS {
        let mut st = common::open(&common::model(name), &opts);
        let mut ggufs: Vec<Decoder> = files
            .iter()
            .map(|f| common::open(&gguf_model_dir(f), &opts))
            .collect();
        for p in common::reference(name) {
            let (ta, la) = common::greedy(&mut st, &p.prompt_ids, STEPS);
            let (tb, lb) = common::greedy(&mut ggufs[0], &p.prompt_ids, STEPS);
            assert_eq!(ta, tb, "{name} prompt {}", p.index);
            assert_eq!(tb[..], p.fp32_tokens[..STEPS], "{name} prompt {}", p.index);
            for other in &mut ggufs[1..] {
                let (tc, lc) = common::greedy(other, &p.prompt_ids, STEPS);
                assert_eq!(tb, tc, "{name} prompt {}", p.index);
                assert_eq!(
                    common::bits(&lb),
                    common::bits(&lc),
                    "{name} prompt {}",
                    p.index
                );
            }
            let d = max_diff(&la, &lb);
            assert!(d <= 1e-6, "{name} prompt {}: {d}", p.index);
            eprintln!("{name} p{}: GGUF {d:.2e} from safetensors", p.index);
        }
    }
}

#[test]
fn deltanet_gguf_tokenizers_give_the_fixture_ids() {
    same_ids("qwen3_next_b");
    same_ids("qwen3_5_moe_text");
}

/// qwen3next (and qwen35moe) key/values llama.cpp computes with in a way no transformers
/// Qwen3-Next (Qwen3.5-MoE) config can say are refused by name; without `attention.recurrent_layers` the layer kinds come from
/// `full_attention_interval` (the fused form says 2 and runs; the split form's 4, which its
/// recurrent_layers overrides, would make layer 1 a DeltaNet layer its tensors are not).
#[test]
fn deltanet_gguf_keys_without_a_transformers_equivalent_are_refused() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;
    let set = |k: &'static str, v: Value| -> Edit {
        Box::new(move |c: &mut serde_json::Map<String, Value>| {
            c.insert(format!("qwen3next.{k}"), v);
        })
    };
    let u32v = |v: u64| serde_json::json!({"type": "u32", "value": v});
    for (key, edit) in [
        (
            "expert_weights_norm",
            set(
                "expert_weights_norm",
                serde_json::json!({"type": "bool", "value": false}),
            ),
        ),
        ("expert_gating_func", set("expert_gating_func", u32v(2))),
        (
            "expert_weights_scale",
            set(
                "expert_weights_scale",
                serde_json::json!({"type": "f32", "value": 2.5}),
            ),
        ),
        ("ssm.inner_size", set("ssm.inner_size", u32v(47))),
        ("ssm.inner_size", set("ssm.inner_size", u32v(0))),
        ("ssm.time_step_rank", set("ssm.time_step_rank", u32v(0))),
        ("ssm.group_count", set("ssm.group_count", u32v(0))),
        ("ssm.group_count", set("ssm.group_count", u32v(4))),
        ("ssm.state_size", set("ssm.state_size", u32v(0))),
        ("ssm.conv_kernel", set("ssm.conv_kernel", u32v(0))),
        (
            "attention.recurrent_layers",
            set(
                "attention.recurrent_layers",
                serde_json::json!({"type": "array", "elem": "bool", "value": [true, false]}),
            ),
        ),
        (
            "full_attention_interval",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("qwen3next.attention.recurrent_layers");
                c.insert(
                    "qwen3next.full_attention_interval".into(),
                    serde_json::json!({"type": "u32", "value": 0}),
                );
            }),
        ),
        (
            "ssm.group_count",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("qwen3next.ssm.group_count");
            }),
        ),
    ] {
        let d = edited("qwen3_next_b", edit);
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, format!("qwen3next.{key}"), "{fault:?}");
    }
    // qwen35moe's M-RoPE sections: required, and for text they must rotate every rotated pair
    // (fixture: 1 pair) with the token's position, within the head (8 wide).
    let sections = |v: &[u64]| serde_json::json!({"type": "array", "elem": "i32", "value": v});
    for edit in [
        Box::new(|c: &mut serde_json::Map<String, Value>| {
            c.remove("qwen35moe.rope.dimension_sections");
        }) as Edit,
        Box::new(move |c: &mut serde_json::Map<String, Value>| {
            c.insert(
                "qwen35moe.rope.dimension_sections".into(),
                sections(&[0, 0, 0, 1]),
            );
        }),
        Box::new(move |c: &mut serde_json::Map<String, Value>| {
            c.insert(
                "qwen35moe.rope.dimension_sections".into(),
                sections(&[11, 11, 10, 0]),
            );
        }),
    ] {
        let d = edited("qwen3_5_moe_text", edit);
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, "qwen35moe.rope.dimension_sections", "{fault:?}");
    }
    // qwen35moe reads the same keys.
    for key in ["expert_gating_func", "ssm.inner_size"] {
        let d = edited("qwen3_5_moe_text", |c| {
            c.insert(format!("qwen35moe.{key}"), u32v(47));
        });
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, format!("qwen35moe.{key}"), "{fault:?}");
    }
    let d = edited("qwen3_next_b", |c| {
        c.remove("qwen3next.attention.recurrent_layers");
    });
    let e = open_err(d.path());
    assert!(e.to_string().contains("layers.1.linear_attn"), "{e}");
    // A shared-expert width of 0 is llama.cpp's "absent": feed_forward_length, not no shared
    // expert (the same bits with the width moved there).
    let d = edited("qwen3_next_b", |c| {
        c.insert(
            "qwen3next.expert_shared_feed_forward_length".into(),
            u32v(0),
        );
        c.insert("qwen3next.feed_forward_length".into(), u32v(24));
    });
    let opts = DecoderOptions::default();
    let p = &common::reference("qwen3_next_b")[0];
    let (_, la) = common::greedy(
        &mut common::open(&gguf_model_dir("qwen3_next_b"), &opts),
        &p.prompt_ids,
        2,
    );
    let (_, lb) = common::greedy(&mut common::open(d.path(), &opts), &p.prompt_ids, 2);
    assert_eq!(common::bits(&la), common::bits(&lb));
}

/// MiMo-V2-Flash's GGUF (what llama.cpp's `MimoV2Model` converter writes: per-layer key/value
/// heads and sliding pattern, values narrower than keys, sinks, two RoPE bases, the value scale)
/// maps onto the safetensors checkpoint — every tensor the same bits, the config what
/// config.json says, each kind's RoPE the same rotated dims and base — and gives its logits bit
/// for bit, and transformers fp32's tokens.
#[test]
fn mimo2_gguf_maps_onto_the_safetensors_model_and_gives_its_bits() {
    let name = "mimo_v2_flash_b";
    let cfg = check_mapping(
        name,
        name,
        &[
            "model_type",
            "num_hidden_layers",
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "v_head_dim",
            "vocab_size",
            "tie_word_embeddings",
            "attention_bias",
            "n_routed_experts",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
            "norm_topk_prob",
            "layer_types",
            "mlp_layer_types",
            "sliding_window",
            "rms_norm_eps",
            "max_position_embeddings",
        ],
    );
    let hf = hf_config(name);
    for k in ["attention_value_scale", "routed_scaling_factor"] {
        let f = |c: &Value| c[k].as_f64().map(|v| v as f32);
        assert_eq!(f(&cfg), f(&hf), "{k}");
    }
    use tarfa_decode::family::mimo_v2_flash::MimoV2FlashConfig;
    let ours = MimoV2FlashConfig::parse(&cfg).expect("parse");
    let theirs = MimoV2FlashConfig::parse(&hf).expect("parse");
    assert_eq!(ours.full_rope, theirs.full_rope);
    assert_eq!(ours.sliding_rope, theirs.sliding_rope);
    assert_ne!(ours.full_rope, ours.sliding_rope);
    same_bits_both_ways(name, name);
    same_ids(name);
}

/// mimo2 key/values and tensors transformers' MiMo-V2-Flash cannot say, or llama.cpp's mimo2
/// does not read, are refused by name; the sliding layers' own RoPE base is read, and without it
/// is llama.cpp's 10000 (the fixture's: the same bits).
#[test]
fn mimo2_gguf_keys_and_tensors_without_a_transformers_equivalent_are_refused() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Map<String, Value>)>;
    let set = |k: &'static str, v: Value| -> Edit {
        Box::new(move |c: &mut serde_json::Map<String, Value>| {
            c.insert(format!("mimo2.{k}"), v);
        })
    };
    let ints = |v: &[u64]| serde_json::json!({"type": "array", "elem": "i32", "value": v});
    let u32v = |v: u64| serde_json::json!({"type": "u32", "value": v});
    let f32v = |v: f64| serde_json::json!({"type": "f32", "value": v});
    let name = "mimo_v2_flash_b";
    for (key, edit) in [
        (
            "attention.head_count_kv",
            set("attention.head_count_kv", ints(&[2, 2, 2, 2])),
        ),
        (
            "attention.head_count_kv",
            set("attention.head_count_kv", ints(&[4, 2])),
        ),
        (
            "attention.head_count_kv",
            set("attention.head_count_kv", u32v(2)),
        ),
        // Twice the full layer's count overflows: refused, not a panic.
        (
            "attention.head_count_kv",
            set(
                "attention.head_count_kv",
                serde_json::json!({"type": "array", "elem": "u64", "value": [0u64, 1u64 << 63, 0u64, 0u64]}),
            ),
        ),
        (
            "attention.sliding_window_pattern",
            Box::new(|c: &mut serde_json::Map<String, Value>| {
                c.remove("mimo2.attention.sliding_window_pattern");
            }),
        ),
        ("expert_gating_func", set("expert_gating_func", u32v(1))),
        (
            "expert_weights_norm",
            set(
                "expert_weights_norm",
                serde_json::json!({"type": "bool", "value": false}),
            ),
        ),
        (
            "expert_weights_scale",
            set("expert_weights_scale", f32v(2.0)),
        ),
        (
            "attention.key_length_swa",
            set("attention.key_length_swa", u32v(8)),
        ),
        (
            "rope.dimension_count_swa",
            set("rope.dimension_count_swa", u32v(6)),
        ),
        ("rope.dimension_count", set("rope.dimension_count", u32v(0))),
    ] {
        let d = edited(name, edit);
        let (k, fault) = gguf_fault(open_err(d.path()));
        assert_eq!(k, format!("mimo2.{key}"), "{fault:?}");
    }
    // Sinks on a full layer (llama.cpp would apply them; transformers' full layers have none),
    // and an attention bias (llama.cpp's mimo2 graph never adds one).
    let dir = gguf_model_dir(name);
    for (extra, n) in [("blk.1.attn_sinks.weight", 4), ("blk.0.attn_q.bias", 64)] {
        let (m, mut t) = store(&dir);
        let tensor = tarfa_decode::weights::Tensor::from_bytes(
            extra,
            tarfa_format::Dtype::F32,
            &[n],
            &vec![0; 4 * n as usize],
        )
        .expect("a tensor");
        t.insert(tensor, 4 * n).expect("insert");
        match gguf_model::adapt(&m.architecture.config, &mut t) {
            Err(DecodeError::BadTensor { name, fault }) => {
                assert_eq!(name, extra);
                assert!(matches!(
                    fault,
                    tarfa_decode::error::TensorFault::NoMeaning { .. }
                ));
            }
            other => panic!("{extra}: {other:?}"),
        }
    }
    let opts = DecoderOptions::default();
    let p = &common::reference(name)[0];
    let run = |dir: &Path| {
        let (_, l) = common::greedy(&mut common::open(dir, &opts), &p.prompt_ids, 2);
        common::bits(&l)
    };
    let base = run(&dir);
    let absent = edited(name, |c| {
        c.remove("mimo2.rope.freq_base_swa");
    });
    assert_eq!(run(absent.path()), base);
    let other = edited(name, |c| {
        c.insert("mimo2.rope.freq_base_swa".into(), f32v(5e4));
    });
    assert_ne!(run(other.path()), base);
    // A value scale of 0 is llama.cpp's "none": other bits than 0.5, the same as no key.
    let zero = edited(name, |c| {
        c.insert("mimo2.attention.value_scale".into(), f32v(0.0));
    });
    let none = edited(name, |c| {
        c.remove("mimo2.attention.value_scale");
    });
    assert_eq!(run(zero.path()), run(none.path()));
    assert_ne!(run(zero.path()), base);
}
