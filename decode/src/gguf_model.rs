//! A GGUF-sourced model (`architecture.source_format = "gguf"`) run through the transformers-named
//! families. The manifest keeps the GGUF's key/values as typed values (spec §8.1.1) and the JNF
//! index keeps llama.cpp's tensor names with row-major shapes (ggml's `ne` reversed at
//! conversion, so a matrix is already `[out, in]` and each expert `[rows, cols]`). This module
//!
//! - renames every trunk and layer tensor from llama.cpp's name to the transformers name the
//!   family reads ([`hf_name`]); a tensor of a decoder layer or of the trunk with no name in the
//!   family is refused (it would otherwise be silently left out of the computation);
//!   nextn/MTP layers (`blk.N` for `N >= block_count - nextn_predict_layers`) keep their GGUF
//!   names: the main decode does not run them (nor does llama.cpp);
//! - synthesises the `config.json` the family parses from the key/values and the tensors present
//!   ([`hf_config`]); a key with no safe default is an error naming it;
//! - rebuilds a `tokenizers` tokenizer.json from `tokenizer.ggml.*` for a byte-level BPE
//!   (`tokenizer.ggml.model = "gpt2"`) ([`tokenizer_json`]), or says what is missing.
//!
//! What is particular to a family — llama.cpp's architecture name, its own layer tensor names
//! and config keys — is its [`crate::family::REGISTRY`] row's [`crate::family::GgufRow`], in the
//! family's module (`qwen3_moe::gguf_config`, `glm4_moe::gguf_config`); this module holds what
//! every family shares.
//!
//! Where llama.cpp's graph hard-codes behaviour, the GGUF means what llama.cpp computes:
//!
//! - `qwen3moe`: the top-k router weights are always renormalised (llama.cpp's qwen3moe graph
//!   passes `norm_w = true` to `build_moe_ffn` whatever the checkpoint's `norm_topk_prob`), so
//!   the config gets `norm_topk_prob: true`; a GGUF that says `expert_weights_norm = false` is
//!   refused as contradictory. A layer without a router (`ffn_gate_inp`) but with a dense FFN
//!   (`ffn_gate`/`ffn_up`/`ffn_down`) is a dense layer (`mlp_only_layers`); llama.cpp's qwen3moe
//!   has no dense layers and would refuse such a file.
//! - `glm4moe`: missing keys take llama.cpp's defaults where it has a usable one:
//!   `expert_weights_norm` false, `expert_gating_func` sigmoid (any other value is refused),
//!   `leading_dense_block_count` 0 (the layers without a router must be exactly the leading
//!   ones), `rope.dimension_count` = head dim (no partial rotation), `expert_group_count` /
//!   `expert_group_used_count` 1, `nextn_predict_layers` 0, `expert_weights_scale` absent or 0
//!   no scaling (1: llama.cpp's default is 0, which its `build_moe_ffn` skips).
//!   `expert_shared_count` and `expert_feed_forward_length` must be present (llama.cpp requires
//!   them too).
//!   M-RoPE sections (`rope.dimension_sections`, the vision model) are refused.
//! - `deepseek2` (run as `deepseek_v3`): both of llama.cpp's MLA forms — since June 2025
//!   `attn_k_b` (each head's key rows of `kv_b_proj`, transposed) and `attn_v_b`, put back
//!   together into `kv_b_proj` with every value unchanged (`deepseek_v3::gguf_assemble`), with
//!   `head_count_kv` 1 and `key_length`/`value_length` the latent's widths beside
//!   `key_length_mla`/`value_length_mla`; before it `attn_kv_b` whole with per-head widths.
//!   llama.cpp rotates interleaved pairs and has no attention biases (`rope_interleave` true,
//!   `attention_bias` false). An absent `expert_gating_func` means softmax to llama.cpp
//!   (DeepSeek-V2) and is refused; `expert_weights_scale` absent or 0 is no scale (1), as
//!   llama.cpp's `build_moe_ffn` does. YaRN is what llama.cpp's deepseek2 computes: `mscale` =
//!   `mscale_all_dim` = `yarn_log_multiplier / 0.1` (in `f32`), betas 32 and 1; a YaRN without
//!   `yarn_log_multiplier` (or with 0), a factor below 1, other betas, an `attn_factor` other
//!   than 1 and a non-zero `attention.temperature_scale` have no transformers equivalent and
//!   are refused by name. Quantised `attn_k_b`/`attn_v_b` are held as `f32` once put back
//!   together (the same values; 64 MiB a layer at DeepSeek-V3's widths). The tokenizer's
//!   `deepseek-v3` pre-tokenizer is llama.cpp's three regexes in turn.
//! - `glm5-next` (run as `glm5_next`): `attention.head_count_kv` is one entry per layer (0: a
//!   KDA layer, else NoPE MLA with DSA), `attention.indexer.types` says which DSA layers run
//!   their own indexer (absent: all), KDA's heads are the attention heads, an absent
//!   `kda.gate_lower_bound` is llama.cpp's −∞ (the softplus gate; transformers' default would be
//!   −5), `ssm_a` holds the converter's `−exp(A_log)` and is used as it is (tarfa's own `exp` of
//!   `A_log` may differ from it by an ulp), the convolutions are `[1, C, 1, K]`, `kv_b_proj` is
//!   put back together as deepseek2's, the dense layers are the leading ones, an absent
//!   `expert_gating_func` is sigmoid, and `swiglu_clamp_exp`/`swiglu_clamp_shexp` must be one
//!   value above 1e-6 for every layer (transformers clamps every SwiGLU by one `swiglu_limit`);
//!   a RoPE dimension other than 0 and an indexer LayerNorm epsilon other than 1e-6 are refused.
//! - `qwen3next` (run as `qwen3_next`): the DeltaNet widths from `ssm.*` (`state_size` the key
//!   head width, `group_count` the key heads, `time_step_rank` the value heads, `inner_size`
//!   their total width), the layer kinds from `attention.recurrent_layers`, else every
//!   `full_attention_interval`-th layer (default 4) attention; the top-k always renormalised
//!   and softmax-weighted (llama.cpp's graph hard-codes both: `expert_weights_norm` false,
//!   another gating function or an `expert_weights_scale` other than 0 and 1 are refused), the
//!   shared expert `expert_shared_feed_forward_length` wide (absent or 0: `feed_forward_length`,
//!   as llama.cpp falls back). The converter stores the zero-centred norms as `1 + w` and `A_log`
//!   as `ssm_a` = `−exp(A_log)`: the family applies the norms as plain weights and uses `ssm_a`
//!   as it is. `in_proj_qkvz` comes split (`attn_qkv`, `attn_gate`) or whole (`ssm_in`, the
//!   first GGUFs' form), `in_proj_ba` whole (`ssm_ba`); the family's `prepare` splits both as it
//!   does a checkpoint's.
//! - `qwen35moe` (run as `qwen3_5_moe_text`): qwen3next's keys and conversion on Qwen3.5's
//!   separate projections (`ssm_beta`, `ssm_alpha`); every layer MoE; the value heads, stored
//!   tiled by the converter where a key head has several, gathered back into transformers'
//!   order; the interleaved M-RoPE sections llama.cpp requires must put every rotated pair in
//!   t, h or w (for text all the token's position: plain RoPE) — a pair left to the fourth
//!   (position 0 for text, unrotated) or sections wider than the head are refused.
//! - `mimo2` (run as `mimo_v2_flash`): the layer kinds from `attention.sliding_window_pattern`,
//!   `attention.head_count_kv` per layer (the sliding layers' twice the full layers', as
//!   transformers' MiMo has them; any other split refused), values `value_length` wide, the
//!   window, `attention.value_scale` (absent or 0: none), one rotation for both kinds with
//!   `rope.freq_base` and `rope.freq_base_swa` (default 10000, llama.cpp's), dense layers where
//!   there is no router, the sigmoid router with its groups, always renormalised, never scaled
//!   (llama.cpp's mimo2 reads no `expert_weights_scale`: another value than 0 or 1 is refused);
//!   sinks on a full layer and attention biases (loaded, never added by llama.cpp's graph) are
//!   refused.
//! - every family: `attention.head_count_kv` defaults to `attention.head_count`,
//!   `attention.key_length` to `embedding_length / head_count`, `rope.freq_base` to 10000;
//!   `vocab_size` is `token_embd`'s row count; the embedding is tied when `output.weight` is
//!   absent; attention biases and q/k norms are on when their tensors are present. RoPE
//!   scaling (`rope.scaling.type` other than `none`; without a type, a `rope.scaling.factor`
//!   other than 0 and 1, which llama.cpp takes as linear) other than deepseek2's YaRN, and
//!   per-layer arrays of head counts outside the families that read them (glm5-next's and
//!   mimo2's `head_count_kv`), are refused.

