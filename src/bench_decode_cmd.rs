//! `tarfa bench-decode`: decode speed against its bounds, measured side by side in one run.
//!
//! - **resident**: every expert in RAM; tokens/s against the memory bound — the machine's read
//!   bandwidth (all threads summing a buffer larger than the caches, measured here, now) ÷ the
//!   bytes one decode step touches (the experts it computed with, measured, plus every resident
//!   tensor but the embedding table's unused rows).
//! - **stream**: experts from disk, cold page cache before each run, no RAM cache; tokens/s against
//!   the storage bound — fio's random-read rate over the layer files at the expert extent size and
//!   the depth one decode step has in flight (its top-k), measured here, now ÷ the expert bytes
//!   read per decoded token.
//! - **gpu-stream** (`--features cuda`): as `stream` (same storage bound, cold page cache before
//!   each run), with the routed experts computed on the GPU: each read into the ring and copied to
//!   VRAM from there for each use (no VRAM expert cache), the layers' products there too.
//!
//! - **gpu** (`--features cuda`, on a machine with a GPU): every weight in VRAM, the whole forward
//!   pass there (the offload path where the family has no whole-model path); tokens/s against the
//!   HBM bound — `--hbm-gbps` (the H200's datasheet 4,800 GB/s by default) ÷ the bytes one step
//!   touches (top-k experts of every MoE layer, by their recorded sizes, plus the resident
//!   tensors as for `resident`). One warm-up run of full length first (clocks, caches).
//!
//! Every run also checks that its logits are bit-identical to the first run's: a benchmark that
//! went faster by computing something else would be caught here.

use std::time::Instant;

use anyhow::{bail, Context};
use rayon::prelude::*;
use tarfa_benchkit::{drop_page_cache, fio::has_fio, fio::randread_gb_per_s};
use tarfa_decode::{Decoder, DecoderOptions, Device, ExpertMode, ExpertOptions, GpuOptions};
use tarfa_runtime::{ModelExperts, SourceOptions};

use crate::bench_io_cmd::common_extent_len;
use crate::cli::BenchDecodeArgs;

/// One mode's figures; a row of `modes` in `--json` (docs/json.md), floats through
/// [`crate::json::float`] so a NaN or an infinity is not written as `null` ("no figure").
#[derive(Debug, serde::Serialize)]
struct ModeRow {
    mode: &'static str,
    runs: usize,
    #[serde(serialize_with = "crate::json::ser_float")]
    prompt_tokens_per_s: f64,
    #[serde(serialize_with = "crate::json::ser_float")]
    decode_tokens_per_s: f64,
    #[serde(serialize_with = "crate::json::ser_float")]
    expert_bytes_per_token: f64,
    #[serde(serialize_with = "crate::json::ser_float")]
    bytes_per_token: f64,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    baseline_gb_per_s: Option<f64>,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    bound_tokens_per_s: Option<f64>,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    ratio_to_bound: Option<f64>,
    cold_cache: bool,
    /// llama.cpp's figures on this mode's device, with `--peer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    peer: Option<PeerFigures>,
}

/// A mode's figures against llama-bench's tests on its device (`--peer`).
#[derive(Debug, serde::Serialize)]
struct PeerFigures {
    file: String,
    backends: String,
    n_threads: u64,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    prompt_tokens_per_s: Option<f64>,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    decode_tokens_per_s: Option<f64>,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    prompt_ratio: Option<f64>,
    #[serde(serialize_with = "crate::json::ser_float_opt")]
    decode_ratio: Option<f64>,
}

/// The peer tests of a mode (`gpu`: a GPU mode) at this run's prompt length and steps: the
/// first file that has either.
fn peer_for(
    peers: &[crate::peer::Peer],
    gpu: bool,
    prompt: u64,
    steps: u64,
) -> Option<(
    &crate::peer::Peer,
    Option<&crate::peer::PeerRow>,
    Option<&crate::peer::PeerRow>,
)> {
    peers.iter().find_map(|p| {
        let (pp, tg) = (p.prompt(gpu, prompt), p.decode(gpu, steps));
        (pp.is_some() || tg.is_some()).then_some((p, pp, tg))
    })
}

