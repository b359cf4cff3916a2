//! The whole forward pass of the GPU decoder — `tarfa_cuda::Engine`'s buffers,
//! launch order and geometry, its KV cache and RoPE tables, `decode::gpu_resident`'s mapping of
//! the checkpoint onto it — run with the CUDA kernels on the CPU emulation, gives the CPU
//! decoder's logits bit for bit at every greedy step of every reference prompt of every
//! `qwen3_moe`, `qwen3_5_moe`, `glm4_moe` and `mixtral` fixture and the quantised GGUF (dense and
//! MoE layers, the softmax and the sigmoid group routers, shared experts plain and gated, biases,
//! partial rotary, tied heads, Gated DeltaNet layers with their recurrent state, gated attention,
//! zero-centred norms, DeepSeek-V3's multi-head latent attention), and does so again
//! after a reset; a prompt fed token by token gives the
//! same bits as one fed whole; so does every ring of the tiled kernels compiled in. What this
//! cannot show (the GPU machine's `decode/tests/gpu.rs` does): the hardware, the driver,
//! cudarc's copies and the CUDA graph.

#[path = "../../decode/tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tarfa_cuda::TileGeometry;
use tarfa_cuda_emu::EmuDevice;
use tarfa_decode::family::Family;
use tarfa_decode::gpu_resident::Declined;
use tarfa_decode::{Decoder, DecoderOptions};

fn emulated(dir: &std::path::Path, batch_prompt: bool) -> Decoder {
    emulated_at(dir, batch_prompt, TileGeometry::DEFAULT)
}

/// The decoder on the emulated device, its tiled kernels at `ring`.
fn emulated_at(dir: &std::path::Path, batch_prompt: bool, ring: TileGeometry) -> Decoder {
    emulated_with(dir, batch_prompt, ring, true).0
}

/// The decoder on the emulated device, its tiled kernels at `ring`, RMSNorms taken into the
/// products or not (`fuse_norms`); and the device's count of launches.
fn emulated_with(
    dir: &std::path::Path,
    batch_prompt: bool,
    ring: TileGeometry,
    fuse_norms: bool,
) -> (Decoder, Arc<AtomicU64>) {
    let opts = DecoderOptions {
        batch_prompt,
        ..DecoderOptions::default()
    };
    emulated_opts(dir, &opts, ring, fuse_norms)
}

/// [`emulated_with`] with the decoder's options `opts`.
fn emulated_opts(
    dir: &std::path::Path,
    opts: &DecoderOptions,
    ring: TileGeometry,
    fuse_norms: bool,
) -> (Decoder, Arc<AtomicU64>) {
    let count = std::sync::Mutex::new(None);
    let dec = Decoder::open_with(dir, opts, |config, tensors, experts| {
        let dev = EmuDevice::with_tile(ring)?;
        *count.lock().expect("count") = Some(dev.launch_count());
        let mut f = tarfa_decode::gpu_resident::build(dev, config, tensors, experts, true)?;
        if let Some(f) = f.as_mut() {
            f.set_norm_fusion(fuse_norms);
        }
        Ok(f.map(|f| Box::new(f) as Box<dyn Family>))
    })
    .expect("open the emulated GPU decoder");
    let count = count.into_inner().expect("count").expect("a device");
    (dec, count)
}

fn run(dec: &mut Decoder, name: &'static str, steps: usize) -> Vec<Vec<Vec<u32>>> {
    run_prompts(dec, name, steps, usize::MAX)
}

/// [`run`] on the first `prompts` reference prompts.
fn run_prompts(
    dec: &mut Decoder,
    name: &'static str,
    steps: usize,
    prompts: usize,
) -> Vec<Vec<Vec<u32>>> {
    common::reference(name)
        .iter()
        .take(prompts)
        .map(|p| common::bits(&common::greedy(dec, &p.prompt_ids, steps).1))
        .collect()
}

const STEPS: usize = 4;