use serde_json::{json, Map, Value};

use crate::error::{DecodeError, GgufFault as G, Result, TensorFault};
use crate::family::{FamilyRow, GgufRow, REGISTRY};
use crate::weights::TensorStore;

/// GGUF architectures (`general.architecture`) this build runs, each with the `model_type` of
/// the family that runs it: the [`crate::family::REGISTRY`] rows that have a GGUF row.
pub fn supported() -> impl Iterator<Item = (&'static str, &'static str)> {
    REGISTRY
        .iter()
        .filter_map(|r| r.gguf.as_ref().map(|g| (g.arch, r.model_types[0])))
}

/// The most tokens a rebuilt tokenizer holds (the decoder's vocabulary limit).
const MAX_TOKENS: usize = crate::config::limits::MAX_VOCAB;

fn wrong_type(key: &str, found: &str, expected: &'static str) -> DecodeError {
    err(
        key,
        G::WrongType {
            found: found.to_string(),
            expected,
        },
    )
}

fn err(key: &str, fault: G) -> DecodeError {
    DecodeError::Gguf {
        key: key.into(),
        fault,
    }
}

/// The typed key/values of a GGUF source (`architecture.config`, spec §8.1.1).
#[derive(Clone, Copy, Debug)]
pub struct Kv<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Kv<'a> {
    /// Whether `key` is present (of any type).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Over the manifest's `architecture.config` of a GGUF source.
    pub fn new(config: &'a Value) -> Result<Kv<'a>> {
        config
            .as_object()
            .map(|map| Kv { map })
            .ok_or_else(|| err("(key/values)", G::NotAnObject))
    }

    /// `(type, value)` of `key`, if present.
    fn typed(&self, key: &str) -> Result<Option<(&'a str, &'a Value)>> {
        let Some(v) = self.map.get(key) else {
            return Ok(None);
        };
        let t = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| err(key, G::NoType))?;
        let value = v.get("value").ok_or_else(|| err(key, G::NoValue))?;
        Ok(Some((t, value)))
    }

    /// An unsigned integer key (any GGUF integer type holding a value ≥ 0).
    pub fn uint(&self, key: &str) -> Result<Option<u64>> {
        match self.typed(key)? {
            None => Ok(None),
            Some(("u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64", v)) => {
                v.as_u64().map(Some).ok_or_else(|| {
                    err(
                        key,
                        G::NotUnsigned {
                            value: v.to_string(),
                        },
                    )
                })
            }
            Some(("array", _)) => Err(err(key, G::PerLayerArray)),
            Some((t, _)) => Err(wrong_type(key, t, "an integer")),
        }
    }

    /// A required unsigned integer key.
    pub fn uint_req(&self, key: &str) -> Result<u64> {
        self.uint(key)?.ok_or_else(|| err(key, G::MissingNoDefault))
    }

    /// A float key (`f32`/`f64`; an integer is accepted); non-finite values are refused.
    pub fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.typed(key)? {
            None => Ok(None),
            Some((
                "f32" | "f64" | "u8" | "u16" | "u32" | "u64" | "i8" | "i16" | "i32" | "i64",
                v,
            )) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    err(
                        key,
                        G::NotFinite {
                            value: v.to_string(),
                        },
                    )
                }),
            Some((t, _)) => Err(wrong_type(key, t, "a float")),
        }
    }

    /// A boolean key.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.typed(key)? {
            None => Ok(None),
            Some(("bool", v)) => v.as_bool().map(Some).ok_or_else(|| {
                err(
                    key,
                    G::NotABool {
                        value: v.to_string(),
                    },
                )
            }),
            Some((t, _)) => Err(wrong_type(key, t, "bool")),
        }
    }

    /// A string key.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.typed(key)? {
            None => Ok(None),
            Some(("string", v)) => v.as_str().map(Some).ok_or_else(|| {
                err(
                    key,
                    G::NotAString {
                        value: v.to_string(),
                    },
                )
            }),
            Some((t, _)) => Err(wrong_type(key, t, "string")),
        }
    }

    /// An array of unsigned integers (`head_count_kv` per layer).
    pub fn uint_list(&self, key: &str) -> Result<Option<Vec<u64>>> {
        const INTS: &[&str] = &["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"];
        let Some(a) = self.array(key, INTS)? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| {
                v.as_u64().ok_or_else(|| {
                    err(
                        key,
                        G::NotUnsigned {
                            value: v.to_string(),
                        },
                    )
                })
            })
            .collect::<Result<Vec<u64>>>()
            .map(Some)
    }

    /// An array of booleans (`attention.indexer.types`).
    pub fn bool_list(&self, key: &str) -> Result<Option<Vec<bool>>> {
        let Some(a) = self.array(key, &["bool"])? else {
            return Ok(None);
        };
        a.iter()
            .map(|v| {
                v.as_bool().ok_or_else(|| {
                    err(
                        key,
                        G::NotABool {
                            value: v.to_string(),
                        },
                    )
                })
            })
            .collect::<Result<Vec<bool>>>()
            .map(Some)
    }

    /// A float, or an array of floats (llama.cpp's `get_key_or_arr`: `swiglu_clamp_exp`), as a
    /// list; non-finite values are refused.
    pub fn float_or_list(&self, key: &str) -> Result<Option<Vec<f64>>> {
        match self.typed(key)? {
            None => Ok(None),
            Some(("array", _)) => {
                let a = self.array(key, &["f32", "f64"])?.unwrap_or(&EMPTY);
                a.iter()
                    .map(|v| {
                        v.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                            err(
                                key,
                                G::NotFinite {
                                    value: v.to_string(),
                                },
                            )
                        })
                    })
                    .collect::<Result<Vec<f64>>>()
                    .map(Some)
            }
            Some(_) => Ok(self.float(key)?.map(|f| vec![f])),
        }
    }

    /// An array key whose elements are of GGUF type `elem` (one of `want`).
    fn array(&self, key: &str, want: &[&'static str]) -> Result<Option<&'a Vec<Value>>> {
        let Some((t, v)) = self.typed(key)? else {
            return Ok(None);
        };
        if t != "array" {
            return Err(wrong_type(key, t, "an array"));
        }
        let elem = self
            .map
            .get(key)
            .and_then(|o| o.get("elem"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if !want.contains(&elem) {
            return Err(err(
                key,
                G::WrongElement {
                    elem: elem.to_string(),
                    expected: want.to_vec(),
                },
            ));
        }
        v.as_array().map(Some).ok_or_else(|| err(key, G::NotAList))
    }
}

static EMPTY: Vec<Value> = Vec::new();

/// A GGUF architecture this build runs: the family's registry row and its GGUF row.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    /// The family.
    pub family: &'static FamilyRow,
    /// How it reads the GGUF.
    pub gguf: &'static GgufRow,
}

impl Arch {
    /// The GGUF name.
    pub fn gguf_name(self) -> &'static str {
        self.gguf.arch
    }

    /// The transformers `model_type` of its family.
    pub fn model_type(self) -> &'static str {
        self.family.model_types[0]
    }
}

