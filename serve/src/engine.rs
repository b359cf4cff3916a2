//! The engine: one thread owning the model, stepping up to `parallel` sequences in turn.
//!
//! Each request is a [`Job`]: its prompt's ids, its limits and stops, and the channel its
//! events go to. The engine admits jobs from a bounded queue into free slots, then gives every
//! active slot one step in turn — a slot's first steps run its prompt, a chunk of
//! [`EngineConfig::prompt_chunk`] tokens each, each later one a single token — and sends what the
//! step made. A slot whose receiver is gone (the client
//! disconnected, stream or not) is freed before its next step. Each sequence is computed alone
//! from its own state, so the tokens and logits of a request are the same bits whatever else
//! runs beside it (spec/EXACTNESS.md §4).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use tarfa_decode::text::{Detokenizer, Text};
use tarfa_decode::{Decoder, Sequence};
pub use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// A request's channel: the engine sends into the first, the request reads the second (and
/// dropping it tells the engine the request is gone).
pub fn channel() -> (UnboundedSender<Event>, UnboundedReceiver<Event>) {
    tokio::sync::mpsc::unbounded_channel()
}

/// Why a generation ended, in OpenAI's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the context.
    Length,
    /// A chat reply whose tool calls parsed (the handlers' finding, not the engine's).
    ToolCalls,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::ToolCalls => "tool_calls",
        }
    }
}

/// What the engine sends a request.
#[derive(Debug)]
pub enum Event {
    /// A generated token's text that may be shown now (possibly empty: held back while it may
    /// begin a stop string or is an incomplete character), or, just before the end, the text
    /// held back until then.
    Delta {
        /// The text that may be shown now.
        text: String,
        /// The token's log-probability and the likeliest alternatives', when asked for (none
        /// for an end-of-sequence token, which is not part of the answer).
        logprob: Option<TokenLogprob>,
    },
    /// The end: why, and the counts.
    Done {
        /// Why it ended.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens (an end-of-sequence token included).
        completion_tokens: usize,
        /// Prompt tokens taken from the prompt cache.
        cached_tokens: usize,
    },
    /// The request failed after it was admitted.
    Error(String),
}

/// A token's fp32 log-probability and the `n` likeliest tokens' (with theirs).
#[derive(Debug, Clone)]
pub struct TokenLogprob {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The likeliest tokens and their log-probabilities, highest first.
    pub top: Vec<(u32, f32)>,
}

/// One request for the engine.
#[derive(Debug)]
pub struct Job {
    /// The prompt's ids (non-empty, each in the vocabulary, fewer than the context).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Stop strings: the text ends before the first that appears.
    pub stop: Vec<String>,
    /// Go on past end-of-sequence tokens.
    pub ignore_eos: bool,
    /// Sampling settings; `None`: greedy.
    pub sampling: Option<crate::sample::Sampling>,
    /// Log-probabilities: `Some(n)` for each token's and the `n` likeliest.
    pub logprobs: Option<usize>,
    /// The request's choice this job is (0 for the first): sampling's draws are keyed by it.
    pub choice: u64,
    /// Where the events go; dropped by the client's side when it goes away.
    pub tx: UnboundedSender<Event>,
    /// When the request arrived (for time to first token).
    pub arrived: Instant,
}

/// Counters the engine and the handlers share, for `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Requests admitted to the queue.
    pub requests: AtomicU64,
    /// Requests refused because the queue was full.
    pub rejected: AtomicU64,
    /// Requests whose client went away before the end.
    pub disconnected: AtomicU64,
    /// Requests finished.
    pub finished: AtomicU64,
    /// Jobs waiting in the queue.
    pub queued: AtomicUsize,
    /// Jobs in the server: queued or in a slot. Requests are admitted while it is below
    /// `--parallel` + `--queue` (and it goes down when a job leaves, whichever way).
    pub admitted: AtomicUsize,
    /// Slots generating.
    pub active: AtomicUsize,
    /// Prompt tokens computed.
    pub prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Time to first token, summed, in microseconds, and its count.
    pub ttft_us: AtomicU64,
    /// How many time-to-first-token figures are summed.
    pub ttft_count: AtomicU64,
    /// Time spent in steps, in microseconds.
    pub busy_us: AtomicU64,
    /// Expert bytes read from disk.
    pub expert_bytes: AtomicU64,
    /// Expert cache hits.
    pub cache_hits: AtomicU64,
    /// Expert reads.
    pub expert_reads: AtomicU64,
    /// Connections open.
    pub connections: AtomicUsize,
    /// Connections refused with 503: `--max-connections` were open.
    pub connections_refused: AtomicU64,
    /// Requests that reused a cached prefix.
    pub prompt_cache_hits: AtomicU64,
    /// Prompt tokens not computed again: taken from the cache.
    pub prompt_cache_tokens: AtomicU64,
}

