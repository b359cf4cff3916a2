//! `tarfa verify --source` from a cold page cache, against the cold read of the same bytes
//! (`cat` of source and output) and against `b3sum` + `sha256sum` of the same files, measured side
//! by side in each run; medians.
//!
//! ```text
//! cargo bench -p tarfa-verifier --bench verify -- --runs 3 [--dir DIR] [--csv PATH] [--keep]
//! ```
//!
//! The source is the conversion benchmark's generated Qwen3-MoE-shaped checkpoint (hidden 2048,
//! expert intermediate 768, 128 experts per layer stored per expert, 3 layers, vocabulary 65,536,
//! 4 shards, BF16): about 4 GiB. It is made once under `--dir` (default `target/bench-verify`),
//! not timed, and reused by later runs when its marker and sizes match; it is converted once, not
//! timed, with `tarfa_converter::convert` (`direct_io: true`). Every run, one after another:
//!
//! 1. drop caches, time `cat SRC/* OUT/*.jnf > /dev/null` (the cold read of source + output);
//! 2. drop caches, time `tarfa_verifier::verify(OUT, source: SRC, direct_io: true)` in this
//!    process, with its CPU time and peak RSS; it must report no fault;
//! 3. drop caches, time `b3sum OUT/*.jnf SRC/*` (cold), then `sha256sum OUT/*.jnf SRC/*` (the
//!    files now in the page cache), and for context `openssl dgst -sha256` of the same files
//!    (GNU `sha256sum` here is not linked with libcrypto and does not use SHA-NI).
//!
//! Then once, for context, `verify` without a source (hashes only), cold. The output is deleted at
//! the end; the source too unless `--keep` (which keeps the output as well).
//!
//! Dropping caches needs root (`echo 3 > /proc/sys/vm/drop_caches`); without it every figure is
//! warm-cache, which the output says loudly and the CSV rows record.
//!
//! Data goes to stdout, progress to stderr.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tarfa_benchkit::{
    self as kit, cpu_time, drop_caches, files, loadavg, marker_text, print_warm_cache_warning,
    remove_dir_if_present, reset_peak_rss, status_kib, tool, BenchArgs, BenchResult,
    GeneratedCheckpoint, Machine, Ratio, StepRow, StepTable,
};
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_verifier::{verify, Options, Report};

/// The goal of the verifier issue: verify at most this times the cold read of source + output.
const GOAL: f64 = 1.1;

