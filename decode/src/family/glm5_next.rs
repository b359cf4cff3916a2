//! `glm5_next` (GLM-5.3-Flash: `Glm5NextForConditionalGeneration`'s text model; the
//! `glm5_next_text` config alone too) as transformers 5.17 computes it in `f32`:
//!
//! - a residual of `hc_mult` streams mixed by manifold-constrained hyper-connections around each
//!   sublayer ([`crate::family::mhc`]), their mean normed at the end;
//! - RMSNorm (weight style, `rms_norm_eps` default 1e-5);
//! - token mixers by `layer_types`: `linear_attention` — Kimi delta attention
//!   ([`crate::family::kda`]) —, or `deepseek_sparse_attention` (legacy `full_attention`) —
//!   multi-head latent attention without RoPE (NoPE; its latent norms at `rms_norm_eps`) whose
//!   queries attend where a DSA indexer says ([`crate::family::dsa`]): the layer's own
//!   (`indexer_types` `full`) or the previous layer's selection (`shared`);
//! - MLPs by `mlp_layer_types`: `dense` (`intermediate_size`) or `sparse` — the sigmoid group
//!   router with its correction bias, routed experts combined in slot order, plus the shared
//!   experts (`n_shared_experts` times an expert's width) —; every SwiGLU clamped
//!   (`swiglu_limit`: the gate above at `L`, the up to `[-L, L]`);
//! - the final norm, `lm_head`.
//!
//! Refused by name rather than run otherwise: a rotated dim (`qk_rope_head_dim` > 0, which
//! transformers refuses), no query LoRA, key/value heads other than the heads, values wider than
//! keys, `index_topk` not a multiple of `index_kpool`, an indexer without the tail
//! (`index_kpool_always_select_tail` false: a query with no complete pool would attend to
//! nothing), a shared indexer not directly after a layer with its own (transformers fails there),
//! another activation.

use serde_json::Value;

