//! The whole forward pass on a device: a `qwen3_moe` model whose trunk and every expert fit
//! there runs each token entirely on it ([`tarfa_runtime::gpu_engine::Engine`]), the
//! activations never leaving it and only the logits coming back. Every kernel computes the bits
//! of the CPU path (`canon`, `blocks`), so the logits are the CPU's bit for bit; this is only
//! where they are computed.
//!
//! [`build`] takes any [`EngineDevice`]: the GPU ([`open`], feature `cuda`, the default of
//! `--device cuda`) or the CPU emulation of the kernels (`cuda-emu`, whose tests hold this whole
//! path to the CPU decoder's logits in CI). [`open`] decides: the family is `qwen3_moe`, every weight BF16 or
//! F32, the whole model fits in VRAM (or in `--vram-gib`), all experts placed on the GPU and the
//! trunk too; else `None` and the decoder runs its layers on the CPU with experts and products
//! offloaded (`crate::gpu::GpuExperts`).

use tarfa_format::Dtype;
use tarfa_runtime::gpu_engine::{
    Engine, EngineDevice, EngineShape, GpuDtype, HostAttention, HostLayer, HostMlp, HostTensor,
    MAX_HEAD_DIM,
};

use crate::blocks::{self, Batch};
use crate::error::{DecodeError, OptionsFault, Result};
use crate::experts::ExpertStore;
use crate::family::qwen3_moe::Qwen3MoeConfig;
use crate::family::{Ctx, Family};
use crate::offload::OffloadReport;
use crate::rope::Rope;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// VRAM left free beside the model.
#[cfg(feature = "cuda")]
const VRAM_MARGIN: u64 = 1 << 30;

/// A `qwen3_moe` decoder running on a device.
#[derive(Debug)]
pub struct GpuQwen3Moe<D: EngineDevice> {
    cfg: Qwen3MoeConfig,
    rope: Rope,
    engine: Engine<D>,
}

fn host<'a>(m: &MatrixRef<'a>) -> Option<HostTensor<'a>> {
    let (bytes, dtype): (&[u8], _) = match m.data {
        WeightSlice::Bf16(w) => (bytemuck::cast_slice(w), GpuDtype::Bf16),
        WeightSlice::F32(w) => (bytemuck::cast_slice(w), GpuDtype::F32),
        _ => return None,
    };
    Some(HostTensor {
        bytes,
        dtype,
        rows: m.rows,
        cols: m.cols,
    })
}

fn host_vec<'a>(s: &'a TensorStore, name: &str, n: usize) -> Result<Option<HostTensor<'a>>> {
    let v = s.get(name)?.vector(n)?;
    Ok(host(&MatrixRef {
        name: "",
        rows: 1,
        cols: n,
        data: v,
    }))
}

fn host_mat<'a>(
    s: &'a TensorStore,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Option<HostTensor<'a>>> {
    Ok(host(&s.get(name)?.matrix(rows, cols)?))
}

/// The whole-model GPU decoder for `config`, or `None` when this model or these options do not
/// take it (another family, a quantised weight, a share of experts or the trunk kept on the CPU,
/// not enough VRAM). Reads every expert once (checked as it lands) to copy it to VRAM.
#[cfg(feature = "cuda")]
pub fn open(
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    o: &crate::offload::GpuOptions,
) -> Result<Option<GpuQwen3Moe<tarfa_runtime::cuda_engine::CudaDevice>>> {
    if !o.whole_model || o.fraction < 1.0 || !o.trunk || !takes(config, experts) {
        return Ok(None);
    }
    let c = Qwen3MoeConfig::parse(config)?;
    if !takes_shape(&c) {
        return Ok(None);
    }
    let Some(parts) = trunk(&c, tensors)? else {
        return Ok(None);
    };
    let need = parts.bytes + experts.total_bytes() + VRAM_MARGIN;
    if o.vram_bytes.is_some_and(|b| b + VRAM_MARGIN < need) {
        return Ok(None);
    }
    let gpu = tarfa_runtime::Gpu::open(o.ordinal)?;
    let (free, _) = gpu.mem_info()?;
    if (free as u64) < need {
        return Ok(None);
    }
    let dev = tarfa_runtime::cuda_engine::CudaDevice::open(&gpu)?;
    build(dev, config, tensors, experts, o.graphs)
}

