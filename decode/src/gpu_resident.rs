//! The whole forward pass on a device: a model whose trunk and every expert fit there runs each
//! token entirely on it ([`tarfa_cuda::Engine`]), the activations never leaving it and only the
//! logits coming back. Every kernel computes the bits of the CPU path (`canon`, `blocks`), so the
//! logits are the CPU's bit for bit; this is only where they are computed.
//!
//! The engine runs the family's [`Plan`] ([`Family::plan`]), the same plan the CPU runs
//! ([`crate::family::plan::PlanDecoder`]): the numbers, the attention's form, each layer's token
//! mixer and MLP (dense, or routed experts with their router — softmax or GLM's sigmoid group
//! router — and shared experts). The mapping of the checkpoint's tensors onto the engine here is
//! the same for every family.
//!
//! [`build`] takes any [`EngineDevice`]: the GPU ([`open`], feature `cuda`, the default of
//! `--device cuda`) or the CPU emulation of the kernels (`cuda-emu`, whose tests hold this whole
//! path to the CPU decoder's logits in CI). [`open`] decides: the family gives a plan the
//! kernels take, every weight BF16 or F32, the whole model fits in VRAM (or in `--vram-gib`),
//! all experts placed on the GPU and the trunk too; else `None` and the decoder runs its layers
//! on the CPU with experts and products offloaded (`crate::gpu::GpuExperts`).

use std::collections::HashMap;

use tarfa_cuda::{
    Engine, EngineDevice, EngineSeq, EngineShape, GpuDtype, HostAttention, HostDeltaNet, HostHyper,
    HostKda, HostLayer, HostMixer, HostMla, HostMlp, HostRoute, HostTensor, HyperDims, KdaDims,
    MlaDims, RopeTables, SwaForm, ValueForm, MAX_DELTA_DK, MAX_DELTA_KERNEL, MAX_HEAD_DIM,
};

use crate::blocks::{self, Batch};
use crate::error::{DecodeError, OptionsFault, Result};
use crate::experts::ExpertStore;
use crate::family::common::NormStyle;
use crate::family::plan::{MixerPlan, MlpPlan, Plan, RoutePlan};
use crate::family::{Ctx, Family};
use crate::offload::OffloadReport;
use crate::quant::QuantType;
use crate::rope::Rope;
use crate::sequence::{State, Truncation};
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// VRAM left free beside the model.
#[cfg(feature = "cuda")]
const VRAM_MARGIN: u64 = 1 << 30;

/// A decoder running a family's whole forward pass on a device.
#[derive(Debug)]
pub struct GpuWhole<D: EngineDevice> {
    family: &'static str,
    vocab: usize,
    hidden: usize,
    layers: usize,
    top_k: usize,
    rope: Rope,
    /// The second attention form's RoPE (MiMo-V2-Flash's sliding layers), when the plan has one.
    swa_rope: Option<Rope>,
    engine: Engine<D>,
}

/// The engine's type for a quantised (or F16) weight, if its kernels take it.
fn gpu_dtype(q: QuantType) -> Option<GpuDtype> {
    Some(match q {
        QuantType::BF16 => GpuDtype::Bf16,
        QuantType::F32 => GpuDtype::F32,
        QuantType::F16 => GpuDtype::F16,
        QuantType::Q8_0 => GpuDtype::Q8_0,
        QuantType::Q4_0 => GpuDtype::Q4_0,
        QuantType::Q4_K => GpuDtype::Q4_K,
        QuantType::Q5_K => GpuDtype::Q5_K,
        QuantType::Q6_K => GpuDtype::Q6_K,
        QuantType::Q4_1 => GpuDtype::Q4_1,
        QuantType::Q5_0 => GpuDtype::Q5_0,
        QuantType::Q5_1 => GpuDtype::Q5_1,
        _ => return None,
    })
}

fn host<'a>(m: &MatrixRef<'a>) -> Option<HostTensor<'a>> {
    let (bytes, dtype): (&[u8], _) = match m.data {
        WeightSlice::Bf16(w) => (bytemuck::cast_slice(w), GpuDtype::Bf16),
        WeightSlice::F32(w) => (bytemuck::cast_slice(w), GpuDtype::F32),
        WeightSlice::Quant(q) => (q.bytes(), gpu_dtype(q.ty())?),
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

/// Why the whole forward pass does not run on the device (the model then runs its layers on the
/// CPU with experts and products offloaded): what `tarfa run` says instead of dropping it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Declined {
    /// The options keep something on the CPU (`--gpu-offload-only`, `--gpu-experts` below 1,
    /// `--cpu-trunk`): what was asked for, nothing to say.
    Asked,
    /// The family has no plan for the engine (its `model_type`).
    Family(String),
    /// The family's plan has a form the kernels do not compute.
    Form(&'static str),
    /// A weight of a type the engine's kernels do not take (they take F32, F16, BF16, Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K).
    Weights,
    /// A layer's experts are not all of one element type per projection.
    MixedExperts,
    /// The model needs more VRAM than `--vram-gib` gives.
    VramLimit {
        /// Bytes the whole model needs (with a margin).
        need: u64,
        /// Bytes `--vram-gib` gives.
        limit: u64,
    },
    /// The model needs more VRAM than the device has free.
    DeviceMemory {
        /// Bytes the whole model needs (with a margin).
        need: u64,
        /// Bytes free on the device.
        free: u64,
    },
}

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        match self {
            Declined::Asked => write!(f, "the options keep part of it on the CPU"),
            Declined::Family(t) => write!(
                f,
                "the GPU's kernels do not run {t:?} models whole yet (qwen3_moe, qwen3_5_moe, glm4_moe and mixtral)"
            ),
            Declined::Form(why) => write!(f, "the GPU's kernels do not take {why}"),
            Declined::Weights => write!(
                f,
                "a weight is of a type the GPU's kernels do not take (they take F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)"
            ),
            Declined::MixedExperts => write!(f, "a layer's experts mix element types"),
            Declined::VramLimit { need, limit } => write!(
                f,
                "it needs {:.2} GiB of VRAM and --vram-gib gives {:.2}",
                gib(*need),
                gib(*limit)
            ),
            Declined::DeviceMemory { need, free } => write!(
                f,
                "it needs {:.2} GiB of VRAM and the device has {:.2} free",
                gib(*need),
                gib(*free)
            ),
        }
    }
}

/// The family's plan, when it has one the engine's kernels take.
fn plan(
    config: &serde_json::Value,
    tensors: &TensorStore,
) -> Result<std::result::Result<Plan, Declined>> {
    let family = crate::family::open(config, tensors)?;
    let Some(p) = family.plan() else {
        let t = config.get("model_type").and_then(|v| v.as_str());
        return Ok(Err(Declined::Family(t.unwrap_or("").to_string())));
    };
    Ok(match refusal(&p) {
        Some(why) => Err(Declined::Form(why)),
        None => Ok(p),
    })
}