/// Held by each test that runs the emulated engine: while a launch runs, the emulation's guard
/// makes every engine's activations in the process inaccessible, so another test's engine
/// writing its own (from the host, between launches) would die of SIGSEGV.
static ENGINE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_engine_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ENGINE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn the_whole_gpu_forward_pass_gives_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    // The qwen3_moe fixtures' every prompt, batched and token by token, and again after a
    // reset; the other families (the same engine path under other plans) their first prompt
    // once, batched: the emulation runs every CUDA thread on two CPU cores.
    for (name, batches, prompts) in [
        ("qwen3_moe", &[true, false][..], usize::MAX),
        ("qwen3_moe_b", &[true, false], usize::MAX),
        ("glm4_moe", &[true], 1),
        ("glm4_moe_b", &[true], 1),
        ("mixtral", &[true], 1),
        // DeltaNet's recurrent state: run token by token, and zeroed by the reset between prompts.
        ("qwen3_5_moe_text", &[true, false], 1),
        // Qwen3.5's engine path from Qwen3-Next's split projections, a dense layer, no
        // renormalisation.
        ("qwen3_next", &[true], 1),
    ] {
        let dir = common::model(name);
        // Four greedy steps: the emulation runs every CUDA thread on two CPU cores, so the
        // steps are kept few; each still crosses every layer, the KV cache and the sampler.
        let cpu = run_prompts(
            &mut common::open(&dir, &DecoderOptions::default()),
            name,
            STEPS,
            prompts,
        );
        for &batch in batches {
            let mut dec = emulated(&dir, batch);
            let r = dec.offload_report().expect("a device report");
            assert!(r.whole_model, "{name}: {r:?}");
            assert_eq!(
                run_prompts(&mut dec, name, STEPS, prompts),
                cpu,
                "{name}: batch prompt {batch}"
            );
            // The same prompts again on the same decoder: each pass from position 0 resets what
            // the last left (the KV cache's rows, a recurrent state).
            if batch && batches.len() > 1 {
                assert_eq!(
                    run_prompts(&mut dec, name, STEPS, prompts),
                    cpu,
                    "{name}: again, after a reset"
                );
            }
            let r = dec.offload_report().expect("a device report");
            // No round trip to the host within a step: the whole pass on the device.
            assert!(
                r.steps > 0 && r.graph_steps == 0 && r.host_round_trips == 0,
                "{name}: {r:?}"
            );
            // A batched prompt ran as matrices (Engine::prompt), except where a DeltaNet
            // layer's recurrence steps it token by token.
            let matrices = batch && !matches!(name, "qwen3_5_moe_text" | "qwen3_next");
            assert_eq!(r.prompt_passes > 0, matrices, "{name}: {r:?}");
        }
    }
}

/// A prompt fed in chunks (`prompt_chunk` 3 and 7: passes of as many tokens, the last
/// part-filled) gives the CPU decoder's bits: the chunk size changes no bit of a prompt run as
/// matrices (`Engine::prompt`), on a softmax-routed model and on GLM's (a dense layer, the
/// sigmoid group router, folded shared experts).
#[test]
fn prompt_chunks_of_any_size_give_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    for name in ["qwen3_moe", "glm4_moe_b"] {
        let dir = common::model(name);
        let cpu = run_prompts(
            &mut common::open(&dir, &DecoderOptions::default()),
            name,
            2,
            1,
        );
        for chunk in [3, 7] {
            let opts = DecoderOptions {
                prompt_chunk: chunk,
                ..DecoderOptions::default()
            };
            let mut dec = emulated_opts(&dir, &opts, TileGeometry::DEFAULT, true).0;
            assert_eq!(
                run_prompts(&mut dec, name, 2, 1),
                cpu,
                "{name}: chunks of {chunk}"
            );
            let r = dec.offload_report().expect("a device report");
            assert!(r.prompt_passes > 1, "{name}, chunks of {chunk}: {r:?}");
        }
    }
}

/// A 48-token prompt on `qwen3_moe` (4 experts, top-2: about 24 of a pass's (token, slot) pairs
/// an expert, so more than one tile of 16 each), every position's logits asked for (the head as a
/// matrix product over the pass): each position's bits are the CPU decoder's.
#[test]
fn a_pass_with_several_tiles_an_expert_gives_every_positions_cpu_bits() {
    let _one = one_engine_at_a_time();
    let name = "qwen3_moe";
    let tokens: Vec<u32> = (0..48u32).map(|i| (i * 37 + 5) % 128).collect();
    let cpu = common::alone(name, &tokens);
    let mut dec = emulated(&common::model(name), true);
    let got = common::bits(&dec.feed(&tokens, true).expect("feed"));
    assert_eq!(got.len(), tokens.len());
    assert_eq!(got, cpu);
    let r = dec.offload_report().expect("a device report");
    assert_eq!((r.prompt_passes, r.prompt_pass_tokens), (1, 48), "{r:?}");
}

