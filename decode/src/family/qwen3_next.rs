//! `qwen3_next` (Qwen3NextForCausalLM: Qwen3-Next) as transformers 5.17 computes it in `f32`:
//! Qwen3.5-MoE's forward pass ([`crate::family::qwen3_5_moe`]: zero-centred norms, gated
//! attention with a quarter of each head rotated, Gated DeltaNet, softmax top-k experts with a
//! gated shared expert) with its own defaults (512 experts, top-10) and three differences:
//!
//! - `norm_topk_prob` as configured (Qwen3.5 always renormalises);
//! - dense SwiGLU layers (`mlp_only_layers`, `decoder_sparse_step`, `intermediate_size`);
//! - the DeltaNet projections fused: `in_proj_qkvz` holds, per key head `g`, the rows
//!   `[q_g (dk) | k_g (dk) | v_g (r·dv) | z_g (r·dv)]` (r value heads a key head), and
//!   `in_proj_ba` per key head `[b_g (r) | a_g (r)]` (transformers' `fix_query_key_value_ordering`).
//!   [`prepare`] puts the same rows in Qwen3.5's order, `in_proj_qkv` (`[q | k | v]`, which the
//!   convolution reads in that order in both), `in_proj_z`, `in_proj_b`, `in_proj_a`, every value
//!   unchanged: each output is the same row's canonical dot, so the same bits.

use serde_json::Value;

use crate::error::{DecodeError, Result, TensorFault};
use crate::family::qwen3_5_moe::{self, LayerType, Qwen3_5MoeConfig};
use crate::weights::{Tensor, TensorStore};

/// Split each DeltaNet layer's `in_proj_qkvz` and `in_proj_ba` into Qwen3.5's four projections
/// (a layer already holding `in_proj_qkv` and `in_proj_z`, or `in_proj_b` and `in_proj_a`, keeps
/// them: a qwen3next GGUF holds the first pair split and `in_proj_ba` fused).
pub fn prepare(config: &Value, s: &mut TensorStore) -> Result<()> {
    let c = Qwen3_5MoeConfig::parse_next(config)?;
    let (nk, nv, dk, dv, h) = (
        c.lin_k_heads,
        c.lin_v_heads,
        c.lin_k_dim,
        c.lin_v_dim,
        c.hidden_size,
    );
    let r = nv / nk;
    let (rv, group) = (r * dv, 2 * dk + 2 * r * dv);
    for (l, t) in c.layer_types.iter().enumerate() {
        if *t != LayerType::Linear {
            continue;
        }
        let p = |n: &str| format!("{}layers.{l}.linear_attn.{n}.weight", c.prefix);
        // The fused form, if this layer holds it; both forms are refused.
        let fused = |s: &TensorStore, fused: &str, split: &str| -> Result<bool> {
            match (s.find(&p(fused)).is_some(), s.find(&p(split)).is_some()) {
                (true, true) => Err(DecodeError::BadTensor {
                    name: p(fused),
                    fault: TensorFault::BothForms { other: p(split) },
                }),
                (f, _) => Ok(f),
            }
        };
        let take = |s: &mut TensorStore, name: String, rows: usize| -> Result<(Tensor, u64)> {
            let shape = s.get(&name)?.shape().to_vec();
            if shape != [rows, h] {
                return Err(DecodeError::BadTensor {
                    name,
                    fault: TensorFault::Shape {
                        shape,
                        expected: vec![rows, h],
                    },
                });
            }
            Ok(s.remove(&name).expect("found above"))
        };
        // Row `i` of each new matrix is row `src(i)` of the fused one (its stored rows copied
        // whole: a quantised matrix stays quantised).
        let rows = |name: String, n: usize, fused: &Tensor, src: &dyn Fn(usize) -> usize| {
            fused
                .rows_of(&name, n, src)
                .ok_or_else(|| DecodeError::BadTensor {
                    name: fused.name().to_string(),
                    fault: TensorFault::Shape {
                        shape: fused.shape().to_vec(),
                        expected: vec![n, h],
                    },
                })
        };
        if fused(s, "in_proj_qkvz", "in_proj_qkv")? {
            let (qkvz, qkvz_bytes) = take(s, p("in_proj_qkvz"), nk * group)?;
            let qk = nk * dk;
            let qkv = rows(p("in_proj_qkv"), 2 * qk + nv * dv, &qkvz, &|i| match i {
                i if i < qk => i / dk * group + i % dk,
                i if i < 2 * qk => (i - qk) / dk * group + dk + (i - qk) % dk,
                i => (i - 2 * qk) / rv * group + 2 * dk + (i - 2 * qk) % rv,
            })?;
            let z = rows(p("in_proj_z"), nv * dv, &qkvz, &|i| {
                i / rv * group + 2 * dk + rv + i % rv
            })?;
            // The stored bytes of the fused tensor shared out by rows.
            let (qkv_rows, total) = ((2 * qk + nv * dv) as u64, (nk * group) as u64);
            let qkv_bytes = qkvz_bytes * qkv_rows / total;
            s.insert(qkv, qkv_bytes)?;
            s.insert(z, qkvz_bytes - qkv_bytes)?;
        }
        if fused(s, "in_proj_ba", "in_proj_b")? {
            let (ba, ba_bytes) = take(s, p("in_proj_ba"), 2 * nv)?;
            let b = rows(p("in_proj_b"), nv, &ba, &|i| i / r * 2 * r + i % r)?;
            let a = rows(p("in_proj_a"), nv, &ba, &|i| i / r * 2 * r + r + i % r)?;
            s.insert(b, ba_bytes / 2)?;
            s.insert(a, ba_bytes - ba_bytes / 2)?;
        }
    }
    Ok(())
}

/// The transformers names of qwen3next's own GGUF layer tensors (below `model.layers.N.`), as
/// llama.cpp's converter writes them (`Qwen3NextModel`): Qwen3.5's DeltaNet names
/// ([`qwen3_5_moe::deltanet_gguf_name`]: `attn_qkv` and `attn_gate`, the converter's split of
/// `in_proj_qkvz`), or `ssm_in` (`in_proj_qkvz` whole, the form llama.cpp wrote first), and
/// `ssm_ba` (`in_proj_ba` whole).
pub fn gguf_layer_name(stem: &str, suffix: &str) -> Option<&'static str> {
    Some(match (stem, suffix) {
        ("ssm_in", "weight") => "linear_attn.in_proj_qkvz.weight",
        ("ssm_ba", "weight") => "linear_attn.in_proj_ba.weight",
        _ => return qwen3_5_moe::deltanet_gguf_name(stem, suffix),
    })
}

/// qwen3_next's keys of a qwen3next GGUF's config: Qwen3.5-MoE's
/// ([`qwen3_5_moe::gguf_keys`]), and the dense layers (layers without a router, llama.cpp's
/// qwen3next has none) and `norm_topk_prob` (always: llama.cpp's graph renormalises).
pub fn gguf_config(
    g: &crate::gguf_model::GgufConfig<'_>,
    c: &mut serde_json::Map<String, Value>,
) -> Result<()> {
    use serde_json::json;
    qwen3_5_moe::gguf_keys(g, c)?;
    c.insert("norm_topk_prob".into(), json!(true));
    g.dense_keys(c)
}

/// The shared expert's gate as transformers holds it ([`qwen3_5_moe::gate_as_matrix`]);
/// Qwen3NextModel's converter keeps the value heads in their order.
pub fn gguf_assemble(config: &Value, s: &mut TensorStore) -> Result<()> {
    let c = Qwen3_5MoeConfig::parse_next(config)?;
    qwen3_5_moe::gate_as_matrix(&c, s)
}
