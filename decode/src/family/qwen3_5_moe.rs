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
use crate::error::{ConfigFault, DecodeError, Result, TensorFault};
use crate::family::common::{AttnSpec, NormStyle};
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan, SharedPlan};
use crate::weights::TensorStore;

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
    /// How the layers', final and q/k norms' weights are applied: `1 + w` (transformers'
    /// zero-centred weights), or `w` as stored where the file holds `1 + w` already (llama.cpp's
    /// converter adds the 1; the GGUF reader writes [`NORM_STYLE_KEY`] `"weight"`).
    pub norm: NormStyle,
}

/// tarfa's own config key (not transformers'), written by the GGUF reader
/// ([`crate::gguf_model`]): `"weight"` when the norm weights are stored with the 1 added, else
/// absent or `"one_plus"`.
pub const NORM_STYLE_KEY: &str = "tarfa_norm_style";

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
        let norm = match c.str(NORM_STYLE_KEY)? {
            None | Some("one_plus") => NormStyle::OnePlus,
            Some("weight") => NormStyle::Weight,
            Some(other) => {
                return Err(bad(
                    NORM_STYLE_KEY,
                    ConfigFault::Unsupported {
                        value: other.to_string(),
                        supported: "one_plus\" or \"weight",
                    },
                ))
            }
        };
        Ok(Qwen3_5MoeConfig {
            next,
            norm,
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
        norm: c.norm,
        eps: c.rms_norm_eps,
        attn: AttnSpec {
            shape: AttnShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                window: None,
            },
            eps: c.rms_norm_eps,
            qk_norm: Some(c.norm),
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

/// The transformers names (below `model.layers.N.`) of the DeltaNet, post-attention norm and
/// shared-expert tensors of llama.cpp's qwen3next and qwen35moe GGUFs: `attn_qkv` (`[q | k | v]`
/// of every head), `attn_gate` (z), `ssm_conv1d`, `ssm_dt.bias`, `ssm_a` (`−exp(A_log)`,
/// [`crate::family::deltanet::NEG_A`]), `ssm_norm`, `ssm_out`, the shared expert and its gate.
pub(crate) fn deltanet_gguf_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("post_attention_norm", "weight") => "post_attention_layernorm.weight",
        ("attn_qkv", "weight") => "linear_attn.in_proj_qkv.weight",
        ("attn_gate", "weight") => "linear_attn.in_proj_z.weight",
        ("ssm_conv1d", "weight") => "linear_attn.conv1d.weight",
        ("ssm_dt", "bias") => "linear_attn.dt_bias",
        ("ssm_a", "") => "linear_attn.neg_exp_A_log",
        ("ssm_norm", "weight") => "linear_attn.norm.weight",
        ("ssm_out", "weight") => "linear_attn.out_proj.weight",
        ("ffn_gate_inp_shexp", "weight") => "mlp.shared_expert_gate.weight",
        ("ffn_gate_shexp", "weight") => "mlp.shared_expert.gate_proj.weight",
        ("ffn_up_shexp", "weight") => "mlp.shared_expert.up_proj.weight",
        ("ffn_down_shexp", "weight") => "mlp.shared_expert.down_proj.weight",
        _ => return None,
    })
}

/// The transformers names of qwen35moe's own GGUF layer tensors: the DeltaNet names
/// ([`deltanet_gguf_name`]) and `ssm_beta`/`ssm_alpha` (`in_proj_b`/`in_proj_a`).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("ssm_beta", "weight") => "linear_attn.in_proj_b.weight",
        ("ssm_alpha", "weight") => "linear_attn.in_proj_a.weight",
        _ => return deltanet_gguf_name(stem, suffix),
    })
}