/// The whole-model GPU decoder for `config`, or why not (a family without a plan, a quantised
/// weight, a share of experts or the trunk kept on the CPU, not enough VRAM). Reads every
/// expert once (checked as it lands) to copy it to VRAM.
#[cfg(feature = "cuda")]
pub fn open(
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    o: &crate::offload::GpuOptions,
) -> Result<std::result::Result<GpuWhole<tarfa_cuda::CudaDevice>, Declined>> {
    if !o.whole_model || o.fraction < 1.0 || !o.trunk {
        return Ok(Err(Declined::Asked));
    }
    let plan = match prepare(config, tensors, experts)? {
        Ok(p) => p,
        Err(d) => return Ok(Err(d)),
    };
    let widened = Widened::of(&plan, tensors)?;
    let Some(parts) = trunk(&plan, tensors, &widened)? else {
        return Ok(Err(Declined::Weights));
    };
    // The weights, the DeltaNet and KDA layers' state (each head's S and the convolutions'
    // history) and a margin for the activations, KV caches and the CUDA context.
    let count = |kind: MixerPlan| plan.mixers.iter().filter(|&&m| m == kind).count();
    let delta = plan.delta.map_or(0, |d| {
        count(MixerPlan::DeltaNet) * (d.v_heads * d.dv * d.dk + d.kernel * d.conv_dim())
    });
    let kda = plan.kda.map_or(0, |k| {
        count(MixerPlan::Kda) * (k.heads * k.dim * k.dim + k.kernel * 3 * k.width())
    });
    let state = ((delta + kda) * 4) as u64;
    let base = parts.bytes + state + VRAM_MARGIN;
    // Each layer's experts (0 for a dense layer): those of layers 0..n stay on the CPU.
    let layers = plan.mlps.len();
    let bytes: Vec<u64> = (0..layers)
        .map(|l| match plan.mlps[l] {
            MlpPlan::Moe { .. } => experts.layer_bytes(l as u32),
            _ => 0,
        })
        .collect();
    let need = |n: usize| base + bytes[n.min(layers)..].iter().sum::<u64>();
    let gpu = tarfa_cuda::Gpu::open(o.ordinal)?;
    let (free, _) = gpu.mem_info()?;
    let free = free as u64;
    let limit = o.vram_bytes.map_or(free, |b| (b + VRAM_MARGIN).min(free));
    // The fewest leading layers whose experts leave the rest room (as llama.cpp's --n-cpu-moe
    // counts layers: dense ones too).
    let fewest = (0..=layers).find(|&n| need(n) <= limit);
    let on_cpu = match (o.cpu_moe_layers, fewest) {
        (Some(n), _) if n > layers => {
            return Err(DecodeError::Options(OptionsFault::CpuMoeLayers {
                asked: n,
                layers,
            }))
        }
        (Some(n), Some(f)) if n < f => {
            return Err(DecodeError::Options(OptionsFault::CpuMoeTooFew {
                asked: n,
                need: need(n),
                limit,
                fewest: f,
            }))
        }
        (Some(n), Some(_)) => n,
        (None, Some(f)) => f,
        // Not even the trunk fits.
        (_, None) => {
            let need = need(layers);
            return Ok(Err(match o.vram_bytes {
                Some(b) if b + VRAM_MARGIN < need => Declined::VramLimit { need, limit: b },
                _ => Declined::DeviceMemory { need, free },
            }));
        }
    };
    let dev = tarfa_cuda::CudaDevice::open(&gpu)?;
    upload(dev, &plan, parts, experts, o.graphs, on_cpu)
}

/// The family's plan, if the engine takes it and the experts' types.
fn prepare(
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &ExpertStore,
) -> Result<std::result::Result<Plan, Declined>> {
    if !takes_experts(experts) {
        return Ok(Err(Declined::Weights));
    }
    plan(config, tensors)
}

/// Whether the engine's kernels take the plan: heads at most [`MAX_HEAD_DIM`] wide (attention
/// keeps a head's vectors in a block's shared memory), one epsilon for every norm, DeltaNet key
/// heads at most [`MAX_DELTA_DK`] wide and convolutions at most [`MAX_DELTA_KERNEL`] long. A
/// plan they do not take runs its layers on the CPU with experts and products offloaded, as any
/// model this path does not take.
fn refusal(p: &Plan) -> Option<&'static str> {
    let a = &p.attn;
    let mla = p.mixers.contains(&MixerPlan::Mla);
    let attends = p.mixers.contains(&MixerPlan::Attention) || mla;
    if attends && a.shape.head_dim > MAX_HEAD_DIM {
        Some("heads wider than 256")
    } else if attends && a.qk_norm.is_some() && a.eps.to_bits() != p.eps.to_bits() {
        Some("q/k norms of another epsilon than the layers'")
    } else if p.delta.is_some_and(|d| d.dk > MAX_DELTA_DK) {
        Some("DeltaNet key heads wider than 256")
    } else if p.delta.is_some_and(|d| d.kernel > MAX_DELTA_KERNEL) {
        Some("DeltaNet convolutions longer than 32")
    } else if p.mixers.contains(&MixerPlan::DeltaNet) && p.delta.is_none() {
        Some("DeltaNet layers without their widths")
    } else if p
        .mixers
        .iter()
        .any(|m| matches!(m, MixerPlan::MlaSparse { .. }))
    {
        Some("GLM-5.3-Flash's DSA layers (MLA attending where its indexer selects)")
    } else if p
        .kda
        .is_some_and(|k| k.dim > MAX_DELTA_DK || k.kernel > MAX_DELTA_KERNEL)
    {
        Some("KDA heads wider than 256 or convolutions longer than 32")
    } else if p.mixers.contains(&MixerPlan::Kda) && p.kda.is_none() {
        Some("KDA layers without their widths")
    } else if p.hyper.is_some_and(|hc| {
        hc.streams == 0
            || hc.iters == 0
            || hc.streams > tarfa_cuda::MAX_HC_STREAMS
            || hc.norm_eps.to_bits() != p.eps.to_bits()
            || p.mixers.iter().any(|m| *m != MixerPlan::Kda)
    }) {
        Some("hyper-connections of no or more than 8 streams, without a Sinkhorn iteration, of another norm epsilon, or beside mixers other than KDA")
    } else if mla && (p.mla.is_none() || p.mixers.iter().any(|m| !matches!(m, MixerPlan::Mla))) {
        Some("multi-head latent attention (MLA) beside layers of other mixers")
    } else if let Some(why) = second_form_refusal(p) {
        Some(why)
    } else if (mla || p.delta.is_some() || p.attn.out_gate) && p.attn.extra.is_some() {
        Some("attention sinks or narrower values beside MLA, DeltaNet or gated attention")
    } else if p
        .attn
        .extra
        .is_some_and(|e| e.v_dim == 0 || e.v_dim > a.shape.head_dim)
    {
        Some("values wider than keys")
    } else {
        None
    }
}

