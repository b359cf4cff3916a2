//! `mimo_v2_flash` (MiMoV2FlashForCausalLM: Xiaomi's MiMo-V2-Flash) as transformers 5.17
//! computes it in `f32`:
//!
//! - RMSNorm (weight style, `rms_norm_eps` default 1e-5);
//! - attention layers of two kinds (`layer_types`; by default the first and every sixth layer
//!   `full_attention`, the rest `sliding_attention`): queries and keys `head_dim` wide (192),
//!   values `v_head_dim` wide (128) and multiplied by `attention_value_scale` (0.707) after
//!   `v_proj`, NeoX RoPE on the first `int(head_dim · partial_rotary_factor)` dims with each
//!   kind's own base (`rope_parameters.full_attention` / `.sliding_attention`), no q/k norm, no
//!   `o_proj` bias. The sliding layers have twice the key/value heads, a window of
//!   `sliding_window` (128) and a learned sink per head (`self_attn.attention_sink_bias` in the checkpoint, the module's `sinks`: a logit that joins the
//!   softmax and is dropped after it);
//! - MLPs of two kinds (`mlp_layer_types`; by default the first `dense`, the rest `sparse`): a
//!   dense SwiGLU of `intermediate_size`, or routed experts selected by DeepSeek-V3's sigmoid
//!   group router with its correction bias, combined in slot order, with no shared expert;
//! - final norm, `lm_head`.

use crate::blocks::AttnShape;
use crate::config::{
    attention_dims, bad, group_router, layer_kinds, limits, rms_eps, ConfigReader, RopeConfig,
};
use crate::error::{ConfigFault, Result};
use crate::family::common::{AttnExtra, AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, SharedPlan};

/// The config keys the forward pass reads.
#[derive(Clone, Debug)]
pub struct MimoV2FlashConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `intermediate_size` (dense layers; default 16384).
    pub intermediate_size: usize,
    /// `moe_intermediate_size` (default 2048).
    pub moe_intermediate_size: usize,
    /// `rms_norm_eps` (default 1e-5).
    pub rms_norm_eps: f32,
    /// The full-attention layers' form.
    pub full: AttnSpec,
    /// The sliding-window layers' form.
    pub sliding: AttnSpec,
    /// Each kind's RoPE.
    pub full_rope: RopeConfig,
    /// The sliding layers' RoPE.
    pub sliding_rope: RopeConfig,
    /// Each layer's kind: sliding or not.
    pub sliding_layers: Vec<bool>,
    /// Each layer's MLP: sparse or not.
    pub sparse: Vec<bool>,
    /// `n_routed_experts` (default 256).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `n_group`, `topk_group` (default 1, 1) and `routed_scaling_factor` (default 1).
    pub groups: (usize, usize, f32),
    /// `norm_topk_prob` (default true).
    pub norm_topk_prob: bool,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

/// A per-layer list `key` of two kinds, `kinds[1]` true (or `default` when absent).
fn two_kinds(
    c: &ConfigReader<'_>,
    key: &str,
    kinds: [&str; 2],
    supported: &'static str,
    n: usize,
    default: impl Fn(usize) -> bool,
) -> Result<Vec<bool>> {
    layer_kinds(
        c,
        key,
        n,
        default,
        |t| kinds.iter().position(|k| *k == t).map(|i| i == 1),
        |value| ConfigFault::Unsupported { value, supported },
    )
}

/// One layer kind's RoPE: `rope_parameters[kind]` (transformers reads nothing else), default RoPE
/// only, `partial_rotary_factor` default 0.334; the whole `rope_parameters` absent takes the
/// released defaults (`default_theta`).
fn kind_rope(
    c: &ConfigReader<'_>,
    kind: &str,
    head_dim: usize,
    default_theta: f64,
) -> Result<RopeConfig> {
    let sub = match c.object("rope_parameters")? {
        None => {
            serde_json::json!({"rope_parameters": {"rope_type": "default", "rope_theta": default_theta}})
        }
        Some(p) => match p.raw(kind) {
            Some(v @ serde_json::Value::Object(_)) => {
                if v.get("rope_theta").is_none() {
                    return Err(bad(
                        &format!("rope_parameters.{kind}.rope_theta"),
                        ConfigFault::Missing,
                    ));
                }
                serde_json::json!({ "rope_parameters": v })
            }
            _ => {
                return Err(bad(
                    &format!("rope_parameters.{kind}"),
                    ConfigFault::Missing,
                ))
            }
        },
    };
    RopeConfig::read(&ConfigReader::new(&sub)?, head_dim, default_theta, 0.334)
}

