//! `glm4_moe` (Glm4MoeForCausalLM: GLM-4.5 / 4.6) as transformers 5.17 computes it in `f32`
//! (`research/model-families.md` §4): RMSNorm (eps 1e-5 by default), GQA attention with biases on
//! q/k/v only (never on o), optional per-head q/k norm, NeoX RoPE on the first
//! `head_dim · partial_rotary_factor` dims (0.5 by default); dense MLP layers below
//! `first_k_dense_replace`; MoE layers with the sigmoid router (correction bias for selection
//! only, group-limited top-k, unbiased weights renormalised and scaled) plus shared experts:
//! `routed + shared`. The nextn (MTP) layers past `num_hidden_layers` are not run.

use serde_json::{json, Map, Value};

use crate::blocks::AttnShape;
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, GgufFault as G, Result};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, SharedPlan};
use crate::gguf_model::GgufConfig;

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Glm4MoeConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size` (dense layers; default 10944).
    pub intermediate_size: usize,
    /// `moe_intermediate_size` (an expert's width; default 1408).
    pub moe_intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps` (default 1e-5).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e4) and rotated dims (`partial_rotary_factor` default 0.5).
    pub rope: RopeConfig,
    /// `attention_bias`: biases on q, k and v.
    pub attention_bias: bool,
    /// `use_qk_norm`.
    pub use_qk_norm: bool,
    /// `n_routed_experts` (default 128).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `n_shared_experts` (default 1): the shared MLP is `moe_intermediate_size` times as wide.
    pub n_shared_experts: usize,
    /// `routed_scaling_factor` (default 1.0), as the `f32` torch multiplies by.
    pub routed_scaling_factor: f32,
    /// `n_group` (default 1).
    pub n_group: usize,
    /// `topk_group` (default 1).
    pub topk_group: usize,
    /// `first_k_dense_replace` (default 1).
    pub first_k_dense_replace: usize,
    /// `norm_topk_prob` (default true).
    pub norm_topk_prob: bool,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl Glm4MoeConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<Glm4MoeConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, head_dim) = attention_dims(&c)?;
        let num_experts = c.usize("n_routed_experts", MAX_EXPERTS)?.unwrap_or(128);
        if num_experts == 0 {
            return Err(bad("n_routed_experts", ConfigFault::Zero));
        }
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(8);
        if top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let (n_group, topk_group, scale) = crate::config::group_router(&c, num_experts, 1, 1, 1.0)?;
        Ok(Glm4MoeConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size", MAX_DIM)?.unwrap_or(10944),
            moe_intermediate_size: c.usize("moe_intermediate_size", MAX_DIM)?.unwrap_or(1408),
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-5)?,
            rope: RopeConfig::read(&c, head_dim, 10000.0, 0.5)?,
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            use_qk_norm: c.bool("use_qk_norm")?.unwrap_or(false),
            num_experts,
            top_k,
            n_shared_experts: c.usize("n_shared_experts", MAX_EXPERTS)?.unwrap_or(1),
            routed_scaling_factor: scale,
            n_group,
            topk_group,
            first_k_dense_replace: c.usize("first_k_dense_replace", MAX_LAYERS)?.unwrap_or(1),
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(true),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }

    /// Whether layer `l` is a MoE layer (else a dense MLP).
    pub fn is_moe(&self, l: usize) -> bool {
        l >= self.first_k_dense_replace
    }

    /// The shared experts' width (0: none).
    pub fn shared_width(&self) -> usize {
        self.moe_intermediate_size * self.n_shared_experts
    }
}

/// glm4_moe's forward pass: every layer attends (partial rotary, q/k norms and q/k/v biases as
/// configured, no o bias); the first `first_k_dense_replace` layers are dense and the rest MoE
/// with the sigmoid group router and shared experts.
pub fn plan(c: &Glm4MoeConfig) -> Plan {
    Plan {
        family: "glm4_moe",
        prefix: "model.".into(),
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        tied: c.tie_word_embeddings,
        norm: NormStyle::Weight,
        eps: c.rms_norm_eps,
        attn: AttnSpec {
            shape: AttnShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                window: None,
            },
            eps: c.rms_norm_eps,
            qk_norm: c.use_qk_norm.then_some(NormStyle::Weight),
            qkv_bias: c.attention_bias,
            o_bias: false,
            out_gate: false,
            extra: None,
        },
        rope: c.rope.clone(),
        swa: None,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        mixers: vec![MixerPlan::Attention; c.num_layers],
        mla: None,
        kda: None,
        dsa: None,
        hyper: None,
        swiglu_limit: None,
        delta: None,
        mlps: MlpPlan::layers(
            c.num_layers,
            |l| c.is_moe(l),
            MlpPlan::sigmoid_group_moe(
                c.n_group,
                c.topk_group,
                c.routed_scaling_factor,
                c.shared_width(),
            ),
            c.intermediate_size,
        ),
        shared: SharedPlan::EXPERTS,
    }
}

