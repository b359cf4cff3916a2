//! A family's forward pass as data ([`Plan`]), and the CPU decoder that runs it
//! ([`PlanDecoder`]). A family module parses its config and gives its plan; the CPU runs the plan
//! here through the shared blocks ([`crate::family::common`], [`crate::family::deltanet`]) and the
//! whole-model GPU engine runs the same plan with its kernels ([`crate::gpu_resident`]). So a
//! family is written once: what it computes is its plan, on every device.

use tarfa_cuda::DeltaShape;

use crate::blocks::{self, Batch, KvCache, Route};
use crate::canon;
use crate::config::RopeConfig;
use crate::error::{DecodeError, Result};
use crate::family::common::{self, AttnSpec, NormStyle, Skeleton};
use crate::family::deltanet::{self, DeltaState};
use crate::family::dsa::{self, DsaShape};
use crate::family::kda::{self, KdaShape};
use crate::family::mhc::{self, HyperSpec};
use crate::family::mla::{self, MlaShape, Sparse};
use crate::family::{Ctx, Family};
use crate::rope::Rope;
use crate::sequence::{LayerState, State};
use crate::weights::{MatrixRef, TensorStore};

/// A family's forward pass, written once: the decoder skeleton every family shares (tensors under `prefix`, e.g. `model.`: the embedding; per layer
/// `input_layernorm`, a token mixer — attention `self_attn.*` or Gated DeltaNet
/// `linear_attn.*` —, `post_attention_layernorm` and an MLP; the final `norm`; `lm_head.weight`
/// or the tied embedding), the attention's form, and each layer's mixer and MLP. The CPU runs it
/// ([`PlanDecoder`]) and so does the whole-model GPU engine ([`crate::gpu_resident`]).
#[derive(Clone, Debug)]
pub struct Plan {
    /// The family, for messages (e.g. that its recurrent state cannot be rewound).
    pub family: &'static str,
    /// The text model's tensor-name prefix (`model.`, or `model.language_model.`).
    pub prefix: String,
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// `tie_word_embeddings`: without an `lm_head.weight` the embedding is the output projection.
    pub tied: bool,
    /// The layer and final norms' style.
    pub norm: NormStyle,
    /// Their epsilon.
    pub eps: f32,
    /// Attention (every layer alike).
    pub attn: AttnSpec,
    /// RoPE.
    pub rope: RopeConfig,
    /// The sliding-window layers' own attention form and RoPE (MiMo-V2-Flash: more key/value
    /// heads, sinks, another base), when there are any.
    pub swa: Option<(AttnSpec, RopeConfig)>,
    /// Routed experts a MoE layer has.
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the selected experts' weights.
    pub norm_topk_prob: bool,
    /// Each layer's token mixer.
    pub mixers: Vec<MixerPlan>,
    /// The Gated DeltaNet layers' widths, when there are any.
    pub delta: Option<DeltaShape>,
    /// The MLA layers' widths, when there are any.
    pub mla: Option<MlaShape>,
    /// The KDA layers' widths, when there are any.
    pub kda: Option<KdaShape>,
    /// The DSA indexers' widths, when there are any.
    pub dsa: Option<DsaShape>,
    /// Hyper-connections in place of the plain residual (GLM-5.3-Flash), or none.
    pub hyper: Option<HyperSpec>,
    /// Every SwiGLU's clamp (`swiglu_limit`: dense, shared and routed experts), or none.
    pub swiglu_limit: Option<f32>,
    /// Each layer's MLP.
    pub mlps: Vec<MlpPlan>,
    /// Where a MoE layer's shared experts are, and their gate.
    pub shared: SharedPlan,
}