fn main() {
    if let Err(e) = bench() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn bench() -> BenchResult<()> {
    let args = BenchArgs::parse("verify")?;
    let root = args
        .dir
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-verify"));
    std::fs::create_dir_all(&root)?;
    let root = root.canonicalize()?;
    let src = root.join("src-qwen3moe-h2048-i768-e128-l3");
    let out = root.join("out");
    remove_dir_if_present(&out)?;
    let outcome = run(&args, &src, &out);
    if args.keep {
        eprintln!("keeping {} and {} (--keep)", src.display(), out.display());
    } else {
        eprintln!(
            "removing {} and the source checkpoint {} (--keep keeps them)",
            out.display(),
            src.display()
        );
        remove_dir_if_present(&out)?;
        remove_dir_if_present(&src)?;
    }
    outcome
}

fn run(args: &BenchArgs, src: &Path, out: &Path) -> BenchResult<()> {
    let spec = SynthSpec::qwen3_moe_bench();
    let data = spec.data_bytes();
    let load_start = loadavg();

    // Room for the source (if it must be made) and one conversion, plus a margin.
    GeneratedCheckpoint {
        dir: src,
        marker: marker_text(&spec, data),
        shards: spec.shards as usize,
        data_bytes: data,
    }
    .prepare(data + (1 << 30), |dir| Ok(write_checkpoint(dir, &spec)?))?;
    eprintln!("converting it once (O_DIRECT, not timed)...");
    let t = Instant::now();
    let summary = tarfa_converter::convert(
        src,
        out,
        &tarfa_converter::Options {
            layers: None,
            direct_io: true,
            ..tarfa_converter::Options::default()
        },
        &tarfa_converter::Quiet,
    )?;
    if summary.layers_written.len() != spec.layers as usize || !summary.trunk_written {
        return Err(format!("conversion wrote too little: {summary:?}").into());
    }
    eprintln!("  converted in {:.1}s", t.elapsed().as_secs_f64());

    let src_files = files(src, |_| true)?;
    let jnf_files = files(out, |p| p.extension().is_some_and(|x| x == "jnf"))?;
    let size = |v: &[PathBuf]| -> std::io::Result<u64> {
        v.iter()
            .map(|p| std::fs::metadata(p).map(|m| m.len()))
            .sum()
    };
    let (src_bytes, jnf_bytes) = (size(&src_files)?, size(&jnf_files)?);
    let bytes = src_bytes + jnf_bytes;
    // The hashing tools' arguments: output first, then source, as the brief of the issue writes.
    let all: Vec<PathBuf> = jnf_files.iter().chain(&src_files).cloned().collect();

    let machine = Machine::probe(src);
    println!("# Verification (cold cache): tarfa verify --source vs cat and b3sum + sha256sum");
    println!(
        "cores: {}   cpu: {}   filesystem: {}   RAM: {}",
        machine.cores, machine.cpu, machine.fs_options, machine.mem
    );
    println!(
        "source: {} files, {src_bytes} bytes; output: {} JNF files, {jnf_bytes} bytes; together \
         {bytes} bytes ({:.2} GiB); {} layers x {} experts (BF16 gate/up [{}, {}], down [{}, {}]), \
         vocab {}; runs: {}",
        src_files.len(),
        jnf_files.len(),
        bytes as f64 / f64::from(1u32 << 30),
        spec.layers,
        spec.experts,
        spec.inter,
        spec.hidden,
        spec.hidden,
        spec.inter,
        spec.vocab,
        args.runs
    );
    println!("load average at start: {load_start}");

    let mut cold = true;
    let mut samples: Vec<RunSample> = Vec::with_capacity(args.runs);
    let mut report = None;
    for run in 0..args.runs {
        eprintln!("run {}/{}", run + 1, args.runs);
        let mut s = RunSample::default();

        cold &= drop_caches();
        s.cat = tool(
            Command::new("cat")
                .args(&src_files)
                .args(&jnf_files)
                .stdout(Stdio::null()),
        )?;

        cold &= drop_caches();
        let (v, r) = verify_once(out, Some(src))?;
        s.verify = v;
        report = Some(r);

        cold &= drop_caches();
        s.b3sum = tool(Command::new("b3sum").args(&all).stdout(Stdio::null()))?;
        s.sha256sum = tool(Command::new("sha256sum").args(&all).stdout(Stdio::null()))?;
        s.openssl = tool(
            Command::new("openssl")
                .args(["dgst", "-sha256"])
                .args(&all)
                .stdout(Stdio::null()),
        )?;

        eprintln!(
            "  cat {:.3}s, verify {:.3}s ({:.2} CPU s, {} MiB), b3sum {:.3}s + sha256sum {:.3}s, \
             openssl {:.3}s",
            s.cat.as_secs_f64(),
            s.verify.wall.as_secs_f64(),
            s.verify.cpu.as_secs_f64(),
            s.verify.hwm_kib / 1024,
            s.b3sum.as_secs_f64(),
            s.sha256sum.as_secs_f64(),
            s.openssl.as_secs_f64()
        );
        samples.push(s);
    }
    let load_end = loadavg();

    // For context: once without a source (every JNF byte read and hashed, nothing compared).
    eprintln!("verify without --source (context)...");
    cold &= drop_caches();
    let (hashes_only, hashes_report) = verify_once(out, None)?;

    let report = report.ok_or("no run")?;
    let reset_ok = samples.iter().all(|s| s.verify.reset) && hashes_only.reset;
    let table = Table::new(&samples, bytes, hashes_only);
    if !cold {
        print_warm_cache_warning();
    }
    table.print(args.runs, cold, reset_ok);
    println!(
        "\nverify --source read {} JNF bytes (O_DIRECT: {}) in {} files, checked {} regions and {} \
         experts, compared {} source bytes; 0 faults.",
        report.bytes_read,
        report.direct_io,
        report.files_read,
        report.regions_checked,
        report.experts_checked,
        report.source_bytes_compared
    );
    println!(
        "verify without a source read {} JNF bytes, compared {} source bytes; 0 faults.",
        hashes_report.bytes_read, hashes_report.source_bytes_compared
    );
    println!("\nload average at end: {load_end}");
    if let Some(csv) = &args.csv {
        table
            .0
            .append_csv(csv, args.runs, cold, &machine, &load_end)
            .map_err(|e| format!("appending to {}: {e}", csv.display()))?;
        eprintln!("appended rows to {}", csv.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The step.

/// One verification: wall time, CPU time of this process, peak RSS over the verification.
#[derive(Clone, Copy, Debug, Default)]
struct VerifySample {
    wall: Duration,
    cpu: Duration,
    hwm_kib: u64,
    /// Whether VmHWM was reset before the verification (else it covers the whole process).
    reset: bool,
}

/// `verify(out, source, direct_io: true)`; any fault is an error that lists them.
fn verify_once(out: &Path, source: Option<&Path>) -> BenchResult<(VerifySample, Report)> {
    let reset = reset_peak_rss();
    if !reset {
        eprintln!(
            "  note: /proc/self/clear_refs refused the reset; VmHWM covers the whole process"
        );
    }
    let cpu0 = cpu_time();
    let t = Instant::now();
    let report = verify(
        out,
        &Options {
            source: source.map(Path::to_path_buf),
            direct_io: true,
            ..Options::default()
        },
        &tarfa_verifier::Quiet,
    )?;
    let wall = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let hwm_kib = status_kib("VmHWM")?;
    if !report.faults.is_empty() {
        let lines: Vec<String> = report.faults.iter().map(|f| f.line()).collect();
        return Err(format!(
            "VERIFY FAILED: a clean conversion reported {} fault(s):\n{}",
            report.faults.len(),
            lines.join("\n")
        )
        .into());
    }
    if report.bytes_read == 0 || (source.is_some() && report.source_bytes_compared == 0) {
        return Err(format!("VERIFY FAILED: verify read nothing: {report:?}").into());
    }
    Ok((
        VerifySample {
            wall,
            cpu,
            hwm_kib,
            reset,
        },
        report,
    ))
}

// ---------------------------------------------------------------------------------------------
// Results.

#[derive(Debug, Default)]
struct RunSample {
    cat: Duration,
    verify: VerifySample,
    b3sum: Duration,
    sha256sum: Duration,
    openssl: Duration,
}

impl RunSample {
    fn baseline(&self) -> Duration {
        self.b3sum + self.sha256sum
    }

    fn baseline_openssl(&self) -> Duration {
        self.b3sum + self.openssl
    }
}

/// The median of per-run values (`--runs` is at least 1).
fn median(v: Vec<f64>) -> f64 {
    kit::median(v).unwrap_or(f64::NAN)
}

/// The steps and ratios of the verification benchmark.
#[derive(Debug)]
struct Table(StepTable);

impl Table {
    fn new(samples: &[RunSample], bytes: u64, hashes_only: VerifySample) -> Table {
        let secs = |f: &dyn Fn(&RunSample) -> Duration| {
            median(samples.iter().map(|s| f(s).as_secs_f64()).collect())
        };
        let plain = |step, seconds| StepRow {
            step,
            seconds,
            cpu: None,
            hwm_mib: None,
        };
        let v = |step, c: &[VerifySample]| StepRow {
            step,
            seconds: median(c.iter().map(|c| c.wall.as_secs_f64()).collect()),
            cpu: Some(median(c.iter().map(|c| c.cpu.as_secs_f64()).collect())),
            hwm_mib: Some(median(
                c.iter().map(|c| c.hwm_kib as f64 / 1024.0).collect(),
            )),
        };
        let verifies: Vec<VerifySample> = samples.iter().map(|s| s.verify).collect();
        let rows = vec![
            plain("cat SRC/* OUT/*.jnf > /dev/null (cold)", secs(&|s| s.cat)),
            v("tarfa verify --source, O_DIRECT (cold)", &verifies),
            plain("b3sum OUT/*.jnf SRC/* (cold)", secs(&|s| s.b3sum)),
            plain("sha256sum OUT/*.jnf SRC/* (warm)", secs(&|s| s.sha256sum)),
            plain("b3sum + sha256sum", secs(&|s| s.baseline())),
            plain(
                "openssl dgst -sha256 OUT/*.jnf SRC/* (warm, context)",
                secs(&|s| s.openssl),
            ),
            plain(
                "b3sum + openssl dgst -sha256 (context)",
                secs(&|s| s.baseline_openssl()),
            ),
            v(
                "tarfa verify, no source, O_DIRECT (cold, once, context)",
                &[hashes_only],
            ),
        ];
        let mut ratios = Vec::new();
        for (name, f) in [
            (
                "verify / cat (cold)",
                &(|s: &RunSample| s.verify.wall.as_secs_f64() / s.cat.as_secs_f64())
                    as &dyn Fn(&RunSample) -> f64,
            ),
            ("verify / (b3sum + sha256sum)", &|s: &RunSample| {
                s.verify.wall.as_secs_f64() / s.baseline().as_secs_f64()
            }),
            (
                "verify / (b3sum + openssl dgst -sha256) (context)",
                &|s: &RunSample| s.verify.wall.as_secs_f64() / s.baseline_openssl().as_secs_f64(),
            ),
        ] {
            let v: Vec<f64> = samples.iter().map(f).collect();
            ratios.push(Ratio {
                name,
                median: median(v.clone()),
                per_run: v,
            });
        }
        Table(StepTable {
            rows,
            ratios,
            bytes,
        })
    }

    fn print(&self, runs: usize, cold: bool, reset_ok: bool) {
        let hwm_note = if reset_ok {
            "peak RSS over the verification (VmHWM after a clear_refs reset)"
        } else {
            "VmHWM of the WHOLE process (clear_refs reset refused)"
        };
        self.0.print_steps(runs, cold);
        println!(
            "\nGB/s is {} bytes (source files + output JNF files) / seconds / 1e9. Peak RSS: \
             {hwm_note}.",
            self.0.bytes
        );
        self.0.print_ratios();
        let cat_ratio = self.0.ratios.first().map_or(f64::NAN, |r| r.median);
        println!(
            "\ngoal verify <= {GOAL}x cold cat: {} ({cat_ratio:.3}x)",
            if cat_ratio <= GOAL { "MET" } else { "NOT MET" }
        );
    }
}