/// The quantised GGUF fixture (F32 norms and routers, a BF16 embedding, an F16 head — widened to
/// F32 at load, so the engine sees F32 —, Q8_0 q/k/v and layer 1 gate experts, Q4_0 o, Q4_K
/// layer 0 gate and up, Q5_K layer 1 down, Q6_K layer 0 down and layer 1 up: gate and up of one
/// expert of two types) runs whole on the engine, every
/// weight dequantised inside the canonical dot, with the CPU's logits at every step of its first
/// reference prompt (the emulation's cost kept to the other families').
#[test]
fn the_quantised_gguf_runs_whole_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let dir = common::quantised_model();
    let cpu = run_prompts(
        &mut common::open(&dir, &DecoderOptions::default()),
        "qwen3_moe_q",
        STEPS,
        1,
    );
    let mut dec = emulated(&dir, true);
    let r = dec.offload_report().expect("a device report");
    assert!(r.whole_model, "{r:?}");
    assert_eq!(run_prompts(&mut dec, "qwen3_moe_q", STEPS, 1), cpu);
}

/// The ring of the tiled kernels is geometry only: at every other ring compiled in (the
/// shallowest, an odd one, one the host must allow above 48 KiB), the engine — its launches
/// sized by the device's ring — gives the CPU's bits, hence the default ring's.
#[test]
fn every_ring_of_the_tiled_kernels_gives_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let name = "qwen3_moe_b";
    let dir = common::model(name);
    let cpu = run(
        &mut common::open(&dir, &DecoderOptions::default()),
        name,
        STEPS,
    );
    let rings = tarfa_cuda_emu::tiles();
    assert!(rings.len() > 1, "{rings:?}");
    for ring in rings.into_iter().filter(|&r| r != TileGeometry::DEFAULT) {
        let mut dec = emulated_at(&dir, true, ring);
        assert_eq!(run(&mut dec, name, STEPS), cpu, "{name}: {ring:?}");
    }
}

/// Each RMSNorm taken into the tiled product launch that reads it (q/k/v, the router, `lm_head`)
/// or given a launch of its own, the engine gives the CPU's bits; taken in, a step has fewer
/// launches (so the fused path is what ran). On both fixtures, and on qwen3_moe with experts 32
/// wide and top-3: the fixtures' 16 are not whole chunks, so only there do the tiled experts'
/// kernels (`tarfa_e_tmoe_gate_up`, `tarfa_e_tmoe_down`) run in a whole forward pass.
#[test]
fn norms_taken_into_the_products_or_launched_alone_give_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let tmp = tempfile::tempdir().expect("tempdir");
    for (label, name, dir) in common::whole_pass_models(tmp.path()) {
        let cpu = run(
            &mut common::open(&dir, &DecoderOptions::default()),
            name,
            STEPS,
        );
        let mut launches = Vec::new();
        for fuse in [true, false] {
            let (mut dec, count) = emulated_with(&dir, true, TileGeometry::DEFAULT, fuse);
            assert_eq!(
                run(&mut dec, name, STEPS),
                cpu,
                "{label}: norms fused {fuse}"
            );
            launches.push(count.load(Ordering::Relaxed));
        }
        assert!(launches[0] < launches[1], "{label}: launches {launches:?}");
    }
}

/// A layer's shared experts of the routed experts' width and types run as slot k of the routed
/// launches (glm4_moe: one shared expert, 16 wide like its experts, weight 1; qwen3_5_moe_text:
/// one gated shared expert, 16 wide, its weight the gate's), and others as launches of their own
/// (glm4_moe_b: two, 32 wide); all give the CPU's bits (the whole-pass test above).
#[test]
fn shared_experts_of_the_routed_width_are_folded_into_their_launches() {
    let _one = one_engine_at_a_time();
    for (name, folded) in [
        ("glm4_moe", 2),
        ("glm4_moe_b", 0),
        ("qwen3_moe", 0),
        ("qwen3_5_moe_text", 4),
    ] {
        let mut report = None;
        Decoder::open_with(
            &common::model(name),
            &DecoderOptions::default(),
            |c, t, e| {
                let dev = EmuDevice::default();
                let f = tarfa_decode::gpu_resident::build(dev, c, t, e, true)?.expect("taken");
                report = Some(f.engine_report());
                Ok(None)
            },
        )
        .expect("open");
        let r = report.expect("a report");
        assert_eq!(r.folded_layers, folded, "{name}: {r:?}");
    }
}