/// Whether the engine's kernels take the model's shape: heads at most
/// [`MAX_HEAD_DIM`] wide (attention keeps a head's vectors in a block's shared memory); a wider
/// one runs its layers on the CPU with experts and products offloaded, as any model this path
/// does not take.
fn takes_shape(c: &Qwen3MoeConfig) -> bool {
    c.head_dim <= MAX_HEAD_DIM
}

/// Whether the whole-model path takes this model at all: `qwen3_moe`, experts BF16 or F32.
fn takes(config: &serde_json::Value, experts: &ExpertStore) -> bool {
    config.get("model_type").and_then(|v| v.as_str()) == Some("qwen3_moe")
        && experts
            .region_dtypes()
            .iter()
            .all(|&d| d == Dtype::BF16 || d == Dtype::F32)
}

/// The whole-model decoder of `config` on `dev` (every weight copied there, every expert read
/// once and checked as it lands), or `None` if the model does not take it (another family, a
/// weight neither BF16 nor F32, experts of a layer of mixed types, heads wider than
/// [`MAX_HEAD_DIM`]). `graphs`: replay each step
/// from a captured graph where the device has them.
pub fn build<D: EngineDevice>(
    dev: D,
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    graphs: bool,
) -> Result<Option<GpuQwen3Moe<D>>> {
    if !takes(config, experts) {
        return Ok(None);
    }
    let c = Qwen3MoeConfig::parse(config)?;
    if !takes_shape(&c) {
        return Ok(None);
    }
    let Some(parts) = trunk(&c, tensors)? else {
        return Ok(None);
    };
    let shape = EngineShape {
        vocab: c.vocab_size,
        hidden: c.hidden_size,
        heads: c.heads,
        kv_heads: c.kv_heads,
        head_dim: c.head_dim,
        rotary_dim: c.rope.rotary_dim,
        eps: c.rms_norm_eps,
        window: c.window,
        // blocks::attend's scaling, rounded the same way.
        scaling: (1.0 / (c.head_dim as f64).sqrt()) as f32,
        top_k: c.top_k,
        norm_topk_prob: c.norm_topk_prob,
    };
    let mut engine = Engine::new(
        dev,
        shape,
        parts.embed,
        parts.final_norm,
        parts.lm_head,
        &parts.layers,
        c.num_experts,
    )?;
    engine.set_graphs(graphs);
    // `TARFA_CUDA_NORM_FUSE=0` takes no RMSNorm into a product (each is launched alone or with
    // the combine), for measuring.
    engine.set_norm_fusion(std::env::var("TARFA_CUDA_NORM_FUSE").as_deref() != Ok("0"));
    // One element type per role across a layer's experts, gate and up alike (the kernels read
    // a layer's experts as one shape); else the offload path, which places each expert alone.
    let mut fits = true;
    for l in 0..c.num_layers {
        if !c.is_moe(l) {
            continue;
        }
        let want: Vec<u32> = (0..c.num_experts as u32).collect();
        if experts.experts_of(l as u32) != want {
            return Err(DecodeError::Options(OptionsFault::WholeModelExperts {
                layer: l,
                num_experts: c.num_experts,
            }));
        }
        let mut types = None;
        experts.with_experts(l as u32, &want, |views| {
            for v in views {
                let (g, u, d) = blocks::expert_projections(v, c.hidden_size)?;
                let (Some(g), Some(u), Some(d)) = (host(&g), host(&u), host(&d)) else {
                    fits = false;
                    return Ok(());
                };
                let t = (g.dtype, d.dtype, g.rows);
                if g.dtype != u.dtype || *types.get_or_insert(t) != t {
                    fits = false;
                }
                if fits {
                    engine.put_expert(l, v.expert as usize, g, u, d)?;
                }
            }
            Ok(())
        })?;
        if !fits {
            return Ok(None);
        }
    }
    engine.finish()?;
    Ok(Some(GpuQwen3Moe {
        rope: Rope::new(c.rope.theta, c.rope.rotary_dim),
        cfg: c,
        engine,
    }))
}