/// Why the engine does not take the plan's second attention form (MiMo-V2-Flash's sliding
/// layers: `Plan::swa`), if so: it takes one of the same query heads, head width, biases and
/// values as the first, no q/k norm in either (their widened weights and epsilon are the first
/// form's only), its own key/value heads, window, RoPE (an even number of rotated dims) and
/// sinks (`tarfa_cuda::SwaForm`), in a plan of plain attention layers.
fn second_form_refusal(p: &Plan) -> Option<&'static str> {
    let sliding = p.mixers.contains(&MixerPlan::SlidingAttention);
    let Some((w, rope)) = p.swa.as_ref().filter(|_| sliding) else {
        return sliding.then_some("sliding layers without their attention form");
    };
    let a = &p.attn;
    let same_values = match (a.extra, w.extra) {
        (None, None) => true,
        (Some(x), Some(y)) => x.v_dim == y.v_dim && x.v_scale.to_bits() == y.v_scale.to_bits(),
        _ => false,
    };
    if w.shape.heads != a.shape.heads
        || w.shape.head_dim != a.shape.head_dim
        || w.shape.kv_heads == 0
        || w.shape.heads % w.shape.kv_heads != 0
        || w.qk_norm.is_some()
        || a.qk_norm.is_some()
        || w.qkv_bias != a.qkv_bias
        || w.o_bias != a.o_bias
        || w.out_gate
        || a.out_gate
        || !same_values
        || rope.rotary_dim > a.shape.head_dim
        || rope.rotary_dim % 2 != 0
        || p.mixers
            .iter()
            .any(|m| !matches!(m, MixerPlan::Attention | MixerPlan::SlidingAttention))
    {
        Some("a second attention form other than the first's heads with their own key/value heads, window, RoPE and sinks")
    } else {
        None
    }
}

/// Norm weights the engine takes as `f32` vectors made here, by tensor name: a zero-centred
/// norm's `1 + w` (NormStyle::OnePlus), as `common::norm` computes it (`1.0 + w` in `f32`). The
/// kernels then apply it as any norm's weight, `w' · (x · r)`: the CPU's `(1 + w) · (x · r)`,
/// bit for bit.
#[derive(Debug, Default)]
struct Widened(
    HashMap<String, Vec<u8>>,
    HashMap<String, (Vec<u8>, GpuDtype)>,
);

impl Widened {
    /// Every zero-centred norm of the plan: the layers', the final one, the q/k norms.
    fn of(p: &Plan, s: &TensorStore) -> Result<Widened> {
        let mut out = HashMap::new();
        let mut stacked = HashMap::new();
        let mut add = |name: String, n: usize| -> Result<()> {
            let w = s.get(&name)?.vector(n)?;
            let bytes = (0..n)
                .flat_map(|i| (1.0 + w.get(i)).to_le_bytes())
                .collect();
            out.insert(name, bytes);
            Ok(())
        };
        let pre = &p.prefix;
        if p.norm == NormStyle::OnePlus {
            add(format!("{pre}norm.weight"), p.hidden)?;
            for l in 0..p.mlps.len() {
                add(format!("{pre}layers.{l}.input_layernorm.weight"), p.hidden)?;
                add(
                    format!("{pre}layers.{l}.post_attention_layernorm.weight"),
                    p.hidden,
                )?;
            }
        }
        // A KDA layer's q, k and v convolutions, stacked into one matrix (the kernel reads
        // channel c's row c of it), when all three are of one type the engine takes.
        if let Some(k) = p.kda {
            for (l, m) in p.mixers.iter().enumerate() {
                if *m != MixerPlan::Kda {
                    continue;
                }
                let a = format!("{pre}layers.{l}.self_attn");
                let parts: Vec<Option<HostTensor<'_>>> = ["q", "k", "v"]
                    .iter()
                    .map(|x| {
                        let name = format!("{a}.{x}_conv1d.weight");
                        let m =
                            crate::family::deltanet::conv_weight(s, &name, k.width(), k.kernel)?;
                        Ok(host(&m))
                    })
                    .collect::<Result<_>>()?;
                if let [Some(q), Some(kk), Some(v)] = parts[..] {
                    if q.dtype == kk.dtype && q.dtype == v.dtype {
                        let bytes = [q.bytes, kk.bytes, v.bytes].concat();
                        stacked.insert(a, (bytes, q.dtype));
                    }
                }
            }
        }
        if p.attn.qk_norm == Some(NormStyle::OnePlus) {
            let d = p.attn.shape.head_dim;
            for (l, m) in p.mixers.iter().enumerate() {
                if *m == MixerPlan::Attention {
                    add(format!("{pre}layers.{l}.self_attn.q_norm.weight"), d)?;
                    add(format!("{pre}layers.{l}.self_attn.k_norm.weight"), d)?;
                }
            }
        }
        Ok(Widened(out, stacked))
    }

    /// Layer `prefix`'s KDA convolutions stacked (`[3·width, kernel]`), if they were.
    fn kda_conv(&self, prefix: &str, rows: usize, kernel: usize) -> Option<HostTensor<'_>> {
        self.1.get(prefix).map(|(bytes, dtype)| HostTensor {
            bytes,
            dtype: *dtype,
            rows,
            cols: kernel,
        })
    }

    /// The norm `name` (`n` elements) as the engine takes it: widened here, or as stored.
    fn norm<'a>(
        &'a self,
        s: &'a TensorStore,
        name: &str,
        n: usize,
    ) -> Result<Option<HostTensor<'a>>> {
        match self.0.get(name) {
            Some(bytes) => Ok(Some(HostTensor {
                bytes,
                dtype: GpuDtype::F32,
                rows: 1,
                cols: n,
            })),
            None => host_vec(s, name, n),
        }
    }
}

/// Whether the whole-model path takes these experts: BF16 or F32.
fn takes_experts(experts: &ExpertStore) -> bool {
    experts
        .region_dtypes()
        .iter()
        .all(|&d| QuantType::from_dtype(d).and_then(gpu_dtype).is_some())
}

/// The whole-model decoder of `config` on `dev` (every weight copied there, every expert read
/// once and checked as it lands), or `None` if the model does not take it
/// ([`build_or_decline`] says why). `graphs`: replay each step from a captured graph where the
/// device has them.
pub fn build<D: EngineDevice>(
    dev: D,
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    graphs: bool,
) -> Result<Option<GpuWhole<D>>> {
    Ok(build_or_decline(dev, config, tensors, experts, graphs)?.ok())
}

