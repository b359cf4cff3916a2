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
use crate::family::qwen3_5_moe::{LayerType, Qwen3_5MoeConfig};
use crate::weights::{Tensor, TensorStore};

/// Split each DeltaNet layer's `in_proj_qkvz` and `in_proj_ba` into Qwen3.5's four projections
/// (a layer already holding `in_proj_qkv` is left as it is).
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
        match (
            s.find(&p("in_proj_qkvz")).is_some(),
            s.find(&p("in_proj_qkv")).is_some(),
        ) {
            (false, true) => continue,
            (true, true) => {
                return Err(DecodeError::BadTensor {
                    name: p("in_proj_qkvz"),
                    fault: TensorFault::BothForms {
                        other: p("in_proj_qkv"),
                    },
                })
            }
            _ => {}
        }
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
        let (qkvz, qkvz_bytes) = take(s, p("in_proj_qkvz"), nk * group)?;
        let (ba, ba_bytes) = take(s, p("in_proj_ba"), 2 * nv)?;
        // Row `i` of each new matrix is row `src(i)` of the fused one.
        let rows = |name: String, n: usize, fused: &Tensor, src: &dyn Fn(usize) -> usize| {
            Tensor::gathered(&name, &[n, h], &[fused], |i| (0, src(i / h) * h + i % h))
        };
        let qk = nk * dk;
        let qkv = rows(p("in_proj_qkv"), 2 * qk + nv * dv, &qkvz, &|i| match i {
            i if i < qk => i / dk * group + i % dk,
            i if i < 2 * qk => (i - qk) / dk * group + dk + (i - qk) % dk,
            i => (i - 2 * qk) / rv * group + 2 * dk + (i - 2 * qk) % rv,
        });
        let z = rows(p("in_proj_z"), nv * dv, &qkvz, &|i| {
            i / rv * group + 2 * dk + rv + i % rv
        });
        let b = rows(p("in_proj_b"), nv, &ba, &|i| i / r * 2 * r + i % r);
        let a = rows(p("in_proj_a"), nv, &ba, &|i| i / r * 2 * r + r + i % r);
        // The stored bytes of each fused tensor shared out by rows.
        let (qkv_rows, total) = ((2 * qk + nv * dv) as u64, (nk * group) as u64);
        let qkv_bytes = qkvz_bytes * qkv_rows / total;
        s.insert(qkv, qkv_bytes)?;
        s.insert(z, qkvz_bytes - qkv_bytes)?;
        s.insert(b, ba_bytes / 2)?;
        s.insert(a, ba_bytes - ba_bytes / 2)?;
    }
    Ok(())
}
