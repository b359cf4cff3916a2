//! Generated Hugging Face checkpoints for tests and benchmarks: Qwen3-MoE-shaped, per-expert or
//! fused, single-file or sharded, optionally with an MTP layer. Written as real safetensors files
//! (8-byte length, JSON header padded to 8, contiguous data), streamed, so a multi-GiB checkpoint
//! never sits in memory. Tensor bytes are deterministic (splitmix64 keyed by the tensor name).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

/// Shape of a generated checkpoint.
#[derive(Clone, Copy, Debug)]
pub struct SynthSpec {
    /// Transformer layers (`num_hidden_layers`).
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Hidden size.
    pub hidden: u64,
    /// Expert intermediate size.
    pub inter: u64,
    /// Vocabulary.
    pub vocab: u64,
    /// Fused 3-D expert tensors (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) instead of
    /// per-expert ones.
    pub fused: bool,
    /// Number of shards (1: a single `model.safetensors`).
    pub shards: u32,
    /// Add one MTP layer, `model.layers.{layers}.*`, with its own experts.
    pub mtp: bool,
}

impl SynthSpec {
    /// A small checkpoint for tests.
    pub fn small() -> SynthSpec {
        SynthSpec {
            layers: 3,
            experts: 4,
            hidden: 64,
            inter: 32,
            vocab: 96,
            fused: false,
            shards: 1,
            mtp: false,
        }
    }

    /// The cold-cache benchmarks' checkpoint (`convert`, `verify`): Qwen3-MoE-shaped (hidden
    /// 2048, expert intermediate 768, 128 experts per layer stored per expert), 3 layers,
    /// vocabulary 65,536, 4 shards; about 4 GiB.
    pub fn qwen3_moe_bench() -> SynthSpec {
        SynthSpec {
            layers: 3,
            experts: 128,
            hidden: 2048,
            inter: 768,
            vocab: 65_536,
            fused: false,
            shards: 4,
            mtp: false,
        }
    }

    /// Total layers written, MTP included.
    pub fn total_layers(&self) -> u32 {
        self.layers + u32::from(self.mtp)
    }

    /// Every tensor, in write order: (name, shape). BF16 throughout.
    pub fn tensors(&self) -> Vec<(String, Vec<u64>)> {
        let (h, i, e) = (self.hidden, self.inter, u64::from(self.experts));
        let mut t = vec![("model.embed_tokens.weight".to_string(), vec![self.vocab, h])];
        for l in 0..self.total_layers() {
            let p = format!("model.layers.{l}");
            if self.mtp && l == self.layers {
                t.push((format!("{p}.eh_proj.weight"), vec![h, 2 * h]));
                t.push((format!("{p}.enorm.weight"), vec![h]));
                t.push((format!("{p}.hnorm.weight"), vec![h]));
                t.push((format!("{p}.shared_head.norm.weight"), vec![h]));
            }
            t.push((format!("{p}.input_layernorm.weight"), vec![h]));
            t.push((format!("{p}.self_attn.q_proj.weight"), vec![h, h]));
            t.push((format!("{p}.self_attn.k_proj.weight"), vec![h / 2, h]));
            t.push((format!("{p}.self_attn.v_proj.weight"), vec![h / 2, h]));
            t.push((format!("{p}.self_attn.o_proj.weight"), vec![h, h]));
            t.push((format!("{p}.self_attn.q_norm.weight"), vec![16]));
            t.push((format!("{p}.self_attn.k_norm.weight"), vec![16]));
            t.push((format!("{p}.post_attention_layernorm.weight"), vec![h]));
            t.push((format!("{p}.mlp.gate.weight"), vec![e, h]));
            if self.fused {
                t.push((format!("{p}.mlp.experts.gate_up_proj"), vec![e, 2 * i, h]));
                t.push((format!("{p}.mlp.experts.down_proj"), vec![e, h, i]));
            } else {
                for x in 0..self.experts {
                    t.push((format!("{p}.mlp.experts.{x}.gate_proj.weight"), vec![i, h]));
                    t.push((format!("{p}.mlp.experts.{x}.up_proj.weight"), vec![i, h]));
                    t.push((format!("{p}.mlp.experts.{x}.down_proj.weight"), vec![h, i]));
                }
            }
        }
        t.push(("model.norm.weight".to_string(), vec![h]));
        t.push(("lm_head.weight".to_string(), vec![self.vocab, h]));
        t
    }

    /// Bytes of tensor data.
    pub fn data_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|(_, s)| s.iter().product::<u64>() * 2)
            .sum()
    }
}

