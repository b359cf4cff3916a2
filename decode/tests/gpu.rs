//! The GPU gives the CPU's bits (issue 12): every family's fixture decoded with all routed
//! experts on the GPU, with half of them (mixed placement), with a VRAM cache of 0 (each expert
//! copied for each use), a small one (evictions) and the default (all cached), with the trunk's
//! and layers' matrix products on the GPU or on the CPU, gives logits bit-identical to the CPU's
//! at every greedy step. Quantised matrices stay on the CPU. Streamed experts are copied to VRAM
//! straight from the expert ring, registered with the device.
//!
//! Built only with `--features cuda`; without a usable GPU it says so and passes, unless
//! `TARFA_REQUIRE_GPU=1` (the GPU machine's runs set it).
#![cfg(feature = "cuda")]

mod common;

use tarfa_decode::{Decoder, DecoderOptions, Device, GpuOptions};

fn gpu_here() -> bool {
    match tarfa_decode::offload::open(&Device::Cuda(GpuOptions::default())) {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("TARFA_REQUIRE_GPU").is_none(),
                "TARFA_REQUIRE_GPU is set but the GPU is not usable: {e}"
            );
            eprintln!("SKIPPED: no usable GPU here: {e}");
            false
        }
    }
}

fn run(dec: &mut Decoder, name: &'static str) -> Vec<Vec<Vec<u32>>> {
    common::reference(name)
        .iter()
        .map(|p| common::bits(&common::greedy(dec, &p.prompt_ids, 12).1))
        .collect()
}

/// Experts (a `fraction` of them) and, with `trunk`, matrix products offloaded from the CPU's
/// layers: the path every family has.
fn gpu(fraction: f64, vram_bytes: Option<u64>, trunk: bool) -> DecoderOptions {
    DecoderOptions {
        device: Device::Cuda(GpuOptions {
            ordinal: 0,
            vram_bytes,
            fraction,
            trunk,
            whole_model: false,
            graphs: false,
            cpu_moe_layers: None,
        }),
        ..DecoderOptions::default()
    }
}

/// The whole forward pass on the GPU (when the model takes it), with or without CUDA graphs.
fn whole(graphs: bool, batch_prompt: bool) -> DecoderOptions {
    DecoderOptions {
        device: Device::Cuda(GpuOptions {
            whole_model: true,
            graphs,
            ..GpuOptions::default()
        }),
        batch_prompt,
        ..DecoderOptions::default()
    }
}

/// Every qwen3_moe, qwen3_5_moe, qwen3_next, glm4_moe, mixtral and deepseek_v3 (MLA) fixture (q/k norms or none, GQA, the
/// softmax and the sigmoid group routers with and without renormalisation, shared experts plain
/// and gated, biases, partial rotary, tied heads, dense layers, Gated DeltaNet layers, gated
/// attention, zero-centred norms, widths that are and are not multiples of 32) decoded with its whole
/// forward pass on the GPU — kernels launched one by one, or replayed from a CUDA graph; the
/// prompt as one call or token by token — gives the CPU's logits bit for bit at every step, and
/// the same again after a reset (the device KV cache holds nothing that leaks into the next
/// sequence).
#[test]
fn the_whole_forward_pass_on_the_gpu_gives_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    for name in [
        "qwen3_moe",
        "qwen3_moe_b",
        "glm4_moe",
        "glm4_moe_b",
        "mixtral",
        "qwen3_5_moe_text",
        "qwen3_next",
        // MLA: a query LoRA and interleaved pairs; a plain q_proj, biases and YaRN.
        "deepseek_v3",
        "deepseek_v3_b",
        // Sliding layers of their own KV heads, window and RoPE, sinks, narrower scaled values.
        "mimo_v2_flash",
        "mimo_v2_flash_b",
    ] {
        let dir = common::model(name);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        for (graphs, batch) in [(true, true), (false, true), (true, false)] {
            let mut dec = common::open(&dir, &whole(graphs, batch));
            assert_eq!(
                run(&mut dec, name),
                cpu,
                "{name}: graphs {graphs}, batch {batch}"
            );
            // Twice on one decoder: the second pass starts from a reset.
            assert_eq!(run(&mut dec, name), cpu, "{name}: again");
            let r = dec.offload_report().expect("a GPU report");
            assert!(
                r.whole_model,
                "{name}: the whole pass ran on the GPU: {r:?}"
            );
            assert!(r.steps > 0, "{name}: {r:?}");
            assert_eq!(r.graph_steps > 0, graphs, "{name}: {r:?}");
            assert_eq!(r.computed, 0, "{name}: no offloaded expert calls: {r:?}");
            eprintln!("{name}: whole model, graphs {graphs}, batch {batch}: {r:?}");
        }
    }
}

