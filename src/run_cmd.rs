//! `tarfa run`: greedy decoding of a JNF model directory, text (or ids) on stdout as generated,
//! the figures on stderr (or one JSON document on stdout).

use std::io::Write;

use anyhow::{bail, Context};
use indicatif::HumanBytes;
use tarfa_decode::{
    Decoder, DecoderOptions, Device, ExpertMode, ExpertOptions, GpuOptions, Isa, PhaseStats,
};
use tarfa_runtime::{BackendChoice, SourceOptions};

use crate::cli::RunArgs;
use tarfa_decode::text::{Detokenizer, NoText, Text};

pub fn run(a: &RunArgs) -> anyhow::Result<bool> {
    // Bad arguments (a flag's or a TARFA_* variable's value) first: exit 2 whatever the path is.
    let opts = options(a)?;
    crate::diagnose::require_model_dir(&a.dir, "run", || {
        crate::diagnose::reads_a_model_dir("run")
    })?;
    // The logits' file, checked before anything is loaded: never one of the model's own files,
    // a link or a directory; a device or FIFO is written into, not replaced.
    let mut logits_out = match &a.logits_out {
        Some(p) => {
            tarfa_format::publish::refuse_input(p, &model_files(&a.dir))
                .with_context(|| "--logits-out".to_string())?;
            // Nor a new file among them: `verify` holds a model directory to its listed files.
            let canon = |d: &std::path::Path| std::fs::canonicalize(d).ok();
            let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
            if canon(parent.unwrap_or(std::path::Path::new("."))) == canon(&a.dir) {
                bail!(
                    "--logits-out: {}: inside the model directory {} (which holds its listed files and nothing else); write it elsewhere",
                    p.display(),
                    a.dir.display()
                );
            }
            Some(
                tarfa_decode::npy::F32Writer::create(p)
                    .with_context(|| "--logits-out".to_string())?,
            )
        }
        None => None,
    };
    let mut dec = Decoder::open(&a.dir, &opts)?;
    // The GPU was asked for its whole forward pass and cannot take it: say why, before the run.
    if let Some(why) = dec.offload_report().and_then(|g| g.whole_model_declined) {
        eprintln!(
            "warning: the whole forward pass does not run on the GPU: {why}; the layers run on the CPU, with the experts and matrix products on the GPU{}",
            if a.model.n_cpu_moe.is_some() { " (--n-cpu-moe does not apply)" } else { "" }
        );
    }
    // The decoder bounds the ring by the model: say so when that is less than was asked for.
    let src = dec.source_report();
    // (Resident experts are all read at start: the ring's bounds are not theirs to warn of.)
    let streams = a.model.experts != "resident";
    for (flag, asked, took, why) in [
        (
            "--qd",
            a.model.qd,
            src.queue_depth,
            "reads in flight: a layer's experts, each read once",
        ),
        (
            "--ring-slots",
            a.model.ring_slots,
            src.slots,
            "slots: a layer's experts and 16 more",
        ),
    ] {
        if streams && asked > took {
            eprintln!(
                "warning: {flag} {asked}: this model uses at most {took} {why}; using {took}"
            );
        }
    }
    // Loaded only where text is made: from --prompt, or the text of --json. A --tokens run
    // printing ids never reads it (a tokenizer.json of 66 MB cost 862 MB of memory). Why there
    // is none is said only if --prompt needs one (--tokens runs without).
    let wants_text = a.prompt.is_some() || a.prompt_file.is_some() || a.json;
    let (tokenizer, no_tokenizer) = if !wants_text {
        (None, String::new())
    } else {
        match Text::of(&dec) {
            Ok(t) => (Some(t), String::new()),
            Err(NoText::Decode(e)) => return Err(e.into()),
            Err(NoText::Broken(why)) if dec.gguf_tokenizer_json().is_none() => bail!(why),
            Err(why) => (None, why.to_string()),
        }
    };
    let text = match (&a.prompt, &a.prompt_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(f)) => Some(read_prompt_file(f)?),
        (None, None) => None,
    };
    let prompt: Vec<u32> = match (&text, &a.tokens) {
        (Some(text), _) => {
            let Some(tk) = &tokenizer else {
                bail!(
                    "{}: {no_tokenizer}; give --tokens instead of --prompt",
                    a.dir.display()
                );
            };
            // As transformers' tokenizer(text): the tokenizer's post-processor adds its special
            // tokens (a BOS for Llama/Mistral tokenizers, none for Qwen's).
            tk.encode(text.as_str(), true)
                .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt, --prompt-file or --tokens"),
    };
    // The end-of-sequence set, checked before the run.
    let eos = if a.ignore_eos {
        Vec::new()
    } else {
        dec.eos_ids()?
    };
    if prompt.is_empty() {
        bail!("the prompt has no tokens");
    }
    // Checked before anything runs, -n 0 included.
    let vocab = dec.vocab_size();
    if let Some(&id) = prompt.iter().find(|&&t| t as usize >= vocab) {
        bail!("token {id} is outside the model's vocabulary of {vocab} (ids 0..{vocab})");
    }
    // The prompt and every generated token but the last are run: that many positions.
    let positions = (prompt.len() as u64).saturating_add((a.max_tokens as u64).saturating_sub(1));
    // The positions this run may take: the model's context, or less with -c.
    let (context, whose) = match (a.ctx_size, dec.context_length()) {
        (Some(c), Some(m)) if c > m => bail!(
            "-c/--ctx-size {c}: the model's context is {m} positions (max_position_embeddings)"
        ),
        (Some(c), _) => (Some(c), "-c/--ctx-size"),
        (None, m) => (m, "the model's context, max_position_embeddings"),
    };
    if let Some(ctx) = context.filter(|&c| prompt.len() > c) {
        bail!(
            "the prompt's {} tokens exceed the {ctx} positions this run may take ({whose})",
            prompt.len()
        );
    }
    if let Some(ctx) = context.filter(|&c| a.max_tokens > 0 && positions > c as u64) {
        bail!(
            "-n {}: the prompt's {} tokens and {} generated take {positions} positions, beyond the {ctx} this run may take ({whose}); ask for at most {} tokens",
            a.max_tokens,
            prompt.len(),
            a.max_tokens,
            (ctx + 1).saturating_sub(prompt.len())
        );
    }
    let text_mode = text.is_some() && !a.json;
    let mut out = std::io::stdout().lock();
    let mut generated: Vec<u32> = Vec::new();
    // The text is of the tokens before an end-of-sequence token, which is not printed; made
    // token by token, a character split across tokens held back until it is whole.
    let mut detok = Detokenizer::new();
    let is_eos = |t: u32| eos.binary_search(&t).is_ok();
    let (pp, dp) = dec.generate_until(&prompt, a.max_tokens, is_eos, |_, tok, logits| {
        generated.push(tok);
        let made = match &tokenizer {
            Some(tk) if !is_eos(tok) => detok.push(tk, tok),
            _ => "",
        };
        if let Some(w) = &mut logits_out {
            w.push(logits)?;
        }
        if a.json {
            return Ok(());
        }
        let io = |e: std::io::Error| tarfa_decode::DecodeError::Io {
            path: "<stdout>".into(),
            op: "write",
            source: e,
        };
        if text_mode {
            write!(out, "{made}").map_err(io)?;
        } else {
            let sep = if generated.len() == 1 { "" } else { " " };
            write!(out, "{sep}{tok}").map_err(io)?;
        }
        out.flush().map_err(io)
    })?;
    // What was held back at the end (a character no later token completed) is printed as it
    // decodes, so the text printed is the text decoded.
    if let Some(tk) = &tokenizer {
        let rest = detok.finish(tk);
        if text_mode {
            write!(out, "{rest}")?;
        }
    }
    if !a.json {
        writeln!(out)?;
    }
    if let (Some(w), Some(p)) = (logits_out, &a.logits_out) {
        w.finish()
            .with_context(|| format!("writing {}", p.display()))?;
    }
    let report = dec.source_report().to_string();
    let stopped = generated.last().is_some_and(|&t| is_eos(t));
    let text = tokenizer.as_ref().map(|_| detok.text());
    let stats = dec.expert_stats();
    if a.json {
        let doc = serde_json::json!({
            "schema": "tarfa.run/1",
            "model": a.dir.display().to_string(),
            "prompt_tokens": prompt,
            "tokens": generated,
            "text": text,
            // As OpenAI's: "stop" at an end-of-sequence token (the last of `tokens`), "length"
            // at -n.
            "finish_reason": if stopped { "stop" } else { "length" },
            "eos_token_ids": eos,
            "isa": dec.isa().to_string(),
            "threads": dec.threads(),
            "experts": {
                "mode": a.model.experts,
                "backend": report,
                "reads": stats.reads,
                "bytes_read": stats.bytes_read,
                "cache_hits": stats.cache_hits,
                "cache_misses": stats.cache_misses,
                "cached_bytes": dec.experts().cached_bytes(),
            },
            "gpu": dec.offload_report().map(|g| serde_json::json!({
                "device": g.device,
                "experts_computed": g.computed,
                "vram_hits": g.vram_hits,
                "uploads": g.uploads,
                "upload_bytes": g.upload_bytes,
                "ring_registered": g.ring_registered,
                "cached_bytes": g.cached_bytes,
                "cache_bytes": g.cache_bytes,
                "trunk_products": g.trunk_products,
                "trunk_bytes": g.trunk_bytes,
                "whole_model": g.whole_model,
                "steps": g.steps,
                "graph_steps": g.graph_steps,
                "prompt_passes": g.prompt_passes,
                "prompt_pass_tokens": g.prompt_pass_tokens,
                "whole_model_declined": g.whole_model_declined,
                "cpu_moe_layers": g.cpu_moe_layers,
                "host_round_trips": g.host_round_trips,
            })),
            "prompt": phase_json(&pp),
            "decode": phase_json(&dp),
            "logits_out": a.logits_out.as_ref().map(|p| p.display().to_string()),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else {
        // The tokens the user asked for (-n), counted as such: the first comes from the
        // prompt's pass, each later one from a decode step.
        let steps = match generated.len() {
            0 => String::new(),
            1 => ", from the prompt's pass".to_string(),
            _ => format!(
                ": the first from the prompt's pass, then {} decode steps in {:.3} s ({:.2} tokens/s)",
                dp.tokens,
                dp.time.as_secs_f64(),
                rate(dp.tokens, dp),
            ),
        };
        eprintln!(
            "prompt: {} tokens in {:.3} s ({:.1} tokens/s); generated {} token{}{steps}",
            pp.tokens,
            pp.time.as_secs_f64(),
            rate(pp.tokens, pp),
            generated.len(),
            if generated.len() == 1 { "" } else { "s" },
        );
        if let (true, Some(&t)) = (stopped, generated.last()) {
            eprintln!(
                "stopped at the end-of-sequence token {t} (of {} asked for; --ignore-eos goes on)",
                a.max_tokens
            );
        }
        let per_tok = dp.experts.bytes_read.checked_div(dp.tokens).unwrap_or(0);
        let held = if a.model.experts == "resident" {
            "all resident, read at start".to_string()
        } else {
            format!("{} cached", HumanBytes(dec.experts().cached_bytes()))
        };
        eprintln!(
            "experts: {} read ({}, {} per decoded token, {:.2} GB/s effective), {} cache hits, {} misses, {held}; {}",
            stats.reads,
            HumanBytes(stats.bytes_read),
            HumanBytes(per_tok),
            gbps(pp.experts.bytes_read + dp.experts.bytes_read, pp.time + dp.time),
            stats.cache_hits,
            stats.cache_misses,
            report,
        );
        // The whole pass on the GPU leaves the CPU's kernels only the prompt's ids and the
        // greedy choice: say where the layers ran.
        match dec.offload_report().filter(|g| g.whole_model) {
            Some(g) if g.cpu_moe_layers > 0 => eprintln!(
                "compute: every layer on the GPU but the routed experts of layers 0..{} (on the CPU), fp32 logits, exact (canonical reduction order)",
                g.cpu_moe_layers
            ),
            Some(_) => eprintln!(
                "compute: every layer on the GPU, fp32 logits, exact (canonical reduction order)"
            ),
            None => eprintln!(
                "compute: {} kernels, {} threads, fp32 logits, exact (canonical reduction order)",
                dec.isa(),
                dec.threads()
            ),
        }
        if let Some(g) = dec.offload_report().filter(|g| g.whole_model) {
            let cpu_moe = match g.cpu_moe_layers {
                0 => String::new(),
                n => format!(
                    "; the routed experts of layers 0..{n} on the CPU ({} kernels, {} threads)",
                    dec.isa(),
                    dec.threads()
                ),
            };
            eprintln!(
                "gpu: {}: whole forward pass there ({} tokens, {} of them in {} prompt passes as matrices, {} replayed from a CUDA graph, {} round trips to the host within them), {} of weights resident{cpu_moe}",
                g.device,
                g.steps,
                g.prompt_pass_tokens,
                g.prompt_passes,
                g.graph_steps,
                g.host_round_trips,
                HumanBytes(g.trunk_bytes),
            );
        } else if let Some(g) = dec.offload_report() {
            eprintln!(
                "gpu: {}: {} expert computations there, {} VRAM cache hits, {} copied in ({}, from {} memory), {} cached of {}; {} trunk products there ({} resident)",
                g.device,
                g.computed,
                g.vram_hits,
                g.uploads,
                HumanBytes(g.upload_bytes),
                if g.ring_registered { "pinned" } else { "pageable" },
                HumanBytes(g.cached_bytes),
                HumanBytes(g.cache_bytes),
                g.trunk_products,
                HumanBytes(g.trunk_bytes),
            );
        }
        if std::env::var_os("TARFA_PROFILE").is_some_and(|v| v == "1") {
            let total = (pp.time + dp.time).as_secs_f64();
            let mut parts = String::new();
            for (name, d) in dec.profile().parts() {
                parts.push_str(&format!(
                    "{name} {:.1}% ({:.3} s); ",
                    100.0 * d.as_secs_f64() / total.max(1e-9),
                    d.as_secs_f64()
                ));
            }
            eprintln!("profile (of {total:.3} s): {parts}");
        }
    }
    Ok(true)
}

/// The most bytes of a --prompt-file.
const MAX_PROMPT_FILE: u64 = 64 << 20;

/// The prompt text of `--prompt-file` (`-`: standard input), bounded, UTF-8.
fn read_prompt_file(f: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    // A stream, bounded: standard input, or a pipe or character device by name (`<(…)`,
    // `/dev/stdin`); anything else must be a regular file.
    let bounded = |r: &mut dyn Read, what: &str| -> anyhow::Result<Vec<u8>> {
        let mut b = Vec::new();
        r.take(MAX_PROMPT_FILE + 1)
            .read_to_end(&mut b)
            .with_context(|| format!("--prompt-file {what}: reading"))?;
        if b.len() as u64 > MAX_PROMPT_FILE {
            bail!("--prompt-file {what}: more than {MAX_PROMPT_FILE} bytes");
        }
        Ok(b)
    };
    let stream = || {
        use std::os::unix::fs::FileTypeExt;
        std::fs::metadata(f)
            .map(|m| m.file_type().is_fifo() || m.file_type().is_char_device())
            .unwrap_or(false)
    };
    let bytes = if f.as_os_str() == "-" {
        bounded(&mut std::io::stdin().lock(), "-")?
    } else if stream() {
        let mut file =
            std::fs::File::open(f).with_context(|| format!("--prompt-file {}", f.display()))?;
        bounded(&mut file, &f.display().to_string())?
    } else {
        tarfa_format::fsio::read_regular(f, MAX_PROMPT_FILE)
            .with_context(|| "--prompt-file".to_string())?
    };
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "--prompt-file {}: not UTF-8 text (byte {} is not part of a character)",
            f.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

fn options(a: &RunArgs) -> anyhow::Result<DecoderOptions> {
    if let Some((flag, v)) = a.sampling.given() {
        bail!(
            "{flag} {v}: tarfa run does not sample; it decodes greedily (each token the highest logit, ties to the lowest id), the same tokens and logits every run (--temp 0 is taken, as greedy)"
        );
    }
    decoder_options(&a.model)
}

/// The decoder's options from the flags `run` and `serve` share; a flag that does not apply
/// (a GPU flag with the CPU, --cache-gib with resident experts) is an error, never dropped.
pub fn decoder_options(a: &crate::cli::ModelFlags) -> anyhow::Result<DecoderOptions> {
    let mut source = SourceOptions::from_env()?;
    if let Some(b) = &a.backend {
        source.backend = b
            .parse::<BackendChoice>()
            .map_err(|e| anyhow::anyhow!("--backend: {e}"))?;
    }
    source.queue_depth = a.qd;
    source.slots = a.ring_slots;
    if a.batch.is_some() && a.no_batch_prompt {
        bail!("--batch: a prompt run token by token (--no-batch-prompt) has no batches");
    }
    let mode: ExpertMode = a
        .experts
        .parse()
        .map_err(|e| anyhow::anyhow!("--experts: {e}"))?;
    if a.cache_gib > 0.0 && mode == ExpertMode::Resident {
        bail!("--cache-gib: applies to --experts stream only (resident holds every expert)");
    }
    let isa = match a.isa.as_deref() {
        None | Some("auto") => None,
        Some(s) => Some(
            s.parse::<Isa>()
                .map_err(|e| anyhow::anyhow!("--isa: {e}"))?,
        ),
    };
    // --threads, --gpu-experts, --vram-gib and --cache-gib are in range: the parser checks them.
    let gpu_experts = a.gpu_experts.unwrap_or(1.0);
    let vram_bytes = a.vram_gib.map(|g| (g * (1u64 << 30) as f64) as u64);
    let gpu = GpuOptions {
        ordinal: 0,
        vram_bytes,
        fraction: gpu_experts,
        trunk: !a.cpu_trunk,
        whole_model: !a.gpu_offload_only,
        graphs: !a.no_cuda_graphs,
        cpu_moe_layers: a.n_cpu_moe,
    };
    if a.n_cpu_moe.is_some() && (a.gpu_offload_only || a.cpu_trunk || a.gpu_experts.is_some()) {
        bail!("--n-cpu-moe: places experts of the whole forward pass on the GPU; it does not apply with --gpu-offload-only, --cpu-trunk or --gpu-experts");
    }
    let device = match a.device.as_str() {
        "cpu" => {
            // A GPU flag with the CPU is a mistake to say, not to drop.
            let given = [
                ("--vram-gib", a.vram_gib.is_some()),
                ("--gpu-experts", a.gpu_experts.is_some()),
                ("--cpu-trunk", a.cpu_trunk),
                ("--gpu-offload-only", a.gpu_offload_only),
                ("--no-cuda-graphs", a.no_cuda_graphs),
                ("--n-cpu-moe", a.n_cpu_moe.is_some()),
            ];
            if let Some((flag, _)) = given.iter().find(|g| g.1) {
                bail!("{flag}: applies with --device cuda or auto only (the device is cpu)");
            }
            Device::Cpu
        }
        "cuda" => Device::Cuda(gpu),
        "auto" => Device::Auto(gpu),
        other => bail!("--device: {other:?} is not cpu, cuda or auto"),
    };
    Ok(DecoderOptions {
        threads: a.threads.unwrap_or(0),
        isa,
        experts: ExpertOptions {
            mode,
            cache_bytes: (a.cache_gib * (1u64 << 30) as f64) as u64,
        },
        source,
        batch_prompt: !a.no_batch_prompt,
        prompt_chunk: a.batch.unwrap_or(0),
        device,
    })
}

fn rate(n: u64, p: PhaseStats) -> f64 {
    let s = p.time.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

fn gbps(bytes: u64, t: std::time::Duration) -> f64 {
    let s = t.as_secs_f64();
    if s > 0.0 {
        bytes as f64 / s / 1e9
    } else {
        0.0
    }
}

fn phase_json(p: &PhaseStats) -> serde_json::Value {
    serde_json::json!({
        "tokens": p.tokens,
        "seconds": crate::json::float(p.time.as_secs_f64()),
        "tokens_per_s": crate::json::float(rate(p.tokens, *p)),
        "expert_reads": p.experts.reads,
        "expert_bytes_read": p.experts.bytes_read,
        "cache_hits": p.experts.cache_hits,
    })
}

/// Every entry of the model directory `dir`: what `--logits-out` must never be.
fn model_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}
