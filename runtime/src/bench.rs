//! Decode-shaped read workloads for `tarfa bench-io`: for each token, `top_k` distinct experts
//! of every layer, drawn at random (a fixed seed, so runs compare), all asked for at once.

use std::time::{Duration, Instant};

use crate::cuda::DeviceSink;
use crate::error::StreamError;
use crate::model::ModelExperts;
use crate::source::ExpertSource;

/// The expert sets of `tokens` tokens: per token, `top_k` distinct experts of every layer
/// (fewer where a layer has fewer), random with `seed`.
pub fn decode_sets(
    model: &ModelExperts,
    top_k: u32,
    tokens: usize,
    seed: u64,
) -> Vec<Vec<(u32, u32)>> {
    let mut rng = SplitMix64(seed);
    (0..tokens)
        .map(|_| {
            let mut set = Vec::new();
            for (layer, n) in model.layers() {
                // Partial Fisher-Yates: the first k of a shuffled 0..n.
                let mut ids: Vec<u32> = (0..n).collect();
                let k = top_k.min(n) as usize;
                for i in 0..k {
                    let j = i + (rng.next() % (ids.len() - i) as u64) as usize;
                    ids.swap(i, j);
                }
                set.extend(ids[..k].iter().map(|&e| (layer, e)));
            }
            set
        })
        .collect()
}

/// What one timed run read.
#[derive(Clone, Copy, Debug)]
pub struct RunFigures {
    /// Experts read.
    pub experts: u64,
    /// Bytes read (whole extents).
    pub bytes: u64,
    /// Wall time from the first request to the last expert handed out (each one checked, when
    /// the source checks).
    pub elapsed: Duration,
}

impl RunFigures {
    /// Decimal gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Stream every set in turn through `src`, dropping each expert once it lands (as a decoder
/// would after using it).
pub fn stream_sets(
    src: &mut ExpertSource,
    sets: &[Vec<(u32, u32)>],
) -> Result<RunFigures, StreamError> {
    let t0 = Instant::now();
    let (mut experts, mut bytes) = (0u64, 0u64);
    for set in sets {
        for x in src.prefetch(set)? {
            let x = x?;
            experts += 1;
            bytes += x.bytes().len() as u64;
        }
    }
    Ok(RunFigures {
        experts,
        bytes,
        elapsed: t0.elapsed(),
    })
}

/// As [`stream_sets`], but each expert, once landed and checked, is copied on to the GPU by
/// `sink` (its slot held until the copy completes); the time runs until the last copy is done.
pub fn stream_sets_to_gpu(
    src: &mut ExpertSource,
    sets: &[Vec<(u32, u32)>],
    sink: &mut DeviceSink,
) -> Result<RunFigures, StreamError> {
    let t0 = Instant::now();
    let (mut experts, mut bytes) = (0u64, 0u64);
    for set in sets {
        for x in src.prefetch(set)? {
            let x = x?;
            experts += 1;
            bytes += x.bytes().len() as u64;
            sink.copy_expert(x)?;
        }
    }
    sink.finish()?;
    Ok(RunFigures {
        experts,
        bytes,
        elapsed: t0.elapsed(),
    })
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