impl MimoV2FlashConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<MimoV2FlashConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, _) = attention_dims(&c)?;
        let head_dim = c.positive_or("head_dim", MAX_DIM, 192)?;
        let v_dim = c.positive_or("v_head_dim", MAX_DIM, 128)?;
        if v_dim > head_dim {
            return Err(bad(
                "v_head_dim",
                ConfigFault::OutOfRange {
                    value: v_dim,
                    max: head_dim,
                },
            ));
        }
        // transformers: the sliding layers have twice the key/value heads.
        let swa_kv = kv_heads * 2;
        if heads % swa_kv != 0 {
            return Err(bad(
                "num_key_value_heads",
                ConfigFault::NotADivisor {
                    value: swa_kv,
                    of_key: "num_attention_heads",
                    of: heads,
                },
            ));
        }
        let window = c.positive_or("sliding_window", usize::MAX, 128)?;
        // transformers: absent, the class default 0.707; null, no scale.
        let v_scale = match v.get("attention_value_scale") {
            None => 0.707,
            Some(serde_json::Value::Null) => 1.0,
            Some(_) => c.f64("attention_value_scale")?.unwrap_or(1.0),
        };
        if !(v_scale as f32).is_finite() {
            return Err(bad(
                "attention_value_scale",
                ConfigFault::NotFinite { value: v_scale },
            ));
        }
        let num_layers = c.positive("num_hidden_layers", MAX_LAYERS)?;
        let sliding_layers = two_kinds(
            &c,
            "layer_types",
            ["full_attention", "sliding_attention"],
            "\"full_attention\" or \"sliding_attention\"",
            num_layers,
            |i| !(i == 0 || (i + 1).is_multiple_of(6)),
        )?;
        let sparse = two_kinds(
            &c,
            "mlp_layer_types",
            ["dense", "sparse"],
            "\"dense\" or \"sparse\"",
            num_layers,
            |i| i > 0,
        )?;
        let num_experts = match c.usize("n_routed_experts", MAX_EXPERTS)? {
            Some(n) => n,
            None => c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(256),
        };
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts == 0 || top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let bias = c.bool("attention_bias")?.unwrap_or(false);
        let rms_norm_eps = rms_eps(&c, 1e-5)?;
        let spec = |kv_heads: usize, window: Option<usize>, sinks: bool| AttnSpec {
            shape: AttnShape {
                heads,
                kv_heads,
                head_dim,
                window,
            },
            eps: rms_norm_eps,
            qk_norm: None,
            qkv_bias: bias,
            o_bias: false,
            out_gate: false,
            extra: Some(AttnExtra {
                v_dim,
                v_scale: v_scale as f32,
                sinks,
            }),
        };
        Ok(MimoV2FlashConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers,
            intermediate_size: c.positive_or("intermediate_size", MAX_DIM, 16384)?,
            moe_intermediate_size: c.positive_or("moe_intermediate_size", MAX_DIM, 2048)?,
            rms_norm_eps,
            full: spec(kv_heads, None, false),
            sliding: spec(swa_kv, Some(window), true),
            full_rope: kind_rope(&c, "full_attention", head_dim, 5_000_000.0)?,
            sliding_rope: kind_rope(&c, "sliding_attention", head_dim, 10_000.0)?,
            sliding_layers,
            sparse,
            num_experts,
            top_k,
            groups: group_router(&c, num_experts, 1, 1, 1.0)?,
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(true),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }
}

/// mimo_v2_flash's forward pass: full-attention and sliding-window layers of their own forms,
/// dense or sparse MLPs, no shared experts.
pub fn plan(c: &MimoV2FlashConfig) -> Plan {
    let (n_group, topk_group, scale) = c.groups;
    Plan {
        family: "mimo_v2_flash",
        prefix: "model.".into(),
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        tied: c.tie_word_embeddings,
        norm: NormStyle::Weight,
        eps: c.rms_norm_eps,
        attn: c.full,
        rope: c.full_rope.clone(),
        swa: Some((c.sliding, c.sliding_rope.clone())),
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        mixers: c
            .sliding_layers
            .iter()
            .map(|&s| match s {
                true => MixerPlan::SlidingAttention,
                false => MixerPlan::Attention,
            })
            .collect(),
        mla: None,
        kda: None,
        dsa: None,
        hyper: None,
        swiglu_limit: None,
        delta: None,
        mlps: MlpPlan::layers(
            c.num_layers,
            |l| c.sparse[l],
            MlpPlan::sigmoid_group_moe(n_group, topk_group, scale, 0),
            c.intermediate_size,
        ),
        shared: SharedPlan::EXPERTS,
    }
}

