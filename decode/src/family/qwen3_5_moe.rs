//! `qwen3_5_moe_text` (Qwen3_5MoeForCausalLM, Qwen3.5-MoE's text model) and the text part of
//! `qwen3_5_moe` checkpoints (prefix `model.language_model.`), as transformers 5.17 computes them
//! in `f32` (`research/model-families.md` §3):
//!
//! - zero-centred RMSNorms `(x · rsqrt(mean(x²) + eps)) · (1 + w)` (layers, q/k norms, final);
//! - `full_attention` layers: gated attention (`q_proj` gives `[q_h | gate_h]` per head, the
//!   output multiplied by `sigmoid(gate)` before `o_proj`), NeoX RoPE on the first quarter of
//!   each head;
//! - `linear_attention` layers: Gated DeltaNet ([`crate::family::deltanet`]) with its
//!   convolution over the last `linear_conv_kernel_dim` projected vectors and its recurrent
//!   state;
//! - every layer MoE: softmax top-k always renormalised, plus the shared expert scaled by
//!   `sigmoid(shared_expert_gate · x)`: `routed + gate · shared`.

use tarfa_cuda::DeltaShape;

use crate::blocks::AttnShape;
use crate::config::{attention_dims, bad, layer_kinds, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, Result};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan, SharedPlan};

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// Gated full attention with a KV cache.
    Full,
    /// Gated DeltaNet with a convolution and a recurrent state.
    Linear,
}

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3_5MoeConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads` (full-attention layers).
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default 256).
    pub head_dim: usize,
    /// `rms_norm_eps` (default 1e-6).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e4) and rotated dims (`partial_rotary_factor` default 0.25).
    pub rope: RopeConfig,
    /// `attention_bias`: biases on q, k, v and o.
    pub attention_bias: bool,
    /// Each layer's mixer (`layer_types`, or every `full_attention_interval`-th layer full).
    pub layer_types: Vec<LayerType>,
    /// `linear_conv_kernel_dim` (default 4).
    pub conv_kernel: usize,
    /// `linear_num_key_heads` (default 16).
    pub lin_k_heads: usize,
    /// `linear_num_value_heads` (default 32).
    pub lin_v_heads: usize,
    /// `linear_key_head_dim` (default 128).
    pub lin_k_dim: usize,
    /// `linear_value_head_dim` (default 128).
    pub lin_v_dim: usize,
    /// `num_experts` (default 256).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `shared_expert_intermediate_size` (default 512).
    pub shared_width: usize,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
    /// Tensor-name prefix of the text model: `model.` (text checkpoints) or
    /// `model.language_model.` (`qwen3_5_moe` checkpoints).
    pub prefix: String,
    /// Qwen3-Next (`qwen3_next`): fused DeltaNet projections, `norm_topk_prob`, dense layers.
    pub next: Option<NextKeys>,
}

/// What a `qwen3_next` config has beside Qwen3.5-MoE's keys.
#[derive(Clone, Debug, PartialEq)]
pub struct NextKeys {
    /// `norm_topk_prob` (default true): renormalise the top-k weights.
    pub norm_topk_prob: bool,
    /// Each layer's MLP dense (in `mlp_only_layers`, or not a `decoder_sparse_step`-th layer).
    pub dense: Vec<bool>,
    /// `intermediate_size` (the dense MLP's width; default 5632).
    pub intermediate_size: usize,
}

impl Qwen3_5MoeConfig {
    /// Parse a `qwen3_5_moe_text` config, or the `text_config` of a `qwen3_5_moe` one.
    pub fn parse(v: &serde_json::Value) -> Result<Qwen3_5MoeConfig> {
        Self::parse_as(v, false)
    }

    /// Parse a `qwen3_next` config (Qwen3-Next: its own defaults and keys).
    pub fn parse_next(v: &serde_json::Value) -> Result<Qwen3_5MoeConfig> {
        Self::parse_as(v, true)
    }

    fn parse_as(v: &serde_json::Value, next: bool) -> Result<Qwen3_5MoeConfig> {
        use limits::*;
        let top = ConfigReader::new(v)?;
        let (c, prefix) = if !next && top.str("model_type")? == Some("qwen3_5_moe") {
            match top.object("text_config")? {
                Some(t) => (t, "model.language_model."),
                None => return Err(bad("text_config", ConfigFault::Missing)),
            }
        } else {
            (top, "model.")
        };
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, _) = attention_dims(&c)?;
        // transformers' Qwen3.5-MoE and Qwen3-Next configs default to 2 key/value heads.
        let kv_heads = match c.raw("num_key_value_heads") {
            Some(_) => kv_heads,
            None if heads.is_multiple_of(2) => 2,
            None => {
                return Err(bad(
                    "num_key_value_heads",
                    ConfigFault::NotADivisor {
                        value: 2,
                        of_key: "num_attention_heads",
                        of: heads,
                    },
                ))
            }
        };
        let head_dim = c.usize("head_dim", MAX_DIM)?.unwrap_or(256);
        if head_dim == 0 {
            return Err(bad("head_dim", ConfigFault::Zero));
        }
        let num_layers = c.positive("num_hidden_layers", MAX_LAYERS)?;
        // Without `layer_types`, every `full_attention_interval`-th layer is full attention.
        let every = match c.raw("layer_types") {
            Some(_) => 1,
            None => match c.usize("full_attention_interval", MAX_LAYERS)?.unwrap_or(4) {
                0 => return Err(bad("full_attention_interval", ConfigFault::Zero)),
                e => e,
            },
        };
        let layer_types = layer_kinds(
            &c,
            "layer_types",
            num_layers,
            |i| match (i + 1) % every {
                0 => LayerType::Full,
                _ => LayerType::Linear,
            },
            // transformers' `remap_legacy_layer_types` names too.
            |t| match t {
                "full_attention" | "attention" => Some(LayerType::Full),
                "linear_attention" | "mamba" | "conv" => Some(LayerType::Linear),
                _ => None,
            },
            |value| ConfigFault::LayerType { value },
        )?;
        let lin_k_heads = c.usize("linear_num_key_heads", MAX_HEADS)?.unwrap_or(16);
        let lin_v_heads = c.usize("linear_num_value_heads", MAX_HEADS)?.unwrap_or(32);
        if lin_k_heads == 0 || lin_v_heads == 0 || lin_v_heads % lin_k_heads != 0 {
            return Err(bad(
                "linear_num_value_heads",
                ConfigFault::NotAMultiple {
                    value: lin_v_heads,
                    of_key: "linear_num_key_heads",
                    of: lin_k_heads,
                },
            ));
        }
        // transformers' defaults: Qwen3-Next 512 experts, top-10; Qwen3.5-MoE 256, top-8.
        let (experts_default, top_k_default) = if next { (512, 10) } else { (256, 8) };
        let num_experts = c
            .usize("num_experts", MAX_EXPERTS)?
            .unwrap_or(experts_default);
        let top_k = c
            .usize("num_experts_per_tok", MAX_EXPERTS)?
            .unwrap_or(top_k_default);
        if num_experts == 0 || top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let tie = match c.bool("tie_word_embeddings")? {
            Some(t) => t,
            None => top.bool("tie_word_embeddings")?.unwrap_or(false),
        };
        let next = match next {
            false => None,
            true => Some(next_keys(&c, num_layers)?),
        };
        Ok(Qwen3_5MoeConfig {
            next,
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-6)?,
            rope: RopeConfig::read(&c, head_dim, 10000.0, 0.25)?,
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            layer_types,
            conv_kernel: c.positive_or("linear_conv_kernel_dim", MAX_DIM, 4)?,
            lin_k_heads,
            lin_v_heads,
            lin_k_dim: c.positive_or("linear_key_head_dim", MAX_DIM, 128)?,
            lin_v_dim: c.positive_or("linear_value_head_dim", MAX_DIM, 128)?,
            num_experts,
            top_k,
            shared_width: c
                .usize("shared_expert_intermediate_size", MAX_DIM)?
                .unwrap_or(512),
            tie_word_embeddings: tie,
            prefix: prefix.to_string(),
        })
    }
}

/// Qwen3-Next's MLP keys: a layer is sparse when it is not in `mlp_only_layers` and `(l + 1)` is a
/// multiple of `decoder_sparse_step` (transformers' `Qwen3NextDecoderLayer`), else a dense SwiGLU
/// of `intermediate_size`.
fn next_keys(c: &ConfigReader<'_>, num_layers: usize) -> Result<NextKeys> {
    use limits::*;
    let step = c.positive_or("decoder_sparse_step", MAX_LAYERS, 1)?;
    let only = c.usize_list("mlp_only_layers")?.unwrap_or_default();
    Ok(NextKeys {
        norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(true),
        dense: (0..num_layers)
            .map(|l| only.contains(&l) || !(l + 1).is_multiple_of(step))
            .collect(),
        intermediate_size: c.positive_or("intermediate_size", MAX_DIM, 5632)?,
    })
}

/// qwen3_5_moe's forward pass: zero-centred norms; `full_attention` layers gated attention
/// (q/k norms, partial rotary), `linear_attention` layers Gated DeltaNet; every layer MoE, its
/// softmax top-k always renormalised, plus the shared expert weighed by its gate.
pub fn plan(c: &Qwen3_5MoeConfig) -> Plan {
    let moe = MlpPlan::Moe {
        router: "mlp.gate.weight",
        route: RoutePlan::Softmax,
        shared: c.shared_width,
    };
    Plan {
        family: match c.next {
            None => "qwen3_5_moe",
            Some(_) => "qwen3_next",
        },
        prefix: c.prefix.clone(),
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        tied: c.tie_word_embeddings,
        norm: NormStyle::OnePlus,
        eps: c.rms_norm_eps,
        attn: AttnSpec {
            shape: AttnShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                window: None,
            },
            eps: c.rms_norm_eps,
            qk_norm: Some(NormStyle::OnePlus),
            qkv_bias: c.attention_bias,
            o_bias: c.attention_bias,
            out_gate: true,
            extra: None,
        },
        rope: c.rope.clone(),
        swa: None,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.next.as_ref().is_none_or(|n| n.norm_topk_prob),
        mixers: c
            .layer_types
            .iter()
            .map(|t| match t {
                LayerType::Full => MixerPlan::Attention,
                LayerType::Linear => MixerPlan::DeltaNet,
            })
            .collect(),
        mla: None,
        kda: None,
        dsa: None,
        hyper: None,
        swiglu_limit: None,
        delta: Some(DeltaShape {
            k_heads: c.lin_k_heads,
            v_heads: c.lin_v_heads,
            dk: c.lin_k_dim,
            dv: c.lin_v_dim,
            kernel: c.conv_kernel,
        }),
        mlps: match &c.next {
            None => vec![moe; c.num_layers],
            Some(n) => MlpPlan::layers(c.num_layers, |l| !n.dense[l], moe, n.intermediate_size),
        },
        shared: SharedPlan {
            prefix: "mlp.shared_expert",
            gate: Some("mlp.shared_expert_gate.weight"),
        },
    }
}