/// A request being generated.
struct Slot {
    job: Job,
    seq: Sequence,
    /// Every generated id (an end-of-sequence token included).
    generated: Vec<u32>,
    /// The text of the ids before an end-of-sequence token, made token by token.
    detok: Detokenizer,
    /// Bytes of that text sent so far.
    sent: usize,
    started: bool,
    /// Prompt tokens the sequence already holds (from the prompt cache).
    cached: usize,
    /// Prompt tokens the sequence holds (the cached ones and those computed so far).
    fed: usize,
    /// Whether its admission was given back (before its end was sent, so a client that sends
    /// its next request on reading the end finds the slot free).
    released: bool,
}

impl Slot {
    /// Give the slot's admission back, once.
    fn release(&mut self, metrics: &Metrics) {
        if !self.released {
            self.released = true;
            metrics.admitted.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A finished sequence kept for its tokens' prefixes: the tokens it holds, the sequence.
struct Cached {
    tokens: Vec<u32>,
    seq: Sequence,
}

/// A sequence for `prompt`: a fork of the cached sequence sharing its longest prefix, truncated
/// to that prefix (at least one prompt token is left to compute, for the logits), or a new one.
/// Computing the rest of the prompt after the prefix gives the bits of computing it whole (each
/// token is computed as alone: spec/EXACTNESS.md §4), so a hit changes no bit.
fn sequence_for(
    dec: &mut Decoder,
    cache: &mut Vec<Cached>,
    prompt: &[u32],
) -> tarfa_decode::Result<(Sequence, usize)> {
    let best = cache
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let common = c
                .tokens
                .iter()
                .zip(prompt)
                .take_while(|(a, b)| a == b)
                .count();
            (i, common.min(prompt.len().saturating_sub(1)))
        })
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
    if let Some((i, n)) = best {
        let mut seq = dec.fork(&cache[i].seq)?;
        // A recurrent model's state truncates only to its length: then it is no hit.
        if dec.truncate(&mut seq, n).is_ok() {
            // Most recently used last.
            let hit = cache.remove(i);
            cache.push(hit);
            return Ok((seq, n));
        }
    }
    Ok((dec.new_sequence()?, 0))
}

/// The engine's fixed settings.
#[derive(Debug)]
pub struct EngineConfig {
    /// Finished sequences kept for their prompts' prefixes (0: none).
    pub prompt_cache: usize,
    /// Sequences generated at once.
    pub parallel: usize,
    /// Positions a sequence may take.
    pub context: usize,
    /// The model's end-of-sequence set, sorted.
    pub eos: Vec<u32>,
    /// Prompt tokens a step computes at most: a long prompt takes several steps, so the other
    /// slots' tokens go on between its chunks and a client that leaves mid-prompt frees its
    /// slot within one chunk. Each token is computed as alone, so the chunking changes no bit.
    pub prompt_chunk: usize,
}

/// Run the engine until the queue's senders are all gone.
pub fn run(
    mut dec: Decoder,
    text: Arc<Text>,
    cfg: EngineConfig,
    jobs: Receiver<Job>,
    metrics: Arc<Metrics>,
) {
    let mut slots: Vec<Slot> = Vec::new();
    let mut cache: Vec<Cached> = Vec::new();
    loop {
        // Admit what waits, up to the free slots; with nothing to do, wait for a job.
        while slots.len() < cfg.parallel {
            let job = if slots.is_empty() {
                match jobs.recv() {
                    Ok(j) => j,
                    Err(_) => return,
                }
            } else {
                match jobs.try_recv() {
                    Ok(j) => j,
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            };
            metrics.queued.fetch_sub(1, Ordering::SeqCst);
            if job.tx.is_closed() {
                metrics.disconnected.fetch_add(1, Ordering::SeqCst);
                metrics.admitted.fetch_sub(1, Ordering::SeqCst);
                continue;
            }
            let seq = if cfg.prompt_cache > 0 {
                sequence_for(&mut dec, &mut cache, &job.prompt)
            } else {
                dec.new_sequence().map(|s| (s, 0))
            };
            match seq {
                Ok((seq, cached)) => {
                    if cached > 0 {
                        metrics.prompt_cache_hits.fetch_add(1, Ordering::SeqCst);
                        metrics
                            .prompt_cache_tokens
                            .fetch_add(cached as u64, Ordering::SeqCst);
                    }
                    slots.push(Slot {
                        job,
                        seq,
                        generated: Vec::new(),
                        detok: Detokenizer::new(),
                        sent: 0,
                        started: false,
                        cached,
                        fed: cached,
                        released: false,
                    })
                }
                Err(e) => {
                    let _ = job.tx.send(Event::Error(e.to_string()));
                    metrics.admitted.fetch_sub(1, Ordering::SeqCst);
                }
            }
        }
        metrics.active.store(slots.len(), Ordering::SeqCst);
        // One step of each slot, in turn.
        let mut i = 0;
        while i < slots.len() {
            let done = if slots[i].job.tx.is_closed() {
                metrics.disconnected.fetch_add(1, Ordering::SeqCst);
                Some(false)
            } else {
                let t0 = Instant::now();
                let before = dec.expert_stats();
                // A step that panics fails its request alone; the engine goes on.
                let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    step(&mut dec, &text, &cfg, &mut slots[i], &metrics)
                }))
                .unwrap_or_else(|_| {
                    let _ = slots[i].job.tx.send(Event::Error(
                        "the engine failed computing this request (a bug: please report it)".into(),
                    ));
                    Some(false)
                });
                let after = dec.expert_stats();
                metrics
                    .busy_us
                    .fetch_add(t0.elapsed().as_micros() as u64, Ordering::SeqCst);
                metrics.expert_bytes.fetch_add(
                    after.bytes_read.saturating_sub(before.bytes_read),
                    Ordering::SeqCst,
                );
                metrics
                    .expert_reads
                    .fetch_add(after.reads.saturating_sub(before.reads), Ordering::SeqCst);
                metrics.cache_hits.fetch_add(
                    after.cache_hits.saturating_sub(before.cache_hits),
                    Ordering::SeqCst,
                );
                done
            };
            match done {
                None => i += 1,
                Some(finished) => {
                    let mut s = slots.swap_remove(i);
                    metrics.active.store(slots.len(), Ordering::SeqCst);
                    s.release(&metrics);
                    // A finished sequence is kept for its prefixes: the prompt and every
                    // generated token but the last (never fed).
                    if finished && cfg.prompt_cache > 0 {
                        let mut tokens = s.job.prompt.clone();
                        tokens
                            .extend_from_slice(&s.generated[..s.generated.len().saturating_sub(1)]);
                        cache.push(Cached { tokens, seq: s.seq });
                        if cache.len() > cfg.prompt_cache {
                            cache.remove(0);
                        }
                    }
                }
            }
        }
    }
}