/// Qwen3.5's gated shared expert of another width than the routed experts' (32 against 16) is not
/// folded: it runs in launches of its own and the combine weighs its output by the gate the
/// top-k launch wrote (`tarfa_e_moe_combine`/`tarfa_e_combine_norm`'s `shw`), with the CPU's
/// bits at every step.
#[test]
fn a_gated_shared_expert_of_its_own_width_runs_apart_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = common::wide_shared_expert_model(tmp.path());
    let name = "qwen3_5_moe_text";
    let cpu = run_prompts(
        &mut common::open(&dir, &DecoderOptions::default()),
        name,
        STEPS,
        1,
    );
    let mut report = None;
    let mut dec = Decoder::open_with(&dir, &DecoderOptions::default(), |c, t, e| {
        let f =
            tarfa_decode::gpu_resident::build(EmuDevice::default(), c, t, e, true)?.expect("taken");
        report = Some(f.engine_report());
        Ok(Some(Box::new(f) as Box<dyn Family>))
    })
    .expect("open");
    assert_eq!(report.expect("a report").folded_layers, 0);
    assert_eq!(run_prompts(&mut dec, name, STEPS, 1), cpu);
}

/// Why `build_or_decline` leaves the model in `dir` to the CPU's layers, if it does.
fn declined(dir: &std::path::Path) -> Option<Declined> {
    let mut why = None;
    Decoder::open_with(
        dir,
        &DecoderOptions::default(),
        |config, tensors, experts| {
            let dev = EmuDevice::default();
            why =
                tarfa_decode::gpu_resident::build_or_decline(dev, config, tensors, experts, true)?
                    .err();
            Ok(None)
        },
    )
    .expect("open");
    why
}

/// A model the whole-model path does not take is left to the CPU's layers, and the reason is
/// said (`tarfa run` prints it): a layer whose experts mix element types. Every family's
/// fixture is taken (Qwen3.5-MoE's DeltaNet layers, gated attention and zero-centred norms
/// included).
#[test]
fn models_not_taken_are_left_to_the_cpu_saying_why() {
    let _one = one_engine_at_a_time();
    let tmp = tempfile::tempdir().expect("tmp");
    let mixed = common::mixed_type_expert_model(tmp.path());
    let dec = emulated(&mixed, true);
    assert!(dec.offload_report().is_none());
    let why = declined(&mixed);
    assert_eq!(why, Some(Declined::MixedExperts));
    assert!(why.expect("a reason").to_string().contains("mix"));
    for name in [
        "qwen3_moe",
        "qwen3_5_moe_text",
        "qwen3_next",
        "glm4_moe",
        "mixtral",
        "deepseek_v3",
        "mimo_v2_flash",
    ] {
        assert_eq!(declined(&common::model(name)), None, "{name}");
    }
    // GLM-5.3-Flash's DSA layers have no kernels yet (its hyper-connections and KDA layers do:
    // `glm5_next_kda_layers_run_whole_with_the_cpu_bits`): named.
    let why = declined(&common::model("glm5_next"));
    assert!(
        matches!(why, Some(Declined::Form(f)) if f.contains("DSA")),
        "{why:?}"
    );
}

/// DeepSeek-V3's multi-head latent attention runs whole on the device with the CPU's bits
/// (`tarfa_e_mla_heads`, `tarfa_e_narrow_heads` and the shared attention kernel at MLA's scale):
/// with a query LoRA and interleaved rotary pairs (deepseek_v3), and with a plain `q_proj`,
/// biases, NeoX halves and YaRN's scale (deepseek_v3_b), and quantised from llama.cpp's split
/// form (deepseek_v3_q); dense first layers, the sigmoid group router and shared experts beside
/// it. A prompt steps its tokens one by one (MLA layers have no
/// pass as matrices yet).
#[test]
fn mla_runs_whole_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    stepped_whole_with_the_cpu_bits([
        (common::model("deepseek_v3"), "deepseek_v3"),
        (common::model("deepseek_v3_b"), "deepseek_v3_b"),
        // llama.cpp's quantised deepseek2 GGUF (`attn_k_b` and `attn_v_b`, Q8_0, assembled into
        // `kv_b_proj`; Q8_0 MLA products, Q4_K/Q6_K experts, a dense layer whose Q5_K gate and
        // Q4_K up differ in type: two one-row accumulations, as a routed expert's may).
        (
            common::converted("fixtures/gguf/deepseek_v3_q.gguf"),
            "deepseek_v3_q",
        ),
    ]);
}