/// Sequences apart from the model on the GPU decoder (CUDA graphs on and off): two sequences'
/// steps interleaved with each other and the decoder's own (each its own device buffers; a graph
/// captured for one is never replayed for another), a fork (device state copied), a
/// truncation or its refusal (a recurrent state), and a truncation to 0 (DeltaNet state zeroed
/// on the device) give every position the bits a fresh CPU decoder gives that sequence alone,
/// on every family's fixture.
#[test]
fn gpu_sequences_interleaved_forked_and_truncated_give_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    for name in [
        "qwen3_moe_b",
        "glm4_moe_b",
        "mixtral",
        "qwen3_5_moe_text",
        "deepseek_v3",
        "mimo_v2_flash_b",
    ] {
        for graphs in [true, false] {
            let mut dec = common::open(&common::model(name), &whole(graphs, true));
            common::sequences_hold(name, &mut dec);
            let r = dec.offload_report().expect("a GPU report");
            assert!(r.whole_model, "{name}: {r:?}");
            assert_eq!(r.graph_steps > 0, graphs, "{name}: {r:?}");
        }
    }
}

/// The whole forward pass on the GPU with the routed experts of layers 0..n computed on the CPU
/// (`--n-cpu-moe`: all layers but the last, or all), each part of a step between them replayed from a
/// CUDA graph or launched one by one: every family's fixture gives the CPU's logits bit for bit
/// at every step, and says where the experts ran.
#[test]
fn experts_of_some_layers_on_the_cpu_give_the_cpu_bits_on_the_gpu() {
    if !gpu_here() {
        return;
    }
    for name in ["qwen3_moe_b", "glm4_moe_b", "mixtral", "qwen3_5_moe_text"] {
        let dir = common::model(name);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        let cfg = std::fs::read(
            common::repo()
                .join("fixtures/hf")
                .join(name)
                .join("config.json"),
        );
        let cfg: serde_json::Value = serde_json::from_slice(&cfg.expect("config")).expect("json");
        let layers = cfg["num_hidden_layers"].as_u64().expect("layers") as usize;
        // Layers 0..n as llama.cpp counts them: all but the last (each fixture's last layer is
        // a MoE layer, and so is another before it), and all.
        for (n, graphs) in [(layers - 1, true), (layers, true), (layers - 1, false)] {
            let opts = DecoderOptions {
                device: Device::Cuda(GpuOptions {
                    cpu_moe_layers: Some(n),
                    graphs,
                    ..GpuOptions::default()
                }),
                ..DecoderOptions::default()
            };
            let mut dec = common::open(&dir, &opts);
            assert_eq!(
                run(&mut dec, name),
                cpu,
                "{name}: --n-cpu-moe {n}, graphs {graphs}"
            );
            let r = dec.offload_report().expect("a GPU report");
            assert!(r.whole_model && r.cpu_moe_layers >= 1, "{name}: {r:?}");
            assert!(r.cpu_moe_layers <= n as u64, "{name}: {r:?}");
            assert!(
                r.host_round_trips > 0 && r.host_round_trips.is_multiple_of(r.steps),
                "{name}: {r:?}"
            );
            // Each part of a step between the CPU's layers replayed from its own graph.
            assert_eq!(r.graph_steps > 0, graphs, "{name}: {r:?}");
        }
    }
}