/// The architecture of a GGUF source, or an error naming it and the supported list.
pub fn arch(kv: &Kv<'_>) -> Result<Arch> {
    let a = kv
        .str("general.architecture")?
        .ok_or_else(|| err("general.architecture", G::Missing))?;
    crate::family::gguf_row(a)
        .and_then(|family| family.gguf.as_ref().map(|gguf| Arch { family, gguf }))
        .ok_or_else(|| {
            err(
                "general.architecture",
                G::UnsupportedArch {
                    arch: a.to_string(),
                },
            )
        })
}

/// Decoder layers (`block_count` less `nextn_predict_layers`) of a GGUF source.
pub fn main_layers(kv: &Kv<'_>, arch: Arch) -> Result<u64> {
    let a = arch.gguf_name();
    let blocks = kv.uint_req(&format!("{a}.block_count"))?;
    let max = crate::config::limits::MAX_LAYERS as u64;
    if blocks > max {
        return Err(err(
            &format!("{a}.block_count"),
            G::TooLarge { value: blocks, max },
        ));
    }
    let nextn = kv.uint(&format!("{a}.nextn_predict_layers"))?.unwrap_or(0);
    if nextn >= blocks {
        return Err(err(
            &format!("{a}.nextn_predict_layers"),
            G::NoDecoderLayer { nextn, blocks },
        ));
    }
    Ok(blocks - nextn)
}

