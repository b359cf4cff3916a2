//! HF safetensors to JNF conversion from a cold page cache, against `cat` of the source (cold)
//! and against `cp -r` + `sync` + `sha256sum`, measured side by side in each run; medians.
//!
//! ```text
//! cargo bench -p tarfa-converter --bench convert -- --runs 3 [--dir DIR] [--csv PATH] [--keep]
//! ```
//!
//! The source is a generated Qwen3-MoE-shaped checkpoint (hidden 2048, expert intermediate 768,
//! 128 experts per layer stored per expert, 3 layers, vocabulary 65,536, 4 shards, BF16): about
//! 4 GiB. It is made once under `--dir` (default `target/bench-convert`), not timed, and reused by
//! later runs when its marker and sizes match. Every run, one after another:
//!
//! 1. drop caches, time `cat SRC/*.safetensors > /dev/null`;
//! 2. delete the previous output, drop caches, time `tarfa_converter::convert` in this process
//!    with `direct_io: true`, and its peak RSS (VmHWM reset through `/proc/self/clear_refs`);
//! 3. the same with `direct_io: false`;
//! 4. delete the previous copy, drop caches, time `cp -r SRC DST`, `sync DST/*` (fsync of each
//!    file, as the converter fsyncs what it writes) and `sha256sum DST/*.safetensors`.
//!
//! Then once with a warm cache, for context. Afterwards (not timed) the outputs are checked: the
//! strict reader and `verify_data` on one layer file and on the trunk, a few regions compared with
//! the source bytes, and the direct and buffered outputs must have the same root digests. All
//! outputs are deleted at the end; the source too unless `--keep`.
//!
//! Dropping caches needs root (`echo 3 > /proc/sys/vm/drop_caches`); without it every figure is
//! warm-cache, which the output says loudly and the CSV rows record.
//!
//! Data goes to stdout, progress to stderr.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tarfa_benchkit::{
    self as kit, cpu_time, drop_caches, files, loadavg, marker_text, print_warm_cache_warning,
    remove_dir_if_present, reset_peak_rss, status_kib, tool, BenchArgs, BenchResult,
    GeneratedCheckpoint, Machine, Ratio, StepRow, StepTable,
};
use tarfa_converter::testkit::{write_checkpoint, SynthSpec};
use tarfa_converter::{convert, Options, Quiet};
use tarfa_format::JnfReader;

