//! `mixtral` (MixtralForCausalLM) as transformers 5.17 computes it in `f32`
//! (`research/model-families.md` §5): RMSNorm, GQA attention without q/k norm or biases, full
//! NeoX RoPE, an optional sliding window, a softmax top-k router always renormalised, SwiGLU
//! experts (`w1` gate, `w3` up, `w2` down) combined in selection-slot order.

use crate::blocks::{self, AttnShape, Batch, Route};
use crate::config::{attention_dims, bad, limits, rms_eps, ConfigReader, RopeConfig};
use crate::error::{ConfigFault, Result};
use crate::family::common::{self, AttnSpec, NormStyle, Skeleton};
use crate::family::{Ctx, Family};
use crate::gpu_resident::{MixerPlan, MlpPlan, RoutePlan, SharedPlan, WholePlan};
use crate::rope::Rope;
use crate::sequence::State;
use crate::weights::{MatrixRef, TensorStore};

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct MixtralConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`).
    pub kv_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps` (default 1e-5).
    pub rms_norm_eps: f32,
    /// RoPE base (default 1e6) and rotated dims (all).
    pub rope: RopeConfig,
    /// `sliding_window` (default none).
    pub window: Option<usize>,
    /// `num_local_experts` (default 8).
    pub num_experts: usize,
    /// `num_experts_per_tok` (default 2).
    pub top_k: usize,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl MixtralConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<MixtralConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        crate::config::silu_activation(&c)?;
        let (hidden_size, heads, kv_heads, head_dim) = attention_dims(&c)?;
        let num_experts = c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts == 0 {
            return Err(bad("num_local_experts", ConfigFault::Zero));
        }
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(2);
        if top_k == 0 || top_k > num_experts {
            return Err(bad(
                "num_experts_per_tok",
                ConfigFault::OutOfRange {
                    value: top_k,
                    max: num_experts,
                },
            ));
        }
        let window = match c.usize("sliding_window", usize::MAX)? {
            Some(0) => return Err(bad("sliding_window", ConfigFault::Zero)),
            w => w,
        };
        Ok(MixtralConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: rms_eps(&c, 1e-5)?,
            rope: RopeConfig::read(&c, head_dim, 1e6, 1.0)?,
            window,
            num_experts,
            top_k,
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }
}

/// The mixtral decoder: config, RoPE tables, and where the router is (`block_sparse_moe.gate`
/// as checkpoints store it, or `mlp.gate`); a sequence holds the KV caches.
#[derive(Debug)]
pub struct Mixtral {
    cfg: MixtralConfig,
    rope: Rope,
    router: &'static str,
}

const EMBED: &str = "model.embed_tokens.weight";

impl Mixtral {
    /// Check the config against the resident tensors (names and shapes) and build the state.
    pub fn new(cfg: MixtralConfig, store: &TensorStore) -> Result<Mixtral> {
        let router = if store.find("model.layers.0.mlp.gate.weight").is_some()
            && store
                .find("model.layers.0.block_sparse_moe.gate.weight")
                .is_none()
        {
            "mlp.gate.weight"
        } else {
            "block_sparse_moe.gate.weight"
        };
        let m = Mixtral {
            rope: Rope::new(cfg.rope.theta, cfg.rope.rotary_dim),
            cfg,
            router,
        };
        m.check(store)?;
        Ok(m)
    }

    fn attn_spec(&self) -> AttnSpec {
        let c = &self.cfg;
        AttnSpec {
            shape: AttnShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
                window: c.window,
            },
            eps: c.rms_norm_eps,
            qk_norm: None,
            qkv_bias: false,
            o_bias: false,
            out_gate: false,
        }
    }

    fn check(&self, s: &TensorStore) -> Result<()> {
        let c = &self.cfg;
        let h = c.hidden_size;
        s.get(EMBED)?.matrix(c.vocab_size, h)?;
        s.get("model.norm.weight")?.vector(h)?;
        self.lm_head(s)?;
        for l in 0..c.num_layers {
            let p = |n: &str| format!("model.layers.{l}.{n}");
            s.get(&p("input_layernorm.weight"))?.vector(h)?;
            s.get(&p("post_attention_layernorm.weight"))?.vector(h)?;
            common::check_attention(s, &p("self_attn"), &self.attn_spec(), h)?;
            s.get(&p(self.router))?.matrix(c.num_experts, h)?;
        }
        Ok(())
    }

    fn lm_head<'s>(&self, s: &'s TensorStore) -> Result<MatrixRef<'s>> {
        let c = &self.cfg;
        common::lm_head(
            s,
            "lm_head.weight",
            EMBED,
            c.tie_word_embeddings,
            c.vocab_size,
            c.hidden_size,
        )
    }
}

impl Family for Mixtral {
    fn name(&self) -> &'static str {
        "mixtral"
    }

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

    fn whole_plan(&self) -> Option<WholePlan> {
        let c = &self.cfg;
        Some(WholePlan {
            family: "mixtral",
            prefix: "model.".into(),
            mixers: vec![MixerPlan::Attention; c.num_layers],
            delta: None,
            shared: SharedPlan::EXPERTS,
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            norm: NormStyle::Weight,
            eps: c.rms_norm_eps,
            attn: self.attn_spec(),
            rope: c.rope.clone(),
            num_experts: c.num_experts,
            top_k: c.top_k,
            // Mixtral always renormalises its top-k (see `forward`).
            norm_topk_prob: true,
            mlps: vec![
                MlpPlan::Moe {
                    router: self.router,
                    route: RoutePlan::Softmax,
                    shared: 0,
                };
                c.num_layers
            ],
        })
    }

    fn new_state(&mut self) -> Result<State> {
        Ok(common::attention_state(self.cfg.num_layers))
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        state: &mut State,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let c = self.cfg.clone();
        let spec = self.attn_spec();
        let sk = Skeleton {
            prefix: "model.",
            vocab: c.vocab_size,
            hidden: c.hidden_size,
            layers: c.num_layers,
            norm: NormStyle::Weight,
            eps: c.rms_norm_eps,
            head: self.lm_head(ctx.tensors)?,
        };
        let (rope, kv) = (&mut self.rope, state.host()?);
        let router = self.router;
        // Router: softmax(z) in f32, the top k, always renormalised; weights stay f32.
        let mlp = |ctx: &mut Ctx<'_>, l: usize, xn: &Batch| -> Result<Batch> {
            let w = ctx
                .tensors
                .get(&format!("model.layers.{l}.{router}"))?
                .matrix(c.num_experts, c.hidden_size)?;
            let isa = ctx.isa;
            let routes: Vec<Route> = common::router_logits(ctx, w, xn)?
                .iter()
                .map(|z| blocks::softmax_topk(isa, z, c.top_k, true))
                .collect();
            common::routed_experts(ctx, l as u32, &routes, xn)
        };
        common::decoder_forward(
            ctx,
            &sk,
            tokens,
            all_logits,
            |ctx, l, xn| {
                let prefix = format!("model.layers.{l}.self_attn");
                common::attention(
                    ctx,
                    &prefix,
                    &spec,
                    c.hidden_size,
                    rope,
                    kv[l].kv(l)?,
                    start,
                    xn,
                )
            },
            mlp,
        )
    }
}