/// One layer's token mixer in a [`Plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerPlan {
    /// Attention of [`Plan::attn`]'s form under `self_attn.`.
    Attention,
    /// Gated DeltaNet of [`Plan::delta`]'s widths under `linear_attn.`
    /// (`in_proj_{qkv,z,b,a}`, `conv1d`, `dt_bias`, `A_log`, `norm`, `out_proj`).
    DeltaNet,
    /// Multi-head latent attention of [`Plan::mla`]'s widths under `self_attn.`
    /// ([`crate::family::mla`]).
    Mla,
    /// Attention of [`Plan::swa`]'s form and RoPE under `self_attn.`.
    SlidingAttention,
    /// Kimi delta attention of [`Plan::kda`]'s widths under `self_attn.` ([`crate::family::kda`]).
    Kda,
    /// MLA of [`Plan::mla`]'s widths attending where a DSA indexer of [`Plan::dsa`]'s widths
    /// says: the layer's own (`self_attn.indexer.*`) when `own`, else the previous layer's
    /// selection (which must be an own-indexer layer).
    MlaSparse {
        /// Whether the layer runs its own indexer.
        own: bool,
    },
}

/// The names of a MoE layer's shared experts (relative to `layers.L.`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedPlan {
    /// Their SwiGLU: `{prefix}.{gate,up,down}_proj.weight`.
    pub prefix: &'static str,
    /// A `[1, hidden]` gate whose `sigmoid(gate · x)` weighs their output (Qwen3.5), or none.
    pub gate: Option<&'static str>,
}

impl SharedPlan {
    /// GLM's (DeepSeek-V3 style) `mlp.shared_experts`, ungated.
    pub const EXPERTS: SharedPlan = SharedPlan {
        prefix: "mlp.shared_experts",
        gate: None,
    };
}

/// One layer's MLP in a [`Plan`] (names relative to the plan's `{prefix}layers.L.`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MlpPlan {
    /// `mlp.{gate,up,down}_proj.weight`, `inter` wide.
    Dense {
        /// Width.
        inter: usize,
    },
    /// Routed experts (the layer's file), selected by the router `router` as `route` says, and
    /// shared experts ([`Plan::shared`]) of width `shared` (0: none) added after them.
    Moe {
        /// The router's weight.
        router: &'static str,
        /// How it selects.
        route: RoutePlan,
        /// Shared experts' width.
        shared: usize,
    },
}

impl MlpPlan {
    /// A DeepSeek-style MoE layer (GLM-4.5, DeepSeek-V3, GLM-5.3-Flash): the router
    /// `mlp.gate.weight` selecting by sigmoid with groups and the correction bias
    /// `mlp.gate.e_score_correction_bias`, the weights scaled by `scale`, and shared experts
    /// `shared` wide.
    pub fn sigmoid_group_moe(n_group: usize, topk_group: usize, scale: f32, shared: usize) -> Self {
        MlpPlan::Moe {
            router: "mlp.gate.weight",
            route: RoutePlan::SigmoidGroup {
                bias: "mlp.gate.e_score_correction_bias",
                n_group,
                topk_group,
                scale,
            },
            shared,
        }
    }

    /// `n` layers: `moe` where `is_moe(l)`, else a dense MLP `inter` wide.
    pub fn layers(
        n: usize,
        is_moe: impl Fn(usize) -> bool,
        moe: MlpPlan,
        inter: usize,
    ) -> Vec<Self> {
        (0..n)
            .map(|l| match is_moe(l) {
                true => moe,
                false => MlpPlan::Dense { inter },
            })
            .collect()
    }
}

/// A router in a [`MlpPlan::Moe`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RoutePlan {
    /// [`crate::blocks::softmax_topk`].
    Softmax,
    /// [`crate::blocks::sigmoid_group_topk`] with the correction bias `bias`.
    SigmoidGroup {
        /// The bias's name.
        bias: &'static str,
        /// Groups.
        n_group: usize,
        /// Groups kept.
        topk_group: usize,
        /// `routed_scaling_factor`.
        scale: f32,
    },
}

impl Plan {
    /// Decoder layers.
    pub fn layers(&self) -> usize {
        self.mixers.len()
    }

    fn name(&self, n: &str) -> String {
        format!("{}{n}", self.prefix)
    }

    fn layer(&self, l: usize, n: &str) -> String {
        format!("{}layers.{l}.{n}", self.prefix)
    }