/// Deterministic tensor bytes: splitmix64 keyed by the name, written in 8-byte words.
pub fn fill(name: &str, buf: &mut [u8], word_offset: u64) {
    let mut s = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        .wrapping_add(word_offset.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    for chunk in buf.chunks_mut(8) {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Clear each BF16's top exponent bit: finite values, no NaN or Inf.
        z &= 0xBFFF_BFFF_BFFF_BFFF;
        chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
    }
}

fn write_shard(path: &Path, tensors: &[(String, Vec<u64>)]) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut at = 0u64;
    for (name, shape) in tensors {
        let n = shape.iter().product::<u64>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + n]}),
        );
        at += n;
    }
    let mut json = serde_json::to_vec(&header)?;
    while json.len() % 8 != 0 {
        json.push(b' ');
    }
    let mut w = BufWriter::with_capacity(8 << 20, File::create(path)?);
    w.write_all(&(json.len() as u64).to_le_bytes())?;
    w.write_all(&json)?;
    let mut buf = vec![0u8; 8 << 20];
    for (name, shape) in tensors {
        let mut left = shape.iter().product::<u64>() * 2;
        let mut word = 0u64;
        while left > 0 {
            let k = left.min(buf.len() as u64) as usize;
            fill(name, &mut buf[..k], word);
            w.write_all(&buf[..k])?;
            word += k as u64 / 8;
            left -= k as u64;
        }
    }
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// Write the checkpoint into `dir` (created): shards, index (if sharded), `config.json`.
pub fn write_checkpoint(dir: &Path, spec: &SynthSpec) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tensors = spec.tensors();
    let shards = spec.shards.max(1) as usize;
    let total = spec.data_bytes();
    // Cut the write order into `shards` runs of about equal bytes.
    let mut runs: Vec<Vec<(String, Vec<u64>)>> = vec![Vec::new(); shards];
    let mut acc = 0u64;
    for t in tensors {
        let k = ((acc * shards as u64) / total.max(1)).min(shards as u64 - 1) as usize;
        acc += t.1.iter().product::<u64>() * 2;
        runs[k].push(t);
    }
    let mut weight_map = serde_json::Map::new();
    for (k, run) in runs.iter().enumerate() {
        let name = if shards == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{:05}.safetensors", k + 1, shards)
        };
        write_shard(&dir.join(&name), run)?;
        for (t, _) in run {
            weight_map.insert(t.clone(), serde_json::Value::String(name.clone()));
        }
    }
    if shards > 1 {
        let index =
            serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            serde_json::to_vec_pretty(&index)?,
        )?;
    }
    let config = serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": spec.hidden,
        "moe_intermediate_size": spec.inter,
        "num_hidden_layers": spec.layers,
        "num_experts": spec.experts,
        "num_experts_per_tok": spec.experts.min(8),
        "num_nextn_predict_layers": u32::from(spec.mtp),
        "vocab_size": spec.vocab,
        "torch_dtype": "bfloat16",
    });
    std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// Tests that hold a run to a memory bound: the test binary re-runs itself as a child under
/// `ulimit -v` (its ignored test `child_entry`, told its case by environment variables), and the
/// child prints its peak RSS ([`report_peak_rss`]) for the parent to read ([`run_bounded_child`]).
pub mod bounded {
    use std::ffi::OsStr;
    use std::process::Command;
    use std::time::{Duration, Instant};

    /// This process's peak resident set (`VmHWM`), KiB.
    pub fn peak_rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }

    /// In the child: print the peak RSS line the parent reads.
    pub fn report_peak_rss() {
        println!("peak_rss_kib={}", peak_rss_kib());
    }

    /// What a child printed and how long it ran.
    #[derive(Debug)]
    pub struct ChildRun {
        /// Its peak RSS, KiB.
        pub peak_kib: u64,
        /// Its stdout and stderr.
        pub text: String,
        /// Wall time.
        pub elapsed: Duration,
    }

    /// Run this test binary's `child_entry` under `ulimit -v vmem_kib` with `env`; panics unless
    /// it succeeds and reports its peak RSS.
    pub fn run_bounded_child(vmem_kib: u64, env: &[(&str, &OsStr)]) -> ChildRun {
        let exe = std::env::current_exe().expect("exe");
        let t0 = Instant::now();
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "ulimit -v {vmem_kib} && exec \"$0\" --exact child_entry --ignored --nocapture --test-threads 1"
            ))
            .arg(&exe);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("spawn");
        let elapsed = t0.elapsed();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "child failed ({:?}):\n{text}",
            out.status
        );
        let peak_kib = text
            .lines()
            .find_map(|l| l.split("peak_rss_kib=").nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no peak in:\n{text}"));
        ChildRun {
            peak_kib,
            text,
            elapsed,
        }
    }
}