use crate::config::{bad, group_router, layer_kinds, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, Result};
use crate::family::common::NormStyle;
use crate::family::dsa::DsaShape;
use crate::family::kda::KdaShape;
use crate::family::mhc::HyperSpec;
use crate::family::mla::MlaShape;
use crate::family::plan::{MixerPlan, MlpPlan, Plan, SharedPlan};
use crate::weights::TensorStore;

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Glm5NextConfig {
    /// `vocab_size` (default 154880).
    pub vocab_size: usize,
    /// `hidden_size` (default 4096).
    pub hidden_size: usize,
    /// `intermediate_size` (dense layers; default 12288).
    pub intermediate_size: usize,
    /// `moe_intermediate_size` (an expert's width; default 2048).
    pub moe_intermediate_size: usize,
    /// `num_hidden_layers` (default 45).
    pub num_layers: usize,
    /// `rms_norm_eps` (default 1e-5).
    pub rms_norm_eps: f32,
    /// The DSA layers' attention.
    pub mla: MlaShape,
    /// Their indexer.
    pub dsa: DsaShape,
    /// The KDA layers' widths.
    pub kda: KdaShape,
    /// The hyper-connections.
    pub hyper: HyperSpec,
    /// Each layer's mixer: KDA, or DSA with its own indexer or the previous layer's.
    pub mixers: Vec<MixerPlan>,
    /// Each layer's MLP sparse (`mlp_layer_types`).
    pub sparse: Vec<bool>,
    /// `n_routed_experts` (default 288).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 8).
    pub top_k: usize,
    /// `n_shared_experts` (default 1).
    pub n_shared_experts: usize,
    /// `routed_scaling_factor` (default 2.5), as the `f32` torch multiplies by.
    pub routed_scaling_factor: f32,
    /// `n_group` (default 1).
    pub n_group: usize,
    /// `topk_group` (default 1).
    pub topk_group: usize,
    /// `norm_topk_prob` (default true).
    pub norm_topk_prob: bool,
    /// `swiglu_limit` (default 10).
    pub swiglu_limit: f32,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

/// A finite number `key` above zero, or `default`.
fn positive_f32(c: &ConfigReader<'_>, key: &str, default: f64) -> Result<f32> {
    // `null` is not the default: transformers' clamp fails on it.
    let v = match c.is_null(key) {
        true => f64::NAN,
        false => c.f64(key)?.unwrap_or(default),
    };
    // Above zero as the f32 the kernels compare with, too (1e-50 would be a clamp at 0).
    if !(v.is_finite() && v > 0.0 && (v as f32).is_finite() && v as f32 > 0.0) {
        return Err(bad(key, ConfigFault::NotPositive { value: v }));
    }
    Ok(v as f32)
}

fn unsupported(key: &str, value: impl ToString, supported: &'static str) -> crate::DecodeError {
    bad(
        key,
        ConfigFault::Unsupported {
            value: value.to_string(),
            supported,
        },
    )
}

impl Glm5NextConfig {
    /// Parse a `glm5_next` config (its `text_config`, or the text keys at the top level as
    /// transformers forwards them) or a `glm5_next_text` one.
    pub fn parse(v: &Value) -> Result<Glm5NextConfig> {
        use limits::*;
        let top = ConfigReader::new(v)?;
        let c = match top.object("text_config")? {
            Some(t) if top.str("model_type")? == Some("glm5_next") => t,
            _ => top,
        };
        // `Glm5NextForConditionalGeneration` ties its head by the top-level key.
        let tie_word_embeddings = top.bool("tie_word_embeddings")?.unwrap_or(false);
        crate::config::silu_activation(&c)?;
        let hidden_size = c.positive_or("hidden_size", MAX_DIM, 4096)?;
        let heads = c.positive_or("num_attention_heads", MAX_HEADS, 64)?;
        let kv_heads = c.usize("num_key_value_heads", MAX_HEADS)?.unwrap_or(64);
        if kv_heads != heads {
            return Err(unsupported(
                "num_key_value_heads",
                kv_heads,
                "num_attention_heads: MLA gives every head its own key and value",
            ));
        }
        if c.is_null("q_lora_rank") {
            return Err(unsupported(
                "q_lora_rank",
                "null",
                "a rank: the DSA indexer reads the query LoRA",
            ));
        }
        let q_rank = c.positive_or("q_lora_rank", MAX_DIM, 1536)?;
        let rope = c.usize("qk_rope_head_dim", MAX_DIM)?.unwrap_or(0);
        if rope != 0 {
            return Err(unsupported(
                "qk_rope_head_dim",
                rope,
                "0: GLM-5.3-Flash's attention has no position encoding",
            ));
        }
        let nope = c.positive_or("qk_nope_head_dim", MAX_DIM, 256)?;
        let v_dim = c.positive_or("v_head_dim", MAX_DIM, 256)?;
        if v_dim > nope {
            return Err(bad(
                "v_head_dim",
                ConfigFault::OutOfRange {
                    value: v_dim,
                    max: nope,
                },
            ));
        }
        let eps = rms_eps(&c, 1e-5)?;
        let mla = MlaShape {
            heads,
            q_lora_rank: Some(q_rank),
            kv_lora_rank: c.positive_or("kv_lora_rank", MAX_DIM, 512)?,
            nope,
            rope: 0,
            v: v_dim,
            interleave: false,
            bias: c.bool("attention_bias")?.unwrap_or(false),
            latent_eps: eps,
            // transformers: `qk_head_dim ** -0.5`, a Python float, met by f32 scores.
            scale: (1.0 / (nope as f64).sqrt()) as f32,
        };
        let pool = c.positive_or("index_kpool", MAX_DIM, 16)?;
        let topk = c.usize("index_topk", MAX_DIM)?.unwrap_or(2048);
        if topk == 0 || !topk.is_multiple_of(pool) {
            return Err(bad(
                "index_topk",
                ConfigFault::NotAMultiple {
                    value: topk,
                    of_key: "index_kpool",
                    of: pool,
                },
            ));
        }
        if c.bool("index_kpool_always_select_tail")? == Some(false) {
            return Err(unsupported(
                "index_kpool_always_select_tail",
                false,
                "true: without the tail a query with no complete pool attends to nothing",
            ));
        }
        let dsa = DsaShape {
            heads: c.positive_or("index_n_heads", MAX_HEADS, 32)?,
            dim: c.positive_or("index_head_dim", MAX_DIM, 128)?,
            topk,
            pool,
            q_rank,
        };
        let kda = kda_shape(&c, eps)?;
        let hyper = HyperSpec {
            streams: c.positive_or("hc_mult", MAX_HEADS, 4)?,
            eps: {
                let e = c.f64("hc_eps")?.unwrap_or(1e-6);
                if !(e.is_finite() && e >= 0.0) {
                    return Err(bad("hc_eps", ConfigFault::Epsilon { value: e }));
                }
                e as f32
            },
            iters: c.usize("hc_sinkhorn_iters", 1 << 12)?.unwrap_or(20),
            norm_eps: eps,
        };
        let n = c.positive_or("num_hidden_layers", MAX_LAYERS, 45)?;
        let dsa_layer = layer_kinds(
            &c,
            "layer_types",
            n,
            |l| l % 4 == 3,
            |t| match t {
                "linear_attention" => Some(false),
                "deepseek_sparse_attention" | "full_attention" => Some(true),
                _ => None,
            },
            |value| ConfigFault::Unsupported {
                value,
                supported: "linear_attention, deepseek_sparse_attention (or full_attention)",
            },
        )?;
        let own = indexer_kinds(&c, n)?;
        let mut mixers = Vec::with_capacity(n);
        for l in 0..n {
            mixers.push(match (dsa_layer[l], own[l]) {
                (false, _) => MixerPlan::Kda,
                (true, true) => MixerPlan::MlaSparse { own: true },
                (true, false) => {
                    if l == 0 || mixers[l - 1] != (MixerPlan::MlaSparse { own: true }) {
                        return Err(unsupported(
                            "indexer_types",
                            format!("shared at layer {l}"),
                            "shared only directly after a deepseek_sparse_attention layer with \
                             its own (full) indexer: transformers has no selection to reuse \
                             otherwise",
                        ));
                    }
                    MixerPlan::MlaSparse { own: false }
                }
            });
        }
        let sparse = layer_kinds(
            &c,
            "mlp_layer_types",
            n,
            |l| l >= 3,
            |t| match t {
                "dense" => Some(false),
                "sparse" => Some(true),
                _ => None,
            },
            |value| ConfigFault::Unsupported {
                value,
                supported: "dense, sparse",
            },
        )?;
        let (num_experts, top_k) = crate::config::routed_experts(&c, 288, 8)?;
        let (n_group, topk_group, scale) = group_router(&c, num_experts, 1, 1, 2.5)?;
        Ok(Glm5NextConfig {
            vocab_size: c.positive_or("vocab_size", MAX_VOCAB, 154880)?,
            hidden_size,
            intermediate_size: c.positive_or("intermediate_size", MAX_DIM, 12288)?,
            moe_intermediate_size: c.positive_or("moe_intermediate_size", MAX_DIM, 2048)?,
            num_layers: n,
            rms_norm_eps: eps,
            mla,
            dsa,
            kda,
            hyper,
            mixers,
            sparse,
            num_experts,
            top_k,
            n_shared_experts: c.usize("n_shared_experts", MAX_EXPERTS)?.unwrap_or(1),
            routed_scaling_factor: scale,
            n_group,
            topk_group,
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(true),
            swiglu_limit: positive_f32(&c, "swiglu_limit", 10.0)?,
            tie_word_embeddings,
        })
    }
}

/// The KDA layers' widths: `linear_*` keys, overridden by a `linear_attn_config` object's
/// (`head_dim`, `num_heads`, `short_conv_kernel_size`, `gate_lower_bound`; with `safe_gate`,
/// default true, an absent or null bound is −5).
fn kda_shape(c: &ConfigReader<'_>, eps: f32) -> Result<KdaShape> {
    use limits::*;
    let mut dim = c.positive_or("linear_head_dim", MAX_DIM, 128)?;
    let mut heads = c.positive_or("linear_num_heads", MAX_HEADS, 64)?;
    let mut kernel = c.positive_or("linear_conv_kernel_dim", 1 << 10, 4)?;
    // Absent: the default; `null`: no bound (the softplus gate).
    let bound = |r: &ConfigReader<'_>, key: &str, default: Option<f64>| -> Result<Option<f64>> {
        match r.is_null(key) {
            true => Ok(None),
            false => Ok(r.f64(key)?.or(default)),
        }
    };
    let mut lower = bound(c, "linear_lower_bound", Some(-5.0))?;
    if let Some(l) = c.object("linear_attn_config")? {
        dim = l.positive_or("head_dim", MAX_DIM, dim)?;
        heads = l.positive_or("num_heads", MAX_HEADS, heads)?;
        kernel = l.positive_or("short_conv_kernel_size", 1 << 10, kernel)?;
        lower = bound(&l, "gate_lower_bound", lower)?;
        if lower.is_none() && l.bool("safe_gate")?.unwrap_or(true) {
            lower = Some(-5.0);
        }
    }
    let lower_bound = match lower {
        None => None,
        Some(b) if b.is_finite() && (b as f32).is_finite() => Some(b as f32),
        Some(b) => {
            return Err(bad(
                "linear_lower_bound",
                ConfigFault::NotFinite { value: b },
            ))
        }
    };
    Ok(KdaShape {
        heads,
        dim,
        kernel,
        lower_bound,
        eps,
    })
}