pub fn run(a: &BenchDecodeArgs) -> anyhow::Result<bool> {
    crate::diagnose::require_model_dir(&a.dir, "bench-decode", || {
        crate::diagnose::reads_a_model_dir("bench-decode")
    })?;
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    // --threads, --tokens, --runs, --prompt-tokens and the GiB flags are in range: the parser
    // checks them. The memory probe's buffer must also fit in what is free now.
    if let Some(avail) = tarfa_decode::experts::mem_available() {
        let want = a.mem_gib * (1u64 << 30) as f64;
        if want > avail as f64 * 0.8 {
            bail!(
                "--mem-gib {}: the memory probe's buffer would take {:.1} GiB, more than 80% of the {:.1} GiB available now; give a smaller --mem-gib",
                a.mem_gib,
                want / (1u64 << 30) as f64,
                avail as f64 / (1u64 << 30) as f64
            );
        }
    }
    let modes: Vec<&str> = a.modes.split(',').map(str::trim).collect();
    for m in &modes {
        if !matches!(*m, "resident" | "stream" | "gpu" | "gpu-stream") {
            bail!("--modes: unknown mode {m:?} (resident, stream, gpu, gpu-stream)");
        }
    }
    // The peer files, read and matched before anything is measured: a file none of whose tests
    // is this run's (the prompt length, the steps, a mode's device) is an error now, not a table
    // of dashes after minutes of measuring.
    let peers = a
        .peer
        .iter()
        .map(|p| crate::peer::Peer::load(p))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let used = |p: &crate::peer::Peer| {
        modes.iter().any(|m| {
            let gpu = m.starts_with("gpu");
            p.prompt(gpu, a.prompt_tokens as u64).is_some()
                || p.decode(gpu, a.tokens as u64).is_some()
        })
    };
    let unused: Vec<String> = peers
        .iter()
        .filter(|p| !used(p))
        .map(|p| format!("{} ({})", p.file.display(), p.tests()))
        .collect();
    if !peers.is_empty() && unused.len() == peers.len() {
        bail!(
            "--peer {}: none of its tests is this run's: pp{} or tg{} on the device of --modes {} (llama-bench -p {} -n {}; -ngl 99 for the GPU modes)",
            unused.join(", "),
            a.prompt_tokens,
            a.tokens,
            a.modes,
            a.prompt_tokens,
            a.tokens
        );
    }
    for u in &unused {
        eprintln!("warning: --peer {u}: none of its tests is this run's; not used");
    }
    // A GPU mode in a build without CUDA: said before any measuring (the disk probe) starts.
    if !cfg!(feature = "cuda") && modes.iter().any(|m| m.starts_with("gpu")) {
        return Err(
            tarfa_decode::DecodeError::Options(tarfa_decode::error::OptionsFault::NoCuda).into(),
        );
    }
    let say = |s: String| {
        if !a.json {
            eprintln!("{s}");
        }
    };
    let model = ModelExperts::open(&a.dir)?;
    let top_k = model.top_k().unwrap_or(8);
    let vocab = tarfa_format::manifest::Manifest::load(&a.dir)?
        .architecture
        .config
        .get("vocab_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(2) as u32;
    let prompt: Vec<u32> = (0..a.prompt_tokens as u32)
        .map(|i| (i.wrapping_mul(7919).wrapping_add(13)) % vocab.max(1))
        .collect();
    let mut rows = Vec::new();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    let mut check = |logits: Vec<Vec<u32>>, what: &str| -> anyhow::Result<()> {
        match &reference {
            None => reference = Some(logits),
            Some(r) if *r == logits => {}
            Some(_) => bail!("{what}: logits differ from the first run's: exactness broken"),
        }
        Ok(())
    };
    say(format!(
        "bench-decode {}: {} threads, prompt {} tokens, {} decode steps, {} run(s) per mode",
        a.dir.display(),
        threads,
        prompt.len(),
        a.tokens,
        a.runs
    ));

    let mut mem_gbps = None;
    if modes.contains(&"resident") {
        let g = memory_read_gbps(threads, a.mem_gib)?;
        say(format!(
            "memory read, {threads} threads summing {:.1} GiB: {g:.2} GB/s (best of 5)",
            a.mem_gib
        ));
        mem_gbps = Some(g);
        let opts = options(threads, ExpertMode::Resident)?;
        let t0 = Instant::now();
        let mut dec = Decoder::open(&a.dir, &opts)?;
        say(format!(
            "resident: opened and read {:.2} GiB of experts in {:.1} s",
            dec.experts().cached_bytes() as f64 / (1u64 << 30) as f64,
            t0.elapsed().as_secs_f64()
        ));
        // Warm-up: page faults of fresh buffers, thread start.
        measure(&mut dec, &prompt, 2)?;
        let mut pr = Vec::new();
        let mut dr = Vec::new();
        let mut per_tok = 0.0;
        for run in 0..a.runs {
            let m = measure(&mut dec, &prompt, a.tokens)?;
            check(m.logits, &format!("resident run {run}"))?;
            pr.push(m.prompt_tps);
            dr.push(m.decode_tps);
            per_tok = m.expert_bytes_used_per_token;
        }
        let touched = per_tok + dec.tensor_bytes_per_token() as f64;
        let decode = median(&mut dr);
        let bound = mem_gbps.map(|g| g * 1e9 / touched);
        rows.push(ModeRow {
            mode: "resident",
            runs: a.runs,
            prompt_tokens_per_s: median(&mut pr),
            decode_tokens_per_s: decode,
            expert_bytes_per_token: per_tok,
            bytes_per_token: touched,
            baseline_gb_per_s: mem_gbps,
            bound_tokens_per_s: bound,
            ratio_to_bound: bound.map(|b| decode / b),
            cold_cache: false,
            peer: None,
        });
    }

    let streamed: Vec<&str> = ["stream", "gpu-stream"]
        .into_iter()
        .filter(|m| modes.contains(m))
        .collect();
    if !streamed.is_empty() {
        let cold = drop_page_cache().is_ok();
        if !cold {
            say(
                "WARNING: cannot drop the page cache (needs root): stream figures are warm-cache"
                    .into(),
            );
        }
        let disk = storage_gbps(a, &model, top_k, &say)?;
        for mode in streamed {
            let mut opts = options(threads, ExpertMode::Stream)?;
            if mode == "gpu-stream" {
                // Layers on the CPU, every expert read from disk into the ring and copied from
                // there to the GPU for each use: no VRAM expert cache, no whole-model upload.
                opts.device = Device::Cuda(GpuOptions {
                    vram_bytes: Some(0),
                    whole_model: false,
                    ..GpuOptions::default()
                });
            }
            let mut pr = Vec::new();
            let mut dr = Vec::new();
            let mut per_tok = Vec::new();
            for run in 0..a.runs {
                let mut dec = Decoder::open(&a.dir, &opts)?;
                if run == 0 {
                    if let Some(r) = dec.offload_report() {
                        say(format!(
                            "{mode}: {}, layers on the CPU (their products on the GPU), every expert read from disk and copied to the GPU from {} memory for each use (no VRAM expert cache)",
                            r.device,
                            if r.ring_registered { "the ring's pinned" } else { "pageable" }
                        ));
                    }
                }
                // Opening reads no expert; the page cache is dropped after it (the GPU's
                // start-up touches files too), so each run starts cold.
                let _ = drop_page_cache();
                let m = measure(&mut dec, &prompt, a.tokens)?;
                check(m.logits, &format!("{mode} run {run}"))?;
                pr.push(m.prompt_tps);
                dr.push(m.decode_tps);
                per_tok.push(m.expert_bytes_read_per_token);
            }
            let decode = median(&mut dr);
            let bytes = median(&mut per_tok);
            let bound = disk * 1e9 / bytes;
            rows.push(ModeRow {
                mode,
                runs: a.runs,
                prompt_tokens_per_s: median(&mut pr),
                decode_tokens_per_s: decode,
                expert_bytes_per_token: bytes,
                bytes_per_token: bytes,
                baseline_gb_per_s: Some(disk),
                bound_tokens_per_s: Some(bound),
                ratio_to_bound: Some(decode / bound),
                cold_cache: cold,
                peer: None,
            });
        }
    }

    if modes.contains(&"gpu") {
        let mut opts = options(threads, ExpertMode::Resident)?;
        opts.device = Device::Cuda(GpuOptions::default());
        let t0 = Instant::now();
        let mut dec = Decoder::open(&a.dir, &opts)?;
        let report = dec
            .offload_report()
            .context("gpu mode: the decoder has no GPU")?;
        let whole = report.whole_model;
        say(format!(
            "gpu: {}, {}; opened and uploaded in {:.1} s",
            report.device,
            if whole {
                "whole forward pass on the GPU"
            } else {
                "layers on the CPU, experts and products on the GPU"
            },
            t0.elapsed().as_secs_f64()
        ));
        // Warm-up at full length: the GPU's clocks rise under load, graphs are captured.
        measure(&mut dec, &prompt, a.tokens)?;
        let mut pr = Vec::new();
        let mut dr = Vec::new();
        for run in 0..a.runs {
            let m = measure(&mut dec, &prompt, a.tokens)?;
            check(m.logits, &format!("gpu run {run}"))?;
            pr.push(m.prompt_tps);
            dr.push(m.decode_tps);
        }
        let per_tok = routed_expert_bytes_per_token(&model, top_k);
        let touched = per_tok + dec.tensor_bytes_per_token() as f64;
        let decode = median(&mut dr);
        let bound = a.hbm_gbps * 1e9 / touched;
        rows.push(ModeRow {
            mode: if whole { "gpu" } else { "gpu-offload" },
            runs: a.runs,
            prompt_tokens_per_s: median(&mut pr),
            decode_tokens_per_s: decode,
            expert_bytes_per_token: per_tok,
            bytes_per_token: touched,
            baseline_gb_per_s: Some(a.hbm_gbps),
            bound_tokens_per_s: Some(bound),
            ratio_to_bound: Some(decode / bound),
            cold_cache: false,
            peer: None,
        });
    }

    for r in &mut rows {
        let gpu = r.mode.starts_with("gpu");
        if let Some((p, pp, tg)) = peer_for(&peers, gpu, prompt.len() as u64, a.tokens as u64) {
            let row = pp.or(tg).expect("one of them");
            r.peer = Some(PeerFigures {
                file: p.file.display().to_string(),
                backends: row.backends.clone(),
                n_threads: row.n_threads,
                prompt_tokens_per_s: pp.map(|x| x.avg_ts),
                decode_tokens_per_s: tg.map(|x| x.avg_ts),
                prompt_ratio: pp.map(|x| r.prompt_tokens_per_s / x.avg_ts),
                decode_ratio: tg.map(|x| r.decode_tokens_per_s / x.avg_ts),
            });
        }
    }

    if a.json {
        let body = serde_json::json!({
            "model": a.dir.display().to_string(),
            "threads": threads,
            "prompt_tokens": prompt.len(),
            "decode_steps": a.tokens,
            "memory_read_gb_per_s": crate::json::float_opt(mem_gbps),
            "modes": rows,
            "logits_identical_across_runs": true,
        });
        crate::json::print(&crate::json::document("tarfa.bench-decode/1", body)?)?;
    } else {
        println!(
            "| mode | prompt tok/s | decode tok/s | bytes/token (experts) | baseline GB/s | bound tok/s | ratio |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        for r in &rows {
            let f = |v: Option<f64>, p: usize| v.map_or("-".into(), |v| format!("{v:.p$}"));
            println!(
                "| {}{} | {:.1} | {:.2} | {:.1} MB ({:.1} MB) | {} | {} | {} |",
                r.mode,
                if matches!(r.mode, "stream" | "gpu-stream") && !r.cold_cache {
                    " (WARM)"
                } else {
                    ""
                },
                r.prompt_tokens_per_s,
                r.decode_tokens_per_s,
                r.bytes_per_token / 1e6,
                r.expert_bytes_per_token / 1e6,
                f(r.baseline_gb_per_s, 2),
                f(r.bound_tokens_per_s, 2),
                f(r.ratio_to_bound, 3),
            );
        }
        println!(
            "logits bit-identical across all {} runs",
            rows.iter().map(|r| r.runs).sum::<usize>()
        );
        if rows.iter().any(|r| r.peer.is_some()) {
            println!();
            println!(
                "| mode | llama.cpp | pp{} tok/s | tarfa ÷ llama.cpp | tg{} tok/s | tarfa ÷ llama.cpp |",
                prompt.len(),
                a.tokens
            );
            println!("|---|---|---:|---:|---:|---:|");
            for r in &rows {
                let Some(p) = &r.peer else { continue };
                let f = |v: Option<f64>, d: usize| v.map_or("-".into(), |v| format!("{v:.d$}"));
                println!(
                    "| {} | {}, {} threads | {} | {} | {} | {} |",
                    r.mode,
                    p.backends,
                    p.n_threads,
                    f(p.prompt_tokens_per_s, 1),
                    f(p.prompt_ratio, 3),
                    f(p.decode_tokens_per_s, 2),
                    f(p.decode_ratio, 3),
                );
            }
        }
    }
    Ok(true)
}

/// The storage bound's rate, GB/s: fio's random read over the layer files at the expert extent
/// size and top-k depth, cold cache, median of 3; without fio (`--no-fio`, or none installed: the
/// GPU machine) the runtime's own io_uring reads with checks off, decode-shaped (one layer's top-k
/// in flight at a time), cold cache, median of 3.
fn storage_gbps(
    a: &BenchDecodeArgs,
    model: &ModelExperts,
    top_k: u32,
    say: &dyn Fn(String),
) -> anyhow::Result<f64> {
    if !a.no_fio && has_fio() {
        let paths: Vec<_> = model.paths().map(|p| p.to_path_buf()).collect();
        let block = common_extent_len(model);
        let bytes = (a.fio_gib * (1u64 << 30) as f64) as u64;
        let mut v = Vec::new();
        for _ in 0..3 {
            let _ = drop_page_cache();
            v.push(randread_gb_per_s(&paths, block, top_k, bytes, None)?);
        }
        let g = median(&mut v);
        say(format!(
            "disk: fio randread bs={block} iodepth={top_k} (io_uring, O_DIRECT) over the layer files: {g:.3} GB/s (median of 3)"
        ));
        return Ok(g);
    }
    // No fio (the GPU machine has none): the runtime's own io_uring path with checks off,
    // decode-shaped (one layer's top-k experts in flight at a time), cold cache.
    let mut sets = Vec::new();
    for token in tarfa_runtime::bench::decode_sets(model, top_k, 8, 0x7a4f) {
        let mut by_layer: std::collections::BTreeMap<u32, Vec<(u32, u32)>> = Default::default();
        for (l, e) in token {
            by_layer.entry(l).or_default().push((l, e));
        }
        sets.extend(by_layer.into_values());
    }
    let opts = SourceOptions {
        queue_depth: top_k,
        verify: false,
        ..SourceOptions::from_env()?
    };
    let mut v = Vec::new();
    for _ in 0..3 {
        let mut src = tarfa_runtime::ExpertSource::open(&a.dir, &opts)?;
        let _ = drop_page_cache();
        v.push(tarfa_runtime::bench::stream_sets(&mut src, &sets)?.gb_per_s());
    }
    let g = median(&mut v);
    say(format!(
            "disk: no fio here; tarfa's io_uring reads with checks off, one layer's top-{top_k} in flight, cold cache: {g:.3} GB/s (median of 3)"
        ));
    Ok(g)
}

fn options(threads: usize, mode: ExpertMode) -> anyhow::Result<DecoderOptions> {
    Ok(DecoderOptions {
        threads,
        isa: None,
        experts: ExpertOptions {
            mode,
            cache_bytes: 0,
        },
        source: SourceOptions::from_env()?,
        batch_prompt: true,
        prompt_chunk: 0,
        device: Default::default(),
    })
}

struct Measured {
    prompt_tps: f64,
    decode_tps: f64,
    expert_bytes_used_per_token: f64,
    expert_bytes_read_per_token: f64,
    logits: Vec<Vec<u32>>,
}

fn measure(dec: &mut Decoder, prompt: &[u32], n: usize) -> anyhow::Result<Measured> {
    dec.reset()?;
    let mut logits = Vec::new();
    let (p, d) = dec.generate(prompt, n, |_, _, l| {
        logits.push(l.iter().map(|v| v.to_bits()).collect());
        Ok(())
    })?;
    let tps = |tokens: u64, s: f64| if s > 0.0 { tokens as f64 / s } else { 0.0 };
    let dt = d.tokens.max(1) as f64;
    Ok(Measured {
        prompt_tps: tps(p.tokens, p.time.as_secs_f64()),
        decode_tps: tps(d.tokens, d.time.as_secs_f64()),
        expert_bytes_used_per_token: d.experts.bytes_used as f64 / dt,
        expert_bytes_read_per_token: d.experts.bytes_read as f64 / dt,
        logits,
    })
}

/// Read bandwidth of this machine's memory with `threads` threads: each sums its share of a
/// buffer of `gib` GiB (far larger than the caches); best of 5 passes, in GB/s.
fn memory_read_gbps(threads: usize, gib: f64) -> anyhow::Result<f64> {
    let words = ((gib * (1u64 << 30) as f64) as usize / 8).max(1 << 20);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .context("thread pool")?;
    let buf: Vec<u64> = pool.install(|| {
        (0..words)
            .into_par_iter()
            .map(|i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect()
    });
    let chunk = words.div_ceil(threads * 8);
    let mut best = 0.0f64;
    let mut sink = 0u64;
    for _ in 0..5 {
        let t = Instant::now();
        let s: u64 = pool.install(|| {
            buf.par_chunks(chunk)
                .map(|c| {
                    // 16 independent lanes: the loop vectorises into several registers, so the
                    // sum is bound by memory, not by one add chain.
                    let mut acc = [0u64; 16];
                    for w in c.chunks_exact(16) {
                        for (a, &v) in acc.iter_mut().zip(w) {
                            *a = a.wrapping_add(v);
                        }
                    }
                    acc.iter().fold(0u64, |a, &v| a.wrapping_add(v))
                })
                .reduce(|| 0, u64::wrapping_add)
        });
        let secs = t.elapsed().as_secs_f64();
        sink = sink.wrapping_add(s);
        best = best.max((words * 8) as f64 / secs / 1e9);
    }
    std::hint::black_box(sink);
    Ok(best)
}

/// Bytes of routed experts one decode step computes with: in each MoE layer, its top-k experts of
/// the layer's mean recorded size (payload, padding excluded).
fn routed_expert_bytes_per_token(model: &ModelExperts, top_k: u32) -> f64 {
    model
        .layers()
        .map(|(layer, n)| {
            let total: usize = (0..n)
                .filter_map(|e| model.get(layer, e))
                .map(|x| x.regions.iter().map(|r| r.len).sum::<usize>())
                .sum();
            total as f64 / f64::from(n.max(1)) * f64::from(top_k.min(n))
        })
        .sum()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mode_row_keeps_nan_and_inf_distinguishable_from_no_figure() {
        let row = ModeRow {
            mode: "resident",
            runs: 1,
            prompt_tokens_per_s: f64::NAN,
            decode_tokens_per_s: f64::INFINITY,
            expert_bytes_per_token: f64::NEG_INFINITY,
            bytes_per_token: 2.5,
            baseline_gb_per_s: Some(f64::NAN),
            bound_tokens_per_s: Some(f64::INFINITY),
            ratio_to_bound: None,
            cold_cache: false,
            peer: None,
        };
        let v = serde_json::to_value(&row).expect("json");
        assert_eq!(v["prompt_tokens_per_s"], "NaN");
        assert_eq!(v["decode_tokens_per_s"], "inf");
        assert_eq!(v["expert_bytes_per_token"], "-inf");
        assert_eq!(v["bytes_per_token"], 2.5);
        assert_eq!(v["baseline_gb_per_s"], "NaN");
        assert_eq!(v["bound_tokens_per_s"], "inf");
        assert_eq!(v["ratio_to_bound"], serde_json::Value::Null);
    }
}
