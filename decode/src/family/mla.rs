//! Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi-K2), as transformers 5.17 computes it in
//! `f32` (`DeepseekV3Attention`):
//!
//! - the query: `q_proj · x`, or with a query LoRA `q_b_proj · rms(q_a_proj · x)`; per head
//!   `[q_nope (nope) | q_rot (rope)]`;
//! - the latent: `kv_a_proj_with_mqa · x = [c (kv_lora_rank) | k_rot (rope)]`, one `k_rot` shared
//!   by every head; `kv_b_proj · rms(c)` gives per head `[k_nope (nope) | v (v_head_dim)]`;
//! - RoPE on `q_rot` and `k_rot` — with `rope_interleave` their dims are pairs `(x0, x1), (x2,
//!   x3), …`, which transformers rotates into the NeoX halves `[x0, x2, … | x1, x3, …]`: the
//!   same as de-interleaving, then the NeoX rotation;
//! - per head the key `[k_nope | k_rot]`, the query `[q_nope | q_rot]`, scores scaled by
//!   `(nope + rope)^-0.5` (under YaRN with `mscale_all_dim`, times `mscale²`), softmax, the
//!   weighted sum of `v`; `o_proj` of the heads' outputs.
//!
//! The two latent norms (`q_a_layernorm`, `kv_a_layernorm`) are DeepSeek-V3's `RMSNorm` of its
//! default epsilon 1e-6, whatever `rms_norm_eps` says; GLM-5.3-Flash's take `rms_norm_eps`
//! ([`MlaShape::latent_eps`]). GLM-5.3-Flash's MLA has no rotated dims (NoPE: `rope` 0) and its
//! DSA layers attend to the positions their indexer selects ([`Sparse`], [`crate::family::dsa`]).
//!
//! The cache holds each position's keys and values expanded per head (values padded with zeros
//! to the key's width, which leaves every score and every output the same bits): the same
//! attention core as every other family ([`blocks::attend`]). The latent cache and the absorbed
//! decode form are not built.

use crate::blocks::{self, AttnShape, Batch, KvCache};
use crate::error::Result;
use crate::family::common::{self, NormStyle};
use crate::family::dsa::{self, DsaShape};
use crate::family::Ctx;
use crate::rope::Rope;
use crate::weights::{TensorStore, WeightSlice};

/// DeepSeek-V3's latent norms' epsilon (transformers' `DeepseekV3RMSNorm` default).
pub const LATENT_EPS: f32 = 1e-6;

/// Which earlier positions an MLA layer's queries attend to.
#[derive(Debug)]
pub enum Sparse<'a> {
    /// Every one (DeepSeek-V3).
    Dense,
    /// Those its own DSA indexer selects; the selection is left in the `Option` for a
    /// following layer that shares it.
    Index(&'a DsaShape, &'a mut Option<Vec<Vec<usize>>>),
    /// Those a previous layer's indexer selected for the same tokens.
    Reuse(&'a [Vec<usize>]),
}

/// One MLA layer's widths.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MlaShape {
    /// Heads (queries, keys and values alike).
    pub heads: usize,
    /// `q_lora_rank`: the query's low-rank width, or none (`q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: the latent's width.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`: a head's dims without RoPE.
    pub nope: usize,
    /// `qk_rope_head_dim`: a head's rotated dims.
    pub rope: usize,
    /// `v_head_dim` (at most `nope + rope`).
    pub v: usize,
    /// `rope_interleave`: the rotated dims are stored as interleaved pairs.
    pub interleave: bool,
    /// `attention_bias`: biases on `q_a_proj`, `kv_a_proj_with_mqa` and `o_proj`.
    pub bias: bool,
    /// The latent norms' epsilon ([`LATENT_EPS`] for DeepSeek-V3, `rms_norm_eps` for
    /// GLM-5.3-Flash).
    pub latent_eps: f32,
    /// The scores' scale: `(nope + rope)^-0.5`, times `yarn_get_mscale(factor,
    /// mscale_all_dim)²` under YaRN with `mscale_all_dim` (transformers' `yarn_apply_mscale`).
    pub scale: f32,
}