fn main() {
    if let Err(e) = bench() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn bench() -> BenchResult<()> {
    let args = BenchArgs::parse("convert")?;
    let root = args
        .dir
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-convert"));
    std::fs::create_dir_all(&root)?;
    let root = root.canonicalize()?;
    let src = root.join("src-qwen3moe-h2048-i768-e128-l3");
    let work = Work {
        out_direct: root.join("out-direct"),
        out_buffered: root.join("out-buffered"),
        copy: root.join("cp-copy"),
    };
    work.remove_all()?;
    let outcome = run(&args, &src, &work);
    eprintln!("removing the outputs under {}", root.display());
    let cleanup = work.remove_all();
    if !args.keep {
        eprintln!(
            "removing the source checkpoint {} (--keep keeps it)",
            src.display()
        );
        remove_dir_if_present(&src)?;
    }
    outcome.and(cleanup.map_err(Into::into))
}

/// The output directories of one run.
#[derive(Debug)]
struct Work {
    out_direct: PathBuf,
    out_buffered: PathBuf,
    copy: PathBuf,
}

impl Work {
    fn remove_all(&self) -> std::io::Result<()> {
        remove_dir_if_present(&self.out_direct)?;
        remove_dir_if_present(&self.out_buffered)?;
        remove_dir_if_present(&self.copy)
    }
}

fn run(args: &BenchArgs, src: &Path, work: &Work) -> BenchResult<()> {
    let spec = SynthSpec::qwen3_moe_bench();
    let data = spec.data_bytes();
    let load_start = loadavg();

    // Room for the source (if it must be made), two conversions and one copy, plus a margin.
    GeneratedCheckpoint {
        dir: src,
        marker: marker_text(&spec, data),
        shards: spec.shards as usize,
        data_bytes: data,
    }
    .prepare(3 * data + (1 << 30), |dir| {
        Ok(write_checkpoint(dir, &spec)?)
    })?;
    let shards = shard_paths(src)?;
    let src_bytes: u64 = shards
        .iter()
        .map(|p| std::fs::metadata(p).map(|m| m.len()))
        .sum::<std::io::Result<u64>>()?;

    let machine = Machine::probe(src);
    println!("# HF to JNF conversion (cold cache): tarfa convert vs cat and cp -r + sha256sum");
    println!(
        "cores: {}   cpu: {}   filesystem: {}   RAM: {}",
        machine.cores, machine.cpu, machine.fs_options, machine.mem
    );
    println!(
        "source: {} shards, {src_bytes} bytes ({:.2} GiB; {data} tensor bytes), {} layers x {} experts \
         (BF16 gate/up [{}, {}], down [{}, {}]), vocab {}; runs: {}",
        shards.len(),
        src_bytes as f64 / f64::from(1u32 << 30),
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
    for run in 0..args.runs {
        eprintln!("run {}/{}", run + 1, args.runs);
        let mut s = RunSample::default();

        cold &= drop_caches();
        s.cat = tool(Command::new("cat").args(&shards).stdout(Stdio::null()))?;

        for (direct, out) in [(true, &work.out_direct), (false, &work.out_buffered)] {
            remove_dir_if_present(out)?;
            cold &= drop_caches();
            let c = convert_once(src, out, direct)?;
            if direct {
                s.direct = c;
            } else {
                s.buffered = c;
            }
        }

        remove_dir_if_present(&work.copy)?;
        cold &= drop_caches();
        s.cp = tool(Command::new("cp").arg("-r").arg(src).arg(&work.copy))?;
        let copies = shard_paths(&work.copy)?;
        let mut sync = Command::new("sync");
        sync.args(
            std::fs::read_dir(&work.copy)?
                .map(|e| e.map(|e| e.path()))
                .collect::<std::io::Result<Vec<_>>>()?,
        );
        s.sync = tool(&mut sync)?;
        s.sha = tool(
            Command::new("sha256sum")
                .args(&copies)
                .stdout(Stdio::null()),
        )?;

        eprintln!(
            "  cat {:.3}s, convert direct {:.3}s ({} MiB), buffered {:.3}s ({} MiB), \
             cp {:.3}s + sync {:.3}s + sha256sum {:.3}s",
            s.cat.as_secs_f64(),
            s.direct.wall.as_secs_f64(),
            s.direct.hwm_kib / 1024,
            s.buffered.wall.as_secs_f64(),
            s.buffered.hwm_kib / 1024,
            s.cp.as_secs_f64(),
            s.sync.as_secs_f64(),
            s.sha.as_secs_f64()
        );
        samples.push(s);
    }
    let load_end = loadavg();

    // For context: once with the source in the page cache.
    eprintln!("warm-cache conversion (context)...");
    tool(Command::new("cat").args(&shards).stdout(Stdio::null()))?;
    let warm_out = work.out_direct.with_file_name("out-warm");
    remove_dir_if_present(&warm_out)?;
    let warm = convert_once(src, &warm_out, true);
    remove_dir_if_present(&warm_out)?;
    let warm = warm?;

    // Check what was written (not timed).
    verify(src, &work.out_direct, &spec)?;
    verify(src, &work.out_buffered, &spec)?;
    same_roots(&work.out_direct, &work.out_buffered)?;
    eprintln!("verified both outputs (strict open + verify_data, regions equal to the source)");

    let reset_ok = samples.iter().all(|s| s.direct.reset && s.buffered.reset);
    let table = Table::new(&samples, src_bytes, warm);
    if !cold {
        print_warm_cache_warning();
    }
    table.print(args.runs, cold, reset_ok);
    println!("\nload average at end: {load_end}");
    if let Some(csv) = &args.csv {
        table
            .steps
            .append_csv(csv, args.runs, cold, &machine, &load_end)
            .map_err(|e| format!("appending to {}: {e}", csv.display()))?;
        eprintln!("appended rows to {}", csv.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The source.

/// The `*.safetensors` files of a directory, sorted.
fn shard_paths(dir: &Path) -> BenchResult<Vec<PathBuf>> {
    files(dir, |p| p.extension().is_some_and(|x| x == "safetensors"))
}

/// Where a tensor's bytes are in the source: shard path and absolute byte range.
fn locate(src: &Path, tensor: &str) -> BenchResult<(PathBuf, u64, u64)> {
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("model.safetensors.index.json"))?)?;
    let shard = index["weight_map"][tensor]
        .as_str()
        .ok_or_else(|| format!("{tensor} is not in the source index"))?;
    let path = src.join(shard);
    let f = File::open(&path)?;
    let mut len = [0u8; 8];
    f.read_exact_at(&mut len, 0)?;
    let n = u64::from_le_bytes(len);
    let mut header = vec![0u8; usize::try_from(n)?];
    f.read_exact_at(&mut header, 8)?;
    let header: serde_json::Value = serde_json::from_slice(&header)?;
    let offsets = &header[tensor]["data_offsets"];
    let (b, e) = (offsets[0].as_u64(), offsets[1].as_u64());
    let (Some(b), Some(e)) = (b, e) else {
        return Err(format!("{tensor}: no data_offsets in {shard}").into());
    };
    Ok((path, 8 + n + b, 8 + n + e))
}

// ---------------------------------------------------------------------------------------------
// The steps.

/// One conversion: wall time, CPU time of this process, peak RSS over the conversion.
#[derive(Clone, Copy, Debug, Default)]
struct ConvertSample {
    wall: Duration,
    cpu: Duration,
    hwm_kib: u64,
    /// Whether VmHWM was reset before the conversion (else it covers the whole process).
    reset: bool,
    bytes: u64,
}

fn convert_once(src: &Path, out: &Path, direct_io: bool) -> BenchResult<ConvertSample> {
    let reset = reset_peak_rss();
    if !reset {
        eprintln!(
            "  note: /proc/self/clear_refs refused the reset; VmHWM covers the whole process"
        );
    }
    let cpu0 = cpu_time();
    let t = Instant::now();
    let summary = convert(
        src,
        out,
        &Options {
            layers: None,
            direct_io,
            ..Options::default()
        },
        &Quiet,
    )?;
    let wall = t.elapsed();
    let cpu = cpu_time().saturating_sub(cpu0);
    let hwm_kib = status_kib("VmHWM")?;
    if summary.layers_written.len() != SynthSpec::qwen3_moe_bench().layers as usize
        || !summary.trunk_written
    {
        return Err(format!("conversion wrote too little: {summary:?}").into());
    }
    Ok(ConvertSample {
        wall,
        cpu,
        hwm_kib,
        reset,
        bytes: summary.bytes_written,
    })
}

/// The strict reader and every hash on one layer file and on the trunk; a few regions compared
/// with the source's bytes.
fn verify(src: &Path, out: &Path, spec: &SynthSpec) -> BenchResult<()> {
    let layer = spec.layers / 2;
    let layer_file = out.join(tarfa_format::manifest::layer_file_name(layer));
    let trunk_file = out.join(tarfa_format::manifest::TRUNK_NAME);
    let checks = [
        (
            &layer_file,
            format!("model.layers.{layer}.self_attn.q_proj.weight"),
        ),
        (
            &layer_file,
            format!(
                "model.layers.{layer}.mlp.experts.{}.down_proj.weight",
                spec.experts / 2
            ),
        ),
        (
            &layer_file,
            format!(
                "model.layers.{layer}.mlp.experts.{}.gate_proj.weight",
                spec.experts - 1
            ),
        ),
        (&trunk_file, "model.norm.weight".to_string()),
    ];
    for file in [&layer_file, &trunk_file] {
        let reader = JnfReader::open(file)
            .map_err(|e| format!("VERIFY FAILED: {} does not open: {e}", file.display()))?;
        reader
            .verify_data()
            .map_err(|e| format!("VERIFY FAILED: {}: {e}", file.display()))?;
        for (f, name) in &checks {
            if f != &file {
                continue;
            }
            let region = reader
                .region_by_name(name)
                .ok_or_else(|| format!("VERIFY FAILED: {name} missing in {}", file.display()))?;
            let got = reader.read_region(region)?;
            let (path, b, e) = locate(src, name)?;
            let mut want = vec![0u8; usize::try_from(e - b)?];
            File::open(&path)?.read_exact_at(&mut want, b)?;
            if got != want {
                return Err(format!(
                    "VERIFY FAILED: region {name} of {} differs from the source bytes",
                    file.display()
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Every JNF file of two outputs has the same root digests (the same bytes, §5.4).
fn same_roots(a: &Path, b: &Path) -> BenchResult<()> {
    let mut n = 0;
    for e in std::fs::read_dir(a)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "jnf") {
            let name = p.file_name().ok_or("no file name")?;
            let ra = JnfReader::open(&p)?;
            let rb = JnfReader::open(b.join(name))?;
            if ra.root() != rb.root() || ra.footer().file_len != rb.footer().file_len {
                return Err(format!(
                    "VERIFY FAILED: {} differs between the direct and buffered outputs",
                    name.to_string_lossy()
                )
                .into());
            }
            n += 1;
        }
    }
    if n == 0 {
        return Err("VERIFY FAILED: no JNF file in the output".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Results.

#[derive(Debug, Default)]
struct RunSample {
    cat: Duration,
    direct: ConvertSample,
    buffered: ConvertSample,
    cp: Duration,
    sync: Duration,
    sha: Duration,
}

impl RunSample {
    fn baseline(&self) -> Duration {
        self.cp + self.sync + self.sha
    }
}

/// The median of per-run values (`--runs` is at least 1).
fn median(v: Vec<f64>) -> f64 {
    kit::median(v).unwrap_or(f64::NAN)
}

/// The steps and ratios of the conversion benchmark, with what its goals need.
#[derive(Debug)]
struct Table {
    steps: StepTable,
    max_hwm_mib: f64,
    region_bytes: u64,
}

impl Table {
    fn new(samples: &[RunSample], bytes: u64, warm: ConvertSample) -> Table {
        let secs = |f: &dyn Fn(&RunSample) -> Duration| {
            median(samples.iter().map(|s| f(s).as_secs_f64()).collect())
        };
        let conv = |f: &dyn Fn(&RunSample) -> ConvertSample| {
            let c: Vec<ConvertSample> = samples.iter().map(f).collect();
            (
                median(c.iter().map(|c| c.wall.as_secs_f64()).collect()),
                median(c.iter().map(|c| c.cpu.as_secs_f64()).collect()),
                median(c.iter().map(|c| c.hwm_kib as f64 / 1024.0).collect()),
            )
        };
        let row = |step, (seconds, cpu, hwm): (f64, f64, f64)| StepRow {
            step,
            seconds,
            cpu: Some(cpu),
            hwm_mib: Some(hwm),
        };
        let plain = |step, seconds| StepRow {
            step,
            seconds,
            cpu: None,
            hwm_mib: None,
        };
        let rows = vec![
            plain("cat SRC/*.safetensors > /dev/null (cold)", secs(&|s| s.cat)),
            row("tarfa convert, O_DIRECT (cold)", conv(&|s| s.direct)),
            row("tarfa convert, buffered (cold)", conv(&|s| s.buffered)),
            plain("cp -r SRC DST (cold)", secs(&|s| s.cp)),
            plain("sync DST/* (fsync)", secs(&|s| s.sync)),
            plain("sha256sum DST/*.safetensors (warm)", secs(&|s| s.sha)),
            plain("cp -r + sync + sha256sum", secs(&|s| s.baseline())),
            row(
                "tarfa convert, O_DIRECT, WARM cache, once (context)",
                (
                    warm.wall.as_secs_f64(),
                    warm.cpu.as_secs_f64(),
                    warm.hwm_kib as f64 / 1024.0,
                ),
            ),
        ];
        let ratio = |f: &dyn Fn(&RunSample) -> f64| {
            let v: Vec<f64> = samples.iter().map(f).collect();
            (median(v.clone()), v)
        };
        let mut ratios = Vec::new();
        for (name, f) in [
            (
                "convert O_DIRECT / cat (cold)",
                &(|s: &RunSample| s.direct.wall.as_secs_f64() / s.cat.as_secs_f64())
                    as &dyn Fn(&RunSample) -> f64,
            ),
            ("convert buffered / cat (cold)", &|s: &RunSample| {
                s.buffered.wall.as_secs_f64() / s.cat.as_secs_f64()
            }),
            (
                "convert O_DIRECT / (cp -r + sync + sha256sum)",
                &|s: &RunSample| s.direct.wall.as_secs_f64() / s.baseline().as_secs_f64(),
            ),
            (
                "convert buffered / (cp -r + sync + sha256sum)",
                &|s: &RunSample| s.buffered.wall.as_secs_f64() / s.baseline().as_secs_f64(),
            ),
        ] {
            let (median, per_run) = ratio(f);
            ratios.push(Ratio {
                name,
                median,
                per_run,
            });
        }
        let max_hwm_mib = samples
            .iter()
            .flat_map(|s| [s.direct.hwm_kib, s.buffered.hwm_kib])
            .chain([warm.hwm_kib])
            .max()
            .unwrap_or(0) as f64
            / 1024.0;
        Table {
            steps: StepTable {
                rows,
                ratios,
                bytes,
            },
            max_hwm_mib,
            region_bytes: samples.first().map_or(0, |s| s.direct.bytes),
        }
    }

    fn print(&self, runs: usize, cold: bool, reset_ok: bool) {
        let hwm_note = if reset_ok {
            "peak RSS over the conversion (VmHWM after a clear_refs reset)"
        } else {
            "VmHWM of the WHOLE process (clear_refs reset refused)"
        };
        self.steps.print_steps(runs, cold);
        println!(
            "\nGB/s is {} source bytes (all shards) / seconds / 1e9; each conversion writes {} \
             region bytes. Peak RSS: {hwm_note}.",
            self.steps.bytes, self.region_bytes
        );
        self.steps.print_ratios();
        let cat_ratio = self.steps.ratios.first().map_or(f64::NAN, |r| r.median);
        println!(
            "\ngoal convert <= 1.3x cold cat: {} ({cat_ratio:.3}x, O_DIRECT)",
            if cat_ratio <= 1.3 { "MET" } else { "NOT MET" }
        );
        println!(
            "goal peak RSS < 1 GiB: {} (largest {:.1} MiB)",
            if self.max_hwm_mib < 1024.0 {
                "MET"
            } else {
                "NOT MET"
            },
            self.max_hwm_mib
        );
    }
}