/// The whole pass on the GPU whose sequences begin with room for 2 positions, with or without
/// CUDA graphs.
fn small_caches(dir: &std::path::Path, graphs: bool) -> Decoder {
    Decoder::open_with(
        dir,
        &DecoderOptions::default(),
        |config, tensors, experts| {
            let gpu = tarfa_runtime::Gpu::open(0)?;
            let dev = tarfa_cuda::CudaDevice::open(&gpu)?;
            let mut f = tarfa_decode::gpu_resident::build(dev, config, tensors, experts, graphs)?;
            if let Some(f) = f.as_mut() {
                f.set_first_capacity(2);
            }
            Ok(f.map(|f| Box::new(f) as Box<dyn tarfa_decode::family::Family>))
        },
    )
    .expect("open the GPU decoder")
}

/// The graphs of a sequence whose KV caches grow (from room for 2 positions: to 4, to 8) while
/// other sequences hold theirs are never replayed with the old caches' addresses, and more
/// sequences than the engine keeps graphs for (8), stepped in turn, each capture theirs again:
/// every position has the bits a fresh CPU decoder gives that sequence alone.
#[test]
fn gpu_sequences_whose_caches_grow_and_more_than_the_graphs_kept_give_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    for name in ["qwen3_moe_b", "qwen3_5_moe_text"] {
        for graphs in [true, false] {
            let mut dec = small_caches(&common::model(name), graphs);
            common::sequences_hold(name, &mut dec);
            // Ten sequences, a token of each in turn.
            let mut seqs: Vec<_> = (0..10).map(|_| dec.new_sequence().expect("seq")).collect();
            let mut got = vec![Vec::new(); seqs.len()];
            for step in 0..5u32 {
                for (i, seq) in seqs.iter_mut().enumerate() {
                    let t = (i as u32 * 7 + step * 3) % 100;
                    let rows = dec.feed_in(seq, &[t], true).expect("feed");
                    got[i].extend(common::bits(&rows));
                }
            }
            for (i, g) in got.iter().enumerate() {
                let toks: Vec<u32> = (0..5u32).map(|s| (i as u32 * 7 + s * 3) % 100).collect();
                assert_eq!(
                    *g,
                    common::alone(name, &toks),
                    "{name}: sequence {i}, graphs {graphs}"
                );
            }
            let r = dec.offload_report().expect("a GPU report");
            assert!(r.whole_model, "{name}: {r:?}");
            assert_eq!(r.graph_steps > 0, graphs, "{name}: {r:?}");
        }
    }
}

/// The whole pass on the GPU (CUDA graphs on) with RMSNorms taken into the products or not.
fn fused(dir: &std::path::Path, norms: bool) -> Decoder {
    let opts = DecoderOptions::default();
    Decoder::open_with(dir, &opts, |config, tensors, experts| {
        let gpu = tarfa_runtime::Gpu::open(0)?;
        let dev = tarfa_cuda::CudaDevice::open(&gpu)?;
        let mut f = tarfa_decode::gpu_resident::build(dev, config, tensors, experts, true)?;
        if let Some(f) = f.as_mut() {
            f.set_norm_fusion(norms);
        }
        Ok(f.map(|f| Box::new(f) as Box<dyn tarfa_decode::family::Family>))
    })
    .expect("open the GPU decoder")
}