/// The transformers name of llama.cpp tensor `name` for `arch`, `None` if it has none.
pub fn hf_name(arch: Arch, name: &str) -> Option<String> {
    match name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("blk.")?;
    let (n, rest) = rest.split_once('.')?;
    if n.is_empty() || n.len() > 9 || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let l: u32 = n.parse().ok()?;
    // `blk.N.ssm_a` (glm5-next's decay rates) has no suffix.
    let (stem, suffix) = rest.split_once('.').unwrap_or((rest, ""));
    let wb = matches!(suffix, "weight" | "bias");
    // MLA has a query projection but no keys, values, q/k norms or q/k/v biases of its own.
    let heads = !arch.gguf.mla;
    let hf = match (stem, suffix) {
        ("attn_norm", "weight") => "input_layernorm.weight".to_string(),
        ("attn_q", "weight") => "self_attn.q_proj.weight".into(),
        ("attn_q", "bias") if heads => "self_attn.q_proj.bias".into(),
        ("attn_k", _) if wb && heads => format!("self_attn.k_proj.{suffix}"),
        ("attn_v", _) if wb && heads => format!("self_attn.v_proj.{suffix}"),
        ("attn_output", "weight") => "self_attn.o_proj.weight".into(),
        ("attn_q_norm", "weight") if heads => "self_attn.q_norm.weight".into(),
        ("attn_k_norm", "weight") if heads => "self_attn.k_norm.weight".into(),
        ("ffn_gate_inp", "weight") => "mlp.gate.weight".into(),
        ("ffn_gate", "weight") => "mlp.gate_proj.weight".into(),
        ("ffn_up", "weight") => "mlp.up_proj.weight".into(),
        ("ffn_down", "weight") => "mlp.down_proj.weight".into(),
        // The family's own names.
        _ => (arch.gguf.layer_name)(stem, suffix)?.to_string(),
    };
    Some(format!("model.layers.{l}.{hf}"))
}

/// The names llama.cpp's DeepSeek-style MoE layers share (glm4moe, deepseek2): the router's
/// correction bias and the shared experts (below `model.layers.N.`).
pub fn shared_expert_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("exp_probs_b", "bias") => "mlp.gate.e_score_correction_bias",
        ("ffn_gate_shexp", "weight") => "mlp.shared_experts.gate_proj.weight",
        ("ffn_up_shexp", "weight") => "mlp.shared_experts.up_proj.weight",
        ("ffn_down_shexp", "weight") => "mlp.shared_experts.down_proj.weight",
        _ => return None,
    })
}

/// Layer of a `blk.N.*` name.
fn block_of(name: &str) -> Option<u64> {
    let (n, _) = name.strip_prefix("blk.")?.split_once('.')?;
    (!n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()))
        .then(|| n.parse().ok())
        .flatten()
}

/// Make a GGUF-sourced model runnable by its family: rename `tensors` to transformers names and
/// return the synthesised `config.json`.
pub fn adapt(config: &Value, tensors: &mut TensorStore) -> Result<Value> {
    let kv = Kv::new(config)?;
    let arch = arch(&kv)?;
    let layers = main_layers(&kv, arch)?;
    // The blocks past them are MTP layers only if they hold nextn tensors: an ordinary block
    // there would be listed, checked and skipped.
    let blocks = kv.uint_req(&format!("{}.block_count", arch.gguf_name()))?;
    for block in layers..blocks {
        // An MTP block left out of the model is fine; one that is there must be one.
        let ours = format!("blk.{block}.");
        let prefix = format!("blk.{block}.nextn.");
        let held = tensors.names().any(|n| n.starts_with(&ours));
        if held && !tensors.names().any(|n| n.starts_with(&prefix)) {
            return Err(err(
                &format!("{}.nextn_predict_layers", arch.gguf_name()),
                G::NotAnMtpBlock {
                    nextn: blocks - layers,
                    block,
                },
            ));
        }
    }
    tensors.rename_with(|name| match block_of(name) {
        // nextn/MTP layers keep their names: not run by the main decode.
        Some(l) if l >= layers => Ok(None),
        _ => match hf_name(arch, name) {
            Some(hf) => Ok(Some(hf)),
            None => Err(DecodeError::BadTensor {
                name: name.into(),
                fault: TensorFault::NoMeaning {
                    model_type: arch.model_type(),
                    gguf_arch: arch.gguf_name(),
                },
            }),
        },
    })?;
    let config = hf_config(&kv, arch, tensors)?;
    if let Some(assemble) = arch.gguf.assemble {
        assemble(&config, tensors)?;
    }
    Ok(config)
}

/// Without `rope.scaling.type` llama.cpp takes linear scaling by `rope.scaling.factor` (or the
/// older `rope.scale_linear`): a factor other than 0 and 1 there is refused, as the families'
/// transformers configs have no linear scaling to carry it.
pub fn no_untyped_scaling(kv: &Kv<'_>, arch: &str) -> Result<()> {
    for k in ["rope.scaling.factor", "rope.scale_linear"] {
        let key = format!("{arch}.{k}");
        if let Some(f) = kv.float(&key)?.filter(|&f| f != 0.0 && f != 1.0) {
            return Err(err(
                &key,
                G::NoEquivalent {
                    value: f.to_string(),
                    why: "without rope.scaling.type llama.cpp scales RoPE linearly by it, which this family's transformers config cannot say",
                },
            ));
        }
    }
    Ok(())
}

/// What a GGUF's config.json is made from: the key/values and what every family reads from
/// them and from the tensors. A family's [`GgufRow::config`] adds its own keys from it.
#[derive(Debug)]
pub struct GgufConfig<'a> {
    /// The key/values.
    pub kv: Kv<'a>,
    /// llama.cpp's architecture: the prefix of its keys.
    pub arch: &'static str,
    /// Decoder layers (the nextn/MTP layers aside).
    pub layers: u64,
    /// `attention.key_length` (default `embedding_length / head_count`).
    pub head_dim: u64,
    /// `rope.dimension_count` (default the head dim; at most the head dim, not 0).
    pub rot: u64,
    /// `rope.freq_base` (default 10000).
    pub theta: f64,
    /// `expert_count`.
    pub experts: u64,
    /// The layers without a router (`ffn_gate_inp`): dense MLP layers.
    pub dense: Vec<u64>,
    /// `feed_forward_length`, if present.
    pub ff: Option<u64>,
    /// Whether the first layer with attention (`attn_q`) has q/k norms.
    pub qk_norm: bool,
}