    /// The output projection: `lm_head.weight`, or the embedding when tied and none is stored.
    fn lm_head<'s>(&self, s: &'s TensorStore) -> Result<MatrixRef<'s>> {
        common::lm_head(
            s,
            "lm_head.weight",
            &self.name("embed_tokens.weight"),
            self.tied,
            self.vocab,
            self.hidden,
        )
    }

    fn delta_shape(&self) -> Result<&DeltaShape> {
        self.delta.as_ref().ok_or(DecodeError::BadPlan {
            family: self.family,
            what: "a Gated DeltaNet layer without the DeltaNet widths",
        })
    }

    fn mla_shape(&self) -> Result<&MlaShape> {
        self.mla.as_ref().ok_or(DecodeError::BadPlan {
            family: self.family,
            what: "an MLA layer without the MLA widths",
        })
    }

    fn kda_shape(&self) -> Result<&KdaShape> {
        self.kda.as_ref().ok_or(DecodeError::BadPlan {
            family: self.family,
            what: "a KDA layer without the KDA widths",
        })
    }

    fn dsa_shape(&self) -> Result<&DsaShape> {
        self.dsa.as_ref().ok_or(DecodeError::BadPlan {
            family: self.family,
            what: "a DSA layer without the indexer's widths",
        })
    }

    fn swa(&self) -> Result<&(AttnSpec, RopeConfig)> {
        self.swa.as_ref().ok_or(DecodeError::BadPlan {
            family: self.family,
            what: "a sliding-window layer without its form",
        })
    }

    /// Every tensor the forward pass reads exists with its shape, before any token is run.
    pub fn check(&self, s: &TensorStore) -> Result<()> {
        let h = self.hidden;
        s.get(&self.name("embed_tokens.weight"))?
            .matrix(self.vocab, h)?;
        s.get(&self.name("norm.weight"))?.vector(h)?;
        self.lm_head(s)?;
        if self.mlps.len() != self.layers() {
            return Err(DecodeError::BadPlan {
                family: self.family,
                what: "a different number of token mixers and MLPs",
            });
        }
        for l in 0..self.layers() {
            let p = |n: &str| self.layer(l, n);
            s.get(&p("input_layernorm.weight"))?.vector(h)?;
            s.get(&p("post_attention_layernorm.weight"))?.vector(h)?;
            match self.mixers[l] {
                MixerPlan::Attention => common::check_attention(s, &p("self_attn"), &self.attn, h)?,
                MixerPlan::DeltaNet => {
                    deltanet::check(s, &p("linear_attn"), self.delta_shape()?, h)?
                }
                MixerPlan::Mla => mla::check(s, &p("self_attn"), self.mla_shape()?, h)?,
                MixerPlan::SlidingAttention => {
                    common::check_attention(s, &p("self_attn"), &self.swa()?.0, h)?
                }
                MixerPlan::Kda => kda::check(s, &p("self_attn"), self.kda_shape()?, h)?,
                MixerPlan::MlaSparse { own } => {
                    mla::check(s, &p("self_attn"), self.mla_shape()?, h)?;
                    if own {
                        dsa::check(s, &p("self_attn"), self.dsa_shape()?, h)?;
                    } else if l == 0 || self.mixers[l - 1] != (MixerPlan::MlaSparse { own: true }) {
                        return Err(DecodeError::BadPlan {
                            family: self.family,
                            what: "a DSA layer sharing a selection not directly after a layer \
                                   with its own indexer",
                        });
                    }
                }
            }
            if let Some(hc) = &self.hyper {
                mhc::check(s, &self.layer(l, ""), hc, h)?;
            }
            match self.mlps[l] {
                MlpPlan::Dense { inter } => common::check_mlp(s, &p("mlp"), inter, h)?,
                MlpPlan::Moe {
                    router,
                    route,
                    shared,
                } => {
                    s.get(&p(router))?.matrix(self.num_experts, h)?;
                    if let RoutePlan::SigmoidGroup { bias, .. } = route {
                        s.get(&p(bias))?.vector(self.num_experts)?;
                    }
                    if shared > 0 {
                        common::check_mlp(s, &p(self.shared.prefix), shared, h)?;
                        if let Some(gate) = self.shared.gate {
                            s.get(&p(gate))?.matrix(1, h)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// A new sequence's state: an empty KV cache per attention layer, a zero DeltaNet state per
    /// DeltaNet layer.
    pub fn new_state(&self) -> Result<State> {
        let layers = (0..self.layers())
            .map(|l| {
                Ok(match self.mixers[l] {
                    MixerPlan::Attention
                    | MixerPlan::Mla
                    | MixerPlan::SlidingAttention
                    | MixerPlan::MlaSparse { .. } => LayerState::Attention(KvCache::default()),
                    MixerPlan::DeltaNet => {
                        LayerState::DeltaNet(DeltaState::new(self.delta_shape()?))
                    }
                    MixerPlan::Kda => LayerState::DeltaNet(self.kda_shape()?.new_state()),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(State::Host(layers))
    }

    /// Layer `l`'s MLP over the batch: a dense SwiGLU, or the router's selection, the routed
    /// experts combined in slot order and the shared experts added after them (weighed by their
    /// gate's sigmoid when they have one).
    fn mlp(&self, ctx: &mut Ctx<'_>, l: usize, x: &Batch) -> Result<Batch> {
        let h = self.hidden;
        let p = |n: &str| self.layer(l, n);
        let (router, route, shared) = match self.mlps[l] {
            MlpPlan::Dense { inter } => {
                return common::mlp(
                    ctx,
                    "dense mlp",
                    (&p("mlp"), inter, h),
                    self.swiglu_limit,
                    x,
                )
            }
            MlpPlan::Moe {
                router,
                route,
                shared,
            } => (router, route, shared),
        };
        let s = ctx.tensors;
        let w = s.get(&p(router))?.matrix(self.num_experts, h)?;
        let isa = ctx.isa;
        let z = common::router_logits(ctx, w, x)?;
        let routes: Vec<Route> = match route {
            RoutePlan::Softmax => z
                .iter()
                .map(|z| blocks::softmax_topk(isa, z, self.top_k, self.norm_topk_prob))
                .collect(),
            RoutePlan::SigmoidGroup {
                bias,
                n_group,
                topk_group,
                scale,
            } => {
                let bias = s.get(&p(bias))?.vector(self.num_experts)?;
                z.iter()
                    .map(|z| {
                        blocks::sigmoid_group_topk(
                            z,
                            bias,
                            self.top_k,
                            n_group,
                            topk_group,
                            self.norm_topk_prob,
                            scale,
                        )
                    })
                    .collect()
            }
        };
        let limit = self.swiglu_limit;
        let mut out = common::routed_experts(ctx, l as u32, &routes, x, limit)?;
        if shared > 0 {
            let sh = common::mlp(
                ctx,
                "shared experts",
                (&p(self.shared.prefix), shared, h),
                limit,
                x,
            )?;
            match self.shared.gate {
                None => blocks::add_into(&mut out, &sh),
                Some(gate) => {
                    let gate = s.get(&p(gate))?.matrix(1, h)?;
                    let g = common::router_logits(ctx, gate, x)?;
                    for ((o, sh), gt) in out.iter_mut().zip(&sh).zip(&g) {
                        let scale = canon::sigmoid(gt[0]);
                        for (a, &b) in o.iter_mut().zip(sh) {
                            *a += scale * b;
                        }
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The CPU decoder of a [`Plan`]: the plan and its RoPE tables (a sequence holds the KV caches
/// and recurrent states).
#[derive(Debug)]
pub struct PlanDecoder {
    plan: Plan,
    rope: Rope,
    /// The sliding-window layers' RoPE, when they have their own.
    swa_rope: Option<Rope>,
}

impl PlanDecoder {
    /// Check the plan against the resident tensors (names and shapes) and build the decoder.
    pub fn new(plan: Plan, store: &TensorStore) -> Result<PlanDecoder> {
        plan.check(store)?;
        Ok(PlanDecoder {
            rope: Rope::of(&plan.rope),
            swa_rope: plan.swa.as_ref().map(|(_, r)| Rope::of(r)),
            plan,
        })
    }

    /// [`PlanDecoder::new`], boxed as the registry opens a family.
    pub fn open(plan: Plan, store: &TensorStore) -> Result<Box<dyn Family>> {
        Ok(Box::new(PlanDecoder::new(plan, store)?))
    }
}

impl Family for PlanDecoder {
    fn name(&self) -> &'static str {
        self.plan.family
    }

    fn vocab_size(&self) -> usize {
        self.plan.vocab
    }

    fn hidden_size(&self) -> usize {
        self.plan.hidden
    }

    fn num_layers(&self) -> usize {
        self.plan.layers()
    }

    fn top_k(&self) -> usize {
        self.plan.top_k
    }

    fn recurrent(&self) -> bool {
        self.plan
            .mixers
            .iter()
            .any(|m| matches!(m, MixerPlan::DeltaNet | MixerPlan::Kda))
    }

    fn plan(&self) -> Option<Plan> {
        Some(self.plan.clone())
    }

    fn new_state(&mut self) -> Result<State> {
        self.plan.new_state()
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        state: &mut State,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let p = &self.plan;
        let sk = Skeleton {
            prefix: &p.prefix,
            vocab: p.vocab,
            hidden: p.hidden,
            layers: p.layers(),
            norm: p.norm,
            eps: p.eps,
            head: p.lm_head(ctx.tensors)?,
        };
        let (rope, swa_rope, layers) = (&mut self.rope, &mut self.swa_rope, state.host()?);
        // The last own-indexer DSA layer's selection, for a following layer that shares it.
        let mut selection: Option<Vec<Vec<usize>>> = None;
        let mixer = |ctx: &mut Ctx<'_>, l: usize, xn: &Batch| match p.mixers[l] {
            MixerPlan::Attention => common::attention(
                ctx,
                &p.layer(l, "self_attn"),
                &p.attn,
                p.hidden,
                rope,
                layers[l].kv(l)?,
                start,
                xn,
            ),
            MixerPlan::SlidingAttention => {
                let rope = swa_rope.as_mut().ok_or(DecodeError::BadPlan {
                    family: p.family,
                    what: "sliding-window layers without their form",
                })?;
                common::attention(
                    ctx,
                    &p.layer(l, "self_attn"),
                    &p.swa()?.0,
                    p.hidden,
                    rope,
                    layers[l].kv(l)?,
                    start,
                    xn,
                )
            }
            MixerPlan::Mla => mla::layer(
                ctx,
                &p.layer(l, "self_attn"),
                p.mla_shape()?,
                p.hidden,
                rope,
                layers[l].kv(l)?,
                start,
                xn,
                Sparse::Dense,
            ),
            MixerPlan::MlaSparse { own } => {
                let shared;
                let sparse = if own {
                    Sparse::Index(p.dsa_shape()?, &mut selection)
                } else {
                    shared = selection.clone().ok_or(DecodeError::BadPlan {
                        family: p.family,
                        what: "a DSA layer sharing a selection no layer made",
                    })?;
                    Sparse::Reuse(&shared)
                };
                mla::layer(
                    ctx,
                    &p.layer(l, "self_attn"),
                    p.mla_shape()?,
                    p.hidden,
                    rope,
                    layers[l].kv(l)?,
                    start,
                    xn,
                    sparse,
                )
            }
            MixerPlan::DeltaNet => deltanet::layer(
                ctx,
                &p.layer(l, "linear_attn"),
                (p.delta_shape()?, p.hidden),
                p.eps,
                layers[l].delta(l)?,
                xn,
            ),
            MixerPlan::Kda => kda::layer(
                ctx,
                &p.layer(l, "self_attn"),
                (p.kda_shape()?, p.hidden),
                layers[l].delta(l)?,
                xn,
            ),
        };
        let mlp = |ctx: &mut Ctx<'_>, l: usize, xn: &Batch| p.mlp(ctx, l, xn);
        match &p.hyper {
            None => common::decoder_forward(ctx, &sk, tokens, all_logits, mixer, mlp),
            Some(hc) => mhc::decoder_forward(ctx, &sk, hc, tokens, all_logits, mixer, mlp),
        }
    }
}
