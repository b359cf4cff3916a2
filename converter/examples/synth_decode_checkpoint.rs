//! Write a generated Qwen3-MoE checkpoint that a decoder can run: the layout of Qwen3-30B-A3B's
//! layers (hidden 2048, 32 query heads and 4 key/value heads of head_dim 128, 128 experts of
//! intermediate 768, top-8) with a complete `config.json`, and weights drawn like a trained
//! model's (BF16 of about normal(0, 0.02); norm weights about 1), so that a forward pass stays
//! finite and the router spreads tokens over the experts. For benchmarking `tarfa run` against
//! llama.cpp on the same weights (`bench/llama/`):
//!
//! ```sh
//! cargo build --release -p tarfa-converter --example synth_decode_checkpoint
//! target/release/examples/synth_decode_checkpoint DIR LAYERS [SHARDS [VOCAB]]
//! ```
//! Each layer is about 1.25 GB (BF16); 10 layers with the default vocabulary of 32,768 make
//! 12.73 GB (11.9 GiB). Values are deterministic: element `i` of a tensor is a function of the
//! tensor's name and `i` alone (splitmix64, a sum of four 16-bit uniforms, rounded to nearest
//! even BF16), so every machine writes the same bytes; shards are written in parallel.
//!
//! With `SYNTH_FAMILY=glm4_moe` it writes a GLM-4.5-shaped checkpoint of the same widths instead:
//! layer 0 a dense MLP (intermediate 6144), then MoE layers with the sigmoid router and its
//! `e_score_correction_bias`, one shared expert of width 768, q/k/v biases without q/k norm,
//! rotary on half of each head, `routed_scaling_factor` 2.5 (GLM-4.5's).
//!
//! With `SYNTH_FAMILY=qwen3_5_moe` it writes a Qwen3.5-MoE text checkpoint
//! (`Qwen3_5MoeForCausalLM`, `model_type` `qwen3_5_moe_text`) shaped like Qwen3.5-35B-A3B's
//! layers: hidden 2048; `layer_types` three `linear_attention` (Gated DeltaNet: 16 key heads and
//! 32 value heads of 128, conv kernel 4) then one `full_attention` (16 query heads, 2 key/value
//! heads of head_dim 256, gated `q_proj` of 2·16·256 rows, per head `[q_h | gate_h]`, q/k norm,
//! rotary on a quarter of each head), repeating; every layer MoE with 256 experts of 512, top-8,
//! one shared expert of 512 behind a sigmoid `shared_expert_gate`. LAYERS must be at least 4
//! (layer `l` is full attention where `(l + 1) % 4 == 0`: 10 layers are 8 DeltaNet and 2
//! full-attention layers, the last two DeltaNet). Its RMSNorm weights (input/post-attention,
//! final, q/k norm) are zero-centred (applied as 1 + w) and drawn about 0 (std 0.05); the
//! DeltaNet output norm is applied as w and drawn about 1; `A_log` and `dt_bias` about 1.0
//! (std 0.5), `conv1d` std 0.2. About 1.69 GB a layer (BF16; the 256 experts are 1.61 GB of
//! it); 10 layers with the default vocabulary of 32,768 make 17.10 GB (15.9 GiB), 4 layers with
//! a vocabulary of 4096 make 6.76 GB.
//!
//! With `SYNTH_FAMILY=glm5_next` it writes GLM-5.3-Flash's text model as its vision-language
//! checkpoint holds it (`Glm5NextForConditionalGeneration`, `model_type` `glm5_next` with a
//! `text_config`, tensors under `model.language_model.`, no vision tower) at GLM-5.3-Flash's
//! widths: hidden 4096; four hyper-connection streams (20 Sinkhorn iterations); layers `l` with
//! `l % 4 == 3` NoPE MLA with DeepSeek sparse attention (64 heads of 256, query LoRA 1536, latent
//! 512; each its own indexer of 32 heads of 128 over pools of 16 keeping 2048 positions, as
//! GLM-5.3-Flash's default schedule), the others Kimi delta
//! attention (64 heads of 128, conv kernel 4, gate lower bound -5); layer 0 a dense MLP (12288),
//! then MoE layers of `GLM5_EXPERTS` experts (default 32; GLM-5.3-Flash has 288, each 50.3 MB)
//! of 2048, top-8, sigmoid router with correction bias, one shared expert, scaled by 2.5; every
//! SwiGLU clamped at 10. KDA's `A_log` about 0 (std 0.5), `dt_bias` about -4 (std 0.5: a decay
//! step near 0.02, FLA's range); the hyper-connections' `fn` std 0.02, `base` about 0 and
//! `scale` about 1. 8 layers of 32 experts with the default vocabulary make 14.63 GB (13.63 GiB).
//!
//! With `SYNTH_FAMILY=deepseek_v3` it writes a DeepSeek-V3-architecture checkpoint at
//! Moonlight-16B-A3B's widths (Moonshot's `deepseek_v3` model) with DeepSeek-V3's query LoRA
//! (1536: llama.cpp's deepseek2 requires one outside its "lite" layer counts): hidden 2048;
//! multi-head latent attention of 16 heads (latent 512, 128 + 64 rotated query/key dims, values
//! of 128, interleaved rotary pairs, base 50,000); layer 0 a dense MLP (11264), then MoE layers
//! of 64 experts of 1408, top-6, sigmoid router with correction bias in one group, two shared
//! experts (2816 wide), scaled by 2.446. About 1.17 GB a layer; 10 layers with the default
//! vocabulary make 11.9 GB.
//!
//! With `SYNTH_FAMILY=mimo_v2_flash` it writes a MiMo-V2-Flash checkpoint at its widths, less
//! the routed experts (`MIMO_EXPERTS`, default 32; the model has 256, each 50.3 MB): hidden
//! 4096; 64 query heads of 192 (a third rotated: 64 dims), values of 128 scaled by 0.707; layer
//! 0 and every sixth full attention (4 key/value heads, RoPE base 5,000,000), the others sliding
//! over 128 positions (8 key/value heads, base 10,000, a sink logit per head); layer 0 a dense
//! MLP (16384), then MoE layers of experts of 2048, top-8, sigmoid router with correction bias,
//! no shared expert, unscaled. 8 layers of 32 experts with the default vocabulary make 13.9 GB.