impl GgufConfig<'_> {
    /// The full name of the architecture's key `k`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// The error of the architecture's key `k`.
    pub fn err(&self, k: &str, fault: G) -> DecodeError {
        err(&self.key(k), fault)
    }

    /// `leading_dense_block_count` (llama.cpp's default 0), held to the layers without a router:
    /// they must be exactly the leading ones.
    pub fn leading_dense(&self) -> Result<u64> {
        let lead = self
            .kv
            .uint(&self.key("leading_dense_block_count"))?
            .unwrap_or(0);
        let want: Vec<u64> = (0..lead.min(self.layers)).collect();
        if self.dense != want {
            return Err(self.err(
                "leading_dense_block_count",
                G::DenseLayers {
                    lead,
                    dense: self.dense.clone(),
                },
            ));
        }
        Ok(lead)
    }

    /// The dense layers as Qwen's configs say them: `decoder_sparse_step` 1, `mlp_only_layers`
    /// the layers without a router, `intermediate_size` their width (`feed_forward_length`,
    /// required when there are any).
    pub fn dense_keys(&self, c: &mut Map<String, Value>) -> Result<()> {
        c.insert("decoder_sparse_step".into(), json!(1));
        c.insert("mlp_only_layers".into(), json!(self.dense));
        if !self.dense.is_empty() {
            c.insert("intermediate_size".into(), json!(self.dense_width()?));
        } else if let Some(f) = self.ff {
            c.insert("intermediate_size".into(), json!(f));
        }
        Ok(())
    }

    /// `feed_forward_length`, which dense layers need.
    pub fn dense_width(&self) -> Result<u64> {
        self.ff.ok_or_else(|| {
            self.err(
                "feed_forward_length",
                G::DenseWithoutWidth {
                    dense: self.dense.clone(),
                },
            )
        })
    }
}

/// The `config.json` of the family, from the key/values and the (renamed) tensors present: what
/// every family reads, then the family's own keys ([`GgufRow::config`]).
pub fn hf_config(kv: &Kv<'_>, arch: Arch, tensors: &TensorStore) -> Result<Value> {
    let a = arch.gguf_name();
    let key = |k: &str| format!("{a}.{k}");
    let layers = main_layers(kv, arch)?;
    let hidden = kv.uint_req(&key("embedding_length"))?;
    let heads = kv.uint_req(&key("attention.head_count"))?;
    if heads == 0 {
        return Err(err(&key("attention.head_count"), G::Zero));
    }
    // A hybrid family's per-layer list is its own to read (`GgufRow::hybrid`).
    let hybrid = arch.gguf.hybrid;
    let kv_heads = match hybrid {
        true => heads,
        false => kv.uint(&key("attention.head_count_kv"))?.unwrap_or(heads),
    };
    let head_dim = match kv.uint(&key("attention.key_length"))? {
        Some(d) => d,
        None => hidden / heads,
    };
    // MLA's widths and RoPE scaling are its family's to read.
    let mla = arch.gguf.mla;
    if let Some(v) = kv
        .uint(&key("attention.value_length"))?
        .filter(|_| !mla && !hybrid)
    {
        if v != head_dim {
            return Err(err(
                &key("attention.value_length"),
                G::ValueLength {
                    value_length: v,
                    key_length: head_dim,
                },
            ));
        }
    }
    let eps = kv
        .float(&key("attention.layer_norm_rms_epsilon"))?
        .ok_or_else(|| err(&key("attention.layer_norm_rms_epsilon"), G::Missing))?;
    let theta = kv.float(&key("rope.freq_base"))?.unwrap_or(10000.0);
    if !mla {
        match kv.str(&key("rope.scaling.type"))? {
            None => no_untyped_scaling(kv, a)?,
            Some("none") => {}
            Some(t) => {
                return Err(err(
                    &key("rope.scaling.type"),
                    G::RopeScaling {
                        kind: t.to_string(),
                    },
                ))
            }
        }
    }
    let rot = kv.uint(&key("rope.dimension_count"))?.unwrap_or(head_dim);
    if (rot == 0 && !hybrid) || rot > head_dim || head_dim == 0 {
        return Err(err(
            &key("rope.dimension_count"),
            G::RotaryDims { rot, head_dim },
        ));
    }
    let experts = kv.uint_req(&key("expert_count"))?;
    let top_k = kv.uint_req(&key("expert_used_count"))?;

    let embed = tensors.get("model.embed_tokens.weight")?;
    let vocab = match embed.shape() {
        [v, h] if *h as u64 == hidden => *v,
        s => {
            return Err(DecodeError::BadTensor {
                name: "token_embd.weight".into(),
                fault: TensorFault::EmbeddingShape {
                    shape: s.to_vec(),
                    hidden,
                },
            })
        }
    };
    let tied = tensors.find("lm_head.weight").is_none();
    let has = |l: u64, n: &str| tensors.find(&format!("model.layers.{l}.{n}")).is_some();
    // A hybrid's first layer may have no attention: the first layer that has.
    let first = (0..layers)
        .find(|&l| has(l, "self_attn.q_proj.weight"))
        .unwrap_or(0);
    let attention_bias = has(first, "self_attn.q_proj.bias");
    let qk_norm = has(first, "self_attn.q_norm.weight");
    let dense: Vec<u64> = (0..layers)
        .filter(|&l| !has(l, "mlp.gate.weight"))
        .collect();
    let ff = kv.uint(&key("feed_forward_length"))?;

    let mut c = Map::new();
    c.insert("model_type".into(), json!(arch.model_type()));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(kv_heads));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("rms_norm_eps".into(), json!(eps));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("tie_word_embeddings".into(), json!(tied));
    c.insert("attention_bias".into(), json!(attention_bias));
    c.insert("num_experts_per_tok".into(), json!(top_k));
    if let Some(n) = kv.uint(&key("context_length"))? {
        c.insert("max_position_embeddings".into(), json!(n));
    }
    if let Some(n) = kv.uint(&key("expert_feed_forward_length"))? {
        c.insert("moe_intermediate_size".into(), json!(n));
    }
    let g = GgufConfig {
        kv: *kv,
        arch: a,
        layers,
        head_dim,
        rot,
        theta,
        experts,
        dense,
        ff,
        qk_norm,
    };
    (arch.gguf.config)(&g, &mut c)?;
    Ok(Value::Object(c))
}

