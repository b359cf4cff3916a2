//! Model families, each written once: a family module parses its config into a typed struct and
//! gives its forward pass as a [`plan::Plan`] (the skeleton every family shares, the attention's
//! form, each layer's token mixer and MLP). The CPU runs a plan through the shared blocks
//! ([`plan::PlanDecoder`]: every tensor checked before the first token, a sequence's state —
//! KV caches, recurrent states — made from the plan and held in the [`crate::sequence`], not
//! here) and the whole-model GPU engine runs the same plan ([`crate::gpu_resident`]). Adding a
//! family is a new module and a row in [`REGISTRY`]; a block no plan has yet is a new variant of
//! the plan, run by both.

pub mod common;
pub mod deepseek_v3;
pub mod deltanet;
pub mod dsa;
pub mod glm4_moe;
pub mod glm5_next;
pub mod kda;
pub mod mhc;
pub mod mimo_v2_flash;
pub mod mixtral;
pub mod mla;
pub mod plan;
pub mod qwen3_5_moe;
pub mod qwen3_moe;
pub mod qwen3_next;

use plan::PlanDecoder;

use crate::blocks::Batch;
use crate::error::{DecodeError, Result, SequenceFault};
use crate::experts::ExpertStore;
use crate::kernels::Isa;
use crate::sequence::{State, Truncation};
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// What a forward pass computes with: kernels, resident tensors, experts.
#[derive(Debug)]
pub struct Ctx<'a> {
    /// The kernels' instruction-set path.
    pub isa: Isa,
    /// Trunk and layer tensors.
    pub tensors: &'a TensorStore,
    /// Routed experts.
    pub experts: &'a mut ExpertStore,
    /// Where the time went, by part of the forward pass.
    pub profile: &'a mut Profile,
    /// A device computing some routed experts (the GPU), or `None`: all on the CPU.
    pub offload: Option<&'a mut dyn crate::offload::ExpertOffload>,
}

impl Ctx<'_> {
    /// `y_t = W x_t (+ b)` for every token ([`crate::blocks::linear`]), on the offload device
    /// when it takes `W` (the same bits), the bias added here either way.
    pub fn linear(
        &mut self,
        part: &'static str,
        w: MatrixRef<'_>,
        bias: Option<WeightSlice<'_>>,
        xs: &[Vec<f32>],
    ) -> Result<Batch> {
        let t = std::time::Instant::now();
        let out = match self.offload.as_deref_mut().and_then(|o| o.linear(&w, xs)) {
            Some(r) => {
                let mut out = r?;
                if let Some(b) = bias {
                    for y in &mut out {
                        for (i, v) in y.iter_mut().enumerate() {
                            *v += b.get(i);
                        }
                    }
                }
                out
            }
            None => crate::blocks::linear(self.isa, w, bias, xs),
        };
        self.profile.add(part, t.elapsed());
        Ok(out)
    }

    /// Several linear layers of the same inputs ([`crate::blocks::linear_many`]; on the offload
    /// device one after another when it takes them all).
    pub fn linear_many(
        &mut self,
        part: &'static str,
        layers: &[(MatrixRef<'_>, Option<WeightSlice<'_>>)],
        xs: &[Vec<f32>],
    ) -> Result<Vec<Batch>> {
        if self.offload.is_some() {
            let mut outs = Vec::with_capacity(layers.len());
            for &(w, b) in layers {
                outs.push(self.linear(part, w, b, xs)?);
            }
            return Ok(outs);
        }
        let isa = self.isa;
        Ok(self
            .profile
            .time(part, || crate::blocks::linear_many(isa, layers, xs)))
    }

    /// A dense SwiGLU MLP ([`crate::blocks::swiglu`]), clamped with a `limit`; on the offload
    /// device when it takes it.
    pub fn swiglu(
        &mut self,
        part: &'static str,
        (gate, up, down): (MatrixRef<'_>, MatrixRef<'_>, MatrixRef<'_>),
        limit: Option<f32>,
        xs: &[Vec<f32>],
    ) -> Result<Batch> {
        let t = std::time::Instant::now();
        let out = match self
            .offload
            .as_deref_mut()
            .and_then(|o| o.swiglu_dense(&gate, &up, &down, xs, limit))
        {
            Some(r) => r?,
            None => crate::blocks::swiglu(self.isa, gate, up, down, xs, limit),
        };
        self.profile.add(part, t.elapsed());
        Ok(out)
    }
}

/// Wall time spent in each part of the forward pass (`tarfa run` prints it with
/// `TARFA_PROFILE=1`). Timing never changes what is computed.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    parts: Vec<(&'static str, std::time::Duration)>,
}