/// Prompt tokens a step computes by default ([`EngineConfig::prompt_chunk`]).
pub const PROMPT_CHUNK: usize = 256;

/// One step of `s`: a chunk of its prompt (what the cache did not hold), or one token. `None`
/// while it goes on; `Some(true)` when it finished, `Some(false)` when it failed or its client
/// left.
fn step(
    dec: &mut Decoder,
    text: &Text,
    cfg: &EngineConfig,
    s: &mut Slot,
    metrics: &Metrics,
) -> Option<bool> {
    let input: Vec<u32> = if s.started {
        vec![*s.generated.last().unwrap_or(&0)]
    } else {
        let end = (s.fed + cfg.prompt_chunk.max(1)).min(s.job.prompt.len());
        s.job.prompt[s.fed..end].to_vec()
    };
    let logits = match dec.feed_in(&mut s.seq, &input, false) {
        Ok(mut l) => l.pop().unwrap_or_default(),
        Err(e) => {
            s.release(metrics);
            let _ = s.job.tx.send(Event::Error(e.to_string()));
            return Some(false);
        }
    };
    if !s.started {
        s.fed += input.len();
        metrics
            .prompt_tokens
            .fetch_add(input.len() as u64, Ordering::SeqCst);
        if s.fed < s.job.prompt.len() {
            return None;
        }
        s.started = true;
        metrics
            .ttft_us
            .fetch_add(s.job.arrived.elapsed().as_micros() as u64, Ordering::SeqCst);
        metrics.ttft_count.fetch_add(1, Ordering::SeqCst);
    }
    let tok = crate::sample::choose(
        &logits,
        s.job.sampling.as_ref(),
        s.job.choice,
        s.generated.len() as u64,
    );
    let logprob = s.job.logprobs.map(|n| {
        let lp = crate::sample::log_softmax(&logits);
        TokenLogprob {
            token: tok,
            logprob: lp[tok as usize],
            top: crate::sample::top(&lp, n),
        }
    });
    s.generated.push(tok);
    metrics.generated_tokens.fetch_add(1, Ordering::SeqCst);
    let eos = !s.job.ignore_eos && cfg.eos.binary_search(&tok).is_ok();
    let grew_from = s.detok.text().len();
    if !eos {
        s.detok.push(text, tok);
    }
    let positions = s.job.prompt.len() + s.generated.len();
    let at_limit = s.generated.len() >= s.job.max_tokens || positions >= cfg.context;
    if eos || at_limit {
        // The end: a character no token completed goes out as it decodes.
        s.detok.finish(text);
    }
    let full = s.detok.text();
    // A stop string ends the text before it; else the text may go out up to what could still
    // begin one (the least hold-back). At the end what was held back goes out too.
    let (shown, finish) = match first_stop(full, &s.job.stop, grew_from) {
        Some(at) => (at, Some(Finish::Stop)),
        None if eos => (full.len(), Some(Finish::Stop)),
        None if at_limit => (full.len(), Some(Finish::Length)),
        None => (full.len() - hold_back(full, &s.job.stop), None),
    };
    let delta = full
        .get(s.sent..shown)
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .unwrap_or_default();
    s.sent += delta.len();
    // An end-of-sequence token sends only the text held back until the end, if any.
    let logprob = if eos { None } else { logprob };
    if (!eos || !delta.is_empty())
        && s.job
            .tx
            .send(Event::Delta {
                text: delta,
                logprob,
            })
            .is_err()
    {
        metrics.disconnected.fetch_add(1, Ordering::SeqCst);
        return Some(false);
    }
    if let Some(finish) = finish {
        metrics.finished.fetch_add(1, Ordering::SeqCst);
        s.release(metrics);
        let _ = s.job.tx.send(Event::Done {
            finish,
            prompt_tokens: s.job.prompt.len(),
            completion_tokens: s.generated.len(),
            cached_tokens: s.cached,
        });
        return Some(true);
    }
    None
}

