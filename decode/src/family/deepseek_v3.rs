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

use crate::blocks::AttnShape;
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, Result};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::mla::MlaShape;
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan, SharedPlan};

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
            scale: scale as f32,
        };
        let num_experts = match c.usize("n_routed_experts", MAX_EXPERTS)? {
            Some(n) => n,
            None => c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(256),
        };
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
        attn: AttnSpec {
            shape: AttnShape {
                heads: m.heads,
                kv_heads: m.heads,
                head_dim: m.qk(),
                window: None,
            },
            eps: c.rms_norm_eps,
            qk_norm: None,
            qkv_bias: false,
            o_bias: m.bias,
            out_gate: false,
        },
        rope: c.rope.clone(),
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        mixers: vec![MixerPlan::Mla; c.num_layers],
        mla: Some(*m),
        delta: None,
        mlps: MlpPlan::layers(
            c.num_layers,
            |l| l >= c.first_k_dense_replace,
            MlpPlan::Moe {
                router: "mlp.gate.weight",
                route: RoutePlan::SigmoidGroup {
                    bias: "mlp.gate.e_score_correction_bias",
                    n_group: c.n_group,
                    topk_group: c.topk_group,
                    scale: c.routed_scaling_factor,
                },
                shared: c.moe_intermediate_size * c.n_shared_experts,
            },
            c.intermediate_size,
        ),
        shared: SharedPlan::EXPERTS,
    }
}