impl Profile {
    /// Run `f`, adding its wall time to `part`.
    pub fn time<R>(&mut self, part: &'static str, f: impl FnOnce() -> R) -> R {
        let t = std::time::Instant::now();
        let r = f();
        self.add(part, t.elapsed());
        r
    }

    /// Add `d` to `part`.
    pub fn add(&mut self, part: &'static str, d: std::time::Duration) {
        match self.parts.iter_mut().find(|p| p.0 == part) {
            Some(p) => p.1 += d,
            None => self.parts.push((part, d)),
        }
    }

    /// The parts in first-seen order with their total time.
    pub fn parts(&self) -> &[(&'static str, std::time::Duration)] {
        &self.parts
    }
}

/// A model family's decoder.
pub trait Family: Send + std::fmt::Debug {
    /// The family's name (its `model_type`, as messages name it).
    fn name(&self) -> &'static str;
    /// Vocabulary size (logits per position).
    fn vocab_size(&self) -> usize;
    /// Hidden size.
    fn hidden_size(&self) -> usize;
    /// Decoder layers.
    fn num_layers(&self) -> usize;
    /// Experts selected per token.
    fn top_k(&self) -> usize;
    /// Whether a layer holds recurrent state (Gated DeltaNet): its sequences cannot be rewound.
    fn recurrent(&self) -> bool {
        false
    }
    /// A new sequence's state: every KV cache empty, every recurrent state zero.
    fn new_state(&mut self) -> Result<State>;
    /// A copy of `state`, which holds `len` positions.
    fn fork_state(&mut self, state: &State, len: usize) -> Result<State> {
        let _ = len;
        match state {
            State::Host(layers) => Ok(State::Host(layers.clone())),
            State::Device(_) => Err(DecodeError::Sequence(SequenceFault::Foreign)),
        }
    }
    /// `state` truncated as `t` says (which [`crate::Sequence`] has held to what its layers
    /// allow).
    fn truncate_state(&mut self, state: &mut State, t: Truncation) -> Result<()> {
        crate::sequence::truncate_host(state.host()?, t);
        Ok(())
    }
    /// This decoder's forward pass as a plan (every family the registry opens has one; the
    /// whole-model GPU engine runs it, [`crate::gpu_resident`]), or `None` for a decoder that is
    /// itself a device running one.
    fn plan(&self) -> Option<plan::Plan> {
        None
    }
    /// What a device running this decoder's whole forward pass did (the GPU decoder), if any.
    fn device_report(&self) -> Option<crate::offload::OffloadReport> {
        None
    }
    /// Run `tokens` of the sequence whose state is `state` and which holds `start` positions,
    /// at positions `start..start + tokens.len()`. Returns the `f32` logits of every position
    /// when `all_logits`, else of the last.
    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        state: &mut State,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>>;
}

/// One family in [`REGISTRY`]: the `model_type`s it reads, how to open it (config parsed, its
/// plan made, tensors checked), its RoPE parameters, and how it reads a GGUF of llama.cpp's.
#[derive(Debug)]
pub struct FamilyRow {
    /// The config's `model_type` values it reads (the first is the one a GGUF's config gets).
    pub model_types: &'static [&'static str],
    /// The decoder of a config, checked against the resident tensors.
    pub open: fn(&serde_json::Value, &TensorStore) -> Result<Box<dyn Family>>,
    /// Its RoPE parameters (the family's defaults applied).
    pub rope: fn(&serde_json::Value) -> Result<crate::config::RopeConfig>,
    /// llama.cpp's architecture of the family's GGUFs, if this build reads them.
    pub gguf: Option<GgufRow>,
    /// Tensors the family makes from the checkpoint's before it runs, whatever the source
    /// (`qwen3_next`: its fused DeltaNet projections split into Qwen3.5's), if any.
    pub prepare: Option<fn(&serde_json::Value, &mut TensorStore) -> Result<()>>,
}

