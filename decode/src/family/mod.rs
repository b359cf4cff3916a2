//! Model families: one module each over the shared [`crate::blocks`]. A family parses its config
//! once into a typed struct, checks every tensor it will read before the first token, holds its
//! own state (KV cache, later recurrent state) and computes a forward pass over a batch of tokens.
//! Adding a family (Qwen3.5-MoE, GLM-4.5-MoE, Mixtral) is a new module and a line in [`open`].

pub mod common;
pub mod glm4_moe;
pub mod mixtral;
pub mod qwen3_5_moe;
pub mod qwen3_moe;

use crate::blocks::Batch;
use crate::error::{DecodeError, Result};
use crate::experts::ExpertStore;
use crate::kernels::Isa;
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

    /// A dense SwiGLU MLP ([`crate::blocks::swiglu`]), on the offload device when it takes it.
    pub fn swiglu(
        &mut self,
        part: &'static str,
        gate: MatrixRef<'_>,
        up: MatrixRef<'_>,
        down: MatrixRef<'_>,
        xs: &[Vec<f32>],
    ) -> Result<Batch> {
        let t = std::time::Instant::now();
        let out = match self
            .offload
            .as_deref_mut()
            .and_then(|o| o.swiglu_dense(&gate, &up, &down, xs))
        {
            Some(r) => r?,
            None => crate::blocks::swiglu(self.isa, gate, up, down, xs),
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
    /// Vocabulary size (logits per position).
    fn vocab_size(&self) -> usize;
    /// Hidden size.
    fn hidden_size(&self) -> usize;
    /// Decoder layers.
    fn num_layers(&self) -> usize;
    /// Experts selected per token.
    fn top_k(&self) -> usize;
    /// Forget every position.
    fn reset(&mut self);
    /// What a device running this decoder's whole forward pass did (the GPU decoder), if any.
    fn device_report(&self) -> Option<crate::offload::OffloadReport> {
        None
    }
    /// Run `tokens` at positions `start..start + tokens.len()` (positions from `start` on are
    /// overwritten). Returns the `f32` logits of every position when `all_logits`, else of the last.
    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>>;
}

/// Families this build decodes, by `model_type`.
pub const SUPPORTED: &[&str] = &[
    "qwen3_moe",
    "qwen3_5_moe_text",
    "qwen3_5_moe",
    "glm4_moe",
    "mixtral",
];

/// The family of `config` (its `model_type`), checked against the resident tensors.
pub fn open(config: &serde_json::Value, tensors: &TensorStore) -> Result<Box<dyn Family>> {
    let model_type = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    match model_type.as_str() {
        "qwen3_moe" => Ok(Box::new(qwen3_moe::Qwen3Moe::new(
            qwen3_moe::Qwen3MoeConfig::parse(config)?,
            tensors,
        )?)),
        "qwen3_5_moe_text" | "qwen3_5_moe" => Ok(Box::new(qwen3_5_moe::Qwen3_5Moe::new(
            qwen3_5_moe::Qwen3_5MoeConfig::parse(config)?,
            tensors,
        )?)),
        "glm4_moe" => Ok(Box::new(glm4_moe::Glm4Moe::new(
            glm4_moe::Glm4MoeConfig::parse(config)?,
            tensors,
        )?)),
        "mixtral" => Ok(Box::new(mixtral::Mixtral::new(
            mixtral::MixtralConfig::parse(config)?,
            tensors,
        )?)),
        _ => Err(DecodeError::UnsupportedFamily {
            model_type,
            supported: SUPPORTED.join(", "),
        }),
    }
}

/// The RoPE parameters `config`'s family uses (its `model_type`'s defaults applied).
pub fn rope_config(config: &serde_json::Value) -> Result<crate::config::RopeConfig> {
    let model_type = config
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    match model_type {
        "qwen3_moe" => Ok(qwen3_moe::Qwen3MoeConfig::parse(config)?.rope),
        "qwen3_5_moe_text" | "qwen3_5_moe" => {
            Ok(qwen3_5_moe::Qwen3_5MoeConfig::parse(config)?.rope)
        }
        "glm4_moe" => Ok(glm4_moe::Glm4MoeConfig::parse(config)?.rope),
        "mixtral" => Ok(mixtral::MixtralConfig::parse(config)?.rope),
        _ => Err(DecodeError::UnsupportedFamily {
            model_type: model_type.to_string(),
            supported: SUPPORTED.join(", "),
        }),
    }
}