/// Each model's first reference prompt, [`STEPS`] greedy steps, on the emulated device: the
/// whole pass there (no round trip to the host), the prompt stepped token by token (no pass as
/// matrices), and the CPU decoder's bits.
fn stepped_whole_with_the_cpu_bits<const N: usize>(
    models: [(std::path::PathBuf, &'static str); N],
) {
    for (dir, name) in models {
        let cpu = run_prompts(
            &mut common::open(&dir, &DecoderOptions::default()),
            name,
            STEPS,
            1,
        );
        let mut dec = emulated(&dir, true);
        let r = dec.offload_report().expect("a device report");
        assert!(r.whole_model, "{dir:?}: {r:?}");
        assert_eq!(run_prompts(&mut dec, name, STEPS, 1), cpu, "{dir:?}");
        let r = dec.offload_report().expect("a device report");
        assert!(
            r.steps > 0 && r.host_round_trips == 0 && r.prompt_passes == 0,
            "{dir:?}: {r:?}"
        );
    }
}

/// MiMo-V2-Flash runs whole on the device with the CPU's bits: full-attention and
/// sliding-window layers of their own key/value heads, window and RoPE base (the second form's
/// tables), sinks on the sliding layers (`tarfa_e_attention`'s softmax takes each head's sink
/// last), values narrower than keys and scaled (`tarfa_e_widen_heads`, `tarfa_e_narrow_heads`),
/// dense and routed layers; from safetensors (both fixtures) and llama.cpp's mimo2 GGUF. The
/// prompt steps token by token (no pass of this form as matrices yet), past the window.
#[test]
fn mimo_v2_flash_runs_whole_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    stepped_whole_with_the_cpu_bits([
        (common::model("mimo_v2_flash"), "mimo_v2_flash"),
        (common::model("mimo_v2_flash_b"), "mimo_v2_flash_b"),
        (
            common::converted("fixtures/gguf/from_hf/mimo_v2_flash_b.gguf"),
            "mimo_v2_flash_b",
        ),
    ]);
}

/// llama.cpp's Qwen3-Next and Qwen3.5 GGUFs hold DeltaNet's decay rates as the converter's
/// `−exp(A_log)` (`ssm_a`): the engine takes them as stored (the CPU's `Rates::Neg`), so the
/// qwen3next GGUF fixture (norms stored as `1 + w`, `ssm_ba` split) runs whole with the CPU's
/// bits. (The kernel's two forms of rates are proven in kernels.rs; decode/tests/gpu.rs runs the
/// quantised qwen35moe GGUF whole too, on hardware: emulated, it costs two minutes.)
#[test]
fn ggufs_with_stored_deltanet_rates_run_whole_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let name = "qwen3_next_b";
    let dir = common::converted("fixtures/gguf/from_hf/qwen3_next_b.gguf");
    let cpu = run_prompts(
        &mut common::open(&dir, &DecoderOptions::default()),
        name,
        STEPS,
        1,
    );
    let mut dec = emulated(&dir, true);
    let r = dec.offload_report().expect("a device report");
    assert!(r.whole_model, "{r:?}");
    assert_eq!(run_prompts(&mut dec, name, STEPS, 1), cpu);
}