/// The trunk and layers' host tensors, and their bytes.
struct Trunk<'a> {
    embed: HostTensor<'a>,
    final_norm: HostTensor<'a>,
    lm_head: Option<HostTensor<'a>>,
    layers: Vec<HostLayer<'a>>,
    /// Bytes of all of them (the VRAM check).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    bytes: u64,
}

/// Every trunk and layer tensor as the engine takes it, or `None` if one is not BF16 or F32.
fn trunk<'a>(c: &Qwen3MoeConfig, s: &'a TensorStore) -> Result<Option<Trunk<'a>>> {
    let (h, d) = (c.hidden_size, c.head_dim);
    let (qd, kvd) = (c.heads * d, c.kv_heads * d);
    let mut all: Vec<Option<HostTensor<'a>>> = Vec::new();
    let mut take = |t: Option<HostTensor<'a>>| {
        all.push(t);
        t
    };
    let embed = take(host_mat(s, "model.embed_tokens.weight", c.vocab_size, h)?);
    let final_norm = take(host_vec(s, "model.norm.weight", h)?);
    // Tied (no `lm_head.weight`; the family checked that at open): the embedding serves.
    let lm_head = match s.find("lm_head.weight") {
        Some(_) => Some(take(host_mat(s, "lm_head.weight", c.vocab_size, h)?)),
        None => None,
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    for l in 0..c.num_layers {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        let bias = |n: &str, rows: usize| -> Result<Option<Option<HostTensor<'a>>>> {
            if !c.attention_bias {
                return Ok(Some(None));
            }
            Ok(host_vec(s, &p(&format!("self_attn.{n}")), rows)?.map(Some))
        };
        let biases = [
            bias("q_proj.bias", qd)?,
            bias("k_proj.bias", kvd)?,
            bias("v_proj.bias", kvd)?,
            bias("o_proj.bias", h)?,
        ];
        if biases.iter().any(|b| b.is_none()) {
            return Ok(None);
        }
        let bias = biases.map(|b| b.flatten());
        for b in bias.iter().flatten() {
            take(Some(*b));
        }
        let mlp = if c.is_moe(l) {
            take(host_mat(s, &p("mlp.gate.weight"), c.num_experts, h)?)
                .map(|router| HostMlp::Moe { router })
        } else {
            let i = c.intermediate_size;
            let g = take(host_mat(s, &p("mlp.gate_proj.weight"), i, h)?);
            let u = take(host_mat(s, &p("mlp.up_proj.weight"), i, h)?);
            let dn = take(host_mat(s, &p("mlp.down_proj.weight"), h, i)?);
            match (g, u, dn) {
                (Some(g), Some(u), Some(dn)) if g.dtype == u.dtype => {
                    Some(HostMlp::Dense([g, u, dn]))
                }
                _ => None,
            }
        };
        let a = |n: &str, rows: usize, cols: usize| {
            host_mat(s, &p(&format!("self_attn.{n}")), rows, cols)
        };
        let parts = (
            take(host_vec(s, &p("input_layernorm.weight"), h)?),
            take(host_vec(s, &p("post_attention_layernorm.weight"), h)?),
            take(a("q_proj.weight", qd, h)?),
            take(a("k_proj.weight", kvd, h)?),
            take(a("v_proj.weight", kvd, h)?),
            take(a("o_proj.weight", h, qd)?),
            take(host_vec(s, &p("self_attn.q_norm.weight"), d)?),
            take(host_vec(s, &p("self_attn.k_norm.weight"), d)?),
        );
        let (
            Some(in_norm),
            Some(post_norm),
            Some(q),
            Some(k),
            Some(v),
            Some(o),
            Some(qn),
            Some(kn),
            Some(mlp),
        ) = (
            parts.0, parts.1, parts.2, parts.3, parts.4, parts.5, parts.6, parts.7, mlp,
        )
        else {
            return Ok(None);
        };
        layers.push(HostLayer {
            in_norm,
            post_norm,
            attn: HostAttention {
                q,
                k,
                v,
                o,
                bias,
                qk_norm: Some((qn, kn)),
            },
            mlp,
        });
    }
    let (Some(embed), Some(final_norm)) = (embed, final_norm) else {
        return Ok(None);
    };
    let lm_head = match lm_head {
        Some(Some(t)) => Some(t),
        Some(None) => return Ok(None),
        None => None,
    };
    if all.iter().any(|t| t.is_none()) {
        return Ok(None);
    }
    let bytes = all.iter().flatten().map(|t| t.bytes.len() as u64).sum();
    Ok(Some(Trunk {
        embed,
        final_norm,
        lm_head,
        layers,
        bytes,
    }))
}