/// [`build`], or why the model does not take it (a family without a plan the kernels take, a
/// weight of a type the kernels do not take, experts of a layer of mixed types, heads wider than
/// [`MAX_HEAD_DIM`]).
pub fn build_or_decline<D: EngineDevice>(
    dev: D,
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    graphs: bool,
) -> Result<std::result::Result<GpuWhole<D>, Declined>> {
    build_placed(dev, config, tensors, experts, graphs, 0)
}

/// [`build_or_decline`] with the routed experts of layers `0..cpu_moe_layers` computed on the
/// CPU (none of them copied to the device; as llama.cpp's `--n-cpu-moe` counts layers).
pub fn build_placed<D: EngineDevice>(
    dev: D,
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    graphs: bool,
    cpu_moe_layers: usize,
) -> Result<std::result::Result<GpuWhole<D>, Declined>> {
    let plan = match prepare(config, tensors, experts)? {
        Ok(p) => p,
        Err(d) => return Ok(Err(d)),
    };
    let widened = Widened::of(&plan, tensors)?;
    match trunk(&plan, tensors, &widened)? {
        Some(parts) => upload(dev, &plan, parts, experts, graphs, cpu_moe_layers),
        None => Ok(Err(Declined::Weights)),
    }
}

/// The engine on `dev` with the plan's trunk and every expert (read once, checked as it lands)
/// but those of layers `0..on_cpu`, which the CPU computes; or why a layer's experts do not take
/// it.
fn upload<D: EngineDevice>(
    dev: D,
    plan: &Plan,
    parts: Trunk<'_>,
    experts: &mut ExpertStore,
    graphs: bool,
    on_cpu: usize,
) -> Result<std::result::Result<GpuWhole<D>, Declined>> {
    let a = &plan.attn.shape;
    let mla = plan.mla.filter(|_| plan.mixers.contains(&MixerPlan::Mla));
    let shape = EngineShape {
        vocab: plan.vocab,
        hidden: plan.hidden,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        rotary_dim: plan.rope.rotary_dim,
        eps: plan.eps,
        window: a.window,
        // blocks::attend's scaling, rounded the same way; MLA's own (`attend_scaled`).
        scaling: match mla {
            Some(m) => m.scale,
            None => (1.0 / (a.head_dim as f64).sqrt()) as f32,
        },
        top_k: plan.top_k,
        norm_topk_prob: plan.norm_topk_prob,
        attn_gate: plan.attn.out_gate,
        delta: plan.delta,
        swa: match (
            &plan.swa,
            plan.mixers.contains(&MixerPlan::SlidingAttention),
        ) {
            (Some((spec, rope)), true) => Some(SwaForm {
                kv_heads: spec.shape.kv_heads,
                window: spec.shape.window,
                rotary_dim: rope.rotary_dim,
            }),
            _ => None,
        },
        values: plan.attn.extra.map(|e| ValueForm {
            dim: e.v_dim,
            scale: e.v_scale,
        }),
        swiglu_limit: plan.swiglu_limit,
        kda: plan.kda.map(|k| KdaDims {
            heads: k.heads,
            dim: k.dim,
            kernel: k.kernel,
            lower_bound: k.lower_bound,
            eps: k.eps,
        }),
        hyper: plan.hyper.map(|hc| HyperDims {
            streams: hc.streams,
            eps: hc.eps,
            iters: hc.iters,
        }),
        mla: mla.map(|m| MlaDims {
            q_lora_rank: m.q_lora_rank,
            kv_lora_rank: m.kv_lora_rank,
            nope: m.nope,
            rope: m.rope,
            v: m.v,
            interleave: m.interleave,
            latent_eps: m.latent_eps,
        }),
    };
    if on_cpu > 0 && (plan.hyper.is_some() || plan.swiglu_limit.is_some()) {
        return Ok(Err(Declined::Form(
            "routed experts of some layers on the CPU (--n-cpu-moe, or a model larger than the VRAM) beside hyper-connections or a clamped SwiGLU",
        )));
    }
    let mut engine = Engine::new(
        dev,
        shape,
        parts.embed,
        parts.final_norm,
        parts.lm_head,
        &parts.layers,
        plan.num_experts,
    )?;
    engine.set_graphs(graphs);
    // `TARFA_CUDA_NORM_FUSE=0` takes no RMSNorm into a product (each is launched alone or with
    // the combine), for measuring.
    engine.set_norm_fusion(std::env::var("TARFA_CUDA_NORM_FUSE").as_deref() != Ok("0"));
    // `TARFA_CUDA_PROMPT=0` steps a prompt's tokens one by one (as before prompts ran as
    // matrices), for measuring.
    engine.set_prompt_matrices(std::env::var("TARFA_CUDA_PROMPT").as_deref() != Ok("0"));
    // `TARFA_CUDA_ATTN_QUADS=0` runs a pass's attention a block per query head (as before four
    // shared a block), for measuring.
    engine.set_attention_quads(std::env::var("TARFA_CUDA_ATTN_QUADS").as_deref() != Ok("0"));
    // One element type per role (gate, up, down) across a layer's experts (the kernels read a
    // layer's experts as one shape); else the offload path, which places each expert alone.
    let mut fits = true;
    if on_cpu > plan.mlps.len() {
        return Err(DecodeError::Options(OptionsFault::CpuMoeLayers {
            asked: on_cpu,
            layers: plan.mlps.len(),
        }));
    }
    for (l, mlp) in plan.mlps.iter().enumerate() {
        if !matches!(mlp, MlpPlan::Moe { .. }) {
            continue;
        }
        let want: Vec<u32> = (0..plan.num_experts as u32).collect();
        if experts.experts_of(l as u32) != want {
            return Err(DecodeError::Options(OptionsFault::WholeModelExperts {
                layer: l,
                num_experts: plan.num_experts,
            }));
        }
        if l < on_cpu {
            // Read when a token selects them, from RAM or disk as the options hold them.
            engine.host_experts(l)?;
            continue;
        }
        let mut types = None;
        experts.with_experts(l as u32, &want, |views| {
            for v in views {
                let (g, u, d) = blocks::expert_projections(v, plan.hidden)?;
                let (Some(g), Some(u), Some(d)) = (host(&g), host(&u), host(&d)) else {
                    fits = false;
                    return Ok(());
                };
                let t = (g.dtype, u.dtype, d.dtype, g.rows);
                if *types.get_or_insert(t) != t {
                    fits = false;
                }
                if fits {
                    engine.put_expert(l, v.expert as usize, g, u, d)?;
                }
            }
            Ok(())
        })?;
        if !fits {
            return Ok(Err(Declined::MixedExperts));
        }
    }
    engine.finish()?;
    Ok(Ok(GpuWhole {
        family: plan.family,
        // The engine's state buffers are allocated zeroed.
        vocab: plan.vocab,
        hidden: plan.hidden,
        layers: plan.mlps.len(),
        top_k: plan.top_k,
        rope: Rope::of(&plan.rope),
        swa_rope: plan.swa.as_ref().map(|(_, r)| Rope::of(r)),
        engine,
    }))
}