/// GPT-2 pre-tokenizer regexes by `tokenizer.ggml.pre`, as llama.cpp's `llama-vocab.cpp` has them.
const PRE_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PRE_CHATGLM4: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const PRE_GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// `deepseek-v3`'s three regexes, applied one after the other (digits in threes, then runs of
/// CJK ideographs and kana, then the rest), as llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK3_LLM`
/// and DeepSeek-V3's own tokenizer.json have them.
const PRE_DEEPSEEK3: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// `tokenizer.ggml.pre` values rebuilt.
pub const SUPPORTED_PRE: &[&str] = &["qwen2", "glm4", "chatglm-bpe", "gpt-2", "deepseek-v3"];

/// llama.cpp's token types.
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The GGUF's token strings, by id (`tokenizer.ggml.tokens`), as llama.cpp decodes: every id
/// its own string, a string that two ids share included (the rebuilt tokenizer's vocabulary
/// maps a string to one id, so the later id of a shared string has no string there).
pub fn token_strings(config: &Value) -> Result<Vec<String>> {
    let kv = Kv::new(config)?;
    let tokens = kv
        .array("tokenizer.ggml.tokens", &["string"])?
        .ok_or_else(|| err("tokenizer.ggml.tokens", G::Missing))?;
    if tokens.len() > MAX_TOKENS {
        return Err(err(
            "tokenizer.ggml.tokens",
            G::TokenCount {
                count: tokens.len(),
                max: MAX_TOKENS,
            },
        ));
    }
    tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            t.as_str()
                .map(str::to_string)
                .ok_or_else(|| err("tokenizer.ggml.tokens", G::ElementNotAString { index: id }))
        })
        .collect()
}

