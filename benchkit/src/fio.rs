//! fio's random read of a model's files: the storage baseline that `tarfa bench-io` and
//! `tarfa bench-decode` put beside their own figures (the same files, block size and queue depth,
//! through io_uring with `O_DIRECT` and fixed buffers, as tarfa's fastest reader).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// Why a fio run gave no figure.
#[derive(Debug, thiserror::Error)]
pub enum FioError {
    /// fio could not be started.
    #[error("running fio")]
    Start(#[source] std::io::Error),
    /// fio ran and failed; what it printed on stderr.
    #[error("fio failed: {0}")]
    Failed(String),
    /// fio's output is not JSON.
    #[error("parsing fio's JSON")]
    Json(#[source] serde_json::Error),
    /// fio's JSON has no read bandwidth.
    #[error("fio's JSON has no jobs[0].read.bw_bytes")]
    NoBandwidth,
}

/// Whether fio runs here.
pub fn has_fio() -> bool {
    crate::has_tool("fio", "--version")
}

/// fio random read of `files` (as one job, offsets 4096-aligned), `bytes` in all, `block` bytes
/// at queue depth `qd`, ended once `limit` has passed (fio's `--runtime`): its GB/s.
pub fn randread_gb_per_s(
    files: &[PathBuf],
    block: usize,
    qd: u32,
    bytes: u64,
    limit: Option<Duration>,
) -> Result<f64, FioError> {
    // fio separates file names with ':'; one inside a name is escaped.
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
        .args(limit.map(|l| format!("--runtime={}ms", l.as_millis().max(1))))
        .output()
        .map_err(FioError::Start)?;
    if !out.status.success() {
        return Err(FioError::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    // fio may print notes before the JSON object.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = text.find('{').map(|i| &text[i..]).unwrap_or(&text);
    let v: serde_json::Value = serde_json::from_str(json).map_err(FioError::Json)?;
    let bw = v["jobs"][0]["read"]["bw_bytes"]
        .as_f64()
        .ok_or(FioError::NoBandwidth)?;
    Ok(bw / 1e9)
}
