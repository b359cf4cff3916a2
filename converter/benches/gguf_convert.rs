//! GGUF to JNF conversion from a cold page cache, against a cold `cat` of the same GGUF; medians.
//!
//! ```text
//! cargo bench -p tarfa-converter --bench gguf_convert -- [--runs 3] [--dir DIR] [--keep]
//! ```
//!
//! The source is a generated GLM-4.5-Air-shaped MoE GGUF: hidden 2048, expert intermediate 768,
//! 64 experts per layer stacked as `blk.N.ffn_{gate,up,down}_exps.weight` in Q8_0, attention in
//! Q8_0, norms and router in F32, 9 layers, a Q8_0 vocabulary of 32,768 for `token_embd` and
//! `output`: about 3 GiB. It is streamed through [`tarfa_gguf::GgufWriter`] from a xorshift
//! generator (random block bytes: the converter never interprets them), once, under `--dir`
//! (default `target/bench-gguf`), and reused while its size matches. Every run:
//!
//! 1. drop caches, time `cat model.gguf > /dev/null`;
//! 2. delete the previous output, drop caches, time `tarfa_converter::convert` in this process
//!    (`direct_io: true`).
//!
//! After the runs (not timed) the output is checked: every region's provenance against the GGUF's
//! own tensor table (expert `e` of a stack at `expert_range(e)`), and the strict reader plus
//! `verify_data` on one layer file and the trunk. Dropping caches needs root (`sync; echo 3 >
//! /proc/sys/vm/drop_caches`); without it the figures are warm-cache and the output says so.
//!
//! Data goes to stdout, progress to stderr.

use std::error::Error;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use tarfa_converter::{convert, Options, Quiet};
use tarfa_format::{Dtype, JnfReader};
use tarfa_gguf::{expert_range, GgufFile, GgufWriter, Value};

type BenchResult<T> = Result<T, Box<dyn Error>>;

const HIDDEN: u64 = 2048;
const FF: u64 = 768;
const EXPERTS: u64 = 64;
const LAYERS: u64 = 9;
const VOCAB: u64 = 32_768;

/// The model's tensors: name, type and GGUF `ne` (innermost first).
fn tensors() -> Vec<(String, Dtype, Vec<u64>)> {
    let mut t = vec![(
        "token_embd.weight".to_string(),
        Dtype::Q8_0,
        vec![HIDDEN, VOCAB],
    )];
    for l in 0..LAYERS {
        let b = |n: &str| format!("blk.{l}.{n}");
        t.push((b("attn_norm.weight"), Dtype::F32, vec![HIDDEN]));
        for p in ["attn_q", "attn_k", "attn_v", "attn_output"] {
            t.push((b(&format!("{p}.weight")), Dtype::Q8_0, vec![HIDDEN, HIDDEN]));
        }
        t.push((b("ffn_norm.weight"), Dtype::F32, vec![HIDDEN]));
        t.push((b("ffn_gate_inp.weight"), Dtype::F32, vec![HIDDEN, EXPERTS]));
        t.push((b("exp_probs_b.bias"), Dtype::F32, vec![EXPERTS]));
        t.push((
            b("ffn_gate_exps.weight"),
            Dtype::Q8_0,
            vec![HIDDEN, FF, EXPERTS],
        ));
        t.push((
            b("ffn_up_exps.weight"),
            Dtype::Q8_0,
            vec![HIDDEN, FF, EXPERTS],
        ));
        t.push((
            b("ffn_down_exps.weight"),
            Dtype::Q8_0,
            vec![FF, HIDDEN, EXPERTS],
        ));
    }
    t.push(("output_norm.weight".into(), Dtype::F32, vec![HIDDEN]));
    t.push(("output.weight".into(), Dtype::Q8_0, vec![HIDDEN, VOCAB]));
    t
}

/// Endless pseudo-random bytes (xorshift64*): fast enough that generation is disk-bound.
struct RandomBytes(u64);

impl Read for RandomBytes {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        for chunk in buf.chunks_mut(8) {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let x = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
        Ok(buf.len())
    }
}

fn writer() -> GgufWriter {
    let mut w = GgufWriter::new(32);
    w.add_kv("general.architecture", Value::String("glm4moe".into()));
    w.add_kv("glm4moe.block_count", Value::U32(LAYERS as u32));
    w.add_kv("glm4moe.expert_count", Value::U32(EXPERTS as u32));
    for (name, dtype, ne) in tensors() {
        w.add_tensor(name, dtype, ne);
    }
    w
}

/// Generate the GGUF unless a complete one (by length) is already there.
fn generate(path: &Path) -> BenchResult<u64> {
    let w = writer();
    let (_, header) = w.header()?;
    if std::fs::metadata(path).is_ok_and(|m| m.len() == header.file_len) {
        eprintln!("reusing {}", path.display());
        return Ok(header.file_len);
    }
    eprintln!(
        "generating {} ({:.2} GiB)",
        path.display(),
        header.file_len as f64 / (1u64 << 30) as f64
    );
    let readers: Vec<Box<dyn Read>> = header
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Box::new(RandomBytes(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1)).take(t.byte_len))
                as Box<dyn Read>
        })
        .collect();
    w.write_file(path, readers)?;
    Ok(header.file_len)
}