impl MlaShape {
    /// What a plain attention layer of these heads would be: a [`crate::family::plan::Plan`]'s
    /// `attn` where every attention layer is MLA (DeepSeek-V3, GLM-5.3-Flash).
    pub fn attn_spec(&self, eps: f32) -> common::AttnSpec {
        common::AttnSpec {
            shape: AttnShape {
                heads: self.heads,
                kv_heads: self.heads,
                head_dim: self.qk(),
                window: None,
            },
            eps,
            qk_norm: None,
            qkv_bias: false,
            o_bias: self.bias,
            out_gate: false,
            extra: None,
        }
    }

    /// A query's and a key's width per head.
    pub fn qk(&self) -> usize {
        self.nope + self.rope
    }

    fn q_rows(&self) -> usize {
        self.heads * self.qk()
    }
}

/// Every tensor [`layer`] reads under `prefix` (e.g. `model.layers.0.self_attn`) exists with its
/// shape.
pub fn check(s: &TensorStore, prefix: &str, m: &MlaShape, hidden: usize) -> Result<()> {
    let p = |n: &str| format!("{prefix}.{n}");
    match m.q_lora_rank {
        None => {
            s.get(&p("q_proj.weight"))?.matrix(m.q_rows(), hidden)?;
        }
        Some(r) => {
            s.get(&p("q_a_proj.weight"))?.matrix(r, hidden)?;
            s.get(&p("q_a_layernorm.weight"))?.vector(r)?;
            s.get(&p("q_b_proj.weight"))?.matrix(m.q_rows(), r)?;
            if m.bias {
                s.get(&p("q_a_proj.bias"))?.vector(r)?;
            }
        }
    }
    let latent = m.kv_lora_rank + m.rope;
    s.get(&p("kv_a_proj_with_mqa.weight"))?
        .matrix(latent, hidden)?;
    s.get(&p("kv_a_layernorm.weight"))?.vector(m.kv_lora_rank)?;
    s.get(&p("kv_b_proj.weight"))?
        .matrix(m.heads * (m.nope + m.v), m.kv_lora_rank)?;
    s.get(&p("o_proj.weight"))?.matrix(hidden, m.heads * m.v)?;
    if m.bias {
        s.get(&p("kv_a_proj_with_mqa.bias"))?.vector(latent)?;
        s.get(&p("o_proj.bias"))?.vector(hidden)?;
    }
    Ok(())
}

/// `x`'s interleaved pairs `(x0, x1), (x2, x3), …` as the NeoX halves `[x0, x2, … | x1, x3, …]`.
fn deinterleave(x: &mut [f32]) {
    let pairs: Vec<f32> = x.to_vec();
    let half = x.len() / 2;
    for (j, pair) in pairs.chunks_exact(2).enumerate() {
        x[j] = pair[0];
        x[half + j] = pair[1];
    }
}

