//! `tarfa bench-io`: stream decode-shaped expert sets (top-k random experts of every layer per
//! token) through each backend at each queue depth, cold cache, and compare with fio's random
//! read of the same files at the same block size and depth. With `--to-gpu` (a build with the
//! `cuda` feature), each row is measured a second time with every landed expert copied on to
//! the GPU, and the pure host-to-device rate of the registered ring is given for context.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tarfa_benchkit::drop_page_cache;
use tarfa_benchkit::fio::{has_fio, randread_gb_per_s};
use tarfa_runtime::bench::{stream_sets_to_gpu_within, stream_sets_within, DecodeSets};
use tarfa_runtime::{
    BackendChoice, BackendKind, DeviceSink, ExpertSource, Gpu, ModelExperts, SourceOptions,
};

use crate::cli::BenchIoArgs;

struct Row {
    backend: BackendKind,
    queue_depth: u32,
    fio_iodepth: u32,
    verify: bool,
    tokens: u64,
    experts: u64,
    bytes: u64,
    seconds: f64,
    gb_per_s: f64,
    fio_gb_per_s: Option<f64>,
    /// Disk→VRAM GB/s (median), with --to-gpu.
    vram_gb_per_s: Option<f64>,
    /// Whole-ring host-to-device GB/s of the registered ring, with --to-gpu.
    h2d_gb_per_s: Option<f64>,
    /// Some of the bytes may have come from the page cache, not the disk: it was not dropped
    /// before the run, or the backend reads through it and asked for an expert twice.
    from_cache: bool,
    /// The time budget ended the (median) run before its last token.
    cut_short: bool,
}

impl Row {
    /// One row of `--json`: the CSV's columns by name, `null` where there is no figure.
    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "backend": self.backend.name(),
            "queue_depth": self.queue_depth,
            "verify": self.verify,
            "tokens": self.tokens,
            "experts": self.experts,
            "bytes": self.bytes,
            "seconds": crate::json::float(self.seconds),
            "gb_per_s": crate::json::float(self.gb_per_s),
            "fio_iodepth": self.fio_iodepth,
            "fio_gb_per_s": crate::json::float_opt(self.fio_gb_per_s),
            "vram_gb_per_s": crate::json::float_opt(self.vram_gb_per_s),
            "h2d_gb_per_s": crate::json::float_opt(self.h2d_gb_per_s),
            "from_cache": self.from_cache,
            "cut_short": self.cut_short,
        })
    }
}

/// Copies that may hold slots at once: well under the spare slots (queue depth + 16), so the
/// reader always has slots to read into.
const GPU_COPIES_IN_FLIGHT: usize = 8;
/// Bytes per run by default: the model's expert bytes, at most this.
const DEFAULT_RUN_BYTES: u64 = 1 << 30;
/// The most GiB per run --gib asks for without --budget.
const MAX_GIB_UNBUDGETED: f64 = 1024.0;

/// The most tokens per run --tokens asks for without --budget.
const MAX_TOKENS_UNBUDGETED: u64 = 1 << 32;

/// The deepest queue --qd takes (each read in flight holds a ring slot of pinned memory).
const MAX_QD: u32 = 4096;

/// The sweep's time budget by default (with the default work).
const DEFAULT_BUDGET_SECS: f64 = 60.0;

/// Progress of the sweep on stderr: each timed run as it ends, with an ETA.
struct Sweep {
    quiet: bool,
    runs: usize,
    done: usize,
    t0: Instant,
}

impl Sweep {
    fn say(&self, s: &str) {
        if !self.quiet {
            eprintln!("{s}");
        }
    }

    fn run_done(&mut self, what: &str, gbps: f64, cut_short: bool) {
        self.done += 1;
        let elapsed = self.t0.elapsed().as_secs_f64();
        let eta = elapsed / self.done as f64 * self.runs.saturating_sub(self.done) as f64;
        self.say(&format!(
            "[{}/{}] {what}: {gbps:.3} GB/s{}; ETA {}",
            self.done,
            self.runs,
            if cut_short {
                " (cut at its time share)"
            } else {
                ""
            },
            clock(eta)
        ));
    }
}