/// The transformers names of mimo2's own GGUF layer tensors (below `model.layers.N.`), as
/// llama.cpp's `MimoV2Model` converter writes them: the sliding layers' sinks (`attn_sinks`),
/// the post-attention norm (`ffn_norm`) and the router's correction bias (`exp_probs_b`).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("attn_sinks", "weight") => "self_attn.attention_sink_bias",
        ("ffn_norm", "weight") => "post_attention_layernorm.weight",
        ("exp_probs_b", "bias") => "mlp.gate.e_score_correction_bias",
        _ => return None,
    })
}

/// mimo_v2_flash's keys of a mimo2 GGUF's config, as llama.cpp's mimo2 loader and graph read
/// them: the layer kinds from `attention.sliding_window_pattern` (true or non-zero: sliding),
/// `attention.head_count_kv` per layer — transformers' MiMo has twice the full layers' key/value
/// heads on the sliding ones, and any other split is refused —, the window, values
/// `attention.value_length` wide (default the keys'), `attention.value_scale` (absent or 0: none),
/// `rope.dimension_count` (not 0) of each head rotated in both kinds, `rope.freq_base` (full) and
/// `rope.freq_base_swa` (sliding; default 10000, llama.cpp's), dense layers where a layer has no
/// router (`feed_forward_length` wide), the sigmoid router (llama.cpp's graph hard-codes it:
/// another `expert_gating_func` is refused) with its groups and correction bias, always
/// renormalised (`expert_weights_norm` false refused), never scaled (llama.cpp's mimo2 reads no
/// `expert_weights_scale`; a value other than 0 or 1 is refused). `head_count_kv` and the
/// pattern may be lists of booleans or integers, or one integer for every layer.
pub fn gguf_config(
    g: &crate::gguf_model::GgufConfig<'_>,
    c: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    use crate::error::GgufFault as G;
    use serde_json::json;
    let kv = &g.kv;
    let layers = g.layers as usize;
    // A list of booleans or integers, or one integer for every layer.
    let per_layer = |k: &str| -> Result<Option<Vec<u64>>> {
        let key = g.key(k);
        if let Ok(Some(b)) = kv.bool_list(&key) {
            return Ok(Some(b.into_iter().map(u64::from).collect()));
        }
        match kv.uint_list(&key) {
            Ok(v) => Ok(v),
            Err(_) => Ok(kv.uint(&key)?.map(|n| vec![n; layers])),
        }
    };
    let short = |k: &str, n: usize| {
        g.err(
            k,
            G::NoEquivalent {
                value: format!("{n} entries"),
                why: "one entry per layer is what llama.cpp's mimo2 reads",
            },
        )
    };
    let pattern = per_layer("attention.sliding_window_pattern")?
        .ok_or_else(|| g.err("attention.sliding_window_pattern", G::MissingNoDefault))?;
    if pattern.len() < layers {
        return Err(short("attention.sliding_window_pattern", pattern.len()));
    }
    let sliding: Vec<bool> = pattern[..layers].iter().map(|&p| p != 0).collect();
    let kv_heads = per_layer("attention.head_count_kv")?
        .ok_or_else(|| g.err("attention.head_count_kv", G::MissingNoDefault))?;
    if kv_heads.len() < layers {
        return Err(short("attention.head_count_kv", kv_heads.len()));
    }
    // The full layers' count K, the sliding layers' 2K.
    let base = match (0..layers).find(|&l| !sliding[l]) {
        Some(l) => kv_heads[l],
        None => kv_heads[0] / 2,
    };
    let split = (0..layers).all(|l| match sliding[l] {
        true => base.checked_mul(2) == Some(kv_heads[l]),
        false => kv_heads[l] == base,
    });
    if base == 0 || !split {
        return Err(g.err(
            "attention.head_count_kv",
            G::NoEquivalent {
                value: format!("{:?}", &kv_heads[..layers]),
                why: "transformers' MiMo-V2-Flash has twice the full layers' key/value heads on \
                      the sliding layers",
            },
        ));
    }
    c.insert("num_key_value_heads".into(), json!(base));
    let kinds: Vec<&str> = sliding
        .iter()
        .map(|&s| match s {
            true => "sliding_attention",
            false => "full_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(kinds));
    c.insert(
        "sliding_window".into(),
        json!(kv.uint_req(&g.key("attention.sliding_window"))?),
    );
    let v_dim = kv
        .uint(&g.key("attention.value_length"))?
        .unwrap_or(g.head_dim);
    // One width and one rotation for both kinds (transformers has one of each).
    for (k, want) in [
        ("attention.key_length_swa", g.head_dim),
        ("attention.value_length_swa", v_dim),
        ("rope.dimension_count_swa", g.rot),
    ] {
        if let Some(found) = kv.uint(&g.key(k))? {
            if found != want {
                return Err(g.err(
                    k,
                    G::NoEquivalent {
                        value: found.to_string(),
                        why: "transformers' MiMo-V2-Flash gives both layer kinds one width and \
                              one rotation",
                    },
                ));
            }
        }
    }
    c.insert("v_head_dim".into(), json!(v_dim));
    // llama.cpp: `if (v_scale)` — absent or 0, no scale (transformers' null).
    let scale = kv
        .float(&g.key("attention.value_scale"))?
        .filter(|&s| s != 0.0);
    c.insert("attention_value_scale".into(), json!(scale));
    let (rot, head_dim) = (g.rot, g.head_dim);
    if rot == 0 {
        return Err(g.err("rope.dimension_count", G::RotaryDims { rot, head_dim }));
    }
    // transformers: int(head_dim · partial_rotary_factor) must give back `rot` (a third of a
    // head is not exact in binary: the midpoint of the pair's interval).
    let partial = match rot as f64 / head_dim as f64 {
        p if (head_dim as f64 * p) as u64 == rot => p,
        _ => (rot as f64 + 0.5) / head_dim as f64,
    };
    // llama.cpp's default (llama-hparams.h), which its mimo2 loader keeps when the key is absent.
    let swa_theta = kv.float(&g.key("rope.freq_base_swa"))?.unwrap_or(10000.0);
    let rope = |theta: f64| json!({"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial});
    c.insert(
        "rope_parameters".into(),
        json!({"full_attention": rope(g.theta), "sliding_attention": rope(swa_theta)}),
    );
    c.insert("n_routed_experts".into(), json!(g.experts));
    let mlp: Vec<&str> = (0..g.layers)
        .map(|l| match g.dense.contains(&l) {
            true => "dense",
            false => "sparse",
        })
        .collect();
    c.insert("mlp_layer_types".into(), json!(mlp));
    if !g.dense.is_empty() {
        c.insert("intermediate_size".into(), json!(g.dense_width()?));
    }
    if kv.bool(&g.key("expert_weights_norm"))? == Some(false) {
        return Err(g.err("expert_weights_norm", G::NoRenormalisation));
    }
    c.insert("norm_topk_prob".into(), json!(true));
    match kv.uint(&g.key("expert_gating_func"))? {
        None | Some(2) => {}
        Some(f) => return Err(g.err("expert_gating_func", G::NotSigmoid { found: f })),
    }
    // llama.cpp's mimo2 reads no `expert_weights_scale`: its experts are never scaled, and a
    // file that says otherwise is refused rather than run one way or the other.
    if let Some(s) = kv.float(&g.key("expert_weights_scale"))? {
        if s != 0.0 && s != 1.0 {
            return Err(g.err(
                "expert_weights_scale",
                G::NoEquivalent {
                    value: s.to_string(),
                    why: "llama.cpp's mimo2 does not read it (no scale); MiMo-V2-Flash's is 1",
                },
            ));
        }
    }
    c.insert("routed_scaling_factor".into(), json!(1.0));
    for (k, hf) in [
        ("expert_group_count", "n_group"),
        ("expert_group_used_count", "topk_group"),
    ] {
        c.insert(hf.into(), json!(kv.uint(&g.key(k))?.unwrap_or(1)));
    }
    Ok(())
}

/// A mimo2 GGUF's tensors where llama.cpp and transformers agree on them: sinks on the sliding
/// layers only (a full layer's `attn_sinks`, which llama.cpp would apply, has no meaning in
/// transformers' MiMo), and no attention biases (llama.cpp loads them but its mimo2 graph never
/// adds them); either is refused.
pub fn gguf_assemble(
    config: &serde_json::Value,
    s: &mut crate::weights::TensorStore,
) -> Result<()> {
    let c = MimoV2FlashConfig::parse(config)?;
    let refuse = |name: String| crate::error::DecodeError::BadTensor {
        name,
        fault: crate::error::TensorFault::NoMeaning {
            model_type: "mimo_v2_flash",
            gguf_arch: "mimo2",
        },
    };
    for (l, &sliding) in c.sliding_layers.iter().enumerate() {
        let name = format!("model.layers.{l}.self_attn.attention_sink_bias");
        if !sliding && s.find(&name).is_some() {
            return Err(refuse(format!("blk.{l}.attn_sinks.weight")));
        }
        for (hf, gguf) in [("q", "q"), ("k", "k"), ("v", "v"), ("o", "output")] {
            let bias = format!("model.layers.{l}.self_attn.{hf}_proj.bias");
            if s.find(&bias).is_some() {
                return Err(refuse(format!("blk.{l}.attn_{gguf}.bias")));
            }
        }
    }
    Ok(())
}
