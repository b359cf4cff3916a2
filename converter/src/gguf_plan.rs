//! The plan of a GGUF model, by llama.cpp's tensor names: `blk.N.ffn_{gate,up,down}_exps.weight`
//! and a fused `blk.N.ffn_gate_up_exps.weight` (`[n_expert, rows, cols]` row-major) are cut into
//! one extent per expert with [`tarfa_gguf::expert_range`], byte for byte in their quant type;
//! their `.bias` stacks (`[n_expert, rows]`) become the bias roles. Every other `blk.N.*` tensor
//! (attention, norms, router `ffn_gate_inp`, `exp_probs_b`, shared experts `ffn_*_shexp`, nextn/MTP
//! `blk.N.nextn.*`) is a plain tensor of layer N, and the rest (`token_embd`, `output_norm`,
//! `output`, ...) is the trunk. Nothing is dropped.

use std::collections::BTreeMap;

use tarfa_format::Role;
use tarfa_gguf::{expert_range, TensorInfo};

use crate::error::{ConvertError, ExpertFault};
use crate::plan::{Item, Plan, Slice, Stack};
use crate::source::{Checkpoint, SourceTensor};

fn parse_u32(s: &str) -> Option<u32> {
    (!s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// `(N, rest)` for `blk.N.rest`.
fn layer_of(name: &str) -> Option<(u32, &str)> {
    let (n, rest) = name.strip_prefix("blk.")?.split_once('.')?;
    Some((parse_u32(n)?, rest))
}

/// What a layer tensor is, from the part of its name after `blk.N.`.
#[derive(Debug, PartialEq, Eq)]
enum LayerTensor {
    /// An expert stack: weights `[n_expert, rows, cols]` or biases `[n_expert, rows]`.
    Experts(Role),
    /// `ffn_*_exps.` with a suffix that is neither `weight` nor `bias`: kept plain, reported.
    Loose,
    Plain,
}

fn classify(rest: &str) -> LayerTensor {
    let Some((stem, suffix)) = rest.split_once('.') else {
        return LayerTensor::Plain;
    };
    let proj = match stem {
        "ffn_gate_exps" => 0,
        "ffn_up_exps" => 1,
        "ffn_down_exps" => 2,
        "ffn_gate_up_exps" => 3,
        _ => return LayerTensor::Plain,
    };
    let bias = match suffix {
        "weight" => false,
        "bias" => true,
        _ => return LayerTensor::Loose,
    };
    LayerTensor::Experts(match (proj, bias) {
        (0, false) => Role::Gate,
        (1, false) => Role::Up,
        (2, false) => Role::Down,
        (3, false) => Role::GateUp,
        (0, true) => Role::GateBias,
        (1, true) => Role::UpBias,
        (2, true) => Role::DownBias,
        _ => Role::GateUpBias,
    })
}

fn is_bias(role: Role) -> bool {
    matches!(
        role,
        Role::GateBias | Role::UpBias | Role::DownBias | Role::GateUpBias
    )
}

/// The header entry `expert_range` reads, rebuilt from the checkpoint's view of the tensor.
fn tensor_info(t: &SourceTensor) -> TensorInfo {
    TensorInfo {
        name: t.name.clone(),
        dtype: t.dtype,
        ne: t.shape.iter().rev().copied().collect(),
        offset: 0,
        data_offset: t.begin,
        byte_len: t.end - t.begin,
        info_offset: 0,
    }
}

/// The per-expert byte ranges of an expert stack.
fn expert_stack(layer: u32, role: Role, t: &SourceTensor) -> Result<Stack, ConvertError> {
    let want_rank = if is_bias(role) { 2 } else { 3 };
    if t.shape.len() != want_rank {
        return Err(ConvertError::BadExperts {
            layer,
            fault: ExpertFault::GgufStackRank {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
                rank: want_rank,
            },
        });
    }
    let n = t.shape[0];
    crate::plan::check_expert_count(layer, n)?;
    let info = tensor_info(t);
    // A bias has one row per expert: expert_range wants 3 dimensions, so view [n, rows] as
    // [n, 1, rows] (same bytes: rows never share a block).
    let as3 = is_bias(role).then(|| {
        let mut as3 = info.clone();
        as3.ne = vec![t.shape[1], 1, n];
        as3
    });
    let range = |e: u64| {
        expert_range(as3.as_ref().unwrap_or(&info), e).map_err(|v| ConvertError::BadExperts {
            layer,
            fault: ExpertFault::GgufSlice(v),
        })
    };
    // Every expert's range is checked (the first fault is the one reported) and must be expert
    // 0's moved by a whole number of strides, as `expert_range` makes it.
    let first = if n == 0 { 0..0 } else { range(0)? };
    let (len, begin) = (first.end - first.start, first.start);
    for e in 0..n {
        let r = range(e)?;
        if r.start != begin + e * len || r.end - r.start != len {
            return Err(ConvertError::BadExperts {
                layer,
                fault: ExpertFault::GgufStackStride {
                    tensor: t.name.clone(),
                    expert: e,
                },
            });
        }
    }
    Ok(Stack {
        role,
        tensor: t.name.clone(),
        shard: t.shard,
        begin,
        stride: len,
        len,
        dtype: t.dtype,
        shape: t.shape[1..].to_vec(),
        src_shape: t.shape.clone(),
    })
}

fn is_known_trunk(name: &str) -> bool {
    matches!(
        name,
        "token_embd.weight"
            | "token_embd_norm.weight"
            | "token_embd_norm.bias"
            | "output_norm.weight"
            | "output_norm.bias"
            | "output.weight"
            | "output.bias"
            | "rope_freqs.weight"
    )
}

/// Build the plan of a checkpoint read from GGUF.
pub fn plan(ck: &Checkpoint) -> Result<Plan, ConvertError> {
    let mut plan = Plan::default();
    let mut stacks: BTreeMap<u32, Vec<(Role, &SourceTensor)>> = BTreeMap::new();
    for t in ck.tensors.values() {
        let whole = || Item {
            name: t.name.clone(),
            role: Role::Tensor,
            slice: Slice::whole(t),
        };
        let Some((layer, rest)) = layer_of(&t.name) else {
            if !is_known_trunk(&t.name) {
                plan.unrecognised.push(t.name.clone());
            }
            plan.trunk.push(whole());
            continue;
        };
        let lp = plan.layers.entry(layer).or_default();
        match classify(rest) {
            LayerTensor::Experts(role) => stacks.entry(layer).or_default().push((role, t)),
            LayerTensor::Loose => {
                plan.loose_expert_tensors.push(t.name.clone());
                lp.plain.push(whole());
            }
            LayerTensor::Plain => lp.plain.push(whole()),
        }
    }
    for (layer, stacks) in stacks {
        let n = stacks[0].1.shape.first().copied().unwrap_or(0);
        crate::plan::check_expert_count(layer, n)?;
        let plain = plan.layers.get(&layer).map_or(0, |lp| lp.plain.len());
        let regions = n
            .saturating_mul(stacks.len() as u64)
            .saturating_add(plain as u64);
        crate::plan::check_index_bound(layer, &stacks[0].1.name, n, regions)?;
        let mut cut = Vec::with_capacity(stacks.len());
        for (role, t) in &stacks {
            if t.shape.first() != Some(&n) {
                return Err(ConvertError::BadExperts {
                    layer,
                    fault: ExpertFault::StackCounts {
                        tensor: t.name.clone(),
                        count: t.shape.first().copied(),
                        first: stacks[0].1.name.clone(),
                        first_count: n,
                    },
                });
            }
            cut.push(expert_stack(layer, *role, t)?);
        }
        plan.set_stacks(layer, n as u32, cut)?;
    }
    plan.check_plain_bounds(ck)?;
    plan.sort_by_source();
    // GGUF's block_count counts nextn/MTP layers; nextn_predict_layers of them are the last.
    let seen = plan.layers.keys().max().map_or(0, |m| m + 1);
    let gguf = ck.shards.first().map_or(ck.dir.clone(), |s| s.path.clone());
    // No block past block_count (it would never run), no absurd count: checked before the
    // counts size anything.
    let layer_fault = |fault| ConvertError::LayerCount {
        path: gguf.clone(),
        fault,
    };
    let declared =
        tarfa_format::manifest::declared_layers("gguf", &ck.config).map_err(layer_fault)?;
    tarfa_format::manifest::check_layer_count("gguf", &ck.config, u64::from(seen))
        .map_err(layer_fault)?;
    let blocks = declared.as_ref().map_or(seen, |d| (d.main + d.mtp) as u32);
    plan.num_layers = blocks.max(seen);
    plan.num_hidden_layers = declared.as_ref().map_or(blocks, |d| d.main as u32);
    // The blocks past the decoder layers are MTP layers only if they hold nextn tensors (those
    // this file holds: a part of a split set or a fetched subset may hold none of a block).
    if let Some(d) = &declared {
        for block in d.main..d.main + d.mtp {
            let ours = format!("blk.{block}.");
            let nextn = format!("blk.{block}.nextn.");
            let held = ck.tensors.keys().any(|n| n.starts_with(&ours));
            if held && !ck.tensors.keys().any(|n| n.starts_with(&nextn)) {
                let arch = d.key.trim_end_matches(".block_count");
                return Err(ConvertError::NotAnMtpBlock {
                    path: gguf,
                    nextn_key: format!("{arch}.nextn_predict_layers"),
                    nextn: d.mtp,
                    block,
                });
            }
        }
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_names_are_classified() {
        assert_eq!(
            layer_of("blk.12.attn_q.weight"),
            Some((12, "attn_q.weight"))
        );
        assert_eq!(layer_of("blk.x.attn_q.weight"), None);
        assert_eq!(layer_of("token_embd.weight"), None);
        assert_eq!(
            classify("ffn_gate_exps.weight"),
            LayerTensor::Experts(Role::Gate)
        );
        assert_eq!(
            classify("ffn_gate_up_exps.weight"),
            LayerTensor::Experts(Role::GateUp)
        );
        assert_eq!(
            classify("ffn_down_exps.bias"),
            LayerTensor::Experts(Role::DownBias)
        );
        assert_eq!(classify("ffn_up_exps.scale"), LayerTensor::Loose);
        assert_eq!(classify("ffn_gate_shexp.weight"), LayerTensor::Plain);
        assert_eq!(classify("ffn_gate_inp.weight"), LayerTensor::Plain);
        assert_eq!(classify("exp_probs_b.bias"), LayerTensor::Plain);
        assert_eq!(classify("nextn.eh_proj.weight"), LayerTensor::Plain);
    }
}