/// Layer `layer`'s routed experts of one token on the CPU (the engine's host layers): each
/// slot's unweighted output into `y` (`ids.len() × hidden`), computed as the CPU's layers
/// compute it — the same bits as the kernels'.
fn cpu_experts(
    store: &mut ExpertStore,
    isa: crate::kernels::Isa,
    hidden: usize,
    layer: usize,
    xn: &[f32],
    ids: &[u32],
    y: &mut [f32],
) -> Result<()> {
    let mut wanted = ids.to_vec();
    wanted.sort_unstable();
    wanted.dedup();
    let x = vec![xn.to_vec()];
    store.with_experts(layer as u32, &wanted, |views| {
        let items: Vec<_> = views.iter().map(|v| (v.clone(), x.as_slice())).collect();
        let outs = blocks::experts_swiglu(isa, &items, hidden, None)?;
        for (v, out) in views.iter().zip(outs) {
            for (slot, _) in ids.iter().enumerate().filter(|(_, &e)| e == v.expert) {
                y[slot * hidden..(slot + 1) * hidden].copy_from_slice(&out[0]);
            }
        }
        Ok(())
    })
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

/// Every trunk and layer tensor of `p` as the engine takes it (zero-centred norms from
/// `widened`), or `None` if one is of a type the kernels do not take (a dense MLP's gate and up
/// may differ in type, as an expert's may).
fn trunk<'a>(p: &Plan, s: &'a TensorStore, widened: &'a Widened) -> Result<Option<Trunk<'a>>> {
    let (h, d) = (p.hidden, p.attn.shape.head_dim);
    let qd = p.attn.shape.heads * d;
    let q_rows = if p.attn.out_gate { 2 * qd } else { qd };
    let pre = &p.prefix;
    let mut all: Vec<Option<HostTensor<'a>>> = Vec::new();
    let mut take = |t: Option<HostTensor<'a>>| {
        all.push(t);
        t
    };
    let embed = take(host_mat(
        s,
        &format!("{pre}embed_tokens.weight"),
        p.vocab,
        h,
    )?);
    let final_norm = take(widened.norm(s, &format!("{pre}norm.weight"), h)?);
    // Tied (no `lm_head.weight`; the family checked that at open): the embedding serves.
    let lm_head = match s.find("lm_head.weight") {
        Some(_) => Some(take(host_mat(s, "lm_head.weight", p.vocab, h)?)),
        None => None,
    };
    // A dense SwiGLU `{prefix}.{gate,up,down}_proj.weight` of width `inter`.
    let swiglu = |prefix: &str, inter: usize| -> Result<Option<[HostTensor<'a>; 3]>> {
        let g = host_mat(s, &format!("{prefix}.gate_proj.weight"), inter, h)?;
        let u = host_mat(s, &format!("{prefix}.up_proj.weight"), inter, h)?;
        let dn = host_mat(s, &format!("{prefix}.down_proj.weight"), h, inter)?;
        Ok(match (g, u, dn) {
            (Some(g), Some(u), Some(dn)) => Some([g, u, dn]),
            _ => None,
        })
    };
    let mut layers = Vec::with_capacity(p.mlps.len());
    for (l, (mlp, mixer)) in p.mlps.iter().zip(&p.mixers).enumerate() {
        let n = |name: &str| format!("{pre}layers.{l}.{name}");
        let mixer = match mixer {
            MixerPlan::Attention | MixerPlan::SlidingAttention => {
                let a = |name: &str| n(&format!("self_attn.{name}"));
                let sliding = *mixer == MixerPlan::SlidingAttention;
                let at = match (sliding, &p.swa) {
                    (false, _) => &p.attn,
                    (true, Some((spec, _))) => spec,
                    (true, None) => return Ok(None),
                };
                let (kvd, vd) = (at.shape.kv_heads * d, at.shape.kv_heads * at.v_dim());
                let od = at.shape.heads * at.v_dim();
                let bias =
                    |on: bool, name: &str, rows: usize| -> Result<Option<Option<HostTensor<'a>>>> {
                        if !on {
                            return Ok(Some(None));
                        }
                        Ok(host_vec(s, &a(name), rows)?.map(Some))
                    };
                let biases = [
                    bias(at.qkv_bias, "q_proj.bias", q_rows)?,
                    bias(at.qkv_bias, "k_proj.bias", kvd)?,
                    bias(at.qkv_bias, "v_proj.bias", vd)?,
                    bias(at.o_bias, "o_proj.bias", h)?,
                ];
                if biases.iter().any(|b| b.is_none()) {
                    return Ok(None);
                }
                let bias = biases.map(|b| b.flatten());
                for b in bias.iter().flatten() {
                    take(Some(*b));
                }
                let qk_norm = match at.qk_norm {
                    Some(_) => {
                        let qn = take(widened.norm(s, &a("q_norm.weight"), d)?);
                        let kn = take(widened.norm(s, &a("k_norm.weight"), d)?);
                        qn.zip(kn).map(Some)
                    }
                    None => Some(None),
                };
                let parts = (
                    take(host_mat(s, &a("q_proj.weight"), q_rows, h)?),
                    take(host_mat(s, &a("k_proj.weight"), kvd, h)?),
                    take(host_mat(s, &a("v_proj.weight"), vd, h)?),
                    take(host_mat(s, &a("o_proj.weight"), h, od)?),
                );
                // Each head's sink logit (MiMo-V2-Flash), as the CPU reads it.
                let sinks = match at.extra {
                    Some(e) if e.sinks => {
                        take(host_vec(s, &a("attention_sink_bias"), at.shape.heads)?).map(Some)
                    }
                    _ => Some(None),
                };
                let (Some(q), Some(k), Some(v), Some(o), Some(qk_norm), Some(sinks)) =
                    (parts.0, parts.1, parts.2, parts.3, qk_norm, sinks)
                else {
                    return Ok(None);
                };
                HostMixer::Attention(HostAttention {
                    q,
                    k,
                    v,
                    o,
                    bias,
                    qk_norm,
                    sliding,
                    sinks,
                })
            }
            MixerPlan::DeltaNet => {
                let Some(ds) = p.delta else {
                    return Ok(None);
                };
                let a = |name: &str| n(&format!("linear_attn.{name}"));
                let (cd, vd, vh) = (ds.conv_dim(), ds.value_dim(), ds.v_heads);
                let conv =
                    crate::family::deltanet::conv_weight(s, &a("conv1d.weight"), cd, ds.kernel)?;
                // The rates' tensor as the CPU takes it: `A_log`, else a GGUF's `−exp(A_log)`.
                let (rates, a_neg) = crate::family::deltanet::Rates::source(s, &n("linear_attn"));
                let parts = [
                    take(host_mat(s, &a("in_proj_qkv.weight"), cd, h)?),
                    take(host_mat(s, &a("in_proj_z.weight"), vd, h)?),
                    take(host_mat(s, &a("in_proj_b.weight"), vh, h)?),
                    take(host_mat(s, &a("in_proj_a.weight"), vh, h)?),
                    take(host(&conv)),
                    take(host_vec(s, &a("dt_bias"), vh)?),
                    take(host_vec(s, &rates, vh)?),
                    take(host_vec(s, &a("norm.weight"), ds.dv)?),
                    take(host_mat(s, &a("out_proj.weight"), h, vd)?),
                ];
                let [Some(qkv), Some(z), Some(b), Some(a), Some(conv), Some(dt_bias), Some(a_log), Some(norm), Some(out)] =
                    parts
                else {
                    return Ok(None);
                };
                HostMixer::DeltaNet(HostDeltaNet {
                    qkv,
                    z,
                    b,
                    a,
                    conv,
                    dt_bias,
                    a_log,
                    a_neg,
                    norm,
                    out,
                })
            }
            MixerPlan::Mla => {
                let Some(m) = p.mla else {
                    return Ok(None);
                };
                let a = |name: &str| n(&format!("self_attn.{name}"));
                let bias = |name: &str, rows: usize| -> Result<Option<Option<HostTensor<'a>>>> {
                    match m.bias {
                        true => Ok(host_vec(s, &a(name), rows)?.map(Some)),
                        false => Ok(Some(None)),
                    }
                };
                let (qk, rank) = (m.qk(), m.kv_lora_rank);
                let q_rows = m.heads * qk;
                let (q_a, q) = match m.q_lora_rank {
                    Some(r) => {
                        let qa = take(host_mat(s, &a("q_a_proj.weight"), r, h)?);
                        let qb = bias("q_a_proj.bias", r)?;
                        let qn = take(host_vec(s, &a("q_a_layernorm.weight"), r)?);
                        let q = take(host_mat(s, &a("q_b_proj.weight"), q_rows, r)?);
                        match (qa, qb, qn) {
                            (Some(qa), Some(qb), Some(qn)) => {
                                if let Some(b) = qb {
                                    take(Some(b));
                                }
                                (Some(Some((qa, qb, qn))), q)
                            }
                            _ => (None, q),
                        }
                    }
                    None => (
                        Some(None),
                        take(host_mat(s, &a("q_proj.weight"), q_rows, h)?),
                    ),
                };
                let kv_a_bias = bias("kv_a_proj_with_mqa.bias", rank + m.rope)?;
                let o_bias = bias("o_proj.bias", h)?;
                let parts = (
                    take(host_mat(
                        s,
                        &a("kv_a_proj_with_mqa.weight"),
                        rank + m.rope,
                        h,
                    )?),
                    take(host_vec(s, &a("kv_a_layernorm.weight"), rank)?),
                    take(host_mat(
                        s,
                        &a("kv_b_proj.weight"),
                        m.heads * (m.nope + m.v),
                        rank,
                    )?),
                    take(host_mat(s, &a("o_proj.weight"), h, m.heads * m.v)?),
                );
                let (
                    Some(q_a),
                    Some(q),
                    (Some(kv_a), Some(kv_norm), Some(kv_b), Some(o)),
                    Some(kv_a_bias),
                    Some(o_bias),
                ) = (q_a, q, parts, kv_a_bias, o_bias)
                else {
                    return Ok(None);
                };
                for b in [kv_a_bias, o_bias].into_iter().flatten() {
                    take(Some(b));
                }
                HostMixer::Mla(HostMla {
                    q_a,
                    q,
                    kv_a,
                    kv_a_bias,
                    kv_norm,
                    kv_b,
                    o,
                    o_bias,
                })
            }
            MixerPlan::Kda => {
                let Some(k) = p.kda else {
                    return Ok(None);
                };
                let a = |name: &str| n(&format!("self_attn.{name}"));
                let (w, dim) = (k.width(), k.dim);
                let (rates, a_neg) = crate::family::deltanet::Rates::source(s, &n("self_attn"));
                let parts = [
                    take(host_mat(s, &a("q_proj.weight"), w, h)?),
                    take(host_mat(s, &a("k_proj.weight"), w, h)?),
                    take(host_mat(s, &a("v_proj.weight"), w, h)?),
                    take(host_mat(s, &a("f_a_proj.weight"), dim, h)?),
                    take(host_mat(s, &a("f_b_proj.weight"), w, dim)?),
                    take(host_mat(s, &a("g_a_proj.weight"), dim, h)?),
                    take(host_mat(s, &a("g_b_proj.weight"), w, dim)?),
                    take(host_mat(s, &a("b_proj.weight"), k.heads, h)?),
                    take(widened.kda_conv(&n("self_attn"), 3 * w, k.kernel)),
                    take(host_vec(s, &a("dt_bias"), w)?),
                    take(host_vec(s, &rates, k.heads)?),
                    take(host_vec(s, &a("o_norm.weight"), dim)?),
                    take(host_mat(s, &a("o_proj.weight"), h, w)?),
                ];
                let [Some(q), Some(kk), Some(v), Some(fa), Some(fb), Some(ga), Some(gb), Some(b), Some(conv), Some(dt_bias), Some(a_log), Some(norm), Some(o)] =
                    parts
                else {
                    return Ok(None);
                };
                HostMixer::Kda(HostKda {
                    qkv: [q, kk, v],
                    f: [fa, fb],
                    g: [ga, gb],
                    b,
                    conv,
                    dt_bias,
                    a_log,
                    a_neg,
                    norm,
                    o,
                })
            }
            // `refusal` declines these before any weight is mapped.
            MixerPlan::MlaSparse { .. } => return Ok(None),
        };
        let mlp = match *mlp {
            MlpPlan::Dense { inter } => swiglu(&n("mlp"), inter)?.map(HostMlp::Dense),
            MlpPlan::Moe {
                router,
                route,
                shared,
            } => {
                let router = take(host_mat(s, &n(router), p.num_experts, h)?);
                let route = match route {
                    RoutePlan::Softmax => Some(HostRoute::Softmax),
                    RoutePlan::SigmoidGroup {
                        bias,
                        n_group,
                        topk_group,
                        scale,
                    } => take(host_vec(s, &n(bias), p.num_experts)?).map(|bias| {
                        HostRoute::SigmoidGroup {
                            bias,
                            n_group,
                            topk_group,
                            scale,
                        }
                    }),
                };
                let shared_t = match shared {
                    0 => Some(None),
                    w => swiglu(&n(p.shared.prefix), w)?.map(Some),
                };
                let shared_gate = match (shared, p.shared.gate) {
                    (0, _) | (_, None) => Some(None),
                    (_, Some(g)) => take(host_mat(s, &n(g), 1, h)?).map(Some),
                };
                match (router, route, shared_t, shared_gate) {
                    (Some(router), Some(route), Some(shared), Some(shared_gate)) => {
                        Some(HostMlp::Moe {
                            router,
                            route,
                            shared,
                            shared_gate,
                        })
                    }
                    _ => None,
                }
            }
        };
        if let Some(
            HostMlp::Dense(t)
            | HostMlp::Moe {
                shared: Some(t), ..
            },
        ) = mlp
        {
            for x in t {
                take(Some(x));
            }
        }
        let in_norm = take(widened.norm(s, &n("input_layernorm.weight"), h)?);
        let post_norm = take(widened.norm(s, &n("post_attention_layernorm.weight"), h)?);
        let (Some(in_norm), Some(post_norm), Some(mlp)) = (in_norm, post_norm, mlp) else {
            return Ok(None);
        };
        // The hyper-connection sites (`hc_attn_*`, `hc_ffn_*`), as `mhc` reads them.
        let hyper = match &p.hyper {
            None => None,
            Some(hc) => {
                let mut site = |stem: &str| -> Result<Option<HostHyper<'a>>> {
                    let parts = (
                        take(host_mat(
                            s,
                            &n(&format!("{stem}_fn")),
                            hc.mix(),
                            hc.streams * h,
                        )?),
                        take(host_vec(s, &n(&format!("{stem}_base")), hc.mix())?),
                        take(host_vec(s, &n(&format!("{stem}_scale")), 3)?),
                    );
                    Ok(match parts {
                        (Some(mix), Some(base), Some(scale)) => {
                            Some(HostHyper { mix, base, scale })
                        }
                        _ => None,
                    })
                };
                match (site("hc_attn")?, site("hc_ffn")?) {
                    (Some(a), Some(f)) => Some([a, f]),
                    _ => return Ok(None),
                }
            }
        };
        layers.push(HostLayer {
            in_norm,
            post_norm,
            mixer,
            mlp,
            hyper,
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

impl<D: EngineDevice> GpuWhole<D> {
    /// Take each RMSNorm into the product launch that reads it where the kernels can (the
    /// default), or give every norm a launch of its own: the same bits either way.
    pub fn set_norm_fusion(&mut self, on: bool) {
        self.engine.set_norm_fusion(on);
    }

    /// Give every new sequence room for `n` positions to begin with ([`Engine::set_first_capacity`]:
    /// for tests that make the caches grow within a few steps).
    pub fn set_first_capacity(&mut self, n: usize) {
        self.engine.set_first_capacity(n);
    }

    /// What the engine holds and did, in its own terms (e.g. the layers whose shared experts
    /// it folded into the routed launches).
    pub fn engine_report(&self) -> tarfa_cuda::EngineReport {
        self.engine.report()
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
            prompt_passes: r.prompt_passes,
            prompt_pass_tokens: r.prompt_pass_tokens,
            // Layers 0..N (as llama.cpp counts them): the last whose experts the CPU computes, + 1.
            cpu_moe_layers: self
                .engine
                .host_layers()
                .last()
                .map_or(0, |&l| l as u64 + 1),
            host_round_trips: r.host_round_trips,
            ..OffloadReport::default()
        }
    }
}

impl<D: EngineDevice> Family for GpuWhole<D>
where
    D::Buf: 'static,
{
    fn name(&self) -> &'static str {
        self.family
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn num_layers(&self) -> usize {
        self.layers
    }

    fn top_k(&self) -> usize {
        self.top_k
    }

    fn recurrent(&self) -> bool {
        self.engine.recurrent()
    }

    fn new_state(&mut self) -> Result<State> {
        Ok(State::Device(Box::new(self.engine.sequence()?)))
    }

    fn fork_state(&mut self, state: &State, len: usize) -> Result<State> {
        let seq = state.device_ref::<EngineSeq<D::Buf>>()?;
        Ok(State::Device(Box::new(self.engine.fork(seq, len)?)))
    }

    fn truncate_state(&mut self, state: &mut State, t: Truncation) -> Result<()> {
        let seq = state.device::<EngineSeq<D::Buf>>()?;
        match t {
            // The KV caches are indexed by position and a step writes its own row and reads
            // rows up to it: nothing to do.
            Truncation::None | Truncation::Keep(_) => Ok(()),
            Truncation::Zero => Ok(self.engine.reset_state(seq)?),
        }
    }

    fn device_report(&self) -> Option<OffloadReport> {
        Some(self.report())
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        state: &mut State,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let t0 = std::time::Instant::now();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(DecodeError::TokenOutOfRange {
                id,
                vocab: self.vocab,
            });
        }
        let seq = state.device::<EngineSeq<D::Buf>>()?;
        // The CPU's share (experts of the layers placed there): its error kept to be returned
        // as it is, the engine told only that the host failed.
        let (isa, hidden) = (ctx.isa, self.hidden);
        let store = &mut *ctx.experts;
        let mut failed = None;
        let mut host = |layer: usize, xn: &[f32], ids: &[u32], y: &mut [f32]| {
            cpu_experts(store, isa, hidden, layer, xn, ids, y).map_err(|e| {
                failed = Some(e);
                tarfa_cuda::CudaError::Usage("the CPU's experts failed".into())
            })
        };
        let mut out = Vec::new();
        let mut run = || -> Result<()> {
            // Several tokens (a prompt): as matrices where the engine takes the model
            // (`Engine::prompt`: the bits of stepping them one by one).
            self.rope.ensure(start + tokens.len());
            if let Some(r) = self.swa_rope.as_mut() {
                r.ensure(start + tokens.len());
            }
            let (cos, sin) = self.rope.tables();
            let rope = RopeTables {
                cos,
                sin,
                swa: self.swa_rope.as_ref().map(Rope::tables),
            };
            out = self
                .engine
                .prompt(seq, tokens, start, rope, all_logits, &mut host)?;
            Ok(())
        };
        let ran = run();
        if let Some(e) = failed {
            return Err(e);
        }
        ran?;
        ctx.profile
            .add("whole forward pass on the GPU", t0.elapsed());
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::AttnShape;
    use crate::config::RopeConfig;
    use crate::family::common::AttnSpec;
    use crate::family::plan::SharedPlan;
    use tarfa_cuda::DeltaShape;

    fn plan(head_dim: usize) -> Plan {
        Plan {
            family: "qwen3_moe",
            prefix: "model.".into(),
            tied: false,
            mixers: vec![MixerPlan::Attention],
            delta: None,
            mla: None,
            kda: None,
            dsa: None,
            hyper: None,
            swiglu_limit: None,
            shared: SharedPlan::EXPERTS,
            vocab: 16,
            hidden: 64,
            norm: NormStyle::Weight,
            eps: 1e-6,
            attn: AttnSpec {
                shape: AttnShape {
                    heads: 2,
                    kv_heads: 1,
                    head_dim,
                    window: None,
                },
                eps: 1e-6,
                qk_norm: Some(NormStyle::Weight),
                qkv_bias: false,
                o_bias: false,
                out_gate: false,
                extra: None,
            },
            rope: RopeConfig {
                yarn: None,
                theta: 1e6,
                rotary_dim: head_dim,
            },
            swa: None,
            num_experts: 4,
            top_k: 2,
            norm_topk_prob: true,
            mlps: vec![MlpPlan::Moe {
                router: "mlp.gate.weight",
                route: RoutePlan::Softmax,
                shared: 0,
            }],
        }
    }

    /// Heads up to the kernels' width take the whole-model path; a wider one is left to the
    /// offload path (the CPU's layers), not refused.
    #[test]
    fn heads_wider_than_the_kernels_take_are_left_to_the_offload_path() {
        for (d, takes) in [(64, true), (MAX_HEAD_DIM, true), (MAX_HEAD_DIM * 2, false)] {
            assert_eq!(refusal(&plan(d)).is_none(), takes, "head_dim {d}");
        }
    }

    /// A second attention form (MiMo-V2-Flash's sliding layers) is taken when it has the first's
    /// query heads, head width and values, its own key/value heads, window and RoPE, and no
    /// q/k norm; other heads or widths, q/k norms, an odd rotation or values beside a gated output
    /// are left to the offload path; so is MLA beside layers of another mixer.
    #[test]
    fn a_second_attention_form_is_taken_only_as_the_engine_computes_it() {
        use crate::family::common::AttnExtra;
        let mimo = || {
            let mut p = plan(64);
            p.attn.qk_norm = None;
            p.attn.extra = Some(AttnExtra {
                v_dim: 32,
                v_scale: 0.5,
                sinks: false,
            });
            let mut w = p.attn;
            w.shape.kv_heads = 2;
            w.shape.window = Some(128);
            w.extra = Some(AttnExtra {
                sinks: true,
                ..p.attn.extra.expect("values")
            });
            let mut rope = p.rope.clone();
            rope.theta = 1e4;
            rope.rotary_dim = 32;
            p.swa = Some((w, rope));
            p.mixers = vec![MixerPlan::SlidingAttention, MixerPlan::Attention];
            p.mlps = vec![p.mlps[0]; 2];
            p
        };
        assert_eq!(refusal(&mimo()), None, "MiMo-V2-Flash's forms are taken");
        type Change = fn(&mut Plan);
        let bad: [(&str, Change); 6] = [
            ("other query heads", |p| {
                if let Some((w, _)) = p.swa.as_mut() {
                    w.shape.heads = 4;
                }
            }),
            ("other head width", |p| {
                if let Some((w, _)) = p.swa.as_mut() {
                    w.shape.head_dim = 32;
                }
            }),
            ("q/k norms", |p| {
                if let Some((w, _)) = p.swa.as_mut() {
                    w.qk_norm = Some(NormStyle::OnePlus);
                }
            }),
            ("other values", |p| {
                if let Some((w, _)) = p.swa.as_mut() {
                    w.extra = Some(AttnExtra {
                        v_dim: 64,
                        v_scale: 0.5,
                        sinks: true,
                    });
                }
            }),
            ("an odd rotation", |p| {
                if let Some((_, r)) = p.swa.as_mut() {
                    r.rotary_dim = 31;
                }
            }),
            ("values beside a gated output", |p| p.attn.out_gate = true),
        ];
        for (what, f) in bad {
            let mut p = mimo();
            f(&mut p);
            assert!(refusal(&p).is_some(), "{what}");
        }
        let mut p = plan(64);
        p.attn.qk_norm = None;
        p.mla = Some(crate::family::mla::MlaShape {
            heads: 2,
            q_lora_rank: None,
            kv_lora_rank: 16,
            nope: 48,
            rope: 16,
            v: 32,
            interleave: true,
            bias: false,
            latent_eps: 1e-6,
            scale: 0.125,
        });
        p.mixers = vec![MixerPlan::Mla, MixerPlan::Mla];
        p.mlps = vec![p.mlps[0]; 2];
        assert_eq!(refusal(&p), None, "MLA layers are taken");
        p.mixers[1] = MixerPlan::Attention;
        assert!(refusal(&p).is_some(), "MLA beside attention");
        p.mixers[1] = MixerPlan::DeltaNet;
        assert!(refusal(&p).is_some(), "MLA beside DeltaNet");
    }

    /// What the kernels do not compute is left to the CPU's layers: q/k norms of another
    /// epsilon than the layers', DeltaNet key heads wider than the kernels hold or convolutions
    /// longer than a warp, DeltaNet layers without their widths. Zero-centred norms and a gated
    /// attention output (Qwen3.5's) are taken.
    #[test]
    fn forms_the_kernels_do_not_compute_are_left_to_the_offload_path() {
        let mut p = plan(64);
        p.norm = NormStyle::OnePlus;
        p.attn.qk_norm = Some(NormStyle::OnePlus);
        p.attn.out_gate = true;
        assert_eq!(refusal(&p), None, "Qwen3.5's forms are taken");
        let mut p = plan(64);
        p.attn.eps = 1e-5;
        assert!(refusal(&p).is_some());
        p.attn.qk_norm = None;
        assert_eq!(refusal(&p), None, "no q/k norm: its epsilon is not used");
        let delta = DeltaShape {
            k_heads: 16,
            v_heads: 32,
            dk: 128,
            dv: 128,
            kernel: 4,
        };
        let mut p = plan(64);
        p.mixers = vec![MixerPlan::DeltaNet];
        assert!(
            refusal(&p).is_some(),
            "DeltaNet layers without their widths"
        );
        p.delta = Some(delta);
        assert_eq!(refusal(&p), None);
        p.delta = Some(DeltaShape {
            dk: MAX_DELTA_DK + 1,
            ..delta
        });
        assert!(refusal(&p).is_some());
        p.delta = Some(DeltaShape {
            kernel: MAX_DELTA_KERNEL + 1,
            ..delta
        });
        assert!(refusal(&p).is_some());
        // Heads too wide for attention matter only where a layer attends.
        let mut p = plan(MAX_HEAD_DIM * 2);
        p.mixers = vec![MixerPlan::DeltaNet];
        p.delta = Some(delta);
        assert_eq!(refusal(&p), None);
    }
}