/// The transformers names of glm4moe's own GGUF layer tensors (below `model.layers.N.`).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        // GLM's o_proj never has a bias (model-families.md §4.1): `attn_output.bias` has none.
        ("post_attention_norm", "weight") => "post_attention_layernorm.weight",
        _ => return crate::gguf_model::shared_expert_name(stem, suffix),
    })
}

/// glm4_moe's keys of a glm4moe GGUF's config, with llama.cpp's defaults where it has a usable
/// one (`crate::gguf_model`).
pub fn gguf_config(g: &GgufConfig<'_>, c: &mut Map<String, Value>) -> Result<()> {
    let kv = &g.kv;
    let (rot, head_dim) = (g.rot, g.head_dim);
    // llama.cpp: an absent (or 0, "none") gating function means sigmoid for glm4moe.
    match kv.uint(&g.key("expert_gating_func"))? {
        None | Some(0) | Some(2) => {}
        Some(f) => return Err(g.err("expert_gating_func", G::NotSigmoid { found: f })),
    }
    if kv.has(&g.key("rope.dimension_sections")) {
        return Err(g.err("rope.dimension_sections", G::MRope));
    }
    let partial = rot as f64 / head_dim as f64;
    // transformers: int(head_dim * partial_rotary_factor) must give back `rot`.
    if (head_dim as f64 * partial) as u64 != rot {
        return Err(g.err("rope.dimension_count", G::RotaryFactor { rot, head_dim }));
    }
    let moe_i = kv.uint_req(&g.key("expert_feed_forward_length"))?;
    let shared = kv.uint_req(&g.key("expert_shared_count"))?;
    if let Some(s) = kv.uint(&g.key("expert_shared_feed_forward_length"))? {
        if Some(s) != moe_i.checked_mul(shared) {
            return Err(g.err(
                "expert_shared_feed_forward_length",
                G::SharedWidth {
                    found: s,
                    width: moe_i,
                    count: shared,
                },
            ));
        }
    }
    // llama.cpp's default: no leading dense layer; the layers without a router are exactly
    // the leading ones.
    let lead = g.leading_dense()?;
    // llama.cpp's default is 0.0, which its `build_moe_ffn` takes (like 1) as no scaling.
    let scale = match kv.float(&g.key("expert_weights_scale"))? {
        None | Some(0.0) => 1.0,
        Some(s) => s,
    };
    let groups = kv.uint(&g.key("expert_group_count"))?.unwrap_or(1);
    let groups_used = kv.uint(&g.key("expert_group_used_count"))?.unwrap_or(1);
    let nextn = kv.uint(&g.key("nextn_predict_layers"))?.unwrap_or(0);
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": g.theta, "partial_rotary_factor": partial}),
    );
    c.insert("partial_rotary_factor".into(), json!(partial));
    c.insert("n_routed_experts".into(), json!(g.experts));
    c.insert("n_shared_experts".into(), json!(shared));
    c.insert("moe_intermediate_size".into(), json!(moe_i));
    c.insert("first_k_dense_replace".into(), json!(lead));
    c.insert("routed_scaling_factor".into(), json!(scale));
    // llama.cpp's default when the key is absent: no renormalisation.
    c.insert(
        "norm_topk_prob".into(),
        json!(kv.bool(&g.key("expert_weights_norm"))?.unwrap_or(false)),
    );
    c.insert("n_group".into(), json!(groups));
    c.insert("topk_group".into(), json!(groups_used));
    c.insert("num_nextn_predict_layers".into(), json!(nextn));
    c.insert("use_qk_norm".into(), json!(g.qk_norm));
    if lead > 0 {
        c.insert("intermediate_size".into(), json!(g.dense_width()?));
    } else if let Some(f) = g.ff {
        c.insert("intermediate_size".into(), json!(f));
    }
    Ok(())
}