/// Where the first stop string begins in `text`, if one is there, given that none was in
/// `text[..grown_from]` (the text before the last token's): only the part a new one can be in
/// is searched, so a token's search does not grow with the answer.
pub fn first_stop(text: &str, stops: &[String], grown_from: usize) -> Option<usize> {
    stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let mut from = grown_from.min(text.len()).saturating_sub(s.len() - 1);
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            text[from..].find(s.as_str()).map(|at| from + at)
        })
        .min()
}

/// How many bytes at the end of `text` to hold back: the longest suffix that is a proper prefix
/// of a stop string (it may become one), on a character boundary.
pub fn hold_back(text: &str, stops: &[String]) -> usize {
    let mut best = 0;
    for s in stops {
        for (i, _) in s.char_indices().skip(1) {
            let prefix = &s[..i];
            if i > best && text.ends_with(prefix) {
                best = i;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn a_stop_string_is_found_and_its_beginning_held_back() {
        let stops = v(&["\n\n", "END"]);
        assert_eq!(first_stop("ab\n\ncd", &stops, 0), Some(2));
        assert_eq!(first_stop("abENDx\n\n", &stops, 0), Some(2));
        assert_eq!(first_stop("abc", &stops, 0), None);
        // Only what the last token's text could complete is searched: a stop string may begin
        // up to its length less one before it.
        assert_eq!(first_stop("abcEND", &stops, 4), Some(3));
        assert_eq!(first_stop("abcEND", &stops, 3), Some(3));
        assert_eq!(first_stop("abcEND", &stops, 6), None);
        assert_eq!(first_stop("ééEND", &v(&["éEND"]), 5), Some(2));
        assert_eq!(first_stop("x\n\n", &stops, 100), None);
        assert_eq!(hold_back("abc\n", &stops), 1);
        assert_eq!(hold_back("abcEN", &stops), 2);
        assert_eq!(hold_back("abcE", &stops), 1);
        assert_eq!(hold_back("abc", &stops), 0);
        // A multi-byte stop is held back on character boundaries.
        let stops = v(&["éé"]);
        assert_eq!(hold_back("aé", &stops), 'é'.len_utf8());
        assert_eq!(first_stop("", &v(&[""]), 0), None);
    }
}