/// RMSNorms taken into the products (`set_norm_fusion(true)`, the default) or each given a
/// launch of its own (`false`: the next layer's input norm in the combine's launch), the whole
/// pass on the GPU gives the CPU's bits. On both fixtures, and on qwen3_moe with experts 32 wide
/// and top-3: the fixtures' are 16 wide, so only there do the tiled experts' kernels run in a
/// whole pass.
#[test]
fn norms_taken_in_or_launched_alone_on_the_gpu_give_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    for (label, name, dir) in common::whole_pass_models(tmp.path()) {
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        for fuse in [true, false] {
            let mut dec = fused(&dir, fuse);
            assert_eq!(run(&mut dec, name), cpu, "{label}: norms fused {fuse}");
            let r = dec.offload_report().expect("a GPU report");
            assert!(r.whole_model && r.steps > 0, "{label}: {r:?}");
        }
    }
}

/// A model the whole-model path does not take (a layer whose experts differ in type: expert 0's
/// up F32, the others' BF16; GLM-5.3-Flash's blocks) falls back to the offload path, still
/// with the CPU's bits.
#[test]
fn models_the_whole_gpu_pass_does_not_take_fall_back_to_offloading() {
    if !gpu_here() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let out = common::mixed_type_expert_model(tmp.path());
    let mut dec = common::open(&out, &whole(true, true));
    let cpu = run(
        &mut common::open(&out, &DecoderOptions::default()),
        "qwen3_moe_b",
    );
    assert_eq!(run(&mut dec, "qwen3_moe_b"), cpu);
    let r = dec.offload_report().expect("report");
    assert!(!r.whole_model, "{r:?}");
    // GLM-5.3-Flash (its DSA layers have no kernels yet): its layers on the CPU, its experts and
    // products offloaded, the CPU's bits.
    let dir = common::model("glm5_next");
    let cpu = run(
        &mut common::open(&dir, &DecoderOptions::default()),
        "glm5_next",
    );
    let mut dec = common::open(&dir, &whole(true, true));
    assert_eq!(run(&mut dec, "glm5_next"), cpu);
    let r = dec.offload_report().expect("report");
    assert!(!r.whole_model && r.computed > 0, "{r:?}");
}

/// llama.cpp's Qwen3-Next and Qwen3.5 GGUFs hold DeltaNet's decay rates as the converter's
/// `−exp(A_log)` (`ssm_a`): the whole-model pass takes them as stored (the CPU's `Rates::Neg`)
/// and gives the CPU's bits — the BF16 qwen3next GGUF and the quantised qwen35moe one (three
/// value heads a key head, K-quants, Q8_0 and a Q4_0 `ssm_out`).
#[test]
fn ggufs_with_stored_deltanet_rates_run_whole_on_the_gpu_with_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    for (src, name) in [
        ("fixtures/gguf/from_hf/qwen3_next_b.gguf", "qwen3_next_b"),
        ("fixtures/gguf/qwen3_5_moe_q.gguf", "qwen3_5_moe_q"),
    ] {
        let dir = common::converted(src);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        let mut dec = common::open(&dir, &whole(true, true));
        assert_eq!(run(&mut dec, name), cpu, "{name}");
        let r = dec.offload_report().expect("report");
        assert!(r.whole_model, "{name}: {r:?}");
    }
}

