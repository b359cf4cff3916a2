//! `tarfa bench-io`: stream decode-shaped expert sets (top-k random experts of every layer per
//! token) through each backend at each queue depth, cold cache, and compare with fio's random
//! read of the same files at the same block size and depth. With `--to-gpu` (a build with the
//! `cuda` feature), each row is measured a second time with every landed expert copied on to
//! the GPU, and the pure host-to-device rate of the registered ring is given for context.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use tarfa_runtime::bench::{decode_sets, stream_sets, stream_sets_to_gpu};
use tarfa_runtime::{
    BackendChoice, BackendKind, DeviceSink, ExpertSource, Gpu, ModelExperts, SourceOptions,
};

use crate::cli::BenchIoArgs;

struct Row {
    backend: BackendKind,
    qd: u32,
    fio_qd: u32,
    verify: bool,
    experts: u64,
    bytes: u64,
    secs: f64,
    gbps: f64,
    fio: Option<f64>,
    /// Disk→VRAM GB/s (median), with --to-gpu.
    vram: Option<f64>,
    /// Whole-ring host-to-device GB/s of the registered ring, with --to-gpu.
    h2d: Option<f64>,
}

/// Copies that may hold slots at once: well under the spare slots (queue depth + 16), so the
/// reader always has slots to read into.
const GPU_COPIES_IN_FLIGHT: usize = 8;

