//! A generated input checkpoint kept between benchmark runs: made once (not timed), marked
//! complete, and reused while its marker and sizes still match.

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::{free_bytes, remove_dir_if_present, BenchResult};

/// Written into the checkpoint directory after generation; names the shape it was made with.
pub const MARKER: &str = "BENCH-CHECKPOINT-COMPLETE";

/// A generated safetensors checkpoint of `shards` files holding `data_bytes` tensor bytes.
#[derive(Debug)]
pub struct GeneratedCheckpoint<'a> {
    /// Its directory.
    pub dir: &'a Path,
    /// The marker's text: the shape it is made with ([`marker_text`]).
    pub marker: String,
    /// Number of `*.safetensors` files.
    pub shards: usize,
    /// Tensor bytes over all shards (headers not counted).
    pub data_bytes: u64,
}

/// The marker of a checkpoint of `shape` holding `data_bytes` tensor bytes.
pub fn marker_text(shape: &impl Debug, data_bytes: u64) -> String {
    format!("{shape:?} data_bytes={data_bytes}\n")
}

impl GeneratedCheckpoint<'_> {
    /// Whether the directory holds a complete checkpoint: its marker matches, and its shards hold
    /// the tensor bytes plus headers (less than 1 MiB of them).
    pub fn is_complete(&self) -> BenchResult<bool> {
        match std::fs::read_to_string(self.dir.join(MARKER)) {
            Ok(m) if m == self.marker => {}
            _ => return Ok(false),
        }
        let shards = files(self.dir, |p| {
            p.extension().is_some_and(|x| x == "safetensors")
        })?;
        if shards.len() != self.shards {
            return Ok(false);
        }
        let mut total = 0u64;
        for p in &shards {
            total += std::fs::metadata(p)?.len();
        }
        Ok(total > self.data_bytes && total < self.data_bytes + (1 << 20))
    }

    /// Make sure there is room for the checkpoint (unless it is already complete) plus `room_after`
    /// bytes of outputs under its parent, then reuse it or make it afresh with `generate` (not
    /// timed) and mark it complete. Progress goes to stderr.
    pub fn prepare(
        &self,
        room_after: u64,
        generate: impl FnOnce(&Path) -> BenchResult<()>,
    ) -> BenchResult<()> {
        let (src, data) = (self.dir, self.data_bytes);
        let have_src = self.is_complete()?;
        let need = room_after + if have_src { 0 } else { data };
        let parent = src.parent().ok_or("source directory has no parent")?;
        let avail = free_bytes(parent)?;
        if avail < need {
            return Err(format!(
                "not enough free space under {}: {avail} bytes free, {need} needed",
                parent.display()
            )
            .into());
        }
        if have_src {
            eprintln!("reusing the source checkpoint {}", src.display());
        } else {
            remove_dir_if_present(src)?;
            eprintln!(
                "generating the source checkpoint {} ({data} bytes, not timed)...",
                src.display()
            );
            let t = Instant::now();
            generate(src)?;
            std::fs::write(src.join(MARKER), &self.marker)?;
            eprintln!("  generated in {:.1}s", t.elapsed().as_secs_f64());
        }
        Ok(())
    }
}

/// The plain files of a directory that `keep` accepts, sorted (what `DIR/*` expands to).
pub fn files(dir: &Path, keep: impl Fn(&Path) -> bool) -> BenchResult<Vec<PathBuf>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_file() && keep(&p) {
            v.push(p);
        }
    }
    v.sort();
    Ok(v)
}