// The GLM-5.3-Flash config is one `json!` of 40 keys.
#![recursion_limit = "256"]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

const HIDDEN: u64 = 2048;
const HEADS: u64 = 32;
const KV_HEADS: u64 = 4;
const HEAD_DIM: u64 = 128;
const EXPERTS: u64 = 128;
const TOP_K: u64 = 8;
const MOE_INTER: u64 = 768;
const DENSE_INTER: u64 = 6144;

/// Qwen3.5-35B-A3B's widths (`SYNTH_FAMILY=qwen3_5_moe`).
mod q35 {
    pub const HEADS: u64 = 16;
    pub const KV_HEADS: u64 = 2;
    pub const HEAD_DIM: u64 = 256;
    pub const EXPERTS: u64 = 256;
    pub const MOE_INTER: u64 = 512;
    pub const SHARED_INTER: u64 = 512;
    pub const LIN_K_HEADS: u64 = 16;
    pub const LIN_V_HEADS: u64 = 32;
    pub const LIN_K_DIM: u64 = 128;
    pub const LIN_V_DIM: u64 = 128;
    pub const CONV_KERNEL: u64 = 4;
    pub const FULL_EVERY: u64 = 4;
}

/// GLM-5.3-Flash's widths (`SYNTH_FAMILY=glm5_next`; transformers' `Glm5NextTextConfig`
/// defaults), less the routed experts (`GLM5_EXPERTS`).
mod g5 {
    pub const HIDDEN: u64 = 4096;
    pub const HEADS: u64 = 64;
    pub const NOPE: u64 = 256;
    pub const V_DIM: u64 = 256;
    pub const Q_LORA: u64 = 1536;
    pub const KV_LORA: u64 = 512;
    pub const INDEX_HEADS: u64 = 32;
    pub const INDEX_DIM: u64 = 128;
    pub const INDEX_TOPK: u64 = 2048;
    pub const KPOOL: u64 = 16;
    pub const LIN_HEADS: u64 = 64;
    pub const LIN_DIM: u64 = 128;
    pub const CONV_KERNEL: u64 = 4;
    pub const MOE_INTER: u64 = 2048;
    pub const DENSE_INTER: u64 = 12288;
    pub const HC: u64 = 4;
    pub const EXPERTS: u64 = 32;
    /// The fewest experts a top-8 router can choose from.
    pub const TOP_K_MIN: u64 = super::TOP_K;
    /// Layer `l` is MLA with DSA (the others KDA), as the config's default `layer_types`.
    pub fn dsa(l: u64) -> bool {
        l % 4 == 3
    }
}

/// Moonlight-16B-A3B's widths (`SYNTH_FAMILY=deepseek_v3`: DeepSeek-V3's architecture).
mod ds {
    pub const HEADS: u64 = 16;
    pub const Q_LORA: u64 = 1536;
    pub const KV_LORA: u64 = 512;
    pub const NOPE: u64 = 128;
    pub const ROPE: u64 = 64;
    pub const V_DIM: u64 = 128;
    pub const EXPERTS: u64 = 64;
    pub const TOP_K: u64 = 6;
    pub const MOE_INTER: u64 = 1408;
    pub const SHARED: u64 = 2;
    pub const DENSE_INTER: u64 = 11264;
    pub const SCALE: f64 = 2.446;
}

/// MiMo-V2-Flash's widths (`SYNTH_FAMILY=mimo_v2_flash`), less the routed experts
/// (`MIMO_EXPERTS`).
mod mimo {
    pub const HIDDEN: u64 = 4096;
    pub const HEADS: u64 = 64;
    pub const KV_HEADS: u64 = 4;
    pub const HEAD_DIM: u64 = 192;
    pub const V_DIM: u64 = 128;
    pub const WINDOW: u64 = 128;
    pub const MOE_INTER: u64 = 2048;
    pub const DENSE_INTER: u64 = 16384;
    pub const EXPERTS: u64 = 32;
    /// Layer `l` slides (the others full attention), as transformers' default `layer_types`.
    pub fn sliding(l: u64) -> bool {
        !(l == 0 || (l + 1) % 6 == 0)
    }
}

/// One tensor: name, shape, and the mean and standard deviation its values are drawn with.
struct Tensor {
    name: String,
    shape: Vec<u64>,
    mean: f32,
    std: f32,
}

impl Tensor {
    /// A tensor drawn about `mean` with standard deviation `std`.
    fn drawn(name: String, shape: Vec<u64>, mean: f32, std: f32) -> Tensor {
        Tensor {
            name,
            shape,
            mean,
            std,
        }
    }

    fn bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * 2
    }
}

/// The architectures written (named as their `model_type`s: every one a MoE).
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
enum Family {
    Qwen3Moe,
    Glm4Moe,
    Qwen3_5Moe,
    Glm5Next,
    DeepseekV3,
    MimoV2Flash,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Qwen3Moe => "qwen3_moe",
            Family::Glm4Moe => "glm4_moe",
            Family::Qwen3_5Moe => "qwen3_5_moe",
            Family::Glm5Next => "glm5_next",
            Family::DeepseekV3 => "deepseek_v3",
            Family::MimoV2Flash => "mimo_v2_flash",
        }
    }
}