fn drop_caches() -> bool {
    let synced = Command::new("sync").status().is_ok_and(|s| s.success());
    match std::fs::write("/proc/sys/vm/drop_caches", "3") {
        Ok(()) => synced,
        Err(e) => {
            eprintln!(
                "!!!!!!!! WARNING: cannot drop caches ({e}); figures are WARM-CACHE !!!!!!!!"
            );
            false
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Every region of the output names a GGUF tensor and the exact bytes of it (or of one expert).
fn check_output(gguf: &Path, out: &Path) -> BenchResult<()> {
    let g = GgufFile::open(gguf)?;
    let mut regions = 0usize;
    let mut files: Vec<PathBuf> = std::fs::read_dir(out)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "jnf"))
        .collect();
    files.sort();
    for f in &files {
        let r = JnfReader::open(f)?;
        let idx = r.index();
        for rec in r.regions() {
            let name = idx.str(rec.name);
            let t = g
                .header()
                .tensor(idx.str(rec.src_tensor))
                .ok_or_else(|| format!("{name}: no such GGUF tensor"))?;
            let want = match name.strip_suffix(']').and_then(|n| n.rsplit_once('[')) {
                Some((_, e)) => expert_range(t, e.parse()?)?,
                None => t.data_range(),
            };
            if (rec.src_begin..rec.src_end) != want {
                return Err(format!(
                    "{name}: provenance {}..{} is not {want:?}",
                    rec.src_begin, rec.src_end
                )
                .into());
            }
            regions += 1;
        }
    }
    let want: usize = g
        .header()
        .tensors
        .iter()
        .map(|t| {
            if t.name.contains("_exps.") {
                EXPERTS as usize
            } else {
                1
            }
        })
        .sum();
    if regions != want {
        return Err(format!("{regions} regions written, {want} expected").into());
    }
    for f in ["trunk.jnf", "layer-00004.jnf"] {
        JnfReader::open(out.join(f))?.verify_data()?;
    }
    eprintln!(
        "checked: {regions} regions' provenance, every byte of trunk.jnf and layer-00004.jnf"
    );
    Ok(())
}

fn main() -> BenchResult<()> {
    let mut runs = 3usize;
    let mut dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-gguf");
    let mut keep = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().ok_or("--runs N")?.parse()?,
            "--dir" => dir = args.next().ok_or("--dir DIR")?.into(),
            "--keep" => keep = true,
            "--bench" => {}
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    std::fs::create_dir_all(&dir)?;
    let gguf = dir.join("model.gguf");
    let out = dir.join("out");
    let bytes = generate(&gguf)?;
    let (mut cat_s, mut conv_s) = (Vec::new(), Vec::new());
    let mut cold = true;
    for run in 1..=runs {
        cold &= drop_caches();
        let t = Instant::now();
        let st = Command::new("cat")
            .arg(&gguf)
            .stdout(Stdio::null())
            .status()?;
        if !st.success() {
            return Err("cat failed".into());
        }
        cat_s.push(t.elapsed().as_secs_f64());
        if out.exists() {
            std::fs::remove_dir_all(&out)?;
        }
        cold &= drop_caches();
        let t = Instant::now();
        let s = convert(
            &gguf,
            &out,
            &Options {
                layers: None,
                direct_io: true,
                ..Options::default()
            },
            &Quiet,
        )?;
        conv_s.push(t.elapsed().as_secs_f64());
        eprintln!(
            "run {run}: cat {:.2} s, convert {:.2} s ({} layers, {} experts, direct {})",
            cat_s[run - 1],
            conv_s[run - 1],
            s.layers_written.len(),
            s.experts_written,
            s.direct_io
        );
    }
    check_output(&gguf, &out)?;
    let (cat, conv) = (median(cat_s.clone()), median(conv_s.clone()));
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    println!(
        "GGUF {:.2} GiB ({bytes} bytes), {runs} runs, {} cache",
        bytes as f64 / (1u64 << 30) as f64,
        if cold { "cold" } else { "WARM" }
    );
    println!("cat runs (s): {cat_s:.2?}");
    println!("convert runs (s): {conv_s:.2?}");
    println!("| what | median s | GB/s |");
    println!("| --- | ---: | ---: |");
    println!(
        "| `cat model.gguf > /dev/null` | {cat:.2} | {:.2} |",
        gbs(cat)
    );
    println!(
        "| `tarfa convert model.gguf` (O_DIRECT) | {conv:.2} | {:.2} |",
        gbs(conv)
    );
    println!(
        "conversion / cat: {:.2}x the time ({:.0}% of cat's throughput)",
        conv / cat,
        100.0 * cat / conv
    );
    std::fs::remove_dir_all(&out)?;
    if !keep {
        std::fs::remove_file(&gguf)?;
    }
    Ok(())
}
