//! `qwen3_moe` (Qwen3MoeForCausalLM) as transformers 5.17 computes it in `f32`
//! (`research/model-families.md` §2): RMSNorm, GQA attention with per-head q/k RMSNorm before
//! full-width NeoX RoPE, a softmax top-k router (`norm_topk_prob` as configured, default false),
//! SwiGLU experts combined in selection-slot order, dense MLP layers per `mlp_only_layers` and
//! `decoder_sparse_step`, final norm, `lm_head` (or the tied embedding).

use crate::blocks::{self, AttnShape, Batch, KvCache, MoeOutputs, Route};
use crate::config::{bad, limits, ConfigReader, RopeConfig};
use crate::error::{DecodeError, Result};
use crate::family::{Ctx, Family};
use crate::rope::Rope;
use crate::weights::{MatrixRef, TensorStore, WeightSlice};

/// The config keys the forward pass reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen3MoeConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `intermediate_size` (dense layers).
    pub intermediate_size: usize,
    /// `num_hidden_layers`.
    pub num_layers: usize,
    /// `num_attention_heads`.
    pub heads: usize,
    /// `num_key_value_heads`.
    pub kv_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`).
    pub head_dim: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// RoPE base and rotated dims.
    pub rope: RopeConfig,
    /// `attention_bias`: biases on q, k, v and o.
    pub attention_bias: bool,
    /// `sliding_window` when `use_sliding_window`.
    pub window: Option<usize>,
    /// `num_experts` / `num_local_experts`.
    pub num_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// `norm_topk_prob` (default false).
    pub norm_topk_prob: bool,
    /// `decoder_sparse_step` (default 1).
    pub decoder_sparse_step: usize,
    /// `mlp_only_layers` (default empty).
    pub mlp_only_layers: Vec<usize>,
    /// `tie_word_embeddings` (default false).
    pub tie_word_embeddings: bool,
}

impl Qwen3MoeConfig {
    /// Parse from the architecture config.
    pub fn parse(v: &serde_json::Value) -> Result<Qwen3MoeConfig> {
        use limits::*;
        let c = ConfigReader::new(v)?;
        let hidden_size = c.positive("hidden_size", MAX_DIM)?;
        let heads = c.positive("num_attention_heads", MAX_HEADS)?;
        let kv_heads = c.usize("num_key_value_heads", MAX_HEADS)?.unwrap_or(heads);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                &format!("{kv_heads} does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = c.usize("head_dim", MAX_DIM)?.unwrap_or(hidden_size / heads);
        if head_dim == 0 {
            return Err(bad("head_dim", "must be at least 1"));
        }
        let num_experts = match c.usize("num_experts", MAX_EXPERTS)? {
            Some(n) => n,
            None => c.usize("num_local_experts", MAX_EXPERTS)?.unwrap_or(128),
        };
        let top_k = c.usize("num_experts_per_tok", MAX_EXPERTS)?.unwrap_or(8);
        if num_experts > 0 && (top_k == 0 || top_k > num_experts) {
            return Err(bad(
                "num_experts_per_tok",
                &format!("{top_k} is not in 1..={num_experts}"),
            ));
        }
        let eps = c.f64("rms_norm_eps")?.unwrap_or(1e-6);
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad(
                "rms_norm_eps",
                &format!("{eps} is not a finite non-negative number"),
            ));
        }
        // transformers: the window applies only with use_sliding_window; an absent key means the
        // class default 4096, an explicit null means no window; 0 would attend to nothing.
        let window = if c.bool("use_sliding_window")?.unwrap_or(false) {
            match v.get("sliding_window") {
                None => Some(4096),
                Some(serde_json::Value::Null) => None,
                Some(_) => match c.usize("sliding_window", usize::MAX)? {
                    Some(0) => return Err(bad("sliding_window", "must be at least 1")),
                    w => w,
                },
            }
        } else {
            None
        };
        let decoder_sparse_step = c.usize("decoder_sparse_step", MAX_LAYERS)?.unwrap_or(1);
        if decoder_sparse_step == 0 {
            return Err(bad("decoder_sparse_step", "must be at least 1"));
        }
        Ok(Qwen3MoeConfig {
            vocab_size: c.positive("vocab_size", MAX_VOCAB)?,
            hidden_size,
            intermediate_size: c.usize("intermediate_size", MAX_DIM)?.unwrap_or(6144),
            num_layers: c.positive("num_hidden_layers", MAX_LAYERS)?,
            heads,
            kv_heads,
            head_dim,
            rms_norm_eps: eps as f32,
            rope: RopeConfig::read(&c, head_dim, 10000.0, 1.0)?,
            attention_bias: c.bool("attention_bias")?.unwrap_or(false),
            window,
            num_experts,
            top_k,
            norm_topk_prob: c.bool("norm_topk_prob")?.unwrap_or(false),
            decoder_sparse_step,
            mlp_only_layers: c.usize_list("mlp_only_layers")?.unwrap_or_default(),
            tie_word_embeddings: c.bool("tie_word_embeddings")?.unwrap_or(false),
        })
    }

    /// Whether layer `l` is a MoE layer (else a dense MLP).
    pub fn is_moe(&self, l: usize) -> bool {
        !self.mlp_only_layers.contains(&l)
            && self.num_experts > 0
            && (l + 1).is_multiple_of(self.decoder_sparse_step)
    }
}

/// The qwen3_moe decoder: config, RoPE tables, one KV cache per layer.
#[derive(Debug)]
pub struct Qwen3Moe {
    cfg: Qwen3MoeConfig,
    rope: Rope,
    kv: Vec<KvCache>,
}

impl Qwen3Moe {
    /// Check the config against the resident tensors (names and shapes) and build the state.
    pub fn new(cfg: Qwen3MoeConfig, store: &TensorStore) -> Result<Qwen3Moe> {
        let m = Qwen3Moe {
            rope: Rope::new(cfg.rope.theta, cfg.rope.rotary_dim),
            kv: vec![KvCache::default(); cfg.num_layers],
            cfg,
        };
        m.check(store)?;
        Ok(m)
    }

    /// Every tensor the forward pass reads exists with its shape, before any token is run.
    fn check(&self, s: &TensorStore) -> Result<()> {
        let c = &self.cfg;
        let (h, d) = (c.hidden_size, c.head_dim);
        s.get("model.embed_tokens.weight")?
            .matrix(c.vocab_size, h)?;
        s.get("model.norm.weight")?.vector(h)?;
        self.lm_head(s)?;
        for l in 0..c.num_layers {
            let p = |n: &str| format!("model.layers.{l}.{n}");
            s.get(&p("input_layernorm.weight"))?.vector(h)?;
            s.get(&p("post_attention_layernorm.weight"))?.vector(h)?;
            s.get(&p("self_attn.q_proj.weight"))?
                .matrix(c.heads * d, h)?;
            s.get(&p("self_attn.k_proj.weight"))?
                .matrix(c.kv_heads * d, h)?;
            s.get(&p("self_attn.v_proj.weight"))?
                .matrix(c.kv_heads * d, h)?;
            s.get(&p("self_attn.o_proj.weight"))?
                .matrix(h, c.heads * d)?;
            s.get(&p("self_attn.q_norm.weight"))?.vector(d)?;
            s.get(&p("self_attn.k_norm.weight"))?.vector(d)?;
            if c.attention_bias {
                s.get(&p("self_attn.q_proj.bias"))?.vector(c.heads * d)?;
                s.get(&p("self_attn.k_proj.bias"))?.vector(c.kv_heads * d)?;
                s.get(&p("self_attn.v_proj.bias"))?.vector(c.kv_heads * d)?;
                s.get(&p("self_attn.o_proj.bias"))?.vector(h)?;
            }
            if c.is_moe(l) {
                s.get(&p("mlp.gate.weight"))?.matrix(c.num_experts, h)?;
            } else {
                let i = c.intermediate_size;
                s.get(&p("mlp.gate_proj.weight"))?.matrix(i, h)?;
                s.get(&p("mlp.up_proj.weight"))?.matrix(i, h)?;
                s.get(&p("mlp.down_proj.weight"))?.matrix(h, i)?;
            }
        }
        Ok(())
    }

    fn lm_head<'s>(&self, s: &'s TensorStore) -> Result<MatrixRef<'s>> {
        let c = &self.cfg;
        let name = match s.find("lm_head.weight") {
            Some(_) => "lm_head.weight",
            None if c.tie_word_embeddings => "model.embed_tokens.weight",
            None => "lm_head.weight",
        };
        s.get(name)?.matrix(c.vocab_size, c.hidden_size)
    }

    fn attention(&mut self, ctx: &mut Ctx<'_>, l: usize, start: usize, x: &Batch) -> Result<Batch> {
        let c = &self.cfg;
        let s = ctx.tensors;
        let (h, d) = (c.hidden_size, c.head_dim);
        let p = |n: &str| format!("model.layers.{l}.self_attn.{n}");
        let bias = |n: &str| -> Result<Option<WeightSlice<'_>>> {
            if c.attention_bias {
                Ok(Some(s.get(&p(n))?.slice()))
            } else {
                Ok(None)
            }
        };
        let wq = s.get(&p("q_proj.weight"))?.matrix(c.heads * d, h)?;
        let wk = s.get(&p("k_proj.weight"))?.matrix(c.kv_heads * d, h)?;
        let wv = s.get(&p("v_proj.weight"))?.matrix(c.kv_heads * d, h)?;
        let wo = s.get(&p("o_proj.weight"))?.matrix(h, c.heads * d)?;
        let qn = s.get(&p("q_norm.weight"))?.vector(d)?;
        let kn = s.get(&p("k_norm.weight"))?.vector(d)?;
        let (bq, bk, bv) = (
            bias("q_proj.bias")?,
            bias("k_proj.bias")?,
            bias("v_proj.bias")?,
        );
        let isa = ctx.isa;
        let mut qkv = ctx.profile.time("attention q/k/v", || {
            blocks::linear_many(isa, &[(wq, bq), (wk, bk), (wv, bv)], x)
        });
        let v = qkv.pop().expect("three outputs");
        let mut k = qkv.pop().expect("three outputs");
        let mut q = qkv.pop().expect("three outputs");
        let shape = AttnShape {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: d,
            window: c.window,
        };
        let (rope, kv) = (&mut self.rope, &mut self.kv[l]);
        let o = ctx.profile.time("attention core", || {
            rope.ensure(start + x.len());
            for (t, (qt, kt)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                blocks::rms_norm_heads(isa, qt, d, qn, c.rms_norm_eps);
                blocks::rms_norm_heads(isa, kt, d, kn, c.rms_norm_eps);
                blocks::rope_heads(rope, qt, d, start + t);
                blocks::rope_heads(rope, kt, d, start + t);
            }
            blocks::attend(isa, shape, kv, start, &q, &k, &v)
        });
        let bo = bias("o_proj.bias")?;
        Ok(ctx
            .profile
            .time("attention o", || blocks::linear(isa, wo, bo, &o)))
    }

    fn mlp(&self, ctx: &mut Ctx<'_>, l: usize, x: &Batch) -> Result<Batch> {
        let c = &self.cfg;
        let s = ctx.tensors;
        let p = |n: &str| format!("model.layers.{l}.mlp.{n}");
        if !c.is_moe(l) {
            let i = c.intermediate_size;
            let g = s.get(&p("gate_proj.weight"))?.matrix(i, c.hidden_size)?;
            let u = s.get(&p("up_proj.weight"))?.matrix(i, c.hidden_size)?;
            let dn = s.get(&p("down_proj.weight"))?.matrix(c.hidden_size, i)?;
            let isa = ctx.isa;
            return Ok(ctx
                .profile
                .time("dense mlp", || blocks::swiglu(isa, g, u, dn, x)));
        }
        let router = s
            .get(&p("gate.weight"))?
            .matrix(c.num_experts, c.hidden_size)?;
        let isa = ctx.isa;
        let routes: Vec<Route> = ctx.profile.time("router", || {
            blocks::linear(isa, router, None, x)
                .iter()
                .map(|z| blocks::softmax_topk(isa, z, c.top_k, c.norm_topk_prob))
                .collect()
        });
        let t = std::time::Instant::now();
        let out = routed_experts(ctx, l as u32, &routes, x);
        ctx.profile
            .add("experts (read, check, compute)", t.elapsed());
        out
    }
}

/// Run each selected expert once over the tokens routed to it (experts in any order: each output
/// lands in its token's selection slot), then combine per token in slot order.
pub fn routed_experts(ctx: &mut Ctx<'_>, layer: u32, routes: &[Route], x: &Batch) -> Result<Batch> {
    let mut wanted: Vec<u32> = routes.iter().flat_map(|r| r.iter().map(|s| s.0)).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let hidden = x.first().map_or(0, |v| v.len());
    // (token, slot, weight) pairs routed to expert e, in token order.
    let routed_to = |e: u32| -> Vec<(usize, usize, f32)> {
        routes
            .iter()
            .enumerate()
            .flat_map(|(t, r)| {
                r.iter()
                    .enumerate()
                    .filter(move |(_, s)| s.0 == e)
                    .map(move |(k, s)| (t, k, s.1))
            })
            .collect()
    };
    let mut outs = MoeOutputs::new(routes);
    let isa = ctx.isa;
    ctx.experts.with_experts(layer, &wanted, |views| {
        let mine: Vec<Vec<(usize, usize, f32)>> =
            views.iter().map(|v| routed_to(v.expert)).collect();
        let xs: Vec<Batch> = mine
            .iter()
            .map(|m| m.iter().map(|&(t, _, _)| x[t].clone()).collect())
            .collect();
        let items: Vec<_> = views
            .iter()
            .cloned()
            .zip(xs.iter().map(|b| b.as_slice()))
            .collect();
        let ys = blocks::experts_swiglu(isa, &items, hidden)?;
        for (m, y) in mine.iter().zip(&ys) {
            for (&(t, k, w), yt) in m.iter().zip(y) {
                outs.put(t, k, yt, w);
            }
        }
        Ok(())
    })?;
    Ok(outs.combine())
}

impl Family for Qwen3Moe {
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
        for kv in &mut self.kv {
            *kv = KvCache::default();
        }
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx<'_>,
        tokens: &[u32],
        start: usize,
        all_logits: bool,
    ) -> Result<Batch> {
        let c = self.cfg.clone();
        let s = ctx.tensors;
        let embed = s
            .get("model.embed_tokens.weight")?
            .matrix(c.vocab_size, c.hidden_size)?;
        let mut x: Batch = tokens
            .iter()
            .map(|&t| {
                if t as usize >= c.vocab_size {
                    return Err(DecodeError::TokenOutOfRange {
                        id: t,
                        vocab: c.vocab_size,
                    });
                }
                let row = embed.row(t as usize);
                Ok((0..c.hidden_size).map(|i| row.get(i)).collect())
            })
            .collect::<Result<_>>()?;
        for l in 0..c.num_layers {
            let p = |n: &str| format!("model.layers.{l}.{n}");
            let w_in = s.get(&p("input_layernorm.weight"))?.vector(c.hidden_size)?;
            let xn = blocks::rms_norm(ctx.isa, &x, w_in, c.rms_norm_eps);
            let a = self.attention(ctx, l, start, &xn)?;
            blocks::add_into(&mut x, &a);
            let w_post = s
                .get(&p("post_attention_layernorm.weight"))?
                .vector(c.hidden_size)?;
            let xn = blocks::rms_norm(ctx.isa, &x, w_post, c.rms_norm_eps);
            let m = self.mlp(ctx, l, &xn)?;
            blocks::add_into(&mut x, &m);
        }
        let keep = if all_logits {
            0
        } else {
            x.len().saturating_sub(1)
        };
        let w_norm = s.get("model.norm.weight")?.vector(c.hidden_size)?;
        let xn = blocks::rms_norm(ctx.isa, &x[keep..], w_norm, c.rms_norm_eps);
        let (isa, head) = (ctx.isa, self.lm_head(s)?);
        Ok(ctx
            .profile
            .time("lm_head", || blocks::linear(isa, head, None, &xn)))
    }
}
