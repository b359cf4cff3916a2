//! JNF write throughput: tarfa's streaming writer (both hashes, fsync, atomic publish) against
//! the plain-tools baseline on the same bytes — `cp` + `sync FILE` (fsync), `b3sum`,
//! `openssl dgst -sha256` — measured side by side in each run; medians reported.
//!
//! ```text
//! cargo bench -p tarfa-format --bench write_throughput -- --runs 3 [--warmup N]
//!     [--dir DIR] [--csv PATH] [--gib G]
//! ```
//!
//! The data set is shaped like Qwen3-30B-A3B's MoE layers: per layer a norm and a router tensor,
//! then 128 experts of BF16 gate/up `[768, 2048]` and down `[2048, 768]` (9 MiB per expert),
//! one layer per file, layers until at least `--gib` GiB (default 2). Region bytes come from a
//! seeded four-lane xorshift; its own cost is measured and printed. Everything is written under a
//! fresh directory inside `--dir` (default `target/tmp`) that is removed at the end.
//!
//! Data goes to stdout, progress to stderr.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tarfa_benchkit::{
    self as kit, has_tool, median, remove_if_present, syncfs, time, tool_output, Align,
    BenchResult, Machine,
};
use tarfa_format::hash::DualHasher;
use tarfa_format::writer::WriterOptions;
use tarfa_format::{Dtype, FileLayout, JnfReader, JnfWriter, RegionSpec, Role};

const EXPERTS_PER_LAYER: u32 = 128;
const HIDDEN: u64 = 2048;
const MOE_INTERMEDIATE: u64 = 768;

