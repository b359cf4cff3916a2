//! Decode-shaped read workloads for `tarfa bench-io`: for each token, `top_k` distinct experts
//! of every layer, drawn at random (a fixed seed, so runs compare), all asked for at once; a
//! run may be held to a time budget.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::error::StreamError;
use crate::model::ModelExperts;
use crate::source::ExpertSource;
use crate::DeviceSink;

/// The expert sets of a decode run: per token, `top_k` distinct experts of every layer (fewer
/// where a layer has fewer), random with `seed`. Made one token at a time, so a run of any
/// length holds one set in memory, and every pass over it yields the same sets.
#[derive(Clone, Debug)]
pub struct DecodeSets {
    layers: Vec<(u32, u32)>,
    top_k: u32,
    tokens: u64,
    seed: u64,
}

/// The sets of `tokens` tokens, all in memory: [`DecodeSets::new`]'s, collected.
pub fn decode_sets(
    model: &ModelExperts,
    top_k: u32,
    tokens: usize,
    seed: u64,
) -> Vec<Vec<(u32, u32)>> {
    DecodeSets::new(model, top_k, tokens as u64, seed)
        .iter()
        .collect()
}

impl DecodeSets {
    /// The sets of `tokens` tokens of `model`.
    pub fn new(model: &ModelExperts, top_k: u32, tokens: u64, seed: u64) -> DecodeSets {
        DecodeSets {
            layers: model.layers().collect(),
            top_k,
            tokens,
            seed,
        }
    }

    /// Tokens in the run.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Experts asked for per token.
    pub fn set_len(&self) -> usize {
        self.layers
            .iter()
            .map(|&(_, n)| self.top_k.min(n) as usize)
            .sum()
    }

    /// The sets, token by token.
    pub fn iter(&self) -> impl Iterator<Item = Vec<(u32, u32)>> + '_ {
        let mut rng = SplitMix64(self.seed);
        (0..self.tokens).map(move |_| {
            let mut set = Vec::with_capacity(self.set_len());
            for &(layer, n) in &self.layers {
                // Partial Fisher-Yates: the first k of a shuffled 0..n.
                let mut ids: Vec<u32> = (0..n).collect();
                let k = self.top_k.min(n) as usize;
                for i in 0..k {
                    let j = i + (rng.next() % (ids.len() - i) as u64) as usize;
                    ids.swap(i, j);
                }
                set.extend(ids[..k].iter().map(|&e| (layer, e)));
            }
            set
        })
    }
}

/// What one timed run read.
#[derive(Clone, Copy, Debug)]
pub struct RunFigures {
    /// Tokens streamed (fewer than asked when the time budget ran out).
    pub tokens: u64,
    /// Experts read.
    pub experts: u64,
    /// Distinct experts among them: reads past this count asked for an expert again, which a
    /// backend reading through the page cache may serve from memory.
    pub distinct: u64,
    /// Bytes read (whole extents).
    pub bytes: u64,
    /// Wall time from the first request to the last expert handed out (each one checked, when
    /// the source checks).
    pub elapsed: Duration,
    /// The time budget ended the run before its last token.
    pub cut_short: bool,
}

impl RunFigures {
    /// Decimal gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }
}

/// Counts of a run while it streams.
struct Tally {
    t0: Instant,
    budget: Option<Duration>,
    tokens: u64,
    experts: u64,
    bytes: u64,
    seen: HashSet<(u32, u32)>,
    cut_short: bool,
}

impl Tally {
    fn new(budget: Option<Duration>) -> Tally {
        Tally {
            t0: Instant::now(),
            budget,
            tokens: 0,
            experts: 0,
            bytes: 0,
            seen: HashSet::new(),
            cut_short: false,
        }
    }

    fn landed(&mut self, id: (u32, u32), len: usize) {
        self.experts += 1;
        self.bytes += len as u64;
        self.seen.insert(id);
    }

    /// One more token done; whether the budget is spent.
    fn token_done(&mut self) -> bool {
        self.tokens += 1;
        self.budget.is_some_and(|b| self.t0.elapsed() >= b)
    }

    fn figures(&self) -> RunFigures {
        RunFigures {
            tokens: self.tokens,
            experts: self.experts,
            distinct: self.seen.len() as u64,
            bytes: self.bytes,
            elapsed: self.t0.elapsed(),
            cut_short: self.cut_short,
        }
    }
}

/// Stream every set in turn through `src`, dropping each expert once it lands (as a decoder
/// would after using it).
pub fn stream_sets(
    src: &mut ExpertSource,
    sets: &[Vec<(u32, u32)>],
) -> Result<RunFigures, StreamError> {
    stream_sets_within(src, sets, None)
}

/// [`stream_sets`] over any sets (a [`DecodeSets::iter`] say); with a `budget`, the run ends
/// after the token during which it ran out.
pub fn stream_sets_within<S: AsRef<[(u32, u32)]>>(
    src: &mut ExpertSource,
    sets: impl IntoIterator<Item = S>,
    budget: Option<Duration>,
) -> Result<RunFigures, StreamError> {
    let mut tally = Tally::new(budget);
    let mut sets = sets.into_iter().peekable();
    while let Some(set) = sets.next() {
        for x in src.prefetch(set.as_ref())? {
            let x = x?;
            tally.landed((x.layer(), x.expert()), x.bytes().len());
        }
        if tally.token_done() {
            tally.cut_short = sets.peek().is_some();
            break;
        }
    }
    Ok(tally.figures())
}

/// As [`stream_sets`], but each expert, once landed and checked, is copied on to the GPU by
/// `sink` (its slot held until the copy completes); the time runs until the last copy is done.
pub fn stream_sets_to_gpu(
    src: &mut ExpertSource,
    sets: &[Vec<(u32, u32)>],
    sink: &mut DeviceSink,
) -> Result<RunFigures, StreamError> {
    stream_sets_to_gpu_within(src, sets, None, sink)
}

/// [`stream_sets_to_gpu`] over any sets, with an optional time budget as
/// [`stream_sets_within`].
pub fn stream_sets_to_gpu_within<S: AsRef<[(u32, u32)]>>(
    src: &mut ExpertSource,
    sets: impl IntoIterator<Item = S>,
    budget: Option<Duration>,
    sink: &mut DeviceSink,
) -> Result<RunFigures, StreamError> {
    let mut tally = Tally::new(budget);
    let mut sets = sets.into_iter().peekable();
    while let Some(set) = sets.next() {
        for x in src.prefetch(set.as_ref())? {
            let x = x?;
            tally.landed((x.layer(), x.expert()), x.bytes().len());
            sink.copy_expert(x)?;
        }
        if tally.token_done() {
            tally.cut_short = sets.peek().is_some();
            break;
        }
    }
    sink.finish()?;
    Ok(tally.figures())
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