/// Each layer's indexer its own (`full`) or shared: `indexer_types`, else the pattern
/// `index_topk_pattern` (a string of `F`/`S` per layer, or a list like `indexer_types`), else
/// every layer from `index_skip_topk_offset` (default 2) on in steps of `index_topk_freq`
/// (default 1) full, the rest shared — as transformers fills them in. (transformers takes any
/// list value but `shared` as full: tarfa refuses values other than `full` and `shared`.)
fn indexer_kinds(c: &ConfigReader<'_>, n: usize) -> Result<Vec<bool>> {
    use limits::*;
    let kind = |t: &str| match t {
        "full" => Some(true),
        "shared" => Some(false),
        _ => None,
    };
    let letter = |t: &str| match t {
        "F" => Some(true),
        "S" => Some(false),
        _ => None,
    };
    let refuse = |value| ConfigFault::Unsupported {
        value,
        supported: "full, shared",
    };
    if c.raw("indexer_types").is_some() {
        return layer_kinds(c, "indexer_types", n, |_| true, kind, refuse);
    }
    match c.raw("index_topk_pattern") {
        Some(Value::String(p)) => {
            let kinds: Vec<Option<bool>> = p.chars().map(|ch| letter(&ch.to_string())).collect();
            if kinds.len() != n {
                return Err(bad(
                    "index_topk_pattern",
                    ConfigFault::LayerTypesCount {
                        entries: kinds.len(),
                        layers: n,
                    },
                ));
            }
            kinds
                .into_iter()
                .map(|k| k.ok_or_else(|| bad("index_topk_pattern", refuse(p.clone()))))
                .collect()
        }
        Some(_) => layer_kinds(c, "index_topk_pattern", n, |_| true, kind, refuse),
        None => {
            let freq = c.usize("index_topk_freq", MAX_LAYERS)?.unwrap_or(1).max(1);
            let offset = c.usize("index_skip_topk_offset", MAX_LAYERS)?.unwrap_or(2);
            Ok((0..n)
                .map(|i| (i + 1).saturating_sub(offset).is_multiple_of(freq))
                .collect())
        }
    }
}

