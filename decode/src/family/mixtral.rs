//! `mixtral` (MixtralForCausalLM) as transformers 5.17 computes it in `f32`
//! (`research/model-families.md` §5): RMSNorm, GQA attention without q/k norm or biases, full
//! NeoX RoPE, an optional sliding window, a softmax top-k router always renormalised, SwiGLU
//! experts (`w1` gate, `w3` up, `w2` down) combined in selection-slot order.

use crate::blocks::AttnShape;
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, Result};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan, SharedPlan};
use crate::weights::TensorStore;

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct MixtralConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`).
    pub kv_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps` (default 1e-5).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e6) and rotated dims (all).
    pub rope: RopeConfig,
    /// `sliding_window` (default none).
    pub window: Option<usize>,
    /// `num_local_experts` (default 8).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 2).
    pub top_k: usize,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl MixtralConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<MixtralConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, head_dim) = attention_dims(&c)?;
        let num_experts = c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts == 0 {
            return Err(bad("num_local_experts", ConfigFault::Zero));
        }
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(2);
        if top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let window = match c.usize("sliding_window", usize::MAX)? {
            Some(0) => return Err(bad("sliding_window", ConfigFault::Zero)),
            w => w,
        };
        Ok(MixtralConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-5)?,
            rope: RopeConfig::read(&c, head_dim, 1e6, 1.0)?,
            window,
            num_experts,
            top_k,
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }
}

/// Where a mixtral checkpoint keeps its routers: `block_sparse_moe.gate` as checkpoints store
/// it, or `mlp.gate` (as transformers 5 writes it).
pub fn router_name(store: &TensorStore) -> &'static str {
    if store.find("model.layers.0.mlp.gate.weight").is_some()
        && store
            .find("model.layers.0.block_sparse_moe.gate.weight")
            .is_none()
    {
        "mlp.gate.weight"
    } else {
        "block_sparse_moe.gate.weight"
    }
}

/// mixtral's forward pass: every layer attends (no q/k norm, no biases, the window when
/// configured) and is MoE, its softmax top-k always renormalised; `router` is the routers' name
/// ([`router_name`]).
pub fn plan(c: &MixtralConfig, router: &'static str) -> Plan {
    Plan {
        family: "mixtral",
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
            qk_norm: None,
            qkv_bias: false,
            o_bias: false,
            out_gate: false,
            extra: None,
        },
        rope: c.rope.clone(),
        swa: None,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: true,
        mixers: vec![MixerPlan::Attention; c.num_layers],
        mla: None,
        kda: None,
        dsa: None,
        hyper: None,
        swiglu_limit: None,
        delta: None,
        mlps: vec![
            MlpPlan::Moe {
                router,
                route: RoutePlan::Softmax,
                shared: 0,
            };
            c.num_layers
        ],
        shared: SharedPlan::EXPERTS,
    }
}