/// Layer `l` of a Qwen3.5 checkpoint is full attention (the others Gated DeltaNet).
fn q35_full(l: u64) -> bool {
    (l + 1) % q35::FULL_EVERY == 0
}

fn tensors(family: Family, layers: u64, vocab: u64, experts: u64) -> Vec<Tensor> {
    match family {
        Family::Qwen3_5Moe => return tensors_q35(layers, vocab),
        Family::Glm5Next => return tensors_g5(layers, vocab, experts),
        Family::DeepseekV3 => return tensors_ds(layers, vocab),
        Family::MimoV2Flash => return tensors_mimo(layers, vocab, experts),
        Family::Qwen3Moe | Family::Glm4Moe => {}
    }
    let glm = family == Family::Glm4Moe;
    let w = |name: String, shape: Vec<u64>| Tensor {
        name,
        shape,
        mean: 0.0,
        std: 0.02,
    };
    let norm = |name: String, n: u64| Tensor {
        name,
        shape: vec![n],
        mean: 1.0,
        std: 0.05,
    };
    let (h, q, kv, i) = (HIDDEN, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, MOE_INTER);
    let mut t = vec![w("model.embed_tokens.weight".into(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        t.push(norm(format!("{p}.input_layernorm.weight"), h));
        t.push(w(format!("{p}.self_attn.q_proj.weight"), vec![q, h]));
        t.push(w(format!("{p}.self_attn.k_proj.weight"), vec![kv, h]));
        t.push(w(format!("{p}.self_attn.v_proj.weight"), vec![kv, h]));
        t.push(w(format!("{p}.self_attn.o_proj.weight"), vec![h, q]));
        if glm {
            t.push(w(format!("{p}.self_attn.q_proj.bias"), vec![q]));
            t.push(w(format!("{p}.self_attn.k_proj.bias"), vec![kv]));
            t.push(w(format!("{p}.self_attn.v_proj.bias"), vec![kv]));
        } else {
            t.push(norm(format!("{p}.self_attn.q_norm.weight"), HEAD_DIM));
            t.push(norm(format!("{p}.self_attn.k_norm.weight"), HEAD_DIM));
        }
        t.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
        if glm && l == 0 {
            t.push(w(format!("{p}.mlp.gate_proj.weight"), vec![DENSE_INTER, h]));
            t.push(w(format!("{p}.mlp.up_proj.weight"), vec![DENSE_INTER, h]));
            t.push(w(format!("{p}.mlp.down_proj.weight"), vec![h, DENSE_INTER]));
            continue;
        }
        t.push(w(format!("{p}.mlp.gate.weight"), vec![EXPERTS, h]));
        if glm {
            t.push(w(
                format!("{p}.mlp.gate.e_score_correction_bias"),
                vec![EXPERTS],
            ));
            for n in ["gate_proj", "up_proj"] {
                t.push(w(format!("{p}.mlp.shared_experts.{n}.weight"), vec![i, h]));
            }
            t.push(w(
                format!("{p}.mlp.shared_experts.down_proj.weight"),
                vec![h, i],
            ));
        }
        for x in 0..EXPERTS {
            t.push(w(
                format!("{p}.mlp.experts.{x}.gate_proj.weight"),
                vec![i, h],
            ));
            t.push(w(format!("{p}.mlp.experts.{x}.up_proj.weight"), vec![i, h]));
            t.push(w(
                format!("{p}.mlp.experts.{x}.down_proj.weight"),
                vec![h, i],
            ));
        }
    }
    t.push(norm("model.norm.weight".into(), h));
    t.push(w("lm_head.weight".into(), vec![vocab, h]));
    t
}

/// A SwiGLU's three matrices under `prefix` (`gate_proj`, `up_proj` `[inter, h]`, `down_proj`
/// `[h, inter]`), drawn as the other matrices (std 0.02).
fn swiglu(v: &mut Vec<Tensor>, prefix: &str, inter: u64, h: u64) {
    for (n, shape) in [
        ("gate_proj", [inter, h]),
        ("up_proj", [inter, h]),
        ("down_proj", [h, inter]),
    ] {
        v.push(Tensor {
            name: format!("{prefix}.{n}.weight"),
            shape: shape.to_vec(),
            mean: 0.0,
            std: 0.02,
        });
    }
}

/// DeepSeek-V3 (`deepseek_v3`) at Moonlight's widths: the tensors of `DeepseekV3ForCausalLM` as
/// transformers names them, experts per expert.
fn tensors_ds(layers: u64, vocab: u64) -> Vec<Tensor> {
    use ds::*;
    let t = Tensor::drawn;
    let w = |name: String, shape: Vec<u64>| t(name, shape, 0.0, 0.02);
    let norm = |name: String, n: u64| t(name, vec![n], 1.0, 0.05);
    let h = HIDDEN;
    let mut v = vec![w("model.embed_tokens.weight".into(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let a = |n: &str| format!("{p}.self_attn.{n}");
        v.push(norm(format!("{p}.input_layernorm.weight"), h));
        v.push(w(a("q_a_proj.weight"), vec![Q_LORA, h]));
        v.push(norm(a("q_a_layernorm.weight"), Q_LORA));
        v.push(w(a("q_b_proj.weight"), vec![HEADS * (NOPE + ROPE), Q_LORA]));
        v.push(w(a("kv_a_proj_with_mqa.weight"), vec![KV_LORA + ROPE, h]));
        v.push(norm(a("kv_a_layernorm.weight"), KV_LORA));
        v.push(w(
            a("kv_b_proj.weight"),
            vec![HEADS * (NOPE + V_DIM), KV_LORA],
        ));
        v.push(w(a("o_proj.weight"), vec![h, HEADS * V_DIM]));
        v.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
        if l == 0 {
            swiglu(&mut v, &format!("{p}.mlp"), DENSE_INTER, h);
            continue;
        }
        v.push(w(format!("{p}.mlp.gate.weight"), vec![EXPERTS, h]));
        v.push(w(
            format!("{p}.mlp.gate.e_score_correction_bias"),
            vec![EXPERTS],
        ));
        swiglu(
            &mut v,
            &format!("{p}.mlp.shared_experts"),
            SHARED * MOE_INTER,
            h,
        );
        for x in 0..EXPERTS {
            swiglu(&mut v, &format!("{p}.mlp.experts.{x}"), MOE_INTER, h);
        }
    }
    v.push(norm("model.norm.weight".into(), h));
    v.push(w("lm_head.weight".into(), vec![vocab, h]));
    v
}

/// MiMo-V2-Flash (`mimo_v2_flash`): the tensors of `MiMoV2FlashForCausalLM` as transformers
/// names them, experts per expert.
fn tensors_mimo(layers: u64, vocab: u64, experts: u64) -> Vec<Tensor> {
    use mimo::*;
    let t = Tensor::drawn;
    let w = |name: String, shape: Vec<u64>| t(name, shape, 0.0, 0.02);
    let norm = |name: String, n: u64| t(name, vec![n], 1.0, 0.05);
    let h = HIDDEN;
    let mut v = vec![w("model.embed_tokens.weight".into(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let a = |n: &str| format!("{p}.self_attn.{n}");
        let kv = if sliding(l) { 2 * KV_HEADS } else { KV_HEADS };
        v.push(norm(format!("{p}.input_layernorm.weight"), h));
        v.push(w(a("q_proj.weight"), vec![HEADS * HEAD_DIM, h]));
        v.push(w(a("k_proj.weight"), vec![kv * HEAD_DIM, h]));
        v.push(w(a("v_proj.weight"), vec![kv * V_DIM, h]));
        v.push(w(a("o_proj.weight"), vec![h, HEADS * V_DIM]));
        if sliding(l) {
            v.push(t(a("attention_sink_bias"), vec![HEADS], 0.0, 1.0));
        }
        v.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
        if l == 0 {
            swiglu(&mut v, &format!("{p}.mlp"), DENSE_INTER, h);
            continue;
        }
        v.push(w(format!("{p}.mlp.gate.weight"), vec![experts, h]));
        v.push(w(
            format!("{p}.mlp.gate.e_score_correction_bias"),
            vec![experts],
        ));
        for x in 0..experts {
            swiglu(&mut v, &format!("{p}.mlp.experts.{x}"), MOE_INTER, h);
        }
    }
    v.push(norm("model.norm.weight".into(), h));
    v.push(w("lm_head.weight".into(), vec![vocab, h]));
    v
}

/// Qwen3.5-MoE (`qwen3_5_moe_text`): the tensors of `Qwen3_5MoeForCausalLM` as transformers
/// names them, experts per expert as for the other families.
fn tensors_q35(layers: u64, vocab: u64) -> Vec<Tensor> {
    use q35::*;
    let t = Tensor::drawn;
    let w = |name: String, shape: Vec<u64>| t(name, shape, 0.0, 0.02);
    // Zero-centred RMSNorm weights (applied as 1 + w).
    let norm0 = |name: String, n: u64| t(name, vec![n], 0.0, 0.05);
    let h = HIDDEN;
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let (key_dim, value_dim) = (LIN_K_HEADS * LIN_K_DIM, LIN_V_HEADS * LIN_V_DIM);
    let conv_dim = 2 * key_dim + value_dim;
    let mut v = vec![w("model.embed_tokens.weight".into(), vec![vocab, h])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        v.push(norm0(format!("{p}.input_layernorm.weight"), h));
        if q35_full(l) {
            let a = format!("{p}.self_attn");
            v.push(w(format!("{a}.q_proj.weight"), vec![2 * q, h]));
            v.push(w(format!("{a}.k_proj.weight"), vec![kv, h]));
            v.push(w(format!("{a}.v_proj.weight"), vec![kv, h]));
            v.push(w(format!("{a}.o_proj.weight"), vec![h, q]));
            v.push(norm0(format!("{a}.q_norm.weight"), HEAD_DIM));
            v.push(norm0(format!("{a}.k_norm.weight"), HEAD_DIM));
        } else {
            let a = format!("{p}.linear_attn");
            v.push(w(format!("{a}.in_proj_qkv.weight"), vec![conv_dim, h]));
            v.push(w(format!("{a}.in_proj_z.weight"), vec![value_dim, h]));
            v.push(w(format!("{a}.in_proj_b.weight"), vec![LIN_V_HEADS, h]));
            v.push(w(format!("{a}.in_proj_a.weight"), vec![LIN_V_HEADS, h]));
            v.push(t(
                format!("{a}.conv1d.weight"),
                vec![conv_dim, 1, CONV_KERNEL],
                0.0,
                0.2,
            ));
            v.push(t(format!("{a}.dt_bias"), vec![LIN_V_HEADS], 1.0, 0.5));
            v.push(t(format!("{a}.A_log"), vec![LIN_V_HEADS], 1.0, 0.5));
            // The gated output norm is applied as w, not 1 + w.
            v.push(t(format!("{a}.norm.weight"), vec![LIN_V_DIM], 1.0, 0.05));
            v.push(w(format!("{a}.out_proj.weight"), vec![h, value_dim]));
        }
        v.push(norm0(format!("{p}.post_attention_layernorm.weight"), h));
        v.push(w(format!("{p}.mlp.gate.weight"), vec![EXPERTS, h]));
        for x in 0..EXPERTS {
            let e = format!("{p}.mlp.experts.{x}");
            swiglu(&mut v, &e, MOE_INTER, h);
        }
        let s = format!("{p}.mlp.shared_expert");
        swiglu(&mut v, &s, SHARED_INTER, h);
        v.push(w(format!("{p}.mlp.shared_expert_gate.weight"), vec![1, h]));
    }
    v.push(norm0("model.norm.weight".into(), h));
    v.push(w("lm_head.weight".into(), vec![vocab, h]));
    v
}

/// GLM-5.3-Flash's text model (`glm5_next`): the tensors of `Glm5NextForConditionalGeneration`
/// under `model.language_model.` as transformers names them, experts per expert.
fn tensors_g5(layers: u64, vocab: u64, experts: u64) -> Vec<Tensor> {
    use g5::*;
    let t = Tensor::drawn;
    let w = |name: String, shape: Vec<u64>| t(name, shape, 0.0, 0.02);
    let norm = |name: String, n: u64| t(name, vec![n], 1.0, 0.05);
    let h = HIDDEN;
    let lin = LIN_HEADS * LIN_DIM;
    let mix = HC * HC + 2 * HC;
    let mut v = vec![w(
        "model.language_model.embed_tokens.weight".into(),
        vec![vocab, h],
    )];
    for l in 0..layers {
        let p = format!("model.language_model.layers.{l}");
        for hc in ["attn", "ffn"] {
            v.push(w(format!("{p}.hc_{hc}_fn"), vec![mix, HC * h]));
            v.push(t(format!("{p}.hc_{hc}_base"), vec![mix], 0.0, 0.05));
            v.push(t(format!("{p}.hc_{hc}_scale"), vec![3], 1.0, 0.05));
        }
        v.push(norm(format!("{p}.input_layernorm.weight"), h));
        v.push(norm(format!("{p}.post_attention_layernorm.weight"), h));
        let a = format!("{p}.self_attn");
        if dsa(l) {
            v.push(w(format!("{a}.q_a_proj.weight"), vec![Q_LORA, h]));
            v.push(norm(format!("{a}.q_a_layernorm.weight"), Q_LORA));
            v.push(w(
                format!("{a}.q_b_proj.weight"),
                vec![HEADS * NOPE, Q_LORA],
            ));
            v.push(w(
                format!("{a}.kv_a_proj_with_mqa.weight"),
                vec![KV_LORA, h],
            ));
            v.push(norm(format!("{a}.kv_a_layernorm.weight"), KV_LORA));
            v.push(w(
                format!("{a}.kv_b_proj.weight"),
                vec![HEADS * (NOPE + V_DIM), KV_LORA],
            ));
            v.push(w(format!("{a}.o_proj.weight"), vec![h, HEADS * V_DIM]));
            let i = format!("{a}.indexer");
            v.push(w(
                format!("{i}.wq_b.weight"),
                vec![INDEX_HEADS * INDEX_DIM, Q_LORA],
            ));
            v.push(w(format!("{i}.wk.weight"), vec![INDEX_DIM, h]));
            v.push(norm(format!("{i}.k_norm.weight"), INDEX_DIM));
            v.push(t(format!("{i}.k_norm.bias"), vec![INDEX_DIM], 0.0, 0.02));
            v.push(w(format!("{i}.weights_proj.weight"), vec![INDEX_HEADS, h]));
            v.push(w(
                format!("{i}.index_kpool_compress_gate"),
                vec![INDEX_DIM, h],
            ));
            v.push(w(
                format!("{i}.index_kpool_compress_ape"),
                vec![KPOOL, INDEX_DIM],
            ));
        } else {
            for x in ["q", "k", "v"] {
                v.push(w(format!("{a}.{x}_proj.weight"), vec![lin, h]));
                v.push(t(
                    format!("{a}.{x}_conv1d.weight"),
                    vec![lin, 1, CONV_KERNEL],
                    0.0,
                    0.2,
                ));
            }
            for x in ["f", "g"] {
                v.push(w(format!("{a}.{x}_a_proj.weight"), vec![LIN_DIM, h]));
                v.push(w(format!("{a}.{x}_b_proj.weight"), vec![lin, LIN_DIM]));
            }
            v.push(w(format!("{a}.b_proj.weight"), vec![LIN_HEADS, h]));
            v.push(t(format!("{a}.A_log"), vec![LIN_HEADS], 0.0, 0.5));
            v.push(t(format!("{a}.dt_bias"), vec![lin], -4.0, 0.5));
            v.push(norm(format!("{a}.o_norm.weight"), LIN_DIM));
            v.push(w(format!("{a}.o_proj.weight"), vec![h, lin]));
        }
        let m = format!("{p}.mlp");
        if l == 0 {
            swiglu(&mut v, &m, DENSE_INTER, h);
            continue;
        }
        v.push(w(format!("{m}.gate.weight"), vec![experts, h]));
        v.push(w(
            format!("{m}.gate.e_score_correction_bias"),
            vec![experts],
        ));
        let s = format!("{m}.shared_experts");
        swiglu(&mut v, &s, MOE_INTER, h);
        for x in 0..experts {
            let e = format!("{m}.experts.{x}");
            swiglu(&mut v, &e, MOE_INTER, h);
        }
    }
    v.push(norm("model.language_model.norm.weight".into(), h));
    v.push(w("lm_head.weight".into(), vec![vocab, h]));
    v
}

/// BF16 bits of element `i` of the tensor whose name hashes to `seed`: mean + std * z, z a sum of
/// four 16-bit uniforms scaled to unit variance (|z| <= 3.47), rounded to nearest even. Integer
/// arithmetic and two correctly rounded f32 operations: the same bits on every machine.
fn value(seed: u64, i: u64, mean: f32, std: f32) -> u16 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    let s = (z & 0xFFFF) + ((z >> 16) & 0xFFFF) + ((z >> 32) & 0xFFFF) + (z >> 48);
    // Sum of four uniforms on 0..=65535: mean 131070, standard deviation 37837.
    let u = (s as f32 - 131_070.0) * (1.0 / 37_837.0);
    let f = mean + std * u;
    let b = f.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

fn write_shard(path: &Path, tensors: &[&Tensor]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0u64;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": t.shape, "data_offsets": [at, at + t.bytes()]}),
        );
        at += t.bytes();
    }
    let mut json = serde_json::to_vec(&header)?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut w = BufWriter::with_capacity(8 << 20, File::create(path)?);
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(&json)?;
    let mut buf = vec![0u8; 8 << 20];
    for t in tensors {
        let seed = seed_of(&t.name);
        let n = t.shape.iter().product::<u64>();
        let mut i = 0u64;
        while i < n {
            let k = (n - i).min(buf.len() as u64 / 2) as usize;
            for (j, out) in buf[..2 * k].chunks_exact_mut(2).enumerate() {
                out.copy_from_slice(&value(seed, i + j as u64, t.mean, t.std).to_le_bytes());
            }
            w.write_all(&buf[..2 * k])?;
            i += k as u64;
        }
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}

fn write_checkpoint(
    family: Family,
    dir: &Path,
    layers: u64,
    shards: usize,
    vocab: u64,
    experts: u64,
) -> std::io::Result<u64> {
    std::fs::create_dir_all(dir)?;
    let all = tensors(family, layers, vocab, experts);
    let total: u64 = all.iter().map(Tensor::bytes).sum();
    // Cut the write order into `shards` runs of about equal bytes.
    let mut runs: Vec<Vec<&Tensor>> = vec![Vec::new(); shards];
    let mut acc = 0u64;
    for t in &all {
        let k = ((acc * shards as u64) / total).min(shards as u64 - 1) as usize;
        acc += t.bytes();
        runs[k].push(t);
    }
    let name = |k: usize| {
        if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, shards)
        }
    };
    std::thread::scope(|s| {
        let jobs: Vec<_> = runs
            .iter()
            .enumerate()
            .map(|(k, run)| s.spawn(move || write_shard(&dir.join(name(k)), run)))
            .collect();
        jobs.into_iter()
            .try_for_each(|j| j.join().expect("a shard writer panicked"))
    })?;
    if shards > 1 {
        let mut weight_map = serde_json::Map::new();
        for (k, run) in runs.iter().enumerate() {
            for t in run {
                weight_map.insert(t.name.clone(), serde_json::Value::String(name(k)));
            }
        }
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index)?,
        )?;
    }
    let config = if family == Family::Glm5Next {
        glm5_config(layers, vocab, experts)
    } else if family == Family::MimoV2Flash {
        // What transformers' MiMoV2FlashConfig reads (MiMo-V2-Flash's config, with this file's
        // layer count, experts and vocabulary; no MTP layers).
        let layer_types: Vec<&str> = (0..layers)
            .map(|l| match mimo::sliding(l) {
                true => "sliding_attention",
                false => "full_attention",
            })
            .collect();
        let mlp_types: Vec<&str> = (0..layers)
            .map(|l| if l == 0 { "dense" } else { "sparse" })
            .collect();
        serde_json::json!({
            "architectures": ["MiMoV2FlashForCausalLM"],
            "model_type": "mimo_v2_flash",
            "hidden_act": "silu",
            "hidden_size": mimo::HIDDEN,
            "intermediate_size": mimo::DENSE_INTER,
            "moe_intermediate_size": mimo::MOE_INTER,
            "num_attention_heads": mimo::HEADS,
            "num_key_value_heads": mimo::KV_HEADS,
            "head_dim": mimo::HEAD_DIM,
            "v_head_dim": mimo::V_DIM,
            "attention_value_scale": 0.707,
            "attention_bias": false,
            "sliding_window": mimo::WINDOW,
            "layer_types": layer_types,
            "mlp_layer_types": mlp_types,
            "n_routed_experts": experts,
            "num_experts_per_tok": TOP_K,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": true,
            "routed_scaling_factor": null,
            "num_hidden_layers": layers,
            "rms_norm_eps": 1e-5,
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0,
                                   "partial_rotary_factor": 0.334},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0,
                                      "partial_rotary_factor": 0.334},
            },
            "max_position_embeddings": 262144,
            "tie_word_embeddings": false,
            "vocab_size": vocab,
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": "bfloat16",
        })
    } else if family == Family::DeepseekV3 {
        // What transformers' DeepseekV3Config reads (Moonlight-16B-A3B's config, with this
        // file's layer count and vocabulary).
        serde_json::json!({
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": HIDDEN,
            "intermediate_size": ds::DENSE_INTER,
            "moe_intermediate_size": ds::MOE_INTER,
            "n_routed_experts": ds::EXPERTS,
            "n_shared_experts": ds::SHARED,
            "num_experts_per_tok": ds::TOP_K,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": true,
            "routed_scaling_factor": ds::SCALE,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "num_attention_heads": ds::HEADS,
            "num_key_value_heads": ds::HEADS,
            "num_hidden_layers": layers,
            "q_lora_rank": ds::Q_LORA,
            "kv_lora_rank": ds::KV_LORA,
            "qk_nope_head_dim": ds::NOPE,
            "qk_rope_head_dim": ds::ROPE,
            "v_head_dim": ds::V_DIM,
            "rope_interleave": true,
            "attention_bias": false,
            "rms_norm_eps": 1e-5,
            "rope_theta": 50_000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": false,
            "vocab_size": vocab,
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": "bfloat16",
        })
    } else if family == Family::Qwen3_5Moe {
        // What transformers' Qwen3_5MoeTextConfig reads (Qwen3.5-35B-A3B's text_config, less
        // the MTP layer and with this file's layer count and vocabulary).
        let layer_types: Vec<&str> = (0..layers)
            .map(|l| {
                if q35_full(l) {
                    "full_attention"
                } else {
                    "linear_attention"
                }
            })
            .collect();
        serde_json::json!({
            "architectures": ["Qwen3_5MoeForCausalLM"],
            "model_type": "qwen3_5_moe_text",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "head_dim": q35::HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "initializer_range": 0.02,
            "layer_types": layer_types,
            "full_attention_interval": q35::FULL_EVERY,
            "linear_conv_kernel_dim": q35::CONV_KERNEL,
            "linear_key_head_dim": q35::LIN_K_DIM,
            "linear_num_key_heads": q35::LIN_K_HEADS,
            "linear_num_value_heads": q35::LIN_V_HEADS,
            "linear_value_head_dim": q35::LIN_V_DIM,
            "max_position_embeddings": 262144,
            "moe_intermediate_size": q35::MOE_INTER,
            "shared_expert_intermediate_size": q35::SHARED_INTER,
            "num_attention_heads": q35::HEADS,
            "num_key_value_heads": q35::KV_HEADS,
            "num_experts": q35::EXPERTS,
            "num_experts_per_tok": TOP_K,
            "num_hidden_layers": layers,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": true,
            },
            "router_aux_loss_coef": 0.001,
            "output_router_logits": false,
            "use_cache": true,
            "tie_word_embeddings": false,
            "vocab_size": vocab,
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": "bfloat16",
        })
    } else if family == Family::Glm4Moe {
        serde_json::json!({
            "architectures": ["Glm4MoeForCausalLM"],
            "model_type": "glm4_moe",
            "attention_bias": true,
            "use_qk_norm": false,
            "head_dim": HEAD_DIM,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "intermediate_size": DENSE_INTER,
            "max_position_embeddings": 131072,
            "moe_intermediate_size": MOE_INTER,
            "n_routed_experts": EXPERTS,
            "n_shared_experts": 1,
            "num_experts_per_tok": TOP_K,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "norm_topk_prob": true,
            "routed_scaling_factor": 2.5,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "num_hidden_layers": layers,
            "num_nextn_predict_layers": 0,
            "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-5,
            "rope_theta": 1_000_000.0,
            "tie_word_embeddings": false,
            "vocab_size": vocab,
            "bos_token_id": null,
            "eos_token_id": null,
            "torch_dtype": "bfloat16",
        })
    } else {
        serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "hidden_size": HIDDEN,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "moe_intermediate_size": MOE_INTER,
        "norm_topk_prob": true,
        "num_attention_heads": HEADS,
        "num_experts": EXPERTS,
        "num_experts_per_tok": TOP_K,
        "num_hidden_layers": layers,
        "num_key_value_heads": KV_HEADS,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_scaling": null,
        "sliding_window": null,
        "use_sliding_window": false,
        "tie_word_embeddings": false,
        "vocab_size": vocab,
        "bos_token_id": null,
        "eos_token_id": null,
        "torch_dtype": "bfloat16",
        })
    };
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(total)
}