/// The text model's tensor prefix: `model.language_model.` (the vision-language checkpoint) when
/// its embedding is there, else `model.`.
pub fn prefix(t: &TensorStore) -> &'static str {
    match t.find("model.language_model.embed_tokens.weight") {
        Some(_) => "model.language_model.",
        None => "model.",
    }
}

/// GLM-5.3-Flash has no RoPE: a table of no rotated dims.
pub fn no_rope() -> RopeConfig {
    RopeConfig {
        theta: 10000.0,
        rotary_dim: 0,
        yarn: None,
    }
}

/// glm5_next's forward pass with its tensors under `prefix`.
pub fn plan(c: &Glm5NextConfig, prefix: &str) -> Plan {
    let m = &c.mla;
    Plan {
        family: "glm5_next",
        prefix: prefix.into(),
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        tied: c.tie_word_embeddings,
        norm: NormStyle::Weight,
        eps: c.rms_norm_eps,
        // What an attention layer would be; the layers here are MLA or KDA.
        attn: m.attn_spec(c.rms_norm_eps),
        rope: no_rope(),
        swa: None,
        num_experts: c.num_experts,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
        mixers: c.mixers.clone(),
        delta: None,
        mla: Some(*m),
        kda: Some(c.kda),
        dsa: Some(c.dsa),
        hyper: Some(c.hyper),
        swiglu_limit: Some(c.swiglu_limit),
        mlps: MlpPlan::layers(
            c.num_layers,
            |l| c.sparse[l],
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

/// The transformers names of glm5-next's own GGUF layer tensors (below `model.layers.N.`), as
/// llama.cpp's converter writes them (`Glm5NextModel`); the MLA, MoE and shared-expert names are
/// deepseek2's. `ssm_a` holds `−exp(A_log)` ([`crate::family::deltanet::NEG_A`]).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("attn_k", "weight") => "self_attn.k_proj.weight",
        ("attn_v", "weight") => "self_attn.v_proj.weight",
        ("ssm_conv1d_q", "weight") => "self_attn.q_conv1d.weight",
        ("ssm_conv1d_k", "weight") => "self_attn.k_conv1d.weight",
        ("ssm_conv1d_v", "weight") => "self_attn.v_conv1d.weight",
        ("ssm_f_a", "weight") => "self_attn.f_a_proj.weight",
        ("ssm_f_b", "weight") => "self_attn.f_b_proj.weight",
        ("ssm_beta", "weight") => "self_attn.b_proj.weight",
        ("ssm_g_a", "weight") => "self_attn.g_a_proj.weight",
        ("ssm_g_b", "weight") => "self_attn.g_b_proj.weight",
        ("ssm_norm", "weight") => "self_attn.o_norm.weight",
        ("ssm_dt", "bias") => "self_attn.dt_bias",
        ("ssm_a", "") => "self_attn.neg_exp_A_log",
        ("indexer", "k_norm.weight") => "self_attn.indexer.k_norm.weight",
        ("indexer", "k_norm.bias") => "self_attn.indexer.k_norm.bias",
        ("indexer", "proj.weight") => "self_attn.indexer.weights_proj.weight",
        ("indexer", "attn_k.weight") => "self_attn.indexer.wk.weight",
        ("indexer", "attn_q_b.weight") => "self_attn.indexer.wq_b.weight",
        ("indexer_compressor_gate", "weight") => "self_attn.indexer.index_kpool_compress_gate",
        ("indexer_compressor_ape", "weight") => "self_attn.indexer.index_kpool_compress_ape",
        ("hc_attn_fn", "weight") => "hc_attn_fn",
        ("hc_attn_base", "weight") => "hc_attn_base",
        ("hc_attn_scale", "weight") => "hc_attn_scale",
        ("hc_ffn_fn", "weight") => "hc_ffn_fn",
        ("hc_ffn_base", "weight") => "hc_ffn_base",
        ("hc_ffn_scale", "weight") => "hc_ffn_scale",
        _ => return crate::family::deepseek_v3::gguf_layer_name(stem, suffix),
    })
}