impl<D: EngineDevice> GpuQwen3Moe<D> {
    /// Take each RMSNorm into the product launch that reads it where the kernels can (the
    /// default), or give every norm a launch of its own: the same bits either way.
    pub fn set_norm_fusion(&mut self, on: bool) {
        self.engine.set_norm_fusion(on);
    }

    /// What the device holds and did.
    pub fn report(&self) -> OffloadReport {
        let r = self.engine.report();
        OffloadReport {
            device: r.device,
            whole_model: true,
            trunk_bytes: r.weight_bytes,
            steps: r.steps,
            graph_steps: r.graph_steps,
            ..OffloadReport::default()
        }
    }
}

impl<D: EngineDevice> Family for GpuQwen3Moe<D> {
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn num_layers(&self) -> usize {
        self.cfg.num_layers
    }

    fn top_k(&self) -> usize {
        self.cfg.top_k
    }

    fn reset(&mut self) {
        // Nothing to forget: the KV cache is indexed by position and every step writes its own.
    }

    fn device_report(&self) -> Option<OffloadReport> {
        Some(self.report())
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let t0 = std::time::Instant::now();
        let mut out = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            if t as usize >= self.cfg.vocab_size {
                return Err(DecodeError::TokenOutOfRange {
                    id: t,
                    vocab: self.cfg.vocab_size,
                });
            }
            let pos = start + i;
            self.rope.ensure(pos + 1);
            let (cos, sin) = self.rope.tables();
            let want = all_logits || i + 1 == tokens.len();
            if let Some(l) = self.engine.step(t, pos, cos, sin, want)? {
                out.push(l);
            }
        }
        ctx.profile
            .add("whole forward pass on the GPU", t0.elapsed());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Heads up to the kernels' width take the whole-model path; a wider one is left to the
    /// offload path (the CPU's layers), not refused.
    #[test]
    fn heads_wider_than_the_kernels_take_are_left_to_the_offload_path() {
        let config = |head_dim: usize| {
            serde_json::json!({
                "model_type": "qwen3_moe", "hidden_size": 64, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": head_dim, "num_hidden_layers": 1,
                "vocab_size": 16, "intermediate_size": 32, "moe_intermediate_size": 16,
                "num_experts": 4, "num_experts_per_tok": 2, "rms_norm_eps": 1e-6,
            })
        };
        for (d, takes) in [(64, true), (MAX_HEAD_DIM, true), (MAX_HEAD_DIM * 2, false)] {
            let c = Qwen3MoeConfig::parse(&config(d)).expect("a qwen3_moe config");
            assert_eq!(c.head_dim, d);
            assert_eq!(takes_shape(&c), takes, "head_dim {d}");
        }
    }
}