#[test]
fn gpu_experts_give_the_cpu_bits_for_every_family_placement_and_vram_cache() {
    if !gpu_here() {
        return;
    }
    for name in [
        "qwen3_moe_b",
        "mixtral",
        "glm4_moe_b",
        "qwen3_5_moe_text",
        "qwen3_next",
        "mimo_v2_flash",
        "deepseek_v3",
        "deepseek_v3_b",
        "glm5_next",
    ] {
        let dir = common::model(name);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        let model = tarfa_runtime::ModelExperts::open(&dir).expect("experts");
        let n_experts = model.len() as u64;
        assert!(n_experts > 2, "{name}");
        // The VRAM copy of one expert (gate, up and down), measured by a first all-GPU run: the
        // small cache below holds two.
        let one_expert = {
            let mut dec = common::open(&dir, &gpu(1.0, None, true));
            run(&mut dec, name);
            let r = dec.offload_report().expect("report");
            r.upload_bytes / r.uploads.max(1)
        };
        let (mut all_gpu_computed, mut distinct) = (0, 0);
        for (fraction, vram, trunk) in [
            (1.0, None, true),
            (1.0, Some(0), true),
            (1.0, Some(one_expert * 2), false),
            (1.0, Some(one_expert * 2), true),
            (0.5, None, true),
            (0.5, None, false),
        ] {
            let mut dec = common::open(&dir, &gpu(fraction, vram, trunk));
            assert_eq!(
                run(&mut dec, name),
                cpu,
                "{name}: GPU fraction {fraction}, VRAM cache {vram:?}, trunk on the GPU {trunk}"
            );
            let r = dec.offload_report().expect("a GPU report");
            assert!(r.computed > 0, "{name}: the GPU computed experts: {r:?}");
            // Experts stream (the default mode): copied to VRAM from the ring, page-locked and
            // registered with the device, in place (one copy of the extent as it landed).
            assert!(r.ring_registered, "{name}: {r:?}");
            assert_eq!(r.trunk_products > 0, trunk, "{name}: {r:?}");
            if vram == Some(0) {
                assert_eq!((r.vram_hits, r.cached_bytes), (0, 0), "{name}: {r:?}");
                assert_eq!(r.uploads, r.computed, "{name}: every use copied: {r:?}");
            }
            if vram.is_none() && fraction == 1.0 {
                assert!(r.vram_hits > 0, "{name}: {r:?}");
                assert!(
                    r.uploads <= n_experts,
                    "{name}: each expert copied once: {r:?}"
                );
                all_gpu_computed = r.computed;
                distinct = r.uploads;
            }
            if let Some(v) = vram.filter(|&v| v > 0) {
                // A cache smaller than the experts used: some were evicted and copied again.
                assert!(r.uploads > distinct, "{name}: {r:?}");
                assert!(r.cached_bytes <= v, "{name}: {r:?}");
            }
            if fraction < 1.0 {
                // Mixed placement: some of the same computations ran on the CPU.
                assert!(r.computed < all_gpu_computed, "{name}: {r:?}");
            }
            eprintln!("{name}: fraction {fraction}, cache {vram:?}: {r:?}");
        }
    }
}

/// GLM-5.3-Flash on the offload path: its clamped SwiGLUs (routed experts, the shared experts
/// and dense MLPs: `tarfa_swiglu_gate` with a limit) and its products on the GPU, the CPU's bits,
/// for both fixtures (clamps of 0.25 and 0.5).
#[test]
fn glm5_next_clamped_swiglus_on_the_gpu_give_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    for name in ["glm5_next", "glm5_next_b"] {
        let dir = common::model(name);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        let mut dec = common::open(&dir, &gpu(1.0, None, true));
        assert_eq!(run(&mut dec, name), cpu, "{name}");
        let r = dec.offload_report().expect("a GPU report");
        assert!(r.trunk_products > 0 && r.computed > 0, "{name}: {r:?}");
    }
}

/// GLM-5.3-Flash's KDA layers whole on the GPU (the fixture cut to them:
/// `common::glm5_next_kda_layers`; its DSA layers have no kernels yet): hyper-connections,
/// `tarfa_e_kda_heads`, the clamped SwiGLU in every expert kernel, with and without graphs — the
/// CPU's bits, nothing computed on the host.
#[test]
fn glm5_next_kda_layers_run_whole_on_the_gpu_with_the_cpu_bits() {
    if !gpu_here() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = common::glm5_next_kda_layers(tmp.path());
    let cpu = run(
        &mut common::open(&dir, &DecoderOptions::default()),
        "glm5_next",
    );
    for graphs in [true, false] {
        let mut dec = common::open(&dir, &whole(graphs, true));
        assert_eq!(run(&mut dec, "glm5_next"), cpu, "graphs {graphs}");
        let r = dec.offload_report().expect("report");
        assert!(
            r.whole_model && r.computed == 0 && r.host_round_trips == 0,
            "{r:?}"
        );
    }
}