pub fn run(a: &BenchIoArgs) -> anyhow::Result<bool> {
    // First, before any work: a build or a machine without CUDA says so at once.
    let gpu = if a.to_gpu {
        Some(Gpu::open(0).context("--to-gpu")?)
    } else {
        None
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
    if depths.contains(&0) {
        bail!("--qd: a queue depth must be at least 1");
    }
    let verify_modes: &[bool] = match a.verify.as_str() {
        "on" => &[true],
        "off" => &[false],
        "both" => &[false, true],
        v => bail!("--verify takes on, off or both, not {v:?}"),
    };
    let top_k = a.top_k.or(model.top_k()).unwrap_or(8);
    let block = common_extent_len(&model);
    let per_token: u64 = model
        .layers()
        .map(|(_, n)| u64::from(top_k.min(n)) * block as u64)
        .sum();
    let tokens = a.tokens.unwrap_or_else(|| {
        (a.gib * (1u64 << 30) as f64 / per_token as f64)
            .ceil()
            .max(1.0) as usize
    });
    let sets = decode_sets(&model, top_k, tokens, a.seed);
    let layers = model.layers().count();
    let quiet = a.quiet;
    let say = |s: String| {
        if !quiet {
            eprintln!("{s}");
        }
    };
    if let Some(g) = &gpu {
        say(format!(
            "gpu: {} (device {}); each landed expert is copied to VRAM from the cuMemHostRegister'd ring, {GPU_COPIES_IN_FLIGHT} copies in flight at most",
            g.name(),
            g.ordinal()
        ));
    }
    say(format!(
        "bench-io: {} experts in {layers} layers; per token top-{top_k} of each layer, {tokens} tokens, block {} bytes ({:.1} MiB), {:.2} GB per run",
        model.len(),
        block,
        block as f64 / (1 << 20) as f64,
        (per_token * tokens as u64) as f64 / 1e9
    ));
    // A token's set is the most a decode step can have in flight: fio runs at that depth too.
    let set_len = sets.first().map_or(1, Vec::len) as u32;
    let paths: Vec<_> = model.paths().map(Path::to_path_buf).collect();
    drop(model);

    let mut can_drop = !a.no_drop_caches;
    let mut drop_caches = |say: &dyn Fn(String)| {
        if can_drop {
            if let Err(e) = drop_page_cache() {
                say(format!(
                    "warning: cannot drop the page cache ({e}); figures are not cold-cache (run as root, or pass --no-drop-caches to silence)"
                ));
                can_drop = false;
            }
        }
    };

    let fio_ok = !a.no_fio && has_fio();
    if !a.no_fio && !fio_ok {
        say("note: fio not found; no fio column (apt install fio)".into());
    }
    let mut fio: BTreeMap<u32, f64> = BTreeMap::new();
    let total_bytes = per_token * tokens as u64;
    if fio_ok {
        for &qd in &depths {
            let depth = qd.min(set_len);
            let mut runs = Vec::new();
            for _ in 0..a.runs.max(1) {
                drop_caches(&say);
                runs.push(run_fio(&paths, block, depth, total_bytes)?);
            }
            let gbps = median(&mut runs);
            say(format!(
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
                let mut runs = Vec::new();
                let mut vram_runs = Vec::new();
                let mut h2d = None;
                for run in 0..a.runs.max(1) {
                    // A fresh source per run: pages of a live map survive drop_caches.
                    let mut src = ExpertSource::open(&a.dir, &opts)?;
                    if run == 0 {
                        for w in src.report().warnings() {
                            say(format!("warning: {w}"));
                        }
                        say(format!("io: {}", src.report()));
                    }
                    drop_caches(&say);
                    runs.push(stream_sets(&mut src, &sets)?);
                    drop(src);
                    if let Some(g) = &gpu {
                        // Interleaved with the pinned run, same settings; registration and the
                        // device allocation happen before the clock starts.
                        let mut src = ExpertSource::open(&a.dir, &opts)?;
                        let mut sink = DeviceSink::new(g, src.ring(), GPU_COPIES_IN_FLIGHT)?;
                        drop_caches(&say);
                        vram_runs.push(stream_sets_to_gpu(&mut src, &sets, &mut sink)?);
                        if run == 0 {
                            h2d = Some(sink.bench_h2d(a.h2d_repeats)?.gb_per_s());
                        }
                    }
                }
                runs.sort_by_key(|r| r.elapsed);
                let f = runs[runs.len() / 2];
                let gbps = f.gb_per_s();
                vram_runs.sort_by_key(|r| r.elapsed);
                let vram = vram_runs.get(vram_runs.len() / 2).map(|r| r.gb_per_s());
                if let Some(v) = vram {
                    say(format!(
                        "{backend} QD {qd} BLAKE3 {}: disk→pinned {gbps:.3} GB/s, disk→VRAM {v:.3} GB/s ({:.3}x), whole-ring H2D {:.1} GB/s",
                        if verify { "on" } else { "off" },
                        v / gbps,
                        h2d.unwrap_or(f64::NAN)
                    ));
                }
                rows.push(Row {
                    backend,
                    qd,
                    fio_qd: qd.min(set_len),
                    verify,
                    experts: f.experts,
                    bytes: f.bytes,
                    secs: f.elapsed.as_secs_f64(),
                    gbps,
                    fio: fio.get(&qd).copied(),
                    vram,
                    h2d,
                });
            }
        }
    }

    let mut out = std::io::stdout().lock();
    let gpu_cols = gpu.is_some();
    if a.csv {
        write!(
            out,
            "backend,queue_depth,verify,experts,bytes,seconds,gb_per_s,fio_iodepth,fio_gb_per_s,ratio_to_fio"
        )?;
        if gpu_cols {
            write!(out, ",vram_gb_per_s,vram_to_pinned,h2d_gb_per_s")?;
        }
        writeln!(out)?;
        for r in &rows {
            write!(
                out,
                "{},{},{},{},{},{:.4},{:.4},{},{},{}",
                r.backend,
                r.qd,
                r.verify,
                r.experts,
                r.bytes,
                r.secs,
                r.gbps,
                r.fio_qd,
                r.fio.map(|f| format!("{f:.4}")).unwrap_or_default(),
                r.fio
                    .map(|f| format!("{:.3}", r.gbps / f))
                    .unwrap_or_default()
            )?;
            if gpu_cols {
                write!(
                    out,
                    ",{},{},{}",
                    r.vram.map(|v| format!("{v:.4}")).unwrap_or_default(),
                    r.vram
                        .map(|v| format!("{:.3}", v / r.gbps))
                        .unwrap_or_default(),
                    r.h2d.map(|h| format!("{h:.2}")).unwrap_or_default()
                )?;
            }
            writeln!(out)?;
        }
    } else {
        write!(
            out,
            "{:<9} {:>4} {:>7} {:>8} {:>9} {:>6} {:>9} {:>7}",
            "backend", "QD", "BLAKE3", "seconds", "GB/s", "fio QD", "fio GB/s", "ratio"
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
                "{:<9} {:>4} {:>7} {:>8.3} {:>9.3} {:>6} {:>9} {:>7}",
                r.backend.name(),
                r.qd,
                if r.verify { "on" } else { "off" },
                r.secs,
                r.gbps,
                r.fio_qd,
                r.fio
                    .map(|f| format!("{f:.3}"))
                    .unwrap_or_else(|| "-".into()),
                r.fio
                    .map(|f| format!("{:.2}x", r.gbps / f))
                    .unwrap_or_else(|| "-".into())
            )?;
            if gpu_cols {
                write!(
                    out,
                    " {:>9} {:>11} {:>8}",
                    r.vram
                        .map(|v| format!("{v:.3}"))
                        .unwrap_or_else(|| "-".into()),
                    r.vram
                        .map(|v| format!("{:.3}x", v / r.gbps))
                        .unwrap_or_else(|| "-".into()),
                    r.h2d
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

/// Whether fio runs here.
pub(crate) fn has_fio() -> bool {
    Command::new("fio").arg("--version").output().is_ok()
}

pub(crate) fn drop_page_cache() -> std::io::Result<()> {
    Command::new("sync").status()?;
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
}

/// fio random read of `files` (as one job, offsets 4096-aligned), `bytes` in all: GB/s.
pub(crate) fn run_fio(
    files: &[std::path::PathBuf],
    block: usize,
    qd: u32,
    bytes: u64,
) -> anyhow::Result<f64> {
    let names: Vec<String> = files
        .iter()
        .map(|p| p.display().to_string().replace(':', "\\:"))
        .collect();
    let out = Command::new("fio")
        .args([
            "--name=tarfa-bench-io",
            "--readonly",
            "--rw=randread",
            "--ioengine=io_uring",
            "--direct=1",
            "--fixedbufs=1",
            "--registerfiles=1",
            "--blockalign=4096",
            "--output-format=json",
        ])
        .arg(format!("--filename={}", names.join(":")))
        .arg(format!("--bs={block}"))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--io_size={bytes}"))
        .output()
        .context("running fio")?;
    if !out.status.success() {
        bail!(
            "fio failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    // fio may print notes before the JSON object.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find('{').map(|i| &text[i..]).unwrap_or(&text);
    let v: serde_json::Value = serde_json::from_str(json).context("parsing fio's JSON")?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .context("fio's JSON has no jobs[0].read.bw_bytes")?;
    Ok(bw / 1e9)
}
