//! `qwen3_moe` (Qwen3MoeForCausalLM) as transformers 5.17 computes it in `f32`
//! (`research/model-families.md` §2): RMSNorm, GQA attention with per-head q/k RMSNorm before
//! full-width NeoX RoPE, a softmax top-k router (`norm_topk_prob` as configured, default false),
//! SwiGLU experts combined in selection-slot order, dense MLP layers per `mlp_only_layers` and
//! `decoder_sparse_step`, final norm, `lm_head` (or the tied embedding).

use serde_json::{json, Map, Value};

use crate::blocks::AttnShape;
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, DecodeError, GgufFault as G, Result};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan, SharedPlan};
use crate::gguf_model::GgufConfig;

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3MoeConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size` (dense layers).
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// RoPE base and rotated dims.
    pub rope: RopeConfig,
    /// `attention_bias`: biases on q, k, v and o.
    pub attention_bias: bool,
    /// `sliding_window` when `use_sliding_window`.
    pub window: Option<usize>,
    /// `num_experts` / `num_local_experts`.
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `norm_topk_prob` (default false).
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step` (default 1).
    pub decoder_sparse_step: usize,
    /// `mlp_only_layers` (default empty).
    pub mlp_only_layers: Vec<usize>,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl Qwen3MoeConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<Qwen3MoeConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, head_dim) = attention_dims(&c)?;
        let num_experts = match c.usize("num_experts", MAX_EXPERTS)? {
            Some(n) => n,
            None => c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(128),
        };
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts > 0 && (top_k == 0 || top_k > num_experts) {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        // transformers: the window applies only with use_sliding_window; an absent key means the
        // class default 4096, an explicit null means no window; 0 would attend to nothing.
        let window = if c.bool("use_sliding_window")?.unwrap_or(false) {
            match v.get("sliding_window") {
                None => Some(4096),
                Some(serde_json::Value::Null) => None,
                Some(_) => match c.usize("sliding_window", usize::MAX)? {
                    Some(0) => return Err(bad("sliding_window", ConfigFault::Zero)),
                    w => w,
                },
            }
        } else {
            None
        };
        let decoder_sparse_step = c.usize("decoder_sparse_step", MAX_LAYERS)?.unwrap_or(1);
        if decoder_sparse_step == 0 {
            return Err(bad("decoder_sparse_step", ConfigFault::Zero));
        }
        Ok(Qwen3MoeConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size", MAX_DIM)?.unwrap_or(6144),
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-6)?,
            rope: RopeConfig::read(&c, head_dim, 10000.0, 1.0)?,
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            window,
            num_experts,
            top_k,
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(false),
            decoder_sparse_step,
            mlp_only_layers: c.usize_list("mlp_only_layers")?.unwrap_or_default(),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }

    /// Whether layer `l` is a MoE layer (else a dense MLP).
    pub fn is_moe(&self, l: usize) -> bool {
        !self.mlp_only_layers.contains(&l)
            && self.num_experts > 0
            && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// qwen3_moe's forward pass: every layer attends (q/k norms, biases as configured, a window
/// when configured) and is MoE (softmax top-k) or dense as configured.
pub fn plan(c: &Qwen3MoeConfig) -> Plan {
    Plan {
        family: "qwen3_moe",
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
                window: c.window,
            },
            eps: c.rms_norm_eps,
            qk_norm: Some(NormStyle::Weight),
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
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
            MlpPlan::Moe {
                router: "mlp.gate.weight",
                route: RoutePlan::Softmax,
                shared: 0,
            },
            c.intermediate_size,
        ),
        shared: SharedPlan::EXPERTS,
    }
}

/// The transformers names of qwen3moe's own GGUF layer tensors (below `model.layers.N.`).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("attn_output", "bias") => "self_attn.o_proj.bias",
        ("ffn_norm", "weight") => "post_attention_layernorm.weight",
        _ => return None,
    })
}

/// qwen3_moe's keys of a qwen3moe GGUF's config: what llama.cpp's qwen3moe graph computes
/// (`crate::gguf_model`).
pub fn gguf_config(g: &GgufConfig<'_>, c: &mut Map<String, Value>) -> Result<()> {
    let kv = &g.kv;
    let (rot, head_dim) = (g.rot, g.head_dim);
    if rot != head_dim {
        return Err(g.err("rope.dimension_count", G::PartialRotation { rot, head_dim }));
    }
    if kv.bool(&g.key("expert_weights_norm"))? == Some(false) {
        return Err(g.err("expert_weights_norm", G::NoRenormalisation));
    }
    if let Some(f) = kv.uint(&g.key("expert_gating_func"))? {
        if f != 1 {
            return Err(g.err("expert_gating_func", G::NotSoftmax { found: f }));
        }
    }
    if let Some(n) = kv.uint(&g.key("expert_shared_count"))? {
        if n != 0 {
            return Err(g.err("expert_shared_count", G::SharedExperts { count: n }));
        }
    }
    if !g.qk_norm {
        return Err(DecodeError::MissingTensor {
            name: "blk.0.attn_q_norm.weight (qwen3moe always has q/k norms)".into(),
        });
    }
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": g.theta}),
    );
    c.insert("num_experts".into(), json!(g.experts));
    // llama.cpp's qwen3moe graph: build_moe_ffn(..., norm_w = true, ...).
    c.insert("norm_topk_prob".into(), json!(true));
    g.dense_keys(c)?;
    c.insert("use_sliding_window".into(), json!(false));
    Ok(())
}