/// A `tokenizers` tokenizer.json for the GGUF's `tokenizer.ggml.*` keys: byte-level BPE
/// (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizer regex llama.cpp uses for
/// `tokenizer.ggml.pre`, tokens as the vocabulary (the first id of a repeated token wins; the
/// text of each id is [`token_strings`]'), `merges` in rank order, CONTROL tokens as special
/// added tokens and USER_DEFINED ones as added tokens. Encoding with special tokens adds the BOS
/// (EOS) where `tokenizer.ggml.add_bos_token` (`add_eos_token`) says so, as llama.cpp does: a
/// `TemplateProcessing` post-processor. An error names the missing or unsupported key.
pub fn tokenizer_json(config: &Value) -> Result<Value> {
    let kv = Kv::new(config)?;
    let model = kv
        .str("tokenizer.ggml.model")?
        .ok_or_else(|| err("tokenizer.ggml.model", G::NoTokenizer))?;
    if model != "gpt2" {
        return Err(err(
            "tokenizer.ggml.model",
            G::TokenizerModel {
                model: model.to_string(),
            },
        ));
    }
    let pre = kv
        .str("tokenizer.ggml.pre")?
        .ok_or_else(|| err("tokenizer.ggml.pre", G::NoPreTokenizer))?;
    let (regexes, nfc): (&[&str], bool) = match pre {
        "qwen2" => (&[PRE_QWEN2], true),
        "glm4" | "chatglm-bpe" => (&[PRE_CHATGLM4], false),
        "gpt-2" => (&[PRE_GPT2], false),
        "deepseek-v3" => (&PRE_DEEPSEEK3, false),
        other => {
            return Err(err(
                "tokenizer.ggml.pre",
                G::PreTokenizer {
                    pre: other.to_string(),
                },
            ))
        }
    };
    let tokens = kv
        .array("tokenizer.ggml.tokens", &["string"])?
        .ok_or_else(|| err("tokenizer.ggml.tokens", G::Missing))?;
    if tokens.is_empty() || tokens.len() > MAX_TOKENS {
        return Err(err(
            "tokenizer.ggml.tokens",
            G::TokenCount {
                count: tokens.len(),
                max: MAX_TOKENS,
            },
        ));
    }
    let merges = kv
        .array("tokenizer.ggml.merges", &["string"])?
        .ok_or_else(|| err("tokenizer.ggml.merges", G::NoMerges))?;
    if merges.len() > MAX_TOKENS {
        return Err(err(
            "tokenizer.ggml.merges",
            G::MergeCount {
                count: merges.len(),
                max: MAX_TOKENS,
            },
        ));
    }
    let types = kv.array(
        "tokenizer.ggml.token_type",
        &["i32", "u32", "i8", "u8", "i16", "u16", "i64", "u64"],
    )?;
    if let Some(t) = types {
        if t.len() != tokens.len() {
            return Err(err(
                "tokenizer.ggml.token_type",
                G::TypeCount {
                    types: t.len(),
                    tokens: tokens.len(),
                },
            ));
        }
    }
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, t) in tokens.iter().enumerate() {
        let s = t
            .as_str()
            .ok_or_else(|| err("tokenizer.ggml.tokens", G::ElementNotAString { index: id }))?;
        let ty = types.and_then(|v| v[id].as_i64()).unwrap_or(1);
        if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TOKEN_CONTROL,
            }));
        }
        if !vocab.contains_key(s) {
            vocab.insert(s.to_string(), json!(id));
        }
    }
    let mut pairs = Vec::with_capacity(merges.len());
    for (i, m) in merges.iter().enumerate() {
        let s = m
            .as_str()
            .ok_or_else(|| err("tokenizer.ggml.merges", G::ElementNotAString { index: i }))?;
        let mut it = s.split(' ');
        match (it.next(), it.next(), it.next()) {
            (Some(a), Some(b), None) if !a.is_empty() && !b.is_empty() => pairs.push(json!([a, b])),
            _ => {
                return Err(err(
                    "tokenizer.ggml.merges",
                    G::BadMerge {
                        index: i,
                        merge: s.to_string(),
                    },
                ))
            }
        }
    }
    // llama.cpp adds the BOS (and EOS) ids to a prompt where tokenizer.ggml.add_bos_token
    // (add_eos_token) says so: a post-processor that does the same.
    let special = |flag: &str, id_key: &str| -> Result<Option<(u64, String)>> {
        if kv.bool(flag)? != Some(true) {
            return Ok(None);
        }
        let id = kv.uint(id_key)?.ok_or_else(|| err(id_key, G::Missing))?;
        let name = usize::try_from(id)
            .ok()
            .and_then(|i| tokens.get(i))
            .and_then(|t| t.as_str())
            .ok_or_else(|| {
                err(
                    id_key,
                    G::TokenCount {
                        count: usize::try_from(id).unwrap_or(usize::MAX),
                        max: tokens.len().saturating_sub(1),
                    },
                )
            })?;
        Ok(Some((id, name.to_string())))
    };
    let bos = special(
        "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.bos_token_id",
    )?;
    let eos = special(
        "tokenizer.ggml.add_eos_token",
        "tokenizer.ggml.eos_token_id",
    )?;
    let post_processor = if bos.is_none() && eos.is_none() {
        Value::Null
    } else {
        let piece = |t: &(u64, String)| json!({"SpecialToken": {"id": t.1, "type_id": 0}});
        let mut single = Vec::new();
        let mut specials = Map::new();
        for (t, first) in [(&bos, true), (&eos, false)] {
            if let Some(t) = t {
                specials.insert(
                    t.1.clone(),
                    json!({"id": t.1, "ids": [t.0], "tokens": [t.1]}),
                );
                if first {
                    single.push(piece(t));
                }
            }
        }
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        if let Some(t) = &eos {
            single.push(piece(t));
        }
        let mut pair = single.clone();
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if nfc { json!({"type": "NFC"}) } else { Value::Null },
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": regexes
                .iter()
                .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
                .chain([json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})])
                .collect::<Vec<_>>(),
        },
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": pairs,
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The architecture named `a` (one this build runs).
    fn named(a: &str) -> Arch {
        let family = crate::family::gguf_row(a).expect("a registered GGUF architecture");
        Arch {
            family,
            gguf: family.gguf.as_ref().expect("its GGUF row"),
        }
    }

    #[test]
    fn every_llama_cpp_layer_name_maps() {
        let q = named("qwen3moe");
        let g = named("glm4moe");
        assert_eq!((q.model_type(), g.model_type()), ("qwen3_moe", "glm4_moe"));
        assert_eq!(
            hf_name(q, "token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
        assert_eq!(
            hf_name(q, "output.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(
            hf_name(q, "blk.7.attn_output.bias").as_deref(),
            Some("model.layers.7.self_attn.o_proj.bias")
        );
        assert_eq!(hf_name(g, "blk.7.attn_output.bias"), None);
        assert_eq!(
            hf_name(q, "blk.0.ffn_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(hf_name(g, "blk.0.ffn_norm.weight"), None);
        assert_eq!(
            hf_name(g, "blk.0.post_attention_norm.weight").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name(g, "blk.3.exp_probs_b.bias").as_deref(),
            Some("model.layers.3.mlp.gate.e_score_correction_bias")
        );
        assert_eq!(
            hf_name(g, "blk.3.ffn_down_shexp.weight").as_deref(),
            Some("model.layers.3.mlp.shared_experts.down_proj.weight")
        );
        assert_eq!(hf_name(q, "blk.3.ffn_down_shexp.weight"), None);
        assert_eq!(
            hf_name(q, "blk.1.ffn_up.weight").as_deref(),
            Some("model.layers.1.mlp.up_proj.weight")
        );
        assert_eq!(hf_name(q, "blk.x.attn_q.weight"), None);
        assert_eq!(hf_name(q, "rope_freqs.weight"), None);
        assert_eq!(hf_name(q, "blk.1.attn_q.scale"), None);
    }

    fn u32v(v: u64) -> Value {
        json!({"type": "u32", "value": v})
    }

    /// The key and fault of a GGUF key/value refusal.
    fn fault<T: std::fmt::Debug>(r: Result<T>) -> (String, G) {
        match r {
            Err(DecodeError::Gguf { key, fault }) => (key, fault),
            other => panic!("expected a GGUF key fault, got {other:?}"),
        }
    }

    #[test]
    fn missing_and_unknown_keys_are_named() {
        let mut m = Map::new();
        m.insert(
            "general.architecture".into(),
            json!({"type": "string", "value": "llama"}),
        );
        let e = arch(&Kv::new(&Value::Object(m.clone())).expect("ok")).expect_err("refused");
        let s = e.to_string();
        assert!(
            s.contains("general.architecture") && s.contains("\"llama\"") && s.contains("qwen3moe"),
            "{s}"
        );
        assert_eq!(
            fault::<Arch>(Err(e)),
            (
                "general.architecture".into(),
                G::UnsupportedArch {
                    arch: "llama".into()
                }
            )
        );
        m.insert(
            "general.architecture".into(),
            json!({"type": "string", "value": "glm4moe"}),
        );
        let v = Value::Object(m.clone());
        let kv = Kv::new(&v).expect("ok");
        assert_eq!(
            fault(main_layers(&kv, named("glm4moe"))),
            ("glm4moe.block_count".into(), G::MissingNoDefault)
        );
        m.insert("glm4moe.block_count".into(), u32v(4));
        m.insert("glm4moe.nextn_predict_layers".into(), u32v(1));
        let v = Value::Object(m.clone());
        assert_eq!(
            main_layers(&Kv::new(&v).expect("ok"), named("glm4moe")).expect("ok"),
            3
        );
        m.insert("glm4moe.nextn_predict_layers".into(), u32v(4));
        let v = Value::Object(m.clone());
        assert_eq!(
            fault(main_layers(&Kv::new(&v).expect("ok"), named("glm4moe"))),
            (
                "glm4moe.nextn_predict_layers".into(),
                G::NoDecoderLayer {
                    nextn: 4,
                    blocks: 4
                }
            )
        );
        m.insert(
            "glm4moe.attention.head_count".into(),
            json!({"type": "array", "elem": "u32", "value": [4, 4]}),
        );
        let v = Value::Object(m);
        assert_eq!(
            fault(
                Kv::new(&v)
                    .expect("ok")
                    .uint("glm4moe.attention.head_count")
            ),
            ("glm4moe.attention.head_count".into(), G::PerLayerArray)
        );
    }

    #[test]
    fn each_typed_value_fault_is_its_own_variant() {
        let v = json!({
            "notype": {"value": 1},
            "novalue": {"type": "u32"},
            "neg": {"type": "i32", "value": -1},
            "s": {"type": "string", "value": "x"},
            "inf": {"type": "f32", "value": "inf"},
            "b": {"type": "bool", "value": 1},
            "str": {"type": "string", "value": 1},
            "arr": {"type": "array", "elem": "f32", "value": [1.0]},
            "arrv": {"type": "array", "elem": "string", "value": 1},
        });
        let kv = Kv::new(&v).expect("object");
        let k = |s: &str| s.to_string();
        assert_eq!(
            fault(Kv::new(&json!(1))),
            (k("(key/values)"), G::NotAnObject)
        );
        assert_eq!(fault(kv.uint("notype")), (k("notype"), G::NoType));
        assert_eq!(fault(kv.uint("novalue")), (k("novalue"), G::NoValue));
        assert_eq!(
            fault(kv.uint("neg")),
            (k("neg"), G::NotUnsigned { value: k("-1") })
        );
        assert_eq!(
            fault(kv.uint("s")),
            (
                k("s"),
                G::WrongType {
                    found: k("string"),
                    expected: "an integer"
                }
            )
        );
        assert_eq!(
            fault(kv.float("inf")),
            (
                k("inf"),
                G::NotFinite {
                    value: k("\"inf\"")
                }
            )
        );
        assert_eq!(fault(kv.bool("b")), (k("b"), G::NotABool { value: k("1") }));
        assert_eq!(
            fault(kv.str("str")),
            (k("str"), G::NotAString { value: k("1") })
        );
        assert_eq!(
            fault(kv.array("arr", &["string"])),
            (
                k("arr"),
                G::WrongElement {
                    elem: k("f32"),
                    expected: vec!["string"]
                }
            )
        );
        assert_eq!(
            fault(kv.array("arrv", &["string"])),
            (k("arrv"), G::NotAList)
        );
    }

    #[test]
    fn tokenizer_keys_missing_or_unsupported_are_named() {
        let mut m = Map::new();
        assert_eq!(
            fault(tokenizer_json(&Value::Object(m.clone()))),
            ("tokenizer.ggml.model".into(), G::NoTokenizer)
        );
        m.insert(
            "tokenizer.ggml.model".into(),
            json!({"type": "string", "value": "llama"}),
        );
        assert_eq!(
            fault(tokenizer_json(&Value::Object(m.clone()))),
            (
                "tokenizer.ggml.model".into(),
                G::TokenizerModel {
                    model: "llama".into()
                }
            )
        );
        m.insert(
            "tokenizer.ggml.model".into(),
            json!({"type": "string", "value": "gpt2"}),
        );
        m.insert(
            "tokenizer.ggml.pre".into(),
            json!({"type": "string", "value": "tekken"}),
        );
        assert_eq!(
            fault(tokenizer_json(&Value::Object(m.clone()))),
            (
                "tokenizer.ggml.pre".into(),
                G::PreTokenizer {
                    pre: "tekken".into()
                }
            )
        );
        m.insert(
            "tokenizer.ggml.pre".into(),
            json!({"type": "string", "value": "qwen2"}),
        );
        m.insert(
            "tokenizer.ggml.tokens".into(),
            json!({"type": "array", "elem": "string", "value": ["a", "b", "ab"]}),
        );
        assert_eq!(
            fault(tokenizer_json(&Value::Object(m.clone()))),
            ("tokenizer.ggml.merges".into(), G::NoMerges)
        );
        m.insert(
            "tokenizer.ggml.merges".into(),
            json!({"type": "array", "elem": "string", "value": ["a b c"]}),
        );
        let e = tokenizer_json(&Value::Object(m.clone())).expect_err("refused");
        assert!(e.to_string().contains("\"a b c\""), "{e}");
        assert_eq!(
            fault::<Value>(Err(e)),
            (
                "tokenizer.ggml.merges".into(),
                G::BadMerge {
                    index: 0,
                    merge: "a b c".into()
                }
            )
        );
        m.insert(
            "tokenizer.ggml.merges".into(),
            json!({"type": "array", "elem": "string", "value": ["a b"]}),
        );
        let t = tokenizer_json(&Value::Object(m)).expect("ok");
        assert_eq!(t["model"]["merges"], json!([["a", "b"]]));
        assert_eq!(t["model"]["vocab"]["ab"], json!(2));
    }
}