fn main() {
    if let Err(e) = bench() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn bench() -> BenchResult<()> {
    let args = Args::parse()?;
    let root = args
        .dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    std::fs::create_dir_all(&root)?;
    // Dropping the TempDir removes everything written, also when a step fails.
    let work = tempfile::Builder::new()
        .prefix("jnf-write-bench-")
        .tempdir_in(&root)?;
    let outcome = run(&args, work.path());
    eprintln!("removing {}", work.path().display());
    drop(work);
    outcome
}

fn run(args: &Args, dir: &Path) -> BenchResult<()> {
    let layers = plan_layers(args.gib);
    let bytes: u64 = layers.iter().map(LayerPlan::data_bytes).sum();
    let machine = Machine::probe(dir);
    println!("# JNF write: tarfa vs cp + b3sum + openssl");
    println!(
        "cores: {}   cpu: {}   filesystem: {}   dir: {}",
        machine.cores,
        machine.cpu,
        machine.fs,
        dir.display()
    );
    println!(
        "data: {} layer files x {EXPERTS_PER_LAYER} experts (BF16 gate/up [768,2048], down [2048,768]), \
         {bytes} region bytes ({:.2} GiB), runs: {}",
        layers.len(),
        bytes as f64 / f64::from(1u32 << 30),
        args.runs
    );

    // The generator's own cost: every region byte produced into a reused buffer, nothing else.
    let generator = time(|| {
        let mut sink = vec![0u8; 4 << 20];
        for layer in &layers {
            for region in layer.regions() {
                let mut src = region.source();
                while src.read(&mut sink)? > 0 {}
            }
        }
        Ok(())
    })?;

    // The baseline's source: the same bytes, concatenated in write order, made once, durable and
    // left in the page cache (not timed). Its digests let us check what b3sum and openssl print.
    eprintln!("materialising the raw source file...");
    let src_path = dir.join("raw-regions.bin");
    let expected = materialise(&layers, &src_path)?;
    let dst_path = dir.join("raw-regions.copy");

    let tools = Tools::probe();
    let mut samples: Vec<RunSample> = Vec::with_capacity(args.runs);
    let mut written: Vec<PathBuf> = Vec::new();
    let mut written_direct: Vec<PathBuf> = Vec::new();
    for run in 0..args.warmup + args.runs {
        if run < args.warmup {
            eprintln!("warm-up run {}/{} (not counted)", run + 1, args.warmup);
        } else {
            eprintln!("run {}/{}", run + 1 - args.warmup, args.runs);
        }
        for p in written.drain(..) {
            std::fs::remove_file(p)?;
        }
        syncfs(dir)?;

        let mut s = RunSample::default();
        let t = Instant::now();
        for layer in &layers {
            let (path, finish) = write_layer(dir, layer)?;
            s.tarfa_finish += finish;
            written.push(path);
        }
        s.tarfa = t.elapsed();

        // The same with O_DIRECT (its own files, freed first like every writing step).
        for p in written_direct.drain(..) {
            std::fs::remove_file(p)?;
        }
        syncfs(dir)?;
        let t = Instant::now();
        for layer in &layers {
            let (path, finish) = write_layer_with(dir, layer, true)?;
            s.direct_finish += finish;
            written_direct.push(path);
        }
        s.direct = t.elapsed();

        // Each writing step first frees its own previous output, so each writes into pages the
        // guest just freed: on a VM, pages idle for seconds go back to the host and cost a fault
        // again on first touch, which would otherwise favour whichever step runs first.
        remove_if_present(&dst_path)?;
        syncfs(dir)?;
        if tools.cp && tools.sync {
            s.cp = Some(tool_output(Command::new("cp").arg(&src_path).arg(&dst_path))?.0);
            s.fsync = Some(tool_output(Command::new("sync").arg(&dst_path))?.0);
        }
        let digest_of = if tools.cp { &dst_path } else { &src_path };
        if tools.b3sum {
            let (d, out) = tool_output(Command::new("b3sum").arg(digest_of))?;
            check_digest("b3sum", &out, &expected.blake3)?;
            s.b3sum = Some(d);
        }
        if tools.openssl {
            let (d, out) = tool_output(
                Command::new("openssl")
                    .args(["dgst", "-sha256"])
                    .arg(digest_of),
            )?;
            check_digest("openssl", &out, &expected.sha256)?;
            s.openssl = Some(d);
        }
        if tools.b3sum {
            let (d, out) = tool_output(
                Command::new("b3sum")
                    .args(["--num-threads", "1"])
                    .arg(digest_of),
            )?;
            check_digest("b3sum --num-threads 1", &out, &expected.blake3)?;
            s.b3sum_1t = Some(d);
        }

        // The writer's two halves apart, for context: hashing without I/O, I/O without hashing.
        s.hash_only = time(|| hash_only(&layers))?;
        let plain = dir.join("plain-write.bin");
        remove_if_present(&plain)?;
        syncfs(dir)?;
        s.write_only = time(|| write_only(&layers, &plain))?;
        eprintln!(
            "  tarfa {:.3}s (finish {:.3}s), O_DIRECT {:.3}s, cp {}, baseline {}",
            s.tarfa.as_secs_f64(),
            s.tarfa_finish.as_secs_f64(),
            s.direct.as_secs_f64(),
            s.cp.map_or("n/a".into(), |d| format!("{:.3}s", d.as_secs_f64())),
            s.baseline()
                .map_or("n/a".into(), |b| format!("{:.3}s", b.as_secs_f64()))
        );
        if run >= args.warmup {
            samples.push(s);
        }
    }

    // Check what was written (not timed): the first layer file passes the strict reader and
    // every hash, and its first region holds the same bytes as the raw source file.
    let first = written.first().ok_or("no file written")?;
    let reader = JnfReader::open(first)?;
    reader.verify_data()?;
    let raw = File::open(&src_path)?;
    let mut raw_offset = 0u64;
    for planned in layers[0].regions() {
        let name = &planned.spec.name;
        if name == "blk.0.attn_norm" || name.ends_with("_exps.64") {
            let region = reader.region_by_name(name).ok_or("region missing")?;
            let got = reader.read_region(region)?;
            let mut want = vec![0u8; got.len()];
            raw.read_exact_at(&mut want, raw_offset)?;
            if got != want {
                return Err(format!("region {name} differs from the raw source file").into());
            }
        }
        raw_offset += planned.len();
    }
    eprintln!("verified {} (strict open + verify_data)", first.display());
    for (b, d) in written.iter().zip(&written_direct) {
        let (rb, rd) = (JnfReader::open(b)?, JnfReader::open(d)?);
        if rb.root() != rd.root() || rb.footer().file_len != rd.footer().file_len {
            return Err(format!("{} differs from its buffered twin", d.display()).into());
        }
    }
    eprintln!("verified: the O_DIRECT files have the buffered files' root digests");

    let table = Table::new(&samples, generator, bytes);
    table.print(&tools, args.runs);
    if let Some(csv) = &args.csv {
        table
            .append_csv(csv, bytes, args.runs, &machine)
            .map_err(|e| format!("appending to {}: {e}", csv.display()))?;
        eprintln!("appended rows to {}", csv.display());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The data set.

/// One region to write: its spec, its role inside an expert (or none), and its generator seed.
#[derive(Clone, Debug)]
struct PlannedRegion {
    spec: RegionSpec,
    role: Option<Role>,
    seed: u64,
}

impl PlannedRegion {
    fn new(layer: u32, name: String, shape: [u64; 2], role: Option<Role>, seed: u64) -> Self {
        let shape = if shape[0] == 1 {
            vec![shape[1]]
        } else {
            shape.to_vec()
        };
        PlannedRegion {
            spec: RegionSpec {
                name,
                dtype: Dtype::BF16,
                shape,
                layer: Some(layer),
                source: None,
            },
            role,
            seed: (u64::from(layer) << 32) ^ seed,
        }
    }

    fn len(&self) -> u64 {
        self.spec.byte_len().unwrap_or(0)
    }

    fn source(&self) -> XorshiftStream {
        XorshiftStream::new(self.seed, self.len())
    }
}

/// One layer file: its plain tensors, then its experts' projections, in write order.
#[derive(Debug)]
struct LayerPlan {
    layer: u32,
    tensors: Vec<PlannedRegion>,
    experts: Vec<[PlannedRegion; 3]>,
}

impl LayerPlan {
    fn new(layer: u32) -> LayerPlan {
        let t = |name: &str, shape, seed| {
            PlannedRegion::new(layer, format!("blk.{layer}.{name}"), shape, None, seed)
        };
        let tensors = vec![
            t("attn_norm", [1, HIDDEN], 1),
            t("ffn_gate_inp", [u64::from(EXPERTS_PER_LAYER), HIDDEN], 2),
        ];
        let experts = (0..EXPERTS_PER_LAYER)
            .map(|e| {
                let p = |name: &str, role, shape, k: u64| {
                    let name = format!("blk.{layer}.ffn_{name}_exps.{e}");
                    PlannedRegion::new(layer, name, shape, Some(role), 16 + u64::from(e) * 4 + k)
                };
                [
                    p("gate", Role::Gate, [MOE_INTERMEDIATE, HIDDEN], 0),
                    p("up", Role::Up, [MOE_INTERMEDIATE, HIDDEN], 1),
                    p("down", Role::Down, [HIDDEN, MOE_INTERMEDIATE], 2),
                ]
            })
            .collect();
        LayerPlan {
            layer,
            tensors,
            experts,
        }
    }

    fn regions(&self) -> impl Iterator<Item = &PlannedRegion> {
        self.tensors.iter().chain(self.experts.iter().flatten())
    }

    fn data_bytes(&self) -> u64 {
        self.regions().map(PlannedRegion::len).sum()
    }
}

/// Layers until the region bytes reach `gib` GiB.
fn plan_layers(gib: f64) -> Vec<LayerPlan> {
    let target = gib * f64::from(1u32 << 30);
    let mut layers = Vec::new();
    let mut total = 0u64;
    while layers.is_empty() || (total as f64) < target {
        let layer = LayerPlan::new(u32::try_from(layers.len()).unwrap_or(u32::MAX));
        total += layer.data_bytes();
        layers.push(layer);
    }
    layers
}

/// A deterministic, seekless byte stream: four interleaved xorshift64 lanes, 32 bytes a step.
/// The bytes depend only on the seed and position, not on how the reads are sized.
#[derive(Debug)]
struct XorshiftStream {
    lanes: [u64; 4],
    left: u64,
    spill: [u8; 32],
    spill_at: usize,
}

impl XorshiftStream {
    fn new(seed: u64, len: u64) -> Self {
        let mut s = seed;
        let mut lanes = [0u64; 4];
        for lane in &mut lanes {
            *lane = splitmix64(&mut s) | 1;
        }
        XorshiftStream {
            lanes,
            left: len,
            spill: [0; 32],
            spill_at: 32,
        }
    }

    fn block(&mut self, out: &mut [u8]) {
        for (lane, bytes) in self.lanes.iter_mut().zip(out.chunks_exact_mut(8)) {
            let mut x = *lane;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *lane = x;
            bytes.copy_from_slice(&x.to_le_bytes());
        }
    }
}

impl Read for XorshiftStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = usize::try_from(self.left).map_or(buf.len(), |left| left.min(buf.len()));
        let out = &mut buf[..n];
        let from_spill = (32 - self.spill_at).min(n);
        out[..from_spill].copy_from_slice(&self.spill[self.spill_at..self.spill_at + from_spill]);
        self.spill_at += from_spill;
        let mut blocks = out[from_spill..].chunks_exact_mut(32);
        for b in &mut blocks {
            self.block(b);
        }
        let tail = blocks.into_remainder();
        if !tail.is_empty() {
            let mut spill = [0u8; 32];
            self.block(&mut spill);
            tail.copy_from_slice(&spill[..tail.len()]);
            self.spill = spill;
            self.spill_at = tail.len();
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn splitmix64(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

// ---------------------------------------------------------------------------------------------
// The steps.

/// Write one layer file with the streaming writer; returns its path and the time `finish` took
/// (index, fsync, rename, directory fsync).
fn write_layer(dir: &Path, plan: &LayerPlan) -> BenchResult<(PathBuf, Duration)> {
    write_layer_with(dir, plan, false)
}

/// [`write_layer`], with `O_DIRECT` writes when `direct_io` (into `direct/` under `dir`).
fn write_layer_with(
    dir: &Path,
    plan: &LayerPlan,
    direct_io: bool,
) -> BenchResult<(PathBuf, Duration)> {
    let path = if direct_io {
        let d = dir.join("direct");
        std::fs::create_dir_all(&d)?;
        d.join(format!("layer-{:05}.jnf", plan.layer))
    } else {
        dir.join(format!("layer-{:05}.jnf", plan.layer))
    };
    let mut w = JnfWriter::create_with(
        &path,
        FileLayout::layer(plan.layer, EXPERTS_PER_LAYER),
        WriterOptions { direct_io },
    )?;
    for t in &plan.tensors {
        w.tensor(&t.spec, &mut t.source())?;
    }
    for (e, projections) in (0u32..).zip(&plan.experts) {
        let mut x = w.begin_expert(plan.layer, e)?;
        for p in projections {
            let role = p.role.ok_or("expert projection without a role")?;
            x.projection(role, &p.spec, &mut p.source())?;
        }
        w = x.end_expert()?;
    }
    let t = Instant::now();
    let written = w.finish()?;
    Ok((written.path, t.elapsed()))
}

/// Every region through a fresh [`DualHasher`] in the writer's 4 MiB chunks; no I/O.
fn hash_only(layers: &[LayerPlan]) -> BenchResult<()> {
    let mut buf = vec![0u8; 4 << 20];
    for region in layers.iter().flat_map(LayerPlan::regions) {
        let mut hasher = DualHasher::new();
        let mut src = region.source();
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
        }
        std::hint::black_box(hasher.finish());
    }
    Ok(())
}

/// Every region written to one plain file in 4 MiB `write(2)` calls, then fsync; no hashing.
fn write_only(layers: &[LayerPlan], path: &Path) -> BenchResult<()> {
    let mut file = File::create(path)?;
    let mut buf = vec![0u8; 4 << 20];
    for region in layers.iter().flat_map(LayerPlan::regions) {
        let mut src = region.source();
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            file.write_all(&buf[..n])?;
        }
    }
    file.sync_all()?;
    Ok(())
}

/// Hex digests of the whole raw source file.
#[derive(Debug)]
struct Expected {
    sha256: String,
    blake3: String,
}

/// Write every region's bytes, concatenated in write order, to `path`; fsync it.
fn materialise(layers: &[LayerPlan], path: &Path) -> BenchResult<Expected> {
    let mut file = File::create(path)?;
    let mut hasher = DualHasher::new();
    let mut buf = vec![0u8; 4 << 20];
    for region in layers.iter().flat_map(LayerPlan::regions) {
        let mut src = region.source();
        loop {
            let n = src.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])?;
        }
    }
    file.sync_all()?;
    let h = hasher.finish();
    Ok(Expected {
        sha256: hex::encode(h.sha256),
        blake3: hex::encode(h.blake3),
    })
}

/// `b3sum` prints `HEX  PATH`; `openssl dgst` prints `SHA2-256(PATH)= HEX`.
fn check_digest(what: &str, out: &str, want: &str) -> BenchResult<()> {
    if out.split_whitespace().any(|w| w == want) {
        Ok(())
    } else {
        Err(format!("{what} printed {out:?}, expected digest {want}").into())
    }
}

// ---------------------------------------------------------------------------------------------
// Tools, machine, results.

/// Which external tools exist.
#[derive(Debug)]
struct Tools {
    cp: bool,
    sync: bool,
    b3sum: bool,
    openssl: bool,
}

impl Tools {
    fn probe() -> Tools {
        let has = |name: &str, arg: &str| {
            let ok = has_tool(name, arg);
            if !ok {
                println!("missing tool: {name} not found on PATH; its rows are skipped");
            }
            ok
        };
        Tools {
            cp: has("cp", "--version"),
            sync: has("sync", "--version"),
            b3sum: has("b3sum", "--version"),
            openssl: has("openssl", "version"),
        }
    }
}

/// One run's timings; `None` where a tool is missing.
#[derive(Debug, Default)]
struct RunSample {
    tarfa: Duration,
    tarfa_finish: Duration,
    direct: Duration,
    direct_finish: Duration,
    cp: Option<Duration>,
    fsync: Option<Duration>,
    b3sum: Option<Duration>,
    openssl: Option<Duration>,
    b3sum_1t: Option<Duration>,
    hash_only: Duration,
    write_only: Duration,
}

impl RunSample {
    fn cp_fsync(&self) -> Option<Duration> {
        Some(self.cp? + self.fsync?)
    }

    fn baseline(&self) -> Option<Duration> {
        Some(self.cp_fsync()? + self.b3sum? + self.openssl?)
    }
}

/// The median of per-run values (seconds); `None` if any run lacks the value.
fn median_all(values: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    values.collect::<Option<Vec<f64>>>().and_then(median)
}

#[derive(Debug)]
struct Row {
    step: &'static str,
    seconds: Option<f64>,
}

#[derive(Debug)]
struct Table {
    rows: Vec<Row>,
    /// Median over runs of tarfa / (cp + fsync + b3sum + openssl) in the same run.
    ratio: Option<f64>,
    /// The same for the O_DIRECT write.
    ratio_direct: Option<f64>,
    baseline: Option<f64>,
    bytes: u64,
}

impl Table {
    fn new(samples: &[RunSample], generator: Duration, bytes: u64) -> Table {
        let secs = |f: &dyn Fn(&RunSample) -> Option<Duration>| {
            median_all(samples.iter().map(|s| f(s).map(|d| d.as_secs_f64())))
        };
        let row = |step, seconds| Row { step, seconds };
        let baseline = secs(&|s| s.baseline());
        let rows = vec![
            row(
                "generator alone (in tarfa write)",
                Some(generator.as_secs_f64()),
            ),
            row("tarfa write (2 hashes + fsync)", secs(&|s| Some(s.tarfa))),
            row("  of which finish (fsync)", secs(&|s| Some(s.tarfa_finish))),
            row(
                "tarfa write, O_DIRECT (2 hashes + fsync)",
                secs(&|s| Some(s.direct)),
            ),
            row(
                "  of which finish (fsync)",
                secs(&|s| Some(s.direct_finish)),
            ),
            row("cp", secs(&|s| s.cp)),
            row("sync FILE (fsync)", secs(&|s| s.fsync)),
            row("cp + fsync", secs(&|s| s.cp_fsync())),
            row("b3sum", secs(&|s| s.b3sum)),
            row("openssl dgst -sha256", secs(&|s| s.openssl)),
            row("cp + fsync + b3sum + openssl", baseline),
            row("b3sum --num-threads 1 (context)", secs(&|s| s.b3sum_1t)),
            row(
                "generator + DualHasher, no I/O (context)",
                secs(&|s| Some(s.hash_only)),
            ),
            row(
                "generator + write(2) + fsync, no hash (context)",
                secs(&|s| Some(s.write_only)),
            ),
        ];
        let ratio = median_all(samples.iter().map(|s| {
            s.baseline()
                .map(|b| s.tarfa.as_secs_f64() / b.as_secs_f64())
        }));
        let ratio_direct = median_all(samples.iter().map(|s| {
            s.baseline()
                .map(|b| s.direct.as_secs_f64() / b.as_secs_f64())
        }));
        Table {
            rows,
            ratio,
            ratio_direct,
            baseline,
            bytes,
        }
    }

    fn gbps(&self, seconds: f64) -> f64 {
        self.bytes as f64 / seconds / 1e9
    }

    fn print(&self, tools: &Tools, runs: usize) {
        println!();
        let step = format!("step (median of {runs})");
        let mut table = kit::Table::new(&[
            (&step, Align::Left),
            ("seconds", Align::Right),
            ("GB/s", Align::Right),
        ]);
        for r in &self.rows {
            table.row(match r.seconds {
                Some(s) => vec![
                    r.step.to_string(),
                    format!("{s:.3}"),
                    format!("{:.2}", self.gbps(s)),
                ],
                None => vec![r.step.to_string(), "skipped".into(), String::new()],
            });
        }
        table.print();
        match self.ratio {
            Some(r) => println!(
                "\nratio tarfa / (cp + fsync + b3sum + openssl): {r:.3} (median of per-run ratios; \
                 below 1.0 means tarfa is faster)"
            ),
            None => println!(
                "\nratio: skipped (missing tools: cp {}, sync {}, b3sum {}, openssl {})",
                tools.cp, tools.sync, tools.b3sum, tools.openssl
            ),
        }
        if let Some(r) = self.ratio_direct {
            println!("ratio tarfa O_DIRECT / (cp + fsync + b3sum + openssl): {r:.3} (median of per-run ratios)");
        }
    }

    fn append_csv(&self, path: &Path, bytes: u64, runs: usize, m: &Machine) -> BenchResult<()> {
        let new = !path.exists();
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if new {
            writeln!(
                f,
                "unix_time,step,bytes,runs,median_s,gb_per_s,ratio_to_baseline,cores,cpu,fs"
            )?;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let cpu = m.cpu.replace(',', " ");
        for r in &self.rows {
            let (s, g, q) = match (r.seconds, self.baseline) {
                (Some(s), Some(b)) => (
                    format!("{s:.4}"),
                    format!("{:.3}", self.gbps(s)),
                    format!("{:.4}", s / b),
                ),
                (Some(s), None) => (
                    format!("{s:.4}"),
                    format!("{:.3}", self.gbps(s)),
                    String::new(),
                ),
                (None, _) => Default::default(),
            };
            let step = r.step.trim();
            writeln!(
                f,
                "{now},{step},{bytes},{runs},{s},{g},{q},{},{cpu},{}",
                m.cores, m.fs
            )?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Arguments.

#[derive(Debug)]
struct Args {
    runs: usize,
    dir: Option<PathBuf>,
    csv: Option<PathBuf>,
    gib: f64,
    warmup: usize,
}

impl Args {
    fn parse() -> BenchResult<Args> {
        let mut a = Args {
            runs: 3,
            dir: None,
            csv: None,
            gib: 2.0,
            warmup: 1,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
            match arg.as_str() {
                "--runs" => a.runs = value()?.parse()?,
                "--dir" => a.dir = Some(value()?.into()),
                "--csv" => a.csv = Some(value()?.into()),
                "--gib" => a.gib = value()?.parse()?,
                "--warmup" => a.warmup = value()?.parse()?,
                // `cargo bench` passes --bench to every harness = false target.
                "--bench" => {}
                "-h" | "--help" => {
                    println!("write_throughput [--runs N] [--warmup N] [--dir DIR] [--csv PATH] [--gib G]");
                    std::process::exit(0);
                }
                other => return Err(format!("unknown argument {other:?}; try --help").into()),
            }
        }
        if a.runs == 0 {
            return Err("--runs must be at least 1".into());
        }
        Ok(a)
    }
}