/// glm5_next's keys of a glm5-next GGUF's config, as llama.cpp's glm5-next loader reads them:
/// per-layer `head_count_kv` (0: KDA) for `layer_types`, `attention.indexer.types` (absent: every
/// DSA layer its own indexer), the KDA keys (no `kda.gate_lower_bound`: llama.cpp's −∞, the
/// softplus gate), NoPE MLA's widths, the k-pool indexer, the hyper-connections, the leading
/// dense layers, the sigmoid router (absent gating: sigmoid) and the SwiGLU clamp.
pub fn gguf_config(
    g: &crate::gguf_model::GgufConfig<'_>,
    c: &mut serde_json::Map<String, Value>,
) -> Result<()> {
    use crate::error::GgufFault as G;
    use serde_json::json;
    let kv = &g.kv;
    let key = |k: &str| g.key(k);
    let req = |k: &str| kv.uint_req(&key(k));
    let layers = g.layers as usize;
    let heads = req("attention.head_count")?;
    let per_layer = kv
        .uint_list(&key("attention.head_count_kv"))?
        .ok_or_else(|| g.err("attention.head_count_kv", G::MissingNoDefault))?;
    if per_layer.len() < layers {
        return Err(g.err(
            "attention.head_count_kv",
            G::NoEquivalent {
                value: format!("{} entries", per_layer.len()),
                why: "one entry per layer (0: a KDA layer) is what glm5-next reads",
            },
        ));
    }
    let kinds: Vec<&str> = per_layer[..layers]
        .iter()
        .map(|&n| match n {
            0 => "linear_attention",
            _ => "deepseek_sparse_attention",
        })
        .collect();
    c.insert("layer_types".into(), json!(kinds));
    if let Some(t) = kv.bool_list(&key("attention.indexer.types"))? {
        if t.len() < layers {
            return Err(g.err(
                "attention.indexer.types",
                G::NoEquivalent {
                    value: format!("{} entries", t.len()),
                    why: "one entry per layer is what llama.cpp's glm5-next reads",
                },
            ));
        }
        let t: Vec<&str> = t[..layers]
            .iter()
            .map(|&full| if full { "full" } else { "shared" })
            .collect();
        c.insert("indexer_types".into(), json!(t));
    } else {
        c.insert("indexer_types".into(), json!(vec!["full"; layers]));
    }
    // KDA: llama.cpp's KDA heads are the attention heads.
    c.insert("num_key_value_heads".into(), json!(heads));
    c.insert("linear_num_heads".into(), json!(heads));
    c.insert("linear_head_dim".into(), json!(req("kda.head_dim")?));
    c.insert(
        "linear_conv_kernel_dim".into(),
        json!(req("ssm.conv_kernel")?),
    );
    c.insert(
        "linear_lower_bound".into(),
        json!(kv.float(&key("kda.gate_lower_bound"))?),
    );
    // NoPE MLA: one latent "head" of keys and values.
    let rank = req("attention.kv_lora_rank")?;
    let rope = kv.uint(&key("rope.dimension_count"))?.unwrap_or(0);
    if rope != 0 {
        return Err(g.err(
            "rope.dimension_count",
            G::NoEquivalent {
                value: rope.to_string(),
                why: "glm5-next's attention has no position encoding (transformers refuses rotated dims)",
            },
        ));
    }
    for (k, want) in [
        ("attention.key_length", rank),
        ("attention.value_length", rank),
    ] {
        let found = kv.uint(&key(k))?.unwrap_or(want);
        if found != want {
            return Err(g.err(
                k,
                G::MlaWidth {
                    found,
                    rule: "kv_lora_rank",
                    expected: want,
                },
            ));
        }
    }
    c.insert("kv_lora_rank".into(), json!(rank));
    c.insert("q_lora_rank".into(), json!(req("attention.q_lora_rank")?));
    c.insert("qk_rope_head_dim".into(), json!(0));
    c.insert(
        "qk_nope_head_dim".into(),
        json!(req("attention.key_length_mla")?),
    );
    c.insert(
        "v_head_dim".into(),
        json!(req("attention.value_length_mla")?),
    );
    c.insert("attention_bias".into(), json!(false));
    // The indexer; its LayerNorm's epsilon is transformers' fixed 1e-6 (absent, llama.cpp's is
    // 0).
    let e = kv.float(&key("attention.layer_norm_epsilon"))?;
    if e.map(|e| e as f32) != Some(1e-6f32) {
        return Err(g.err(
            "attention.layer_norm_epsilon",
            G::NoEquivalent {
                value: e.map_or("missing".into(), |e| e.to_string()),
                why: "transformers' indexer LayerNorm has epsilon 1e-6 (llama.cpp's is 0 without the key)",
            },
        ));
    }
    for (k, hf) in [
        ("attention.indexer.head_count", "index_n_heads"),
        ("attention.indexer.key_length", "index_head_dim"),
        ("attention.indexer.top_k", "index_topk"),
        ("attention.indexer.kpool", "index_kpool"),
        ("hyper_connection.count", "hc_mult"),
        ("hyper_connection.sinkhorn_iterations", "hc_sinkhorn_iters"),
    ] {
        c.insert(hf.into(), json!(req(k)?));
    }
    c.insert(
        "index_kpool_always_select_tail".into(),
        json!(kv
            .bool(&key("attention.indexer.kpool_select_tail"))?
            .unwrap_or(true)),
    );
    let hc_eps = kv
        .float(&key("hyper_connection.epsilon"))?
        .ok_or_else(|| g.err("hyper_connection.epsilon", G::MissingNoDefault))?;
    c.insert("hc_eps".into(), json!(hc_eps));
    // The MoE: llama.cpp's leading dense layers, its sigmoid default, its scale rule.
    // llama.cpp's glm5-next takes none (0) or absent as sigmoid.
    match kv.uint(&key("expert_gating_func"))? {
        None | Some(0) | Some(2) => {}
        Some(f) => return Err(g.err("expert_gating_func", G::NotSigmoid { found: f })),
    }
    let lead = g.leading_dense()? as usize;
    let mlp: Vec<&str> = (0..layers)
        .map(|l| if l < lead { "dense" } else { "sparse" })
        .collect();
    c.insert("mlp_layer_types".into(), json!(mlp));
    if lead > 0 {
        c.insert("intermediate_size".into(), json!(g.dense_width()?));
    } else if let Some(f) = g.ff {
        c.insert("intermediate_size".into(), json!(f));
    }
    c.insert("n_routed_experts".into(), json!(g.experts));
    c.insert(
        "n_shared_experts".into(),
        json!(req("expert_shared_count")?),
    );
    c.insert(
        "moe_intermediate_size".into(),
        json!(req("expert_feed_forward_length")?),
    );
    let scale = match kv.float(&key("expert_weights_scale"))? {
        None | Some(0.0) => 1.0,
        Some(s) => s,
    };
    c.insert("routed_scaling_factor".into(), json!(scale));
    c.insert(
        "norm_topk_prob".into(),
        json!(kv.bool(&key("expert_weights_norm"))?.unwrap_or(false)),
    );
    let groups = kv.uint(&key("expert_group_count"))?.unwrap_or(1).max(1);
    let used = match groups {
        1 => 1,
        _ => req("expert_group_used_count")?,
    };
    c.insert("n_group".into(), json!(groups));
    c.insert("topk_group".into(), json!(used));
    c.insert(
        "num_nextn_predict_layers".into(),
        json!(kv.uint(&key("nextn_predict_layers"))?.unwrap_or(0)),
    );
    // The clamp: llama.cpp clamps the routed experts by `swiglu_clamp_exp` and every other
    // SwiGLU (shared experts, dense layers) by `swiglu_clamp_shexp` (absent: the same), each per
    // layer, a value at most 1e-6 meaning none; transformers clamps them all by one limit.
    let exp = kv.float_or_list(&key("swiglu_clamp_exp"))?;
    let shexp = kv.float_or_list(&key("swiglu_clamp_shexp"))?;
    let values: Vec<f64> = [exp.as_deref(), shexp.as_deref().or(exp.as_deref())]
        .into_iter()
        .flatten()
        .flat_map(|v| match v.len() {
            1 => vec![v[0]; layers],
            _ => v.iter().take(layers).copied().collect(),
        })
        .collect();
    let limit = values.first().copied().filter(|&l| l > 1e-6);
    match limit {
        Some(l) if values.len() == 2 * layers && values.iter().all(|&v| v == l) => {
            c.insert("swiglu_limit".into(), json!(l));
        }
        _ => {
            return Err(g.err(
                "swiglu_clamp_exp",
                G::NoEquivalent {
                    value: format!("{values:?}"),
                    why: "transformers clamps every SwiGLU of GLM-5.3-Flash by one swiglu_limit: the routed and shared values must be one number above 1e-6 for every layer",
                },
            ))
        }
    }
    Ok(())
}