/// The quantised GGUF fixture (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K): on the offload
/// path its quantised experts stay on the CPU; whole on the GPU every weight is dequantised inside
/// the canonical dot; the CPU's bits either way.
#[test]
fn a_quantised_gguf_gives_the_cpu_bits_offloaded_and_whole_on_the_gpu() {
    if !gpu_here() {
        return;
    }
    let out = common::quantised_model();
    let cpu = run(
        &mut common::open(&out, &DecoderOptions::default()),
        "qwen3_moe_q",
    );
    let mut dec = common::open(&out, &gpu(1.0, None, true));
    assert_eq!(run(&mut dec, "qwen3_moe_q"), cpu);
    let r = dec.offload_report().expect("report");
    assert_eq!(r.computed, 0, "{r:?}");
    // Its BF16 embedding / F16 head and F32 routers may go to the GPU; the quantised matrices not.
    eprintln!("qwen3_moe_q: {r:?}");
    // The whole pass takes it: every type of the fixture dequantised inside the canonical dot.
    for (graphs, batch) in [(true, true), (false, false)] {
        let mut dec = common::open(&out, &whole(graphs, batch));
        assert_eq!(run(&mut dec, "qwen3_moe_q"), cpu, "graphs {graphs}");
        let r = dec.offload_report().expect("report");
        assert!(r.whole_model && r.computed == 0, "{r:?}");
    }
}

/// deepseek2 GGUFs (MLA), in both MLA forms and quantised (its dense layer's Q5_K gate beside a
/// Q4_K up), on the offload path and whole on the GPU: the CPU's bits.
#[test]
fn deepseek2_ggufs_give_the_cpu_bits_on_the_gpu() {
    if !gpu_here() {
        return;
    }
    for (src, name) in [
        ("fixtures/gguf/from_hf/deepseek_v3.gguf", "deepseek_v3"),
        ("fixtures/gguf/from_hf/deepseek_v3.kv-b.gguf", "deepseek_v3"),
        ("fixtures/gguf/deepseek_v3_q.gguf", "deepseek_v3_q"),
    ] {
        let dir = common::converted(src);
        let cpu = run(&mut common::open(&dir, &DecoderOptions::default()), name);
        let mut dec = common::open(&dir, &gpu(1.0, None, true));
        assert_eq!(run(&mut dec, name), cpu, "{src}");
        let r = dec.offload_report().expect("report");
        assert!(!r.whole_model, "{src}: {r:?}");
        eprintln!("{src}: {r:?}");
        let mut dec = common::open(&dir, &whole(true, true));
        assert_eq!(run(&mut dec, name), cpu, "{src}: whole");
        let r = dec.offload_report().expect("report");
        assert!(r.whole_model, "{src}: {r:?}");
    }
}

/// An expert whose gate is BF16 and whose up is F32 (legal in a checkpoint) is not taken by the
/// GPU, whose kernel reads gate and up as one type: the bits stay the CPU's.
#[test]
fn an_expert_with_gate_and_up_of_different_types_stays_on_the_cpu() {
    if !gpu_here() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let out = common::mixed_type_expert_model(tmp.path());
    let cpu = run(
        &mut common::open(&out, &DecoderOptions::default()),
        "qwen3_moe_b",
    );
    // And the same values as the fixture: widening changed no value.
    let plain = run(
        &mut common::open(&common::model("qwen3_moe_b"), &DecoderOptions::default()),
        "qwen3_moe_b",
    );
    assert_eq!(cpu, plain);
    let mut dec = common::open(&out, &gpu(1.0, None, true));
    assert_eq!(run(&mut dec, "qwen3_moe_b"), cpu);
    let r = dec.offload_report().expect("report");
    assert!(r.computed > 0, "{r:?}");
}