fn clock(secs: f64) -> String {
    let s = secs.round() as u64;
    format!("{}:{:02}", s / 60, s % 60)
}

pub fn run(a: &BenchIoArgs) -> anyhow::Result<bool> {
    // First, before any work: a build or a machine without CUDA says so at once.
    let gpu = if a.to_gpu {
        Some(Gpu::open(0).context("--to-gpu")?)
    } else {
        None
    };
    // A request that cannot finish is refused unless a time budget ends it (issue 26,
    // finding 25: --gib 1e30 was clamped to 18 EB and ran for ever).
    if a.budget.is_none_or(|b| b == 0.0) {
        if let Some(g) = a.gib.filter(|&g| g > MAX_GIB_UNBUDGETED) {
            bail!("--gib {g}: more than {MAX_GIB_UNBUDGETED} GiB per run cannot be asked for without a time limit; give --budget SECS to end the sweep when it is spent");
        }
        if let Some(t) = a.tokens.filter(|&t| t > MAX_TOKENS_UNBUDGETED) {
            bail!("--steps {t}: more than {MAX_TOKENS_UNBUDGETED} steps per run cannot be asked for without a time limit; give --budget SECS to end the sweep when it is spent");
        }
    }
    crate::diagnose::require_model_dir(&a.dir, "bench-io", || {
        crate::diagnose::reads_a_model_dir("bench-io")
    })?;
    // --gib, --tokens, --budget, --top-k, --slots and --runs are in range: the parser checks them.
    let budget_secs = match a.budget {
        Some(b) => (b > 0.0).then_some(b),
        None if a.tokens.is_none() && a.gib.is_none() => Some(DEFAULT_BUDGET_SECS),
        None => None,
    };
    let model = ModelExperts::open(&a.dir)?;
    if model.is_empty() {
        bail!("{} has no experts to read", a.dir.display());
    }
    let backends: Vec<BackendKind> = a
        .backend
        .split(',')
        .map(|s| s.trim().parse().map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<_>>()?;
    let depths: Vec<u32> =
        a.qd.split(',')
            .map(|s| {
                s.trim()
                    .parse::<u32>()
                    .context("--qd takes numbers, e.g. 1,32,256")
            })
            .collect::<anyhow::Result<_>>()?;
    if let Some(d) = depths.iter().find(|&&d| !(1..=MAX_QD).contains(&d)) {
        bail!("--qd: a queue depth is 1..={MAX_QD}, not {d}");
    }
    let verify_modes: &[bool] = match a.verify.as_str() {
        "on" => &[true],
        "off" => &[false],
        "both" => &[false, true],
        v => bail!("--check takes on, off or both, not {v:?}"),
    };
    let top_k = a.top_k.or(model.top_k()).unwrap_or(8);
    let block = common_extent_len(&model);
    let per_token: u64 = model
        .layers()
        .map(|(_, n)| u64::from(top_k.min(n)) * block as u64)
        .sum::<u64>()
        .max(1);
    let model_bytes: u64 = model
        .all()
        .into_iter()
        .filter_map(|(l, e)| model.get(l, e).map(|x| x.len as u64))
        .sum();
    let run_bytes = match a.gib {
        Some(g) => (g * (1u64 << 30) as f64) as u64,
        None => model_bytes.min(DEFAULT_RUN_BYTES),
    };
    let tokens = a
        .tokens
        .unwrap_or_else(|| run_bytes.div_ceil(per_token).max(1));
    let sets = DecodeSets::new(&model, top_k, tokens, a.seed);
    let layers = model.layers().count();
    let fio_ok = !a.no_fio && has_fio();
    let per_run_count = a.runs.max(1);
    let timed_runs = per_run_count
        * (if fio_ok { depths.len() } else { 0 }
            + backends.len()
                * depths.len()
                * verify_modes.len()
                * (1 + usize::from(gpu.is_some())));
    let share = budget_secs.map(|b| Duration::from_secs_f64(b / timed_runs.max(1) as f64));
    let mut sweep = Sweep {
        quiet: a.quiet,
        runs: timed_runs,
        done: 0,
        t0: Instant::now(),
    };
    if let Some(g) = &gpu {
        sweep.say(&format!(
            "gpu: {} (device {}); each landed expert is copied to VRAM from the cuMemHostRegister'd ring, {GPU_COPIES_IN_FLIGHT} copies in flight at most",
            g.name(),
            g.ordinal()
        ));
    }
    sweep.say(&format!(
        "bench-io: {} experts in {layers} layers ({:.1} MiB); per token top-{top_k} of each layer, {tokens} tokens, block {} bytes ({:.1} MiB), {:.2} GB per run{}",
        model.len(),
        model_bytes as f64 / (1 << 20) as f64,
        block,
        block as f64 / (1 << 20) as f64,
        per_token.saturating_mul(tokens) as f64 / 1e9,
        if a.tokens.is_none() && a.gib.is_none() {
            " (the model's expert bytes, at most 1 GiB: --gib or --steps for more)"
        } else {
            ""
        }
    ));
    sweep.say(&format!(
        "{timed_runs} timed runs{}",
        match (budget_secs, share) {
            (Some(b), Some(s)) => format!(
                "; time budget {} ({:.2} s per run at most, --budget)",
                clock(b),
                s.as_secs_f64()
            ),
            _ => String::new(),
        }
    ));
    // A token's set is the most a decode step can have in flight: fio runs at that depth too.
    let set_len = sets.set_len() as u32;
    let paths: Vec<_> = model.paths().map(Path::to_path_buf).collect();
    drop(model);

    // Whether every run so far started from a dropped page cache.
    let cold = std::cell::Cell::new(!a.no_drop_caches);
    if cold.get() {
        sweep.say("dropping the page cache (sync; echo 3 > /proc/sys/vm/drop_caches) before each run: cold-cache figures");
    } else {
        sweep.say("not dropping the page cache (--no-drop-caches): figures may come from memory, not the disk");
    }
    let drop_caches = |sweep: &Sweep| {
        if cold.get() {
            if let Err(e) = drop_page_cache() {
                sweep.say(&format!(
                    "warning: cannot drop the page cache ({e}); figures are not cold-cache (run as root, or pass --no-drop-caches to silence)"
                ));
                cold.set(false);
            }
        }
        cold.get()
    };

    if !a.no_fio && !fio_ok {
        sweep.say("note: fio not found; no fio column (apt install fio)");
    }
    let mut fio: BTreeMap<u32, f64> = BTreeMap::new();
    let total_bytes = per_token.saturating_mul(tokens);
    if fio_ok {
        for &qd in &depths {
            let depth = qd.min(set_len);
            let mut runs = Vec::new();
            for _ in 0..per_run_count {
                drop_caches(&sweep);
                let gbps = randread_gb_per_s(&paths, block, depth, total_bytes, share)?;
                sweep.run_done(&format!("fio iodepth {depth}"), gbps, false);
                runs.push(gbps);
            }
            let gbps = median(&mut runs);
            sweep.say(&format!(
                "fio randread bs={block} iodepth={depth} (io_uring, O_DIRECT): {gbps:.3} GB/s (median of {})",
                runs.len()
            ));
            fio.insert(qd, gbps);
        }
    }

    let mut rows = Vec::new();
    for &backend in &backends {
        for &qd in &depths {
            for &verify in verify_modes {
                let opts = SourceOptions {
                    backend: BackendChoice::Only(backend),
                    queue_depth: qd,
                    slots: a.slots.unwrap_or(0),
                    verify,
                    ..SourceOptions::from_env()?
                };
                let label = format!(
                    "{backend} QD {qd} BLAKE3 {}",
                    if verify { "on" } else { "off" }
                );
                let mut runs = Vec::new();
                let mut vram_runs = Vec::new();
                let mut h2d = None;
                let mut through_cache = false;
                for run in 0..per_run_count {
                    // A fresh source per run: pages of a live map survive drop_caches.
                    let mut src = ExpertSource::open(&a.dir, &opts)?;
                    let report = src.report().clone();
                    if run == 0 {
                        for w in report.warnings() {
                            sweep.say(&format!("warning: {w}"));
                        }
                        sweep.say(&format!("io: {report}"));
                    }
                    let direct = report.direct_io && report.backend != BackendKind::Mmap;
                    let dropped = drop_caches(&sweep);
                    let f = stream_sets_within(&mut src, sets.iter(), share)?;
                    // O_DIRECT reads always reach the disk. Buffered ones may be served from
                    // memory: all of them when the cache was not dropped, else those of an
                    // expert asked for again.
                    through_cache |= !direct && (!dropped || f.distinct < f.experts);
                    sweep.run_done(&label, f.gb_per_s(), f.cut_short);
                    runs.push(f);
                    drop(src);
                    if let Some(g) = &gpu {
                        // Interleaved with the pinned run, same settings; registration and the
                        // device allocation happen before the clock starts.
                        let mut src = ExpertSource::open(&a.dir, &opts)?;
                        let mut sink = DeviceSink::new(g, src.ring(), GPU_COPIES_IN_FLIGHT)?;
                        drop_caches(&sweep);
                        let v = stream_sets_to_gpu_within(&mut src, sets.iter(), share, &mut sink)?;
                        sweep.run_done(&format!("{label} to VRAM"), v.gb_per_s(), v.cut_short);
                        vram_runs.push(v);
                        if run == 0 {
                            h2d = Some(sink.bench_h2d(a.h2d_repeats)?.gb_per_s());
                        }
                    }
                }
                runs.sort_by(|x, y| x.gb_per_s().total_cmp(&y.gb_per_s()));
                let f = runs[runs.len() / 2];
                let gbps = f.gb_per_s();
                vram_runs.sort_by(|x, y| x.gb_per_s().total_cmp(&y.gb_per_s()));
                let vram = vram_runs.get(vram_runs.len() / 2).map(|r| r.gb_per_s());
                if let Some(v) = vram {
                    sweep.say(&format!(
                        "{label}: disk→pinned {gbps:.3} GB/s, disk→VRAM {v:.3} GB/s ({:.3}x), whole-ring H2D {:.1} GB/s",
                        v / gbps,
                        h2d.unwrap_or(f64::NAN)
                    ));
                }
                if through_cache && !a.no_drop_caches {
                    sweep.say(&format!(
                        "warning: {label}: buffered reads, and the figure may come from the page cache, not the disk ({})",
                        if cold.get() {
                            "an expert was asked for twice in a run; read less per run (--gib) or a larger model"
                        } else {
                            "the page cache could not be dropped"
                        }
                    ));
                }
                rows.push(Row {
                    backend,
                    queue_depth: qd,
                    fio_iodepth: qd.min(set_len),
                    verify,
                    tokens: f.tokens,
                    experts: f.experts,
                    bytes: f.bytes,
                    seconds: f.elapsed.as_secs_f64(),
                    gb_per_s: gbps,
                    fio_gb_per_s: fio.get(&qd).copied(),
                    vram_gb_per_s: vram,
                    h2d_gb_per_s: h2d,
                    from_cache: through_cache,
                    cut_short: f.cut_short,
                });
            }
        }
    }

    let mut out = std::io::stdout().lock();
    let gpu_cols = gpu.is_some();
    if a.json {
        let doc = serde_json::json!({
            "schema": "tarfa.bench-io/1",
            "dir": a.dir.display().to_string(),
            "top_k": top_k,
            "tokens": tokens,
            "block_bytes": block,
            "model_expert_bytes": model_bytes,
            "runs": per_run_count,
            "budget_seconds": crate::json::float_opt(budget_secs),
            "page_cache_dropped": cold.get(),
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
    } else if a.csv {
        write!(
            out,
            "backend,queue_depth,verify,experts,bytes,seconds,gb_per_s,fio_iodepth,fio_gb_per_s,ratio_to_fio,from_cache,cut_short"
        )?;
        if gpu_cols {
            write!(out, ",vram_gb_per_s,vram_to_pinned,h2d_gb_per_s")?;
        }
        writeln!(out)?;
        for r in &rows {
            write!(
                out,
                "{},{},{},{},{},{:.4},{:.4},{},{},{},{},{}",
                r.backend,
                r.queue_depth,
                r.verify,
                r.experts,
                r.bytes,
                r.seconds,
                r.gb_per_s,
                r.fio_iodepth,
                r.fio_gb_per_s
                    .map(|f| format!("{f:.4}"))
                    .unwrap_or_default(),
                r.fio_gb_per_s
                    .map(|f| format!("{:.3}", r.gb_per_s / f))
                    .unwrap_or_default(),
                r.from_cache,
                r.cut_short
            )?;
            if gpu_cols {
                write!(
                    out,
                    ",{},{},{}",
                    r.vram_gb_per_s
                        .map(|v| format!("{v:.4}"))
                        .unwrap_or_default(),
                    r.vram_gb_per_s
                        .map(|v| format!("{:.3}", v / r.gb_per_s))
                        .unwrap_or_default(),
                    r.h2d_gb_per_s
                        .map(|h| format!("{h:.2}"))
                        .unwrap_or_default()
                )?;
            }
            writeln!(out)?;
        }
    } else {
        write!(
            out,
            "{:<9} {:>4} {:>7} {:>8} {:>9} {:>6} {:>9} {:>7} {:>5}",
            "backend", "QD", "BLAKE3", "seconds", "GB/s", "fio QD", "fio GB/s", "ratio", "cache"
        )?;
        if gpu_cols {
            write!(
                out,
                " {:>9} {:>11} {:>8}",
                "VRAM GB/s", "VRAM/pinned", "H2D GB/s"
            )?;
        }
        writeln!(out)?;
        for r in &rows {
            write!(
                out,
                "{:<9} {:>4} {:>7} {:>8.3} {:>9.3} {:>6} {:>9} {:>7} {:>5}",
                r.backend.name(),
                r.queue_depth,
                if r.verify { "on" } else { "off" },
                r.seconds,
                r.gb_per_s,
                r.fio_iodepth,
                r.fio_gb_per_s
                    .map(|f| format!("{f:.3}"))
                    .unwrap_or_else(|| "-".into()),
                r.fio_gb_per_s
                    .map(|f| format!("{:.2}x", r.gb_per_s / f))
                    .unwrap_or_else(|| "-".into()),
                if r.from_cache { "warm" } else { "cold" }
            )?;
            if gpu_cols {
                write!(
                    out,
                    " {:>9} {:>11} {:>8}",
                    r.vram_gb_per_s
                        .map(|v| format!("{v:.3}"))
                        .unwrap_or_else(|| "-".into()),
                    r.vram_gb_per_s
                        .map(|v| format!("{:.3}x", v / r.gb_per_s))
                        .unwrap_or_else(|| "-".into()),
                    r.h2d_gb_per_s
                        .map(|h| format!("{h:.1}"))
                        .unwrap_or_else(|| "-".into())
                )?;
            }
            writeln!(out)?;
        }
    }
    Ok(true)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The most common extent length: the block size fio is given.
pub(crate) fn common_extent_len(model: &ModelExperts) -> usize {
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for (l, e) in model.all() {
        if let Some(x) = model.get(l, e) {
            *counts.entry(x.len).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by_key(|&(len, n)| (n, len))
        .map(|(len, _)| len)
        .unwrap_or(4096)
}