/// glm5-next's `attn_k_b`/`attn_v_b` back into `kv_b_proj` (deepseek2's split form), every
/// value unchanged.
pub fn gguf_assemble(config: &Value, s: &mut TensorStore) -> Result<()> {
    let c = Glm5NextConfig::parse(config)?;
    crate::family::deepseek_v3::assemble_kv_b(s, c.num_layers, &c.mla)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn small(extra: Value) -> Value {
        let mut v = json!({
            "model_type": "glm5_next_text", "hidden_size": 32, "num_attention_heads": 4,
            "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 16,
            "n_routed_experts": 4, "num_experts_per_tok": 2, "index_topk": 8, "index_kpool": 4,
            "layer_types": ["linear_attention", "deepseek_sparse_attention",
                            "deepseek_sparse_attention", "linear_attention"],
        });
        for (k, x) in extra.as_object().expect("object") {
            v[k] = x.clone();
        }
        v
    }

    fn lower(extra: Value) -> Option<f32> {
        Glm5NextConfig::parse(&small(extra))
            .expect("parses")
            .kda
            .lower_bound
    }

    /// The KDA gate's lower bound as transformers' `Glm5NextTextConfig.__post_init__` sets it
    /// (each case checked against transformers 5.17): `null` is the softplus gate.
    #[test]
    fn the_lower_bound_follows_transformers_null_included() {
        assert_eq!(lower(json!({})), Some(-5.0));
        assert_eq!(lower(json!({"linear_lower_bound": -3.0})), Some(-3.0));
        assert_eq!(lower(json!({"linear_lower_bound": null})), None);
        let cfg = json!({"linear_attn_config": {"gate_lower_bound": null, "safe_gate": false}});
        assert_eq!(lower(cfg), None);
        let cfg =
            json!({"linear_lower_bound": -3.0, "linear_attn_config": {"gate_lower_bound": null}});
        assert_eq!(lower(cfg), Some(-5.0));
        let cfg = json!({"linear_attn_config": {"gate_lower_bound": -2.0, "head_dim": 16}});
        let c = Glm5NextConfig::parse(&small(cfg)).expect("parses");
        assert_eq!((c.kda.lower_bound, c.kda.dim), (Some(-2.0), 16));
    }

    /// What transformers refuses, or would run other than tarfa, is refused by name.
    #[test]
    fn refusals_name_their_key() {
        for (extra, key) in [
            (json!({"q_lora_rank": null}), "q_lora_rank"),
            (json!({"qk_rope_head_dim": 64}), "qk_rope_head_dim"),
            (json!({"num_key_value_heads": 2}), "num_key_value_heads"),
            (json!({"index_topk": 6}), "index_topk"),
            (
                json!({"index_kpool_always_select_tail": false}),
                "index_kpool_always_select_tail",
            ),
            // A list value other than full/shared (transformers would take "S" as full).
            (
                json!({"indexer_types": ["full", "S", "full", "full"]}),
                "indexer_types",
            ),
            // Shared directly after a KDA layer: transformers has no selection to reuse.
            (
                json!({"indexer_types": ["full", "full", "full", "shared"],
                    "layer_types": ["deepseek_sparse_attention", "deepseek_sparse_attention",
                                    "linear_attention", "deepseek_sparse_attention"]}),
                "indexer_types",
            ),
            (json!({"swiglu_limit": null}), "swiglu_limit"),
        ] {
            let e = Glm5NextConfig::parse(&small(extra.clone()))
                .expect_err(&extra.to_string())
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    /// Layer kinds and indexers by transformers' defaults, legacy names and patterns.
    #[test]
    fn layer_and_indexer_kinds_follow_transformers() {
        let c =
            Glm5NextConfig::parse(&json!({"model_type": "glm5_next_text", "num_hidden_layers": 8}))
                .expect("defaults");
        let kinds: Vec<bool> = c.mixers.iter().map(|m| *m != MixerPlan::Kda).collect();
        assert_eq!(
            kinds,
            [false, false, false, true, false, false, false, true]
        );
        assert_eq!(
            c.sparse,
            [false, false, false, true, true, true, true, true]
        );
        let c = Glm5NextConfig::parse(&small(json!({
            "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"],
            "index_topk_pattern": "FSFS",
        })))
        .expect("pattern");
        assert_eq!(
            c.mixers,
            [true, false, true, false].map(|own| MixerPlan::MlaSparse { own })
        );
        // freq 2 from offset 1: layers 0, 2 full (transformers' formula).
        let c = Glm5NextConfig::parse(&small(json!({
            "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention"],
            "index_topk_freq": 2, "index_skip_topk_offset": 1,
        })))
        .expect("freq");
        assert_eq!(
            c.mixers,
            [true, false, true, false].map(|own| MixerPlan::MlaSparse { own })
        );
        // The head ties by the top-level key of a glm5_next config.
        let v = json!({"model_type": "glm5_next", "tie_word_embeddings": true,
                       "text_config": small(json!({}))});
        assert!(
            Glm5NextConfig::parse(&v)
                .expect("nested")
                .tie_word_embeddings
        );
    }
}