/// What transformers' `Glm5NextConfig` reads: GLM-5.3-Flash's text config with this file's
/// layers, experts and vocabulary, one leading dense layer, every DSA layer its own indexer, no
/// MTP layer.
fn glm5_config(layers: u64, vocab: u64, experts: u64) -> serde_json::Value {
    use g5::*;
    let layer_types: Vec<&str> = (0..layers)
        .map(|l| {
            if dsa(l) {
                "deepseek_sparse_attention"
            } else {
                "linear_attention"
            }
        })
        .collect();
    let mlp_types: Vec<&str> = (0..layers)
        .map(|l| if l == 0 { "dense" } else { "sparse" })
        .collect();
    let text = serde_json::json!({
            "model_type": "glm5_next_text",
            "attention_bias": false,
            "hc_eps": 1e-6,
            "hc_mult": HC,
            "hc_sinkhorn_iters": 20,
            "hidden_act": "silu",
            "hidden_size": HIDDEN,
            "index_head_dim": INDEX_DIM,
            "index_kpool": KPOOL,
            "index_kpool_always_select_tail": true,
            "index_n_heads": INDEX_HEADS,
            "index_topk": INDEX_TOPK,
            // GLM-5.3-Flash's default schedule (index_topk_freq 1): every DSA layer runs its
            // own indexer. ("shared" reuses the selection of the layer just before, which
            // here is a KDA layer: no selection to reuse.)
            "indexer_types": vec!["full"; layers as usize],
            "intermediate_size": DENSE_INTER,
            "kv_lora_rank": KV_LORA,
            "layer_types": layer_types,
            "linear_conv_kernel_dim": CONV_KERNEL,
            "linear_head_dim": LIN_DIM,
            "linear_lower_bound": -5.0,
            "linear_num_heads": LIN_HEADS,
            "max_position_embeddings": 1_048_576,
            "mlp_layer_types": mlp_types,
            "moe_intermediate_size": MOE_INTER,
            "n_group": 1,
            "n_routed_experts": experts,
            "n_shared_experts": 1,
            "norm_topk_prob": true,
            "num_attention_heads": HEADS,
            "num_experts_per_tok": TOP_K,
            "num_hidden_layers": layers,
            "num_key_value_heads": HEADS,
            "q_lora_rank": Q_LORA,
            "qk_nope_head_dim": NOPE,
            "qk_rope_head_dim": 0,
            "rms_norm_eps": 1e-5,
            "routed_scaling_factor": 2.5,
            "swiglu_limit": 10.0,
            "tie_word_embeddings": false,
            "topk_group": 1,
            "v_head_dim": V_DIM,
            "vocab_size": vocab,
            "bos_token_id": null,
            "eos_token_id": null,
            "pad_token_id": null,
    });
    serde_json::json!({
        "architectures": ["Glm5NextForConditionalGeneration"],
        "model_type": "glm5_next",
        "tie_word_embeddings": false,
        "text_config": text,
        "torch_dtype": "bfloat16",
    })
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let num = |i: usize| args.get(i).and_then(|s| s.parse::<u64>().ok());
    let (Some(dir), Some(layers)) = (args.get(1), num(2).filter(|&l| l > 0)) else {
        eprintln!("usage: synth_decode_checkpoint DIR LAYERS [SHARDS [VOCAB]]");
        std::process::exit(2);
    };
    let shards = num(3).unwrap_or(4).max(1) as usize;
    let vocab = num(4).unwrap_or(32_768);
    let family = match std::env::var("SYNTH_FAMILY").as_deref() {
        Err(_) | Ok("qwen3_moe") => Family::Qwen3Moe,
        Ok("glm4_moe") => Family::Glm4Moe,
        Ok("qwen3_5_moe") => Family::Qwen3_5Moe,
        Ok("glm5_next") => Family::Glm5Next,
        Ok("deepseek_v3") => Family::DeepseekV3,
        Ok("mimo_v2_flash") => Family::MimoV2Flash,
        Ok(other) => {
            eprintln!(
                "error: SYNTH_FAMILY={other:?}: qwen3_moe, glm4_moe, qwen3_5_moe, glm5_next, \
                 deepseek_v3 or mimo_v2_flash"
            );
            std::process::exit(2);
        }
    };
    // The routed experts of the families written with fewer than the model's: GLM5_EXPERTS
    // (glm5_next), MIMO_EXPERTS (mimo_v2_flash).
    let (var, default) = match family {
        Family::MimoV2Flash => ("MIMO_EXPERTS", mimo::EXPERTS),
        _ => ("GLM5_EXPERTS", g5::EXPERTS),
    };
    for other in ["GLM5_EXPERTS", "MIMO_EXPERTS"] {
        let applies = matches!(
            (other, family),
            ("GLM5_EXPERTS", Family::Glm5Next) | ("MIMO_EXPERTS", Family::MimoV2Flash)
        );
        if std::env::var_os(other).is_some() && !applies {
            eprintln!(
                "error: {other} applies to SYNTH_FAMILY={} only",
                if other == "GLM5_EXPERTS" {
                    "glm5_next"
                } else {
                    "mimo_v2_flash"
                }
            );
            std::process::exit(2);
        }
    }
    let experts = match std::env::var(var) {
        Err(_) => default,
        Ok(s) => match s.parse::<u64>() {
            Ok(n) if (g5::TOP_K_MIN..=1024).contains(&n) => n,
            _ => {
                eprintln!(
                    "error: {var}={s:?}: a whole number of experts from {} to 1024",
                    g5::TOP_K_MIN
                );
                std::process::exit(2);
            }
        },
    };
    if family == Family::Qwen3_5Moe && layers < q35::FULL_EVERY {
        eprintln!(
            "error: SYNTH_FAMILY=qwen3_5_moe: LAYERS {layers} must be at least {} \
             (three linear-attention layers, then one full-attention layer)",
            q35::FULL_EVERY
        );
        std::process::exit(2);
    }
    let t = std::time::Instant::now();
    match write_checkpoint(family, Path::new(dir), layers, shards, vocab, experts) {
        Ok(total) => {
            let (experts, heads, kv_heads, head_dim) = match family {
                Family::Qwen3_5Moe => (q35::EXPERTS, q35::HEADS, q35::KV_HEADS, q35::HEAD_DIM),
                Family::Glm5Next => (experts, g5::HEADS, g5::HEADS, g5::NOPE),
                Family::DeepseekV3 => (ds::EXPERTS, ds::HEADS, ds::HEADS, ds::NOPE + ds::ROPE),
                Family::MimoV2Flash => (experts, mimo::HEADS, mimo::KV_HEADS, mimo::HEAD_DIM),
                Family::Qwen3Moe | Family::Glm4Moe => (EXPERTS, HEADS, KV_HEADS, HEAD_DIM),
            };
            let top_k = match family {
                Family::DeepseekV3 => ds::TOP_K,
                _ => TOP_K,
            };
            println!(
                "{dir}: {} {layers} layers x {experts} experts (top-{top_k}), \
                 {heads}x{head_dim} query / {kv_heads}x{head_dim} kv heads, vocab {vocab}, \
                 {total} bytes in {shards} shards, written in {:.1} s",
                family.name(),
                t.elapsed().as_secs_f64()
            )
        }
        Err(e) => {
            eprintln!("error: {dir}: {e}");
            std::process::exit(1);
        }
    }
}