/// The config keys qwen3next and qwen35moe GGUFs share, as llama.cpp's loaders and graphs read
/// them: the DeltaNet widths from `ssm.*` (`state_size` the key head width, `group_count` the key
/// heads, `time_step_rank` the value heads, `inner_size` all value heads' width), the layer kinds
/// from `attention.recurrent_layers` (else every `full_attention_interval`-th layer, default 4,
/// attention), `rope.dimension_count` of each head rotated, the top-k renormalised and weighed
/// by softmax (both graphs hard-code it), the shared expert's width
/// (`expert_shared_feed_forward_length`, else `feed_forward_length` as llama.cpp falls back), and
/// the norm weights as stored (the converter added transformers' 1: [`NORM_STYLE_KEY`]).
pub(crate) fn gguf_keys(
    g: &crate::gguf_model::GgufConfig<'_>,
    c: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    use crate::error::GgufFault as G;
    use serde_json::json;
    let kv = &g.kv;
    let req = |k: &str| kv.uint_req(&g.key(k));
    let layers = g.layers as usize;
    let v_heads = req("ssm.time_step_rank")?;
    let inner = req("ssm.inner_size")?;
    if v_heads == 0 {
        return Err(g.err("ssm.time_step_rank", G::Zero));
    }
    if inner % v_heads != 0 {
        return Err(g.err(
            "ssm.inner_size",
            G::NoEquivalent {
                value: inner.to_string(),
                why: "all value heads' width: ssm.time_step_rank heads of one width",
            },
        ));
    }
    // Each key head serves whole value heads; no width or kernel is 0 (refused here, by the
    // GGUF's own key names, before the synthesised config is parsed).
    let groups = req("ssm.group_count")?;
    if groups == 0 || v_heads % groups != 0 {
        return Err(g.err(
            "ssm.group_count",
            G::NoEquivalent {
                value: groups.to_string(),
                why: "a non-zero divisor of ssm.time_step_rank (key heads of whole value heads)",
            },
        ));
    }
    let (state, kernel) = (req("ssm.state_size")?, req("ssm.conv_kernel")?);
    for (k, v) in [
        ("ssm.inner_size", inner),
        ("ssm.state_size", state),
        ("ssm.conv_kernel", kernel),
    ] {
        if v == 0 {
            return Err(g.err(k, G::Zero));
        }
    }
    c.insert("linear_num_value_heads".into(), json!(v_heads));
    c.insert("linear_value_head_dim".into(), json!(inner / v_heads));
    c.insert("linear_num_key_heads".into(), json!(groups));
    c.insert("linear_key_head_dim".into(), json!(state));
    c.insert("linear_conv_kernel_dim".into(), json!(kernel));
    let recurrent = match kv.bool_list(&g.key("attention.recurrent_layers"))? {
        Some(r) if r.len() < layers => {
            return Err(g.err(
                "attention.recurrent_layers",
                G::NoEquivalent {
                    value: format!("{} entries", r.len()),
                    why: "one entry per layer is what llama.cpp reads",
                },
            ))
        }
        Some(r) => r[..layers].to_vec(),
        None => {
            let every = kv.uint(&g.key("full_attention_interval"))?.unwrap_or(4);
            if every == 0 {
                return Err(g.err("full_attention_interval", G::Zero));
            }
            (0..g.layers).map(|l| (l + 1) % every != 0).collect()
        }
    };
    let kinds: Vec<&str> = recurrent
        .iter()
        .map(|&r| match r {
            true => "linear_attention",
            false => "full_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(kinds));
    let (rot, head_dim) = (g.rot, g.head_dim);
    let partial = rot as f64 / head_dim as f64;
    // transformers: int(head_dim * partial_rotary_factor) must give back `rot`.
    if (head_dim as f64 * partial) as u64 != rot {
        return Err(g.err("rope.dimension_count", G::RotaryFactor { rot, head_dim }));
    }
    c.insert(
        "rope_parameters".into(),
        json!({"rope_type": "default", "rope_theta": g.theta, "partial_rotary_factor": partial}),
    );
    // build_moe_ffn(..., SILU, norm_w = true, scale, GATING_FUNC_SOFTMAX, ...).
    if kv.bool(&g.key("expert_weights_norm"))? == Some(false) {
        return Err(g.err("expert_weights_norm", G::NoRenormalisation));
    }
    if let Some(f) = kv.uint(&g.key("expert_gating_func"))? {
        if f != 1 {
            return Err(g.err("expert_gating_func", G::NotSoftmax { found: f }));
        }
    }
    if let Some(s) = kv.float(&g.key("expert_weights_scale"))? {
        if s != 0.0 && s != 1.0 {
            return Err(g.err(
                "expert_weights_scale",
                G::NoEquivalent {
                    value: s.to_string(),
                    why: "Qwen3-Next and Qwen3.5 do not scale their routed experts",
                },
            ));
        }
    }
    c.insert("num_experts".into(), json!(g.experts));
    // llama.cpp: `n_ff_shexp ? n_ff_shexp : n_ff` — 0 is absent.
    let shared = match kv.uint(&g.key("expert_shared_feed_forward_length"))? {
        Some(s) if s > 0 => s,
        _ => {
            g.ff.ok_or_else(|| g.err("expert_shared_feed_forward_length", G::MissingNoDefault))?
        }
    };
    c.insert("shared_expert_intermediate_size".into(), json!(shared));
    c.insert(NORM_STYLE_KEY.into(), json!("weight"));
    Ok(())
}

/// qwen3_5_moe's keys of a qwen35moe GGUF's config ([`gguf_keys`]): every layer MoE (a layer
/// without a router is refused: Qwen3.5-MoE has none), and the interleaved M-RoPE sections
/// (`rope.dimension_sections`, which llama.cpp requires). For text the t, h and w positions are
/// the token's and the fourth is 0, so the sections are plain RoPE — transformers' Qwen3.5 on
/// text — only where every rotated pair falls in t, h or w (llama.cpp's `ggml_mrope_cache_init`:
/// pair `i`'s sector `i mod Σsections`, taken by t, h, w in turn up to three times each one's
/// count); a pair left to the fourth stays unrotated in llama.cpp and is refused, as are sections
/// wider than the head (llama.cpp asserts).
pub fn gguf_config(
    g: &crate::gguf_model::GgufConfig<'_>,
    c: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<()> {
    use crate::error::GgufFault as G;
    let key = "rope.dimension_sections";
    let s =
        g.kv.uint_list(&g.key(key))?
            .ok_or_else(|| g.err(key, G::MissingNoDefault))?;
    let bad = |why: &'static str| {
        g.err(
            key,
            G::NoEquivalent {
                value: format!("{s:?}"),
                why,
            },
        )
    };
    if s.len() != 4 {
        return Err(bad("four sections (t, h, w and the fourth)"));
    }
    let total = match s.iter().try_fold(0u64, |a, &x| a.checked_add(x)) {
        Some(t) if t > 0 && t <= g.head_dim => t,
        _ => return Err(bad("sections of 1 to head_dim pairs in all")),
    };
    let text = (0..g.rot / 2).all(|pair| {
        let sector = pair % total;
        (0..3usize).any(|k| sector % 3 == k as u64 && sector < 3 * s[k])
    });
    if !text {
        return Err(bad(
            "a rotated pair in the fourth section, which llama.cpp leaves unrotated for text",
        ));
    }
    if !g.dense.is_empty() {
        return Err(g.err(
            "feed_forward_length",
            G::NoEquivalent {
                value: format!("dense layers {:?}", g.dense),
                why: "every Qwen3.5-MoE layer is MoE (ffn_gate_inp)",
            },
        ));
    }
    gguf_keys(g, c)
}

/// The shared expert's gate as transformers holds it, `[1, hidden]` (llama.cpp's loader declares
/// the vector `{n_embd}`, which a GGUF may hold: the same values).
pub(crate) fn gate_as_matrix(c: &Qwen3_5MoeConfig, s: &mut TensorStore) -> Result<()> {
    for l in 0..c.num_layers {
        let name = format!("{}layers.{l}.mlp.shared_expert_gate.weight", c.prefix);
        if s.find(&name).is_some_and(|t| t.shape().len() == 1) {
            let (t, bytes) = s.remove(&name).expect("found above");
            let shape = t.shape().to_vec();
            let t = t
                .reshaped(&[1, c.hidden_size])
                .ok_or(DecodeError::BadTensor {
                    name,
                    fault: TensorFault::Shape {
                        shape,
                        expected: vec![c.hidden_size],
                    },
                })?;
            s.insert(t, bytes)?;
        }
    }
    Ok(())
}

/// A qwen35moe GGUF's tensors as the family reads them: the shared expert's gate a matrix
/// ([`gate_as_matrix`]), and, where a key head has several value heads, the value heads back in
/// transformers' order. llama.cpp's converter (`_LinearAttentionVReorderBase`) stores them
/// tiled — file head `j·nk + g` is transformers' head `g·r + j` (`r` value heads a key head) —
/// in every value-head-indexed tensor: `attn_qkv`'s value rows, `attn_gate`'s rows, `ssm_beta`,
/// `ssm_alpha`, `ssm_a`, `ssm_dt`, the convolution's value channels and `ssm_out`'s columns.
/// Each is gathered back, every value unchanged — rows whole in their stored type, `ssm_out`'s
/// columns as `f32` values (a quantised `ssm_out` costs `hidden · value_dim · 4` bytes a layer:
/// 32 MiB at Qwen3.5-35B-A3B's widths) —, so each dot runs over transformers' order: the
/// checkpoint's bits.
pub fn gguf_assemble(config: &serde_json::Value, s: &mut TensorStore) -> Result<()> {
    let c = Qwen3_5MoeConfig::parse(config)?;
    gate_as_matrix(&c, s)?;
    let (nk, nv) = (c.lin_k_heads, c.lin_v_heads);
    if nk == nv {
        return Ok(());
    }
    let r = nv / nk;
    // Transformers' head `h` is the file's head `(h % r)·nk + h / r`.
    let file_head = |h: usize| (h % r) * nk + h / r;
    let key_dim = 2 * nk * c.lin_k_dim;
    for (l, t) in c.layer_types.iter().enumerate() {
        if *t != LayerType::Linear {
            continue;
        }
        let a = |n: &str| format!("{}layers.{l}.linear_attn.{n}", c.prefix);
        // (tensor, rows before the value heads, width of a head, along columns)
        let dv = c.lin_v_dim;
        for (name, skip, width, columns) in [
            (a("in_proj_qkv.weight"), key_dim, dv, false),
            (a("in_proj_z.weight"), 0, dv, false),
            (a("in_proj_b.weight"), 0, 1, false),
            (a("in_proj_a.weight"), 0, 1, false),
            (a(crate::family::deltanet::NEG_A), 0, 1, false),
            (a("dt_bias"), 0, 1, false),
            (a("conv1d.weight"), key_dim, dv, false),
            (a("out_proj.weight"), 0, dv, true),
        ] {
            let Some(t) = s.find(&name) else { continue };
            let shape = t.shape().to_vec();
            let rows = shape.first().copied().unwrap_or(1);
            let cols = shape.iter().skip(1).product::<usize>();
            let along = if columns { cols } else { rows };
            if along != skip + nv * width {
                return Err(DecodeError::BadTensor {
                    name,
                    fault: TensorFault::Shape {
                        shape,
                        expected: vec![skip + nv * width],
                    },
                });
            }
            let src = |i: usize| match i < skip {
                true => i,
                false => {
                    let (h, e) = ((i - skip) / width, (i - skip) % width);
                    skip + file_head(h) * width + e
                }
            };
            let (old, bytes) = s.remove(&name).expect("found above");
            // Rows move whole (a quantised row's blocks as stored); columns only as values (an
            // F32 copy of a quantised `ssm_out`: `hidden · value_dim · 4` bytes a layer).
            let new = match (columns, old.rows_of(&name, rows, src)) {
                (false, Some(t)) => t,
                _ => crate::weights::Tensor::gathered(&name, &shape, &[&old], |i| {
                    let (row, col) = (i / cols, i % cols);
                    match columns {
                        true => (0, row * cols + src(col)),
                        false => (0, src(row) * cols + col),
                    }
                }),
            };
            s.insert(new, bytes)?;
        }
    }
    Ok(())
}
