//! `deepseek_v3` (DeepseekV3ForCausalLM: DeepSeek-V3/R1; Kimi-K2 checkpoints declare
//! `kimi_k2` with the same keys) as transformers 5.17 computes it in `f32`: RMSNorm, multi-head
//! latent attention ([`crate::family::mla`]), the first `first_k_dense_replace` layers a dense
//! SwiGLU MLP and the rest MoE — the sigmoid group router with its correction bias (GLM-4.5's,
//! which is DeepSeek-V3's), SwiGLU experts combined in selection-slot order, plus the shared
//! experts (`n_shared_experts` times an expert's width) —, final norm, `lm_head`.
//!
//! RoPE default or YaRN (the released DeepSeek-V3/R1 and Kimi-K2 checkpoints'), YaRN's
//! `mscale_all_dim` also scaling the attention's scores. Refused by name rather than run
//! otherwise: another RoPE type, `num_key_value_heads` other than the heads (transformers would
//! repeat keys that MLA already gives every head), values wider than keys.

use serde_json::{json, Map, Value};

use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, DecodeError, GgufFault as G, Result, TensorFault};
use crate::family::common::NormStyle;
use crate::family::mla::MlaShape;
use crate::family::plan::{MixerPlan, MlpPlan, Plan, SharedPlan};
use crate::gguf_model::GgufConfig;
use crate::weights::{Tensor, TensorStore};

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct DeepseekV3Config {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size` (dense layers; default 18432).
    pub intermediate_size: usize,
    /// `moe_intermediate_size` (an expert's width; default 2048).
    pub moe_intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `rms_norm_eps` (default 1e-6).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e4) over `qk_rope_head_dim` dims.
    pub rope: RopeConfig,
    /// The attention's widths.
    pub mla: MlaShape,
    /// `n_routed_experts` (default 256).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `n_shared_experts` (default 1).
    pub n_shared_experts: usize,
    /// `routed_scaling_factor` (default 2.5), as the `f32` torch multiplies by.
    pub routed_scaling_factor: f32,
    /// `n_group` (default 8).
    pub n_group: usize,
    /// `topk_group` (default 4).
    pub topk_group: usize,
    /// `first_k_dense_replace` (default 3).
    pub first_k_dense_replace: usize,
    /// `norm_topk_prob` (default true).
    pub norm_topk_prob: bool,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl DeepseekV3Config {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<DeepseekV3Config> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        // `head_dim` in a saved config is transformers' copy of `qk_rope_head_dim`: not read.
        let (hidden_size, heads, kv_heads, _) = attention_dims(&c)?;
        if kv_heads != heads {
            return Err(bad(
                "num_key_value_heads",
                ConfigFault::Unsupported {
                    value: kv_heads.to_string(),
                    supported: "num_attention_heads: MLA gives every head its own key and value",
                },
            ));
        }
        let q_lora_rank = match v.get("q_lora_rank") {
            Some(serde_json::Value::Null) => None,
            None => Some(1536),
            Some(_) => Some(c.positive_or("q_lora_rank", MAX_DIM, 1536)?),
        };
        let nope = c.positive_or("qk_nope_head_dim", MAX_DIM, 128)?;
        let rope_dim = c.positive_or("qk_rope_head_dim", MAX_DIM, 64)?;
        if !rope_dim.is_multiple_of(2) {
            return Err(bad(
                "qk_rope_head_dim",
                ConfigFault::Unsupported {
                    value: rope_dim.to_string(),
                    supported: "an even width: RoPE rotates pairs",
                },
            ));
        }
        let v_dim = c.positive_or("v_head_dim", MAX_DIM, 128)?;
        if v_dim > nope + rope_dim {
            return Err(bad(
                "v_head_dim",
                ConfigFault::OutOfRange {
                    value: v_dim,
                    max: nope + rope_dim,
                },
            ));
        }
        let rope = RopeConfig::read_with_yarn(&c, rope_dim, 10000.0, 1.0)?;
        // transformers' DeepSeek-V3 rotates every rope dim whatever `partial_rotary_factor` says.
        if rope.rotary_dim != rope_dim {
            return Err(bad(
                "partial_rotary_factor",
                ConfigFault::Unsupported {
                    value: format!("{} of {rope_dim} rope dims", rope.rotary_dim),
                    supported: "1: DeepSeek-V3 rotates all of qk_rope_head_dim",
                },
            ));
        }
        // transformers' `yarn_apply_mscale`: Python floats, then met by f32 scores.
        let mut scale = 1.0 / ((nope + rope_dim) as f64).sqrt();
        if let Some(y) = rope.yarn.as_ref().filter(|y| y.mscale_all_dim != 0.0) {
            let m = crate::config::Yarn::mscale(y.factor, y.mscale_all_dim);
            scale = scale * m * m;
        }
        let mla = MlaShape {
            heads,
            q_lora_rank,
            kv_lora_rank: c.positive_or("kv_lora_rank", MAX_DIM, 512)?,
            nope,
            rope: rope_dim,
            v: v_dim,
            interleave: c.bool("rope_interleave")?.unwrap_or(true),
            bias: c.bool("attention_bias")?.unwrap_or(false),
            latent_eps: crate::family::mla::LATENT_EPS,
            scale: scale as f32,
        };
        let (num_experts, top_k) = crate::config::routed_experts(&c, 256, 8)?;
        let (n_group, topk_group, scale) = crate::config::group_router(&c, num_experts, 8, 4, 2.5)?;
        Ok(DeepseekV3Config {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size", MAX_DIM)?.unwrap_or(18432),
            moe_intermediate_size: c.usize("moe_intermediate_size", MAX_DIM)?.unwrap_or(2048),
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            rms_norm_eps: rms_eps(&c, 1e-6)?,
            rope,
            mla,
            num_experts,
            top_k,
            n_shared_experts: c.usize("n_shared_experts", MAX_EXPERTS)?.unwrap_or(1),
            routed_scaling_factor: scale,
            n_group,
            topk_group,
            first_k_dense_replace: c.usize("first_k_dense_replace", MAX_LAYERS)?.unwrap_or(3),
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(true),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }
}

/// deepseek_v3's forward pass: every layer MLA; layers below `first_k_dense_replace` dense, the
/// rest MoE with the sigmoid group router and the shared experts.
pub fn plan(c: &DeepseekV3Config) -> Plan {
    let m = &c.mla;
    Plan {
        family: "deepseek_v3",
        prefix: "model.".into(),
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        tied: c.tie_word_embeddings,
        norm: NormStyle::Weight,
        eps: c.rms_norm_eps,
        // What an attention layer would be; every layer here is MLA (`mla`).
        attn: m.attn_spec(c.rms_norm_eps),
        rope: c.rope.clone(),
        swa: None,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        mixers: vec![MixerPlan::Mla; c.num_layers],
        mla: Some(*m),
        kda: None,
        dsa: None,
        hyper: None,
        swiglu_limit: None,
        delta: None,
        mlps: MlpPlan::layers(
            c.num_layers,
            |l| l >= c.first_k_dense_replace,
            MlpPlan::sigmoid_group_moe(
                c.n_group,
                c.topk_group,
                c.routed_scaling_factor,
                c.moe_intermediate_size * c.n_shared_experts,
            ),
            c.intermediate_size,
        ),
        shared: SharedPlan::EXPERTS,
    }
}

/// `attn_k_b` renamed: assembled into `kv_b_proj` by [`gguf_assemble`].
const K_B: &str = "self_attn.k_b_proj.weight";
/// `attn_v_b` renamed: assembled into `kv_b_proj` by [`gguf_assemble`].
const V_B: &str = "self_attn.v_b_proj.weight";

/// The transformers names of deepseek2's own GGUF layer tensors (below `model.layers.N.`).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("attn_q_a", "weight") => "self_attn.q_a_proj.weight",
        ("attn_q_a_norm", "weight") => "self_attn.q_a_layernorm.weight",
        ("attn_q_b", "weight") => "self_attn.q_b_proj.weight",
        ("attn_kv_a_mqa", "weight") => "self_attn.kv_a_proj_with_mqa.weight",
        ("attn_kv_a_norm", "weight") => "self_attn.kv_a_layernorm.weight",
        // GGUFs written before llama.cpp split it (June 2025).
        ("attn_kv_b", "weight") => "self_attn.kv_b_proj.weight",
        ("attn_k_b", "weight") => K_B,
        ("attn_v_b", "weight") => V_B,
        ("ffn_norm", "weight") => "post_attention_layernorm.weight",
        _ => return crate::gguf_model::shared_expert_name(stem, suffix),
    })
}

/// deepseek_v3's keys of a deepseek2 GGUF's config: what llama.cpp's deepseek2 graph computes,
/// in both of its MLA forms (`crate::gguf_model`).
pub fn gguf_config(g: &GgufConfig<'_>, c: &mut Map<String, Value>) -> Result<()> {
    let kv = &g.kv;
    let key = |k: &str| g.key(k);
    let width = |k: &str, found: u64, rule: &'static str, expected: u64| -> Result<()> {
        match found == expected {
            true => Ok(()),
            false => Err(g.err(
                k,
                G::MlaWidth {
                    found,
                    rule,
                    expected,
                },
            )),
        }
    };
    match kv.uint(&key("expert_gating_func"))? {
        Some(2) => {}
        None => return Err(g.err("expert_gating_func", G::SoftmaxByDefault)),
        Some(f) => return Err(g.err("expert_gating_func", G::NotSigmoid { found: f })),
    }
    let heads = kv.uint_req(&key("attention.head_count"))?;
    let kv_heads = kv.uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
    // Every width bounded before any arithmetic on them.
    let bounded = |k: &str, v: u64| -> Result<u64> {
        let max = limits::MAX_DIM as u64;
        match v <= max {
            true => Ok(v),
            false => Err(g.err(k, G::TooLarge { value: v, max })),
        }
    };
    let rank = bounded(
        "attention.kv_lora_rank",
        kv.uint_req(&key("attention.kv_lora_rank"))?,
    )?;
    let rope = bounded(
        "rope.dimension_count",
        kv.uint_req(&key("rope.dimension_count"))?,
    )?;
    let value_length = bounded(
        "attention.value_length",
        kv.uint_req(&key("attention.value_length"))?,
    )?;
    if let Some(t) = kv
        .float(&key("attention.temperature_scale"))?
        .filter(|&t| t != 0.0)
    {
        return Err(g.err(
            "attention.temperature_scale",
            G::NoEquivalent {
                value: t.to_string(),
                why: "llama.cpp's deepseek2 scales the queries by it past attention.temperature_length, which no transformers DeepSeek-V3 config does",
            },
        ));
    }
    let (qk, v) = match (
        kv.uint(&key("attention.key_length_mla"))?,
        kv.uint(&key("attention.value_length_mla"))?,
    ) {
        // llama.cpp's MLA form: one latent "head" of keys and values that every head shares.
        (Some(qk), Some(v)) => {
            let (qk, v) = (
                bounded("attention.key_length_mla", qk)?,
                bounded("attention.value_length_mla", v)?,
            );
            let latent = rank + rope;
            width(
                "attention.key_length",
                g.head_dim,
                "kv_lora_rank + rope.dimension_count",
                latent,
            )?;
            width("attention.value_length", value_length, "kv_lora_rank", rank)?;
            width("attention.head_count_kv", kv_heads, "one latent", 1)?;
            (qk, v)
        }
        // The form before it: keys and values per head.
        (None, None) => {
            width(
                "attention.head_count_kv",
                kv_heads,
                "attention.head_count",
                heads,
            )?;
            (bounded("attention.key_length", g.head_dim)?, value_length)
        }
        (Some(_), None) => {
            return Err(g.err(
                "attention.key_length_mla",
                G::MlaHalf {
                    other: "attention.value_length_mla",
                },
            ))
        }
        (None, Some(_)) => {
            return Err(g.err(
                "attention.value_length_mla",
                G::MlaHalf {
                    other: "attention.key_length_mla",
                },
            ))
        }
    };
    if rope == 0 || rope >= qk {
        return Err(g.err(
            "rope.dimension_count",
            G::RotaryDims {
                rot: rope,
                head_dim: qk.saturating_sub(1),
            },
        ));
    }
    let lead = g.leading_dense()?;
    // llama.cpp scales the routed weights only by a scale other than 0 and 1.
    let scale = match kv.float(&key("expert_weights_scale"))? {
        None | Some(0.0) => 1.0,
        Some(s) => s,
    };
    let groups = kv.uint(&key("expert_group_count"))?.unwrap_or(1).max(1);
    let groups_used = match groups {
        1 => 1,
        _ => kv.uint_req(&key("expert_group_used_count"))?,
    };
    c.insert("rope_parameters".into(), gguf_rope(g)?);
    c.insert("num_key_value_heads".into(), json!(heads));
    c.insert("head_dim".into(), json!(rope));
    c.insert("qk_nope_head_dim".into(), json!(qk - rope));
    c.insert("qk_rope_head_dim".into(), json!(rope));
    c.insert("v_head_dim".into(), json!(v));
    c.insert("kv_lora_rank".into(), json!(rank));
    c.insert(
        "q_lora_rank".into(),
        json!(kv.uint(&key("attention.q_lora_rank"))?),
    );
    // llama.cpp rotates interleaved pairs, and has no attention biases.
    c.insert("rope_interleave".into(), json!(true));
    c.insert("attention_bias".into(), json!(false));
    c.insert("n_routed_experts".into(), json!(g.experts));
    c.insert(
        "n_shared_experts".into(),
        json!(kv.uint_req(&key("expert_shared_count"))?),
    );
    c.insert(
        "moe_intermediate_size".into(),
        json!(kv.uint_req(&key("expert_feed_forward_length"))?),
    );
    c.insert("first_k_dense_replace".into(), json!(lead));
    c.insert("routed_scaling_factor".into(), json!(scale));
    c.insert(
        "norm_topk_prob".into(),
        json!(kv.bool(&key("expert_weights_norm"))?.unwrap_or(false)),
    );
    c.insert("n_group".into(), json!(groups));
    c.insert("topk_group".into(), json!(groups_used));
    c.insert(
        "num_nextn_predict_layers".into(),
        json!(kv.uint(&key("nextn_predict_layers"))?.unwrap_or(0)),
    );
    if lead > 0 {
        c.insert("intermediate_size".into(), json!(g.dense_width()?));
    } else if let Some(f) = g.ff {
        c.insert("intermediate_size".into(), json!(f));
    }
    Ok(())
}

/// The `rope_parameters` of what llama.cpp's deepseek2 computes: no scaling, or YaRN with
/// `mscale` = `mscale_all_dim` = `yarn_log_multiplier / 0.1` (computed in `f32`, as llama.cpp
/// does; its converter writes `0.1 · mscale_all_dim`, and it assumes `mscale` the same).
fn gguf_rope(g: &GgufConfig<'_>) -> Result<Value> {
    let kv = &g.kv;
    let key = |k: &str| g.key(k);
    let no = |k: &str, value: String, why: &'static str| g.err(k, G::NoEquivalent { value, why });
    if let Some(f) = kv
        .float(&key("rope.scaling.attn_factor"))?
        .filter(|&f| f != 1.0)
    {
        return Err(no(
            "rope.scaling.attn_factor",
            f.to_string(),
            "llama.cpp's deepseek2 scales cos, sin and the scores by it, which no transformers config does",
        ));
    }
    match kv.str(&key("rope.scaling.type"))? {
        None | Some("none") => {
            crate::gguf_model::no_untyped_scaling(&g.kv, g.arch)?;
            return Ok(json!({"rope_type": "default", "rope_theta": g.theta}));
        }
        Some("yarn") => {}
        Some(t) => {
            return Err(g.err(
                "rope.scaling.type",
                G::RopeScaling {
                    kind: t.to_string(),
                },
            ))
        }
    }
    let factor = kv
        .float(&key("rope.scaling.factor"))?
        .ok_or_else(|| g.err("rope.scaling.factor", G::MissingNoDefault))?;
    if factor < 1.0 {
        return Err(no(
            "rope.scaling.factor",
            factor.to_string(),
            "below 1 llama.cpp's deepseek2 scales the scores by 1 + 0.1·mscale·ln(factor), unclamped; transformers' YaRN by 1",
        ));
    }
    let original = match kv.uint(&key("rope.scaling.original_context_length"))? {
        Some(n) => n,
        None => kv.uint_req(&key("context_length"))?,
    };
    // llama.cpp takes 0 as no multiplier; f32(L) / 0.1 as it computes it must be a finite m ≠ 0.
    const NO_LOG_MUL: &str = "without it (or at 0) llama.cpp's deepseek2 scales both cos/sin and the scores by YaRN's mscale, which no transformers config does";
    let log_mul = kv
        .float(&key("rope.scaling.yarn_log_multiplier"))?
        .ok_or_else(|| {
            no(
                "rope.scaling.yarn_log_multiplier",
                "missing".into(),
                NO_LOG_MUL,
            )
        })?;
    let m = f64::from(log_mul as f32 / 0.1f32);
    if m == 0.0 || !m.is_finite() {
        return Err(no(
            "rope.scaling.yarn_log_multiplier",
            log_mul.to_string(),
            NO_LOG_MUL,
        ));
    }
    // llama.cpp reads neither: its YaRN betas are always 32 and 1.
    for (k, default) in [
        ("rope.scaling.yarn_beta_fast", 32.0),
        ("rope.scaling.yarn_beta_slow", 1.0),
    ] {
        if let Some(b) = kv.float(&key(k))?.filter(|&b| b != default) {
            return Err(no(
                k,
                b.to_string(),
                "llama.cpp's deepseek2 does not read it and computes with beta_fast 32, beta_slow 1",
            ));
        }
    }
    Ok(json!({
        "rope_type": "yarn",
        "rope_theta": g.theta,
        "factor": factor,
        "original_max_position_embeddings": original,
        "mscale": m,
        "mscale_all_dim": m,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }))
}

/// deepseek2's `attn_k_b` (`[heads, kv_lora_rank, nope]`: each head's key rows of `kv_b_proj`
/// transposed) and `attn_v_b` (`[heads, v, kv_lora_rank]`) put back together as `kv_b_proj`
/// (`[heads · (nope + v), kv_lora_rank]`, per head its `nope` key rows, then its `v` value rows):
/// the same values, so each output's dot over the latent is the same canonical dot. A layer
/// already holding `kv_b_proj` (a GGUF from before the split) is left as it is.
pub fn gguf_assemble(config: &Value, s: &mut TensorStore) -> Result<()> {
    let c = DeepseekV3Config::parse(config)?;
    assemble_kv_b(s, c.num_layers, &c.mla)
}

/// `kv_b_proj` of each of `layers` layers (`model.layers.L.`) that has llama.cpp's split form put
/// back together from `attn_k_b` and `attn_v_b` (renamed `k_b_proj`/`v_b_proj`), every value
/// unchanged; a layer with `kv_b_proj` whole, or neither, is left as it is. deepseek2's and
/// glm5-next's.
pub fn assemble_kv_b(s: &mut TensorStore, layers: usize, m: &MlaShape) -> Result<()> {
    let (heads, rank, nope, v) = (m.heads, m.kv_lora_rank, m.nope, m.v);
    let gguf = |l: usize, n: &str| format!("blk.{l}.{n}.weight");
    let bad = |name: String, fault: TensorFault| DecodeError::BadTensor { name, fault };
    for l in 0..layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let (kb, vb, kvb) = (p(K_B), p(V_B), p("self_attn.kv_b_proj.weight"));
        match (s.find(&kb).is_some(), s.find(&vb).is_some()) {
            // Whole, or missing (which the decoder's check names).
            (false, false) => continue,
            (true, false) => {
                return Err(bad(
                    gguf(l, "attn_k_b"),
                    TensorFault::Unpaired {
                        missing: gguf(l, "attn_v_b"),
                    },
                ))
            }
            (false, true) => {
                return Err(bad(
                    gguf(l, "attn_v_b"),
                    TensorFault::Unpaired {
                        missing: gguf(l, "attn_k_b"),
                    },
                ))
            }
            (true, true) if s.find(&kvb).is_some() => {
                return Err(bad(
                    gguf(l, "attn_kv_b"),
                    TensorFault::BothForms {
                        other: gguf(l, "attn_k_b"),
                    },
                ))
            }
            (true, true) => {}
        }
        for (name, gname, want) in [
            (&kb, "attn_k_b", [heads, rank, nope]),
            (&vb, "attn_v_b", [heads, v, rank]),
        ] {
            let shape = s.get(name)?.shape();
            if shape != want {
                return Err(bad(
                    gguf(l, gname),
                    TensorFault::Shape {
                        shape: shape.to_vec(),
                        expected: want.to_vec(),
                    },
                ));
            }
        }
        let (k, k_bytes) = s.remove(&kb).expect("found above");
        let (vt, v_bytes) = s.remove(&vb).expect("found above");
        let w = nope + v;
        let t = Tensor::gathered(&kvb, &[heads * w, rank], &[&k, &vt], |i| {
            let (row, r) = (i / rank, i % rank);
            let (h, j) = (row / w, row % w);
            match j < nope {
                true => (0, (h * rank + r) * nope + j),
                false => (1, (h * v + (j - nope)) * rank + r),
            }
        });
        s.insert(t, k_bytes + v_bytes)?;
    }
    Ok(())
}