/// One MLA layer under `prefix` over a batch at positions `start..`, its keys and values stored
/// in `kv` (`rope` rotates `m.rope` dims), attending as `sparse` says.
#[allow(clippy::too_many_arguments)]
pub fn layer(
    ctx: &mut Ctx<'_>,
    prefix: &str,
    m: &MlaShape,
    hidden: usize,
    rope: &mut Rope,
    kv: &mut KvCache,
    start: usize,
    x: &Batch,
    sparse: Sparse<'_>,
) -> Result<Batch> {
    let s = ctx.tensors;
    let p = |n: &str| format!("{prefix}.{n}");
    let bias = |n: &str| -> Result<Option<WeightSlice<'_>>> {
        match m.bias {
            true => Ok(Some(s.get(&p(n))?.slice())),
            false => Ok(None),
        }
    };
    let (qk, rank) = (m.qk(), m.kv_lora_rank);
    let w_kva = s
        .get(&p("kv_a_proj_with_mqa.weight"))?
        .matrix(rank + m.rope, hidden)?;
    let b_kva = bias("kv_a_proj_with_mqa.bias")?;
    let (mut q, latent, q_resid) = match m.q_lora_rank {
        None => {
            let w_q = s.get(&p("q_proj.weight"))?.matrix(m.q_rows(), hidden)?;
            let mut out = ctx.linear_many("mla q, latent", &[(w_q, None), (w_kva, b_kva)], x)?;
            let latent = out.pop().expect("two outputs");
            (out.pop().expect("two outputs"), latent, None)
        }
        Some(r) => {
            let w_qa = s.get(&p("q_a_proj.weight"))?.matrix(r, hidden)?;
            let b_qa = bias("q_a_proj.bias")?;
            let mut out = ctx.linear_many("mla q_a, latent", &[(w_qa, b_qa), (w_kva, b_kva)], x)?;
            let latent = out.pop().expect("two outputs");
            let qa = out.pop().expect("two outputs");
            let w_n = s.get(&p("q_a_layernorm.weight"))?.vector(r)?;
            let qa = common::norm(ctx, NormStyle::Weight, &qa, w_n, m.latent_eps);
            let w_qb = s.get(&p("q_b_proj.weight"))?.matrix(m.q_rows(), r)?;
            (ctx.linear("mla q_b", w_qb, None, &qa)?, latent, Some(qa))
        }
    };
    let c: Batch = latent.iter().map(|t| t[..rank].to_vec()).collect();
    let w_n = s.get(&p("kv_a_layernorm.weight"))?.vector(rank)?;
    let c = common::norm(ctx, NormStyle::Weight, &c, w_n, m.latent_eps);
    let w_kvb = s
        .get(&p("kv_b_proj.weight"))?
        .matrix(m.heads * (m.nope + m.v), rank)?;
    let kvb = ctx.linear("mla kv_b", w_kvb, None, &c)?;
    let t0 = std::time::Instant::now();
    rope.ensure(start + x.len());
    let mut k = Vec::with_capacity(x.len());
    let mut v = Vec::with_capacity(x.len());
    for (t, ((qt, lt), kvt)) in q.iter_mut().zip(&latent).zip(&kvb).enumerate() {
        let pos = start + t;
        let mut k_rot = lt[rank..].to_vec();
        if m.interleave {
            deinterleave(&mut k_rot);
        }
        rope.apply(&mut k_rot, pos);
        let (mut kt, mut vt) = (Vec::with_capacity(m.q_rows()), vec![0.0f32; m.q_rows()]);
        for h in 0..m.heads {
            let q_rot = &mut qt[h * qk + m.nope..(h + 1) * qk];
            if m.interleave {
                deinterleave(q_rot);
            }
            rope.apply(q_rot, pos);
            let head = &kvt[h * (m.nope + m.v)..(h + 1) * (m.nope + m.v)];
            kt.extend_from_slice(&head[..m.nope]);
            kt.extend_from_slice(&k_rot);
            vt[h * qk..h * qk + m.v].copy_from_slice(&head[m.nope..]);
        }
        k.push(kt);
        v.push(vt);
    }
    let shape = AttnShape {
        heads: m.heads,
        kv_heads: m.heads,
        head_dim: qk,
        window: None,
    };
    ctx.profile.add("attention core", t0.elapsed());
    let select = match sparse {
        Sparse::Dense => None,
        Sparse::Reuse(s) => Some(s.to_vec()),
        Sparse::Index(d, keep) => {
            let q_resid = q_resid.as_ref().ok_or(crate::error::DecodeError::BadPlan {
                family: "mla",
                what: "a DSA indexer without a query LoRA",
            })?;
            let s = dsa::select(ctx, prefix, (d, hidden), kv, start, (x, q_resid))?;
            *keep = Some(s.clone());
            Some(s)
        }
    };
    let t0 = std::time::Instant::now();
    let o = match &select {
        None => blocks::attend_scaled(ctx.isa, shape, m.scale, kv, start, &q, &k, &v),
        Some(sel) => blocks::attend_selected(ctx.isa, shape, m.scale, kv, start, &q, &k, &v, sel),
    };
    let o: Batch = o
        .iter()
        .map(|ot| {
            ot.chunks_exact(qk)
                .flat_map(|head| head[..m.v].iter().copied())
                .collect()
        })
        .collect();
    ctx.profile.add("attention core", t0.elapsed());
    let w_o = s.get(&p("o_proj.weight"))?.matrix(hidden, m.heads * m.v)?;
    ctx.linear("attention o", w_o, bias("o_proj.bias")?, &o)
}

#[cfg(test)]
mod tests {
    use super::deinterleave;

    #[test]
    fn interleaved_pairs_become_the_neox_halves() {
        let mut x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        deinterleave(&mut x);
        assert_eq!(x, [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
    }
}