/// Heads wider than the attention kernels take come from a model's config, not a caller's
/// mistake: a typed error naming the limit and what to run instead, before anything is copied.
#[test]
fn a_head_dim_above_the_kernels_limit_is_head_dim_too_large() {
    use tarfa_cuda::{
        CudaError, Engine, EngineShape, GpuDtype, HostAttention, HostLayer, HostMixer, HostMlp,
        HostTensor, MAX_HEAD_DIM,
    };
    let head_dim = MAX_HEAD_DIM * 2;
    let shape = EngineShape {
        vocab: 4,
        hidden: head_dim,
        heads: 1,
        kv_heads: 1,
        head_dim,
        rotary_dim: head_dim,
        eps: 1e-6,
        window: None,
        scaling: 1.0,
        top_k: 1,
        norm_topk_prob: true,
        attn_gate: false,
        delta: None,
        mla: None,
        swa: None,
        values: None,
        swiglu_limit: None,
        kda: None,
        hyper: None,
    };
    let zeros = vec![0u8; 4 * head_dim * 4];
    let t = |rows: usize, cols: usize| HostTensor {
        bytes: &zeros[..rows * cols * 4],
        dtype: GpuDtype::F32,
        rows,
        cols,
    };
    // One attention layer (the limit is the attention kernel's: refused before any tensor is
    // looked at, so these need not have the shape's sizes).
    let layer = HostLayer {
        in_norm: t(1, head_dim),
        post_norm: t(1, head_dim),
        mixer: HostMixer::Attention(HostAttention {
            q: t(1, 1),
            k: t(1, 1),
            v: t(1, 1),
            o: t(1, 1),
            bias: [None; 4],
            qk_norm: None,
            sliding: false,
            sinks: None,
        }),
        mlp: HostMlp::Dense([t(1, 1), t(1, 1), t(1, 1)]),
        hyper: None,
    };
    let e = Engine::new(
        EmuDevice::default(),
        shape,
        t(4, head_dim),
        t(1, head_dim),
        None,
        &[layer],
        1,
    )
    .expect_err("head_dim 512");
    assert!(
        matches!(
            e,
            CudaError::HeadDimTooLarge {
                head_dim: 512,
                max: 256
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("--gpu-offload-only"), "{e}");
}

/// Sequences apart from the model on the emulated GPU decoder: two sequences' steps interleaved
/// with each other and the decoder's own (each a set of device buffers, the step's kernels given
/// the one it runs; each sequence's KV caches growing from room for 2 positions), a fork (its device state copied), a truncation (attention)
/// or its refusal (a recurrent state), and a truncation to 0 (the DeltaNet state zeroed on the
/// device) each give every position the bits a fresh CPU decoder gives that sequence alone. On
/// the fixture with both kinds of layer state (KV caches and DeltaNet states); the CPU's test
/// runs every family.
#[test]
fn gpu_sequences_interleaved_forked_and_truncated_give_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    // Qwen3.5 (DeltaNet state beside KV caches); MiMo-V2-Flash (KV caches of two widths, each
    // layer's grown and forked at its own).
    for name in ["qwen3_5_moe_text", "mimo_v2_flash_b"] {
        // Room for 2 positions at first: every sequence's KV caches grow (to 4, then 8) while
        // the others hold theirs.
        let mut dec = Decoder::open_with(
            &common::model(name),
            &DecoderOptions::default(),
            |config, tensors, experts| {
                let dev = EmuDevice::with_tile(TileGeometry::DEFAULT)?;
                let mut f = tarfa_decode::gpu_resident::build(dev, config, tensors, experts, true)?;
                if let Some(f) = f.as_mut() {
                    f.set_first_capacity(2);
                }
                Ok(f.map(|f| Box::new(f) as Box<dyn Family>))
            },
        )
        .expect("open the emulated GPU decoder");
        common::sequences_hold(name, &mut dec);
        let r = dec.offload_report().expect("a device report");
        assert!(r.whole_model && r.steps > 0, "{name}: {r:?}");
    }
}

/// The decoder on the emulated device with the routed experts of layers `0..cpu_moe` computed
/// on the CPU, RMSNorms taken into the products or not (`fuse_norms`: without, a layer's input
/// norm is computed in the combine of the layer before, a CPU layer's too).
fn emulated_placed(dir: &std::path::Path, cpu_moe: usize, fuse_norms: bool) -> Decoder {
    Decoder::open_with(
        dir,
        &DecoderOptions::default(),
        |config, tensors, experts| {
            let dev = EmuDevice::with_tile(TileGeometry::DEFAULT)?;
            let mut f = tarfa_decode::gpu_resident::build_placed(
                dev, config, tensors, experts, true, cpu_moe,
            )?;
            if let Ok(f) = f.as_mut() {
                f.set_norm_fusion(fuse_norms);
            }
            Ok(f.ok().map(|f| Box::new(f) as Box<dyn Family>))
        },
    )
    .expect("open the emulated GPU decoder")
}

/// The whole forward pass on the emulated GPU with the routed experts of layers 0..n (the first
/// MoE layer's, or every one's, as llama.cpp's --n-cpu-moe counts layers) computed on the CPU — the step stopped after their top-k, the normed x and the
/// slots read back, the CPU's outputs weighed and combined on the device with the shared
/// experts' — gives the CPU decoder's bits: on Qwen3-MoE (no shared expert), GLM-4.5 (a dense
/// first layer, the sigmoid group router, shared experts) and Qwen3.5 (a gated shared expert,
/// DeltaNet layers).
#[test]
fn experts_of_some_layers_on_the_cpu_give_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    // (layers 0..n, norms fused, MoE layers among them): qwen3_moe_b's layer 1 and glm4_moe_b's
    // layers 0 and 1 are dense.
    for (name, placements) in [
        (
            "qwen3_moe_b",
            &[(1, true, 1), (3, true, 2), (1, false, 1)][..],
        ),
        ("glm4_moe_b", &[(3, true, 1)][..]),
        ("qwen3_5_moe_text", &[(1, true, 1)][..]),
    ] {
        let dir = common::model(name);
        let cpu = run_prompts(
            &mut common::open(&dir, &DecoderOptions::default()),
            name,
            STEPS,
            1,
        );
        for &(n, fuse, moe_on_cpu) in placements {
            let mut dec = emulated_placed(&dir, n, fuse);
            let r = dec.offload_report().expect("a device report");
            assert!(r.whole_model, "{name}: {r:?}");
            let read = dec.expert_stats().reads;
            assert_eq!(
                run_prompts(&mut dec, name, STEPS, 1),
                cpu,
                "{name}: the experts of layers 0..{n} on the CPU, norms fused {fuse}"
            );
            let r = dec.offload_report().expect("a device report");
            assert!(r.cpu_moe_layers == n as u64 && r.steps > 0, "{name}: {r:?}");
            // A round trip per token and MoE layer on the CPU, and no other.
            assert_eq!(r.host_round_trips, r.steps * moe_on_cpu, "{name}: {r:?}");
            // Experts of those layers were read by the CPU as tokens chose them (the GPU's were
            // read once, when the decoder was opened).
            assert!(dec.expert_stats().reads > read, "{name}");
        }
    }
    // More layers than the model has: refused, naming both.
    let e = Decoder::open_with(
        &common::model("qwen3_moe_b"),
        &DecoderOptions::default(),
        |config, tensors, experts| {
            let dev = EmuDevice::with_tile(TileGeometry::DEFAULT)?;
            let f =
                tarfa_decode::gpu_resident::build_placed(dev, config, tensors, experts, true, 4)?;
            Ok(f.ok().map(|f| Box::new(f) as Box<dyn Family>))
        },
    )
    .expect_err("4 of 3 layers");
    assert!(
        e.to_string()
            .contains("--n-cpu-moe 4: the model has 3 layers"),
        "{e}"
    );
}

