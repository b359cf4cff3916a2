//! llama.cpp's own figures beside tarfa's: the JSON `llama-bench -o json` writes, read for
//! `tarfa bench-decode --peer FILE`, so anyone can rerun the comparison of BENCHMARKS.md.
//!
//! A llama-bench row is one test: `n_prompt` tokens of prompt processing (`pp512`: `n_gen` 0) or
//! `n_gen` tokens of generation (`tg32`: `n_prompt` 0), its mean rate `avg_ts` in tokens/s, and
//! where it ran (`backends`, `n_gpu_layers`). A row ran on the GPU when its backends name one and
//! it offloaded layers (`-ngl` above 0); it is then the peer of bench-decode's GPU modes, else of
//! its CPU modes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The largest peer file read: llama-bench writes a few KiB per test.
const MAX_BYTES: u64 = 16 << 20;

/// One llama-bench test.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    /// Prompt tokens (0 for a generation test).
    pub n_prompt: u64,
    /// Generated tokens (0 for a prompt test).
    pub n_gen: u64,
    /// Mean tokens/s.
    pub avg_ts: f64,
    /// Whether it ran on a GPU.
    pub gpu: bool,
    /// llama-bench's `backends`, `model_type` and `n_threads`, for the report.
    pub backends: String,
    /// The model as llama-bench names it.
    pub model_type: String,
    /// CPU threads.
    pub n_threads: u64,
}

/// A peer file's tests.
#[derive(Clone, Debug)]
pub struct Peer {
    /// Where they were read from.
    pub file: PathBuf,
    /// Its tests.
    pub rows: Vec<PeerRow>,
}

impl Peer {
    /// Read `path`: a JSON list of llama-bench tests (at most 16 MiB). A test without
    /// `n_prompt`, `n_gen` or a finite positive `avg_ts` is an error naming it.
    pub fn load(path: &Path) -> anyhow::Result<Peer> {
        // A regular file of at most 16 MiB (not a FIFO, a device or a directory).
        let bytes = tarfa_format::fsio::read_regular(path, MAX_BYTES)
            .with_context(|| format!("--peer {}", path.display()))?;
        let rows = parse(&bytes).with_context(|| {
            format!(
                "--peer {}: not the JSON of `llama-bench -o json`",
                path.display()
            )
        })?;
        Ok(Peer {
            file: path.to_path_buf(),
            rows,
        })
    }

    /// The prompt test of `n` tokens that ran on the GPU (`gpu`) or the CPU.
    pub fn prompt(&self, gpu: bool, n: u64) -> Option<&PeerRow> {
        self.rows
            .iter()
            .find(|r| r.gpu == gpu && r.n_prompt == n && r.n_gen == 0)
    }

    /// The generation test of `n` tokens that ran on the GPU (`gpu`) or the CPU.
    pub fn decode(&self, gpu: bool, n: u64) -> Option<&PeerRow> {
        self.rows
            .iter()
            .find(|r| r.gpu == gpu && r.n_gen == n && r.n_prompt == 0)
    }

    /// Its tests in llama-bench's names (`pp512 (CUDA)`, `tg32 (CPU)`), for an error.
    pub fn tests(&self) -> String {
        self.rows
            .iter()
            .map(|r| {
                let t = if r.n_gen == 0 {
                    format!("pp{}", r.n_prompt)
                } else if r.n_prompt == 0 {
                    format!("tg{}", r.n_gen)
                } else {
                    format!("pp{}+tg{}", r.n_prompt, r.n_gen)
                };
                format!("{t} ({})", if r.gpu { "GPU" } else { "CPU" })
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// llama-bench's JSON: a list of tests.
pub fn parse(bytes: &[u8]) -> anyhow::Result<Vec<PeerRow>> {
    let v: serde_json::Value = serde_json::from_slice(bytes).context("invalid JSON")?;
    let Some(list) = v.as_array() else {
        bail!("not a list of tests");
    };
    if list.is_empty() {
        bail!("no tests in it");
    }
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let uint = |k: &str| -> anyhow::Result<u64> {
                t.get(k)
                    .and_then(serde_json::Value::as_u64)
                    .with_context(|| format!("test {i}: no {k}"))
            };
            let text = |k: &str| -> String {
                t.get(k)
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let avg_ts = t
                .get("avg_ts")
                .and_then(serde_json::Value::as_f64)
                .filter(|x| x.is_finite() && *x > 0.0)
                .with_context(|| format!("test {i}: no positive avg_ts"))?;
            let backends = text("backends");
            let offloaded = t
                .get("n_gpu_layers")
                .and_then(serde_json::Value::as_i64)
                .unwrap_or(0)
                > 0;
            let on_gpu = backends.split(',').any(|b| {
                let b = b.trim();
                !b.is_empty() && !b.eq_ignore_ascii_case("CPU") && !b.eq_ignore_ascii_case("BLAS")
            });
            Ok(PeerRow {
                n_prompt: uint("n_prompt")?,
                n_gen: uint("n_gen")?,
                avg_ts,
                gpu: on_gpu && offloaded,
                backends,
                model_type: text("model_type"),
                n_threads: t
                    .get("n_threads")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Peer {
        Peer::load(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/peer")
                .join(name),
        )
        .expect("load")
    }

    #[test]
    fn llama_benchs_own_files_are_read_on_their_device() {
        let cpu = fixture("llama-bench-cpu.json");
        assert_eq!(cpu.prompt(false, 8).map(|r| r.avg_ts), Some(215.419218));
        assert_eq!(cpu.decode(false, 32).map(|r| r.avg_ts), Some(61.799471));
        assert_eq!(cpu.decode(true, 32), None);
        assert_eq!(cpu.prompt(false, 512), None);
        assert_eq!(cpu.tests(), "pp8 (CPU), tg32 (CPU)");
        let cuda = fixture("llama-bench-cuda.json");
        assert_eq!(cuda.prompt(true, 8).map(|r| r.avg_ts), Some(3380.313667));
        assert_eq!(cuda.decode(true, 32).map(|r| r.avg_ts), Some(888.616926));
        assert_eq!(cuda.decode(false, 32), None);
        assert_eq!(cuda.rows[0].backends, "CUDA");
    }

    #[test]
    fn what_is_not_llama_benchs_json_is_refused_by_name() {
        for (text, why) in [
            ("", "invalid JSON"),
            ("{}", "not a list"),
            ("[]", "no tests"),
            ("[{\"n_prompt\": 8, \"avg_ts\": 1.0}]", "test 0: no n_gen"),
            (
                "[{\"n_prompt\": 8, \"n_gen\": 0, \"avg_ts\": 0}]",
                "no positive avg_ts",
            ),
            (
                "[{\"n_prompt\": -1, \"n_gen\": 0, \"avg_ts\": 1}]",
                "no n_prompt",
            ),
        ] {
            let e = parse(text.as_bytes()).expect_err(text);
            assert!(format!("{e:#}").contains(why), "{text}: {e:#}");
        }
        // A CUDA build that offloaded nothing ran on the CPU.
        let rows = parse(br#"[{"n_prompt": 0, "n_gen": 32, "avg_ts": 5, "backends": "CUDA", "n_gpu_layers": 0}]"#)
            .expect("rows");
        assert!(!rows[0].gpu);
    }
}