/// How a family reads a GGUF of llama.cpp's ([`crate::gguf_model`]): what is particular to it.
/// The names and keys every family shares are `gguf_model`'s.
#[derive(Debug)]
pub struct GgufRow {
    /// llama.cpp's `general.architecture`.
    pub arch: &'static str,
    /// The transformers name, below `model.layers.N.`, of a llama.cpp layer tensor
    /// `blk.N.STEM.SUFFIX` that is this family's own (`None`: no meaning in this family).
    pub layer_name: fn(stem: &str, suffix: &str) -> Option<&'static str>,
    /// The family's own keys of the config.json it parses, from the GGUF's key/values and
    /// tensors (what every family reads is already in `config`).
    pub config: fn(
        &crate::gguf_model::GgufConfig<'_>,
        &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<()>,
    /// Multi-head latent attention: `attention.key_length`, `attention.value_length` and
    /// `rope.scaling.*` are the family's to read (`config`), and the other families' attention
    /// tensors (`attn_k`, `attn_v`, q/k norms, q/k/v biases) have no meaning.
    pub mla: bool,
    /// Tensors the family makes from the GGUF's before it runs, given the synthesised config
    /// (deepseek2: `attn_k_b` and `attn_v_b` back into `kv_b_proj`), if any.
    pub assemble: Option<fn(&serde_json::Value, &mut TensorStore) -> Result<()>>,
    /// Layers of two kinds with their own head counts (glm5-next: recurrent and attention;
    /// mimo2: full and sliding): `attention.head_count_kv` is a list per layer (glm5-next: 0 for a
    /// recurrent layer), `attention.value_length` may differ from the keys' and
    /// `rope.dimension_count` may be 0 (glm5-next's NoPE; mimo2 refuses it), all the family's to
    /// read (`config`).
    pub hybrid: bool,
}

/// Every family this build decodes: adding one is its module and a row here.
pub const REGISTRY: &[FamilyRow] = &[
    FamilyRow {
        model_types: &["qwen3_moe"],
        open: |c, t| {
            let cfg = qwen3_moe::Qwen3MoeConfig::parse(c)?;
            PlanDecoder::open(qwen3_moe::plan(&cfg), t)
        },
        rope: |c| Ok(qwen3_moe::Qwen3MoeConfig::parse(c)?.rope),
        gguf: Some(GgufRow {
            arch: "qwen3moe",
            layer_name: qwen3_moe::gguf_layer_name,
            config: qwen3_moe::gguf_config,
            mla: false,
            assemble: None,
            hybrid: false,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["qwen3_5_moe_text", "qwen3_5_moe"],
        open: |c, t| {
            let cfg = qwen3_5_moe::Qwen3_5MoeConfig::parse(c)?;
            PlanDecoder::open(qwen3_5_moe::plan(&cfg), t)
        },
        rope: |c| Ok(qwen3_5_moe::Qwen3_5MoeConfig::parse(c)?.rope),
        gguf: Some(GgufRow {
            arch: "qwen35moe",
            layer_name: qwen3_5_moe::gguf_layer_name,
            config: qwen3_5_moe::gguf_config,
            mla: false,
            assemble: Some(qwen3_5_moe::gguf_assemble),
            hybrid: false,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["qwen3_next"],
        open: |c, t| {
            let cfg = qwen3_5_moe::Qwen3_5MoeConfig::parse_next(c)?;
            PlanDecoder::open(qwen3_5_moe::plan(&cfg), t)
        },
        rope: |c| Ok(qwen3_5_moe::Qwen3_5MoeConfig::parse_next(c)?.rope),
        gguf: Some(GgufRow {
            arch: "qwen3next",
            layer_name: qwen3_next::gguf_layer_name,
            config: qwen3_next::gguf_config,
            mla: false,
            assemble: Some(qwen3_next::gguf_assemble),
            hybrid: false,
        }),
        prepare: Some(qwen3_next::prepare),
    },
    FamilyRow {
        model_types: &["glm4_moe"],
        open: |c, t| {
            let cfg = glm4_moe::Glm4MoeConfig::parse(c)?;
            PlanDecoder::open(glm4_moe::plan(&cfg), t)
        },
        rope: |c| Ok(glm4_moe::Glm4MoeConfig::parse(c)?.rope),
        gguf: Some(GgufRow {
            arch: "glm4moe",
            layer_name: glm4_moe::gguf_layer_name,
            config: glm4_moe::gguf_config,
            mla: false,
            assemble: None,
            hybrid: false,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["deepseek_v3", "kimi_k2"],
        open: |c, t| {
            let cfg = deepseek_v3::DeepseekV3Config::parse(c)?;
            PlanDecoder::open(deepseek_v3::plan(&cfg), t)
        },
        rope: |c| Ok(deepseek_v3::DeepseekV3Config::parse(c)?.rope),
        gguf: Some(GgufRow {
            arch: "deepseek2",
            layer_name: deepseek_v3::gguf_layer_name,
            config: deepseek_v3::gguf_config,
            mla: true,
            assemble: Some(deepseek_v3::gguf_assemble),
            hybrid: false,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["mimo_v2_flash"],
        open: |c, t| {
            let cfg = mimo_v2_flash::MimoV2FlashConfig::parse(c)?;
            PlanDecoder::open(mimo_v2_flash::plan(&cfg), t)
        },
        rope: |c| Ok(mimo_v2_flash::MimoV2FlashConfig::parse(c)?.full_rope),
        gguf: Some(GgufRow {
            arch: "mimo2",
            layer_name: mimo_v2_flash::gguf_layer_name,
            config: mimo_v2_flash::gguf_config,
            mla: false,
            assemble: Some(mimo_v2_flash::gguf_assemble),
            hybrid: true,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["glm5_next", "glm5_next_text"],
        open: |c, t| {
            let cfg = glm5_next::Glm5NextConfig::parse(c)?;
            PlanDecoder::open(glm5_next::plan(&cfg, glm5_next::prefix(t)), t)
        },
        rope: |c| {
            glm5_next::Glm5NextConfig::parse(c)?;
            Ok(glm5_next::no_rope())
        },
        gguf: Some(GgufRow {
            arch: "glm5-next",
            layer_name: glm5_next::gguf_layer_name,
            config: glm5_next::gguf_config,
            mla: true,
            assemble: Some(glm5_next::gguf_assemble),
            hybrid: true,
        }),
        prepare: None,
    },
    FamilyRow {
        model_types: &["mixtral"],
        open: |c, t| {
            let cfg = mixtral::MixtralConfig::parse(c)?;
            PlanDecoder::open(mixtral::plan(&cfg, mixtral::router_name(t)), t)
        },
        rope: |c| Ok(mixtral::MixtralConfig::parse(c)?.rope),
        gguf: None,
        prepare: None,
    },
];

/// The row of `config`'s `model_type`, or the error naming every one this build reads.
pub fn row(config: &serde_json::Value) -> Result<&'static FamilyRow> {
    let model_type = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    REGISTRY
        .iter()
        .find(|r| r.model_types.contains(&model_type))
        .ok_or_else(|| DecodeError::UnsupportedFamily {
            model_type: model_type.to_string(),
            supported: REGISTRY
                .iter()
                .flat_map(|r| r.model_types.iter().copied())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Make the tensors `config`'s family computes with from the checkpoint's
/// ([`FamilyRow::prepare`]; nothing for most families).
pub fn prepare(config: &serde_json::Value, tensors: &mut TensorStore) -> Result<()> {
    match row(config)?.prepare {
        Some(prepare) => prepare(config, tensors),
        None => Ok(()),
    }
}

/// The family of `config` (its `model_type`), checked against the resident tensors.
pub fn open(config: &serde_json::Value, tensors: &TensorStore) -> Result<Box<dyn Family>> {
    (row(config)?.open)(config, tensors)
}

/// The row of the family that reads GGUFs of llama.cpp's architecture `arch`, if any.
pub fn gguf_row(arch: &str) -> Option<&'static FamilyRow> {
    REGISTRY
        .iter()
        .find(|r| r.gguf.as_ref().is_some_and(|g| g.arch == arch))
}

/// The RoPE parameters `config`'s family uses (its `model_type`'s defaults applied).
pub fn rope_config(config: &serde_json::Value) -> Result<crate::config::RopeConfig> {
    (row(config)?.rope)(config)
}

#[cfg(test)]
mod tests {
    use super::REGISTRY;

    /// No `model_type` and no GGUF architecture is claimed by two rows (the lookups take the
    /// first), and a family's own GGUF layer names are not names every family maps.
    #[test]
    fn every_model_type_and_gguf_architecture_has_one_row() {
        let types: Vec<&str> = REGISTRY
            .iter()
            .flat_map(|r| r.model_types.iter().copied())
            .collect();
        let archs: Vec<&str> = REGISTRY
            .iter()
            .filter_map(|r| r.gguf.as_ref().map(|g| g.arch))
            .collect();
        for list in [&types, &archs] {
            let mut sorted = list.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), list.len(), "{list:?}");
        }
        assert_eq!(
            archs,
            [
                "qwen3moe",
                "qwen35moe",
                "qwen3next",
                "glm4moe",
                "deepseek2",
                "mimo2",
                "glm5-next"
            ]
        );
        for r in REGISTRY {
            let Some(g) = &r.gguf else { continue };
            for (stem, suffix) in [
                ("attn_q", "weight"),
                ("ffn_gate_inp", "weight"),
                ("attn_norm", "weight"),
            ] {
                assert_eq!((g.layer_name)(stem, suffix), None, "{}: {stem}", g.arch);
            }
        }
    }
}