/// GLM-5.3-Flash's KDA layers run whole on the device with the CPU's bits (DSA layers are not
/// on the engine yet: the fixture itself is declined, saying so,
/// `models_not_taken_are_left_to_the_cpu_saying_why`): the streams mixed by
/// hyper-connections around each sublayer (`kernels/mhc.cu`), Kimi delta attention
/// (`tarfa_e_kda_heads`, its state carried over the prompt's tokens and the steps after), the
/// clamped SwiGLU in the dense layer, the routed experts and the shared expert, the streams'
/// mean before the head. The prompt steps token by token (no pass as matrices of this form).
#[test]
fn glm5_next_kda_layers_run_whole_with_the_cpu_bits() {
    let _one = one_engine_at_a_time();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = common::glm5_next_kda_layers(tmp.path());
    let cpu = run_prompts(
        &mut common::open(&dir, &DecoderOptions::default()),
        "glm5_next",
        STEPS,
        1,
    );
    assert_eq!(declined(&dir), None);
    // Norms taken into the products and launched alone (the streams' weightless norm then a
    // `tarfa_e_rms_norm` of streams·hidden of its own).
    for fuse in [true, false] {
        let mut dec = emulated_with(&dir, true, TileGeometry::DEFAULT, fuse).0;
        let r = dec.offload_report().expect("a device report");
        assert!(r.whole_model, "{r:?}");
        assert_eq!(
            run_prompts(&mut dec, "glm5_next", STEPS, 1),
            cpu,
            "fuse {fuse}"
        );
        let r = dec.offload_report().expect("a device report");
        assert!(
            r.steps > 0 && r.host_round_trips == 0 && r.prompt_passes == 0,
            "{r:?}"
        );
    }
}
