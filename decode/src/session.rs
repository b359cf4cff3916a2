//! [`Decoder`]: a model directory opened for decoding — manifest, every file held to it, resident
//! tensors, the expert store, the family, a thread pool — and greedy generation over it. Its
//! sequences ([`Sequence`]) are values apart from it: the decoder keeps one of its own for
//! [`Decoder::feed`] and [`Decoder::generate`], and makes, forks and truncates any number more
//! ([`Decoder::new_sequence`], [`Decoder::fork`], [`Decoder::truncate`], [`Decoder::feed_in`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tarfa_format::manifest::{FileKind, Manifest};
use tarfa_runtime::{ExpertSource, ModelExperts, SourceOptions, SourceReport};

use crate::error::{DecodeError, ManifestMismatch, OptionsFault, Result, SequenceFault};
use crate::experts::{ExpertOptions, ExpertStats, ExpertStore};
use crate::family::{self, Ctx, Family, Profile};
use crate::kernels::Isa;
use crate::sequence::{new_owner, Sequence, Truncation};
use crate::weights::TensorStore;

/// How to open a [`Decoder`].
#[derive(Clone, Debug)]
pub struct DecoderOptions {
    /// Compute threads (0: one per core).
    pub threads: usize,
    /// Kernel path (`None`: `TARFA_ISA`, else the widest this CPU runs).
    pub isa: Option<Isa>,
    /// How experts are held.
    pub experts: ExpertOptions,
    /// How experts are read from disk (`queue_depth` 0: twice the model's top-k, at least 8;
    /// `slots` 0: the queue depth and 8 more; both bounded by the model's largest layer).
    pub source: SourceOptions,
    /// Run a prompt as one batch (each selected expert read once for all its tokens); else token
    /// by token. The logits are the same bits either way.
    pub batch_prompt: bool,
    /// With `batch_prompt`, the most tokens one batch takes (0: the whole prompt): a longer
    /// prompt runs in chunks of this many, each after the one before (chunked prefill, as
    /// llama.cpp's `--batch-size`). The chunk size changes no bit.
    pub prompt_chunk: usize,
    /// Where routed experts are computed (the CPU, or the GPU for all or some of them). The
    /// logits are the same bits either way.
    pub device: crate::offload::Device,
}

impl Default for DecoderOptions {
    fn default() -> Self {
        DecoderOptions {
            threads: 0,
            isa: None,
            experts: ExpertOptions::default(),
            source: SourceOptions::default(),
            batch_prompt: true,
            prompt_chunk: 0,
            device: crate::offload::Device::Cpu,
        }
    }
}

/// Where time and expert bytes went, by phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct PhaseStats {
    /// Tokens run.
    pub tokens: u64,
    /// Wall time.
    pub time: Duration,
    /// Expert counters during the phase.
    pub experts: ExpertStats,
}

/// A model opened for decoding.
#[derive(Debug)]
pub struct Decoder {
    dir: PathBuf,
    manifest: Manifest,
    tensors: TensorStore,
    experts: ExpertStore,
    family: Box<dyn Family>,
    /// The threads every parallel phase of a forward pass runs on.
    team: crate::team::Team,
    threads: usize,
    isa: Isa,
    batch_prompt: bool,
    prompt_chunk: usize,
    /// Numbers this decoder's sequences.
    id: u64,
    /// Positions a sequence may hold: the config's `max_position_embeddings` (a VL checkpoint's
    /// text model's), if it says.
    context: Option<usize>,
    /// The sequence of [`Decoder::feed`] and [`Decoder::generate`].
    seq: Sequence,
    profile: Profile,
    offload: Option<Box<dyn crate::offload::ExpertOffload>>,
    /// Why the whole forward pass is not on the device it was asked of.
    declined: Option<String>,
}

impl Decoder {
    /// Open `dir`: the manifest (its digest), every layer file and the trunk (root digests against
    /// the manifest), every layer of the config present, resident tensors read and hash-checked,
    /// the family's tensors checked by name and shape, experts ready to stream (or read now).
    pub fn open(dir: &Path, opts: &DecoderOptions) -> Result<Decoder> {
        let mut declined = None;
        let mut dec = Decoder::open_with(dir, opts, |config, tensors, experts| {
            whole_model_gpu(config, tensors, experts, &opts.device, &mut declined)
        })?;
        dec.declined = declined;
        Ok(dec)
    }

    /// [`Decoder::open`], with `whole_model` deciding whether a device runs the whole forward
    /// pass (it returns that decoder, e.g. [`crate::gpu_resident::build`] on some device) or not
    /// (`None`: the family's CPU layers, experts offloaded per `opts.device`).
    pub fn open_with(
        dir: &Path,
        opts: &DecoderOptions,
        whole_model: impl FnOnce(
            &serde_json::Value,
            &TensorStore,
            &mut ExpertStore,
        ) -> Result<Option<Box<dyn Family>>>,
    ) -> Result<Decoder> {
        let manifest = Manifest::load(dir)?;
        let config = &manifest.architecture.config;
        // No layer the config does not declare, no absurd count: before anything is sized by it.
        manifest
            .architecture
            .check_layer_count()
            .map_err(|fault| DecodeError::LayerCount {
                dir: dir.to_path_buf(),
                fault,
            })?;
        check_layers_present(dir, &manifest)?;
        check_config_file(dir, &manifest)?;
        let isa = match opts.isa {
            Some(i) => i
                .checked()
                .map_err(|f| DecodeError::Options(OptionsFault::Isa(f)))?,
            None => Isa::from_env().map_err(|f| DecodeError::Options(OptionsFault::Isa(f)))?,
        };
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            opts.threads
        };
        let team = crate::team::Team::new(threads, "tarfa-decode")
            .map_err(|source| DecodeError::ThreadPool { threads, source })?;
        let model = ModelExperts::open(dir)?;
        let mut tensors = TensorStore::load(dir, &manifest, &model)?;
        // A GGUF source: llama.cpp's names and key/values, mapped onto the family's.
        let gguf_config;
        let config = if manifest.architecture.source_format == "gguf" {
            gguf_config = crate::gguf_model::adapt(config, &mut tensors)?;
            &gguf_config
        } else {
            config
        };
        family::prepare(config, &mut tensors)?;
        let mut family = family::open(config, &tensors)?;
        let context = config
            .get("max_position_embeddings")
            .or_else(|| config.get("text_config")?.get("max_position_embeddings"))
            .and_then(|v| v.as_u64())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n > 0);
        // Queue depth 0: sized for decoding, twice the experts one layer selects per token (a
        // prompt's larger sets wait for slots); the ring a few slots beyond what is in flight.
        let mut src_opts = opts.source.clone();
        if src_opts.queue_depth == 0 {
            let k = family.top_k().max(1) as u32;
            src_opts.queue_depth = (2 * k).max(8);
        }
        // Bounded by the model: the decoder reads one layer's experts at a time, each at most
        // once, so more reads in flight than a layer has experts, or more slots than those and
        // a few being checked, would only pin memory (--qd 100000 pinned 1.2 GB for 96 KiB of
        // experts). `tarfa run` says when it took less than it was asked for.
        let per_layer = model.layers().map(|(_, n)| n).max().unwrap_or(0).max(1);
        src_opts.queue_depth = src_opts.queue_depth.min(per_layer);
        // Slots 0: the queue depth and 8 more, whoever chose the depth.
        let slots = if src_opts.slots == 0 {
            src_opts.queue_depth.saturating_add(8)
        } else {
            src_opts.slots
        };
        src_opts.slots = slots.min(per_layer.saturating_add(16));
        let source = ExpertSource::with_model(model, &src_opts)?;
        let mut experts = ExpertStore::new(source, &opts.experts)?;
        // The whole forward pass on the GPU when the family has it and the model fits; else
        // experts and products offloaded from the CPU's layers (or all on the CPU).
        let mut offload = None;
        let whole = whole_model(config, &tensors, &mut experts)?;
        match whole {
            Some(f) => family = f,
            None => {
                offload = crate::offload::open(&opts.device)?;
                if let Some(o) = offload.as_mut() {
                    o.use_ring(experts.source().ring());
                }
            }
        }
        let id = new_owner();
        let seq = Sequence::new(id, family.name(), family.recurrent(), family.new_state()?);
        Ok(Decoder {
            dir: dir.to_path_buf(),
            manifest,
            tensors,
            experts,
            family,
            team,
            threads,
            isa,
            batch_prompt: opts.batch_prompt,
            prompt_chunk: opts.prompt_chunk,
            id,
            context,
            seq,
            profile: Profile::default(),
            offload,
            declined: None,
        })
    }

    /// What the offload device (the GPU) did, when one computes experts.
    pub fn offload_report(&self) -> Option<crate::offload::OffloadReport> {
        self.family
            .device_report()
            .or_else(|| self.offload.as_ref().map(|o| o.report()))
            .map(|mut r| {
                r.whole_model_declined = self.declined.clone();
                r
            })
    }

    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The kernel path in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Compute threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The expert source's report (backend, queue depth, ring).
    pub fn source_report(&self) -> &SourceReport {
        self.experts.source().report()
    }

    /// Expert counters so far.
    pub fn expert_stats(&self) -> ExpertStats {
        self.experts.stats()
    }

    /// The expert store (sizes, cache).
    pub fn experts(&self) -> &ExpertStore {
        &self.experts
    }

    /// Bytes of resident tensors one decode step reads: all of them but the embedding table, of
    /// which one row (the whole table when it is also the output head).
    pub fn tensor_bytes_per_token(&self) -> u64 {
        let embed = self.tensors.stored_bytes("model.embed_tokens.weight");
        let tied = self.tensors.find("lm_head.weight").is_none();
        if tied || embed == 0 {
            self.tensors.bytes()
        } else {
            let row = embed / self.vocab_size().max(1) as u64;
            self.tensors.bytes() - embed + row
        }
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.family.vocab_size()
    }

    /// The model's end-of-sequence set, sorted: `generation_config.json`'s `eos_token_id` (an id
    /// or a list), else the config's (or its `text_config`'s), else a GGUF's
    /// `tokenizer.ggml.eos_token_id`, `eot_token_id` and `eom_token_id` (llama.cpp's
    /// end-of-generation ids). Empty when none says: only the length ends a generation. An id
    /// outside the vocabulary, or a value that is not an id, is refused by name.
    pub fn eos_ids(&self) -> Result<Vec<u32>> {
        use crate::error::ConfigFault as F;
        let vocab = self.vocab_size();
        let mut ids = Vec::new();
        let mut take = |key: &str, v: &serde_json::Value| -> Result<()> {
            let one = |x: &serde_json::Value| -> Result<u32> {
                match x.as_u64() {
                    Some(id) if (id as usize) < vocab => Ok(id as u32),
                    Some(id) => Err(crate::config::bad(
                        key,
                        F::OutOfRange {
                            value: usize::try_from(id).unwrap_or(usize::MAX),
                            max: vocab.saturating_sub(1),
                        },
                    )),
                    None => Err(crate::config::bad(
                        key,
                        F::ElementNotInteger {
                            value: x.to_string(),
                        },
                    )),
                }
            };
            match v {
                serde_json::Value::Null => {}
                serde_json::Value::Array(a) => {
                    for x in a {
                        ids.push(one(x)?);
                    }
                }
                x => ids.push(one(x)?),
            }
            Ok(())
        };
        let config = &self.manifest.architecture.config;
        if self.manifest.architecture.source_format == "gguf" {
            for k in ["eos_token_id", "eot_token_id", "eom_token_id"] {
                let key = format!("tokenizer.ggml.{k}");
                if let Some(v) = config.get(&key).and_then(|e| e.get("value")) {
                    take(&key, v)?;
                }
            }
        } else if let Some(v) = match self.aux_file("generation_config.json")? {
            Some(f) => match serde_json::from_slice::<serde_json::Value>(&f.bytes) {
                Ok(g) if g.is_object() => g.get("eos_token_id").filter(|v| !v.is_null()).cloned(),
                Ok(g) => {
                    return Err(crate::config::bad(
                        "generation_config.json",
                        F::FileNotJson {
                            detail: format!("a {}", json_kind(&g)),
                        },
                    ))
                }
                Err(e) => {
                    return Err(crate::config::bad(
                        "generation_config.json",
                        F::FileNotJson {
                            detail: e.to_string(),
                        },
                    ))
                }
            },
            None => None,
        } {
            take("generation_config.json: eos_token_id", &v)?;
        } else if let Some(v) = config
            .get("eos_token_id")
            .filter(|v| !v.is_null())
            .or_else(|| config.get("text_config")?.get("eos_token_id"))
        {
            take("eos_token_id", v)?;
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// Positions a sequence may hold (the model's context: `max_position_embeddings`), if the
    /// config says; a pass beyond it is refused.
    pub fn context_length(&self) -> Option<usize> {
        self.context
    }

    /// Positions its own sequence holds (`None` after a pass failed part-way through a
    /// recurrent state: [`Decoder::reset`] it).
    pub fn position(&self) -> Option<usize> {
        self.seq.len()
    }

    /// Experts selected per token.
    pub fn top_k(&self) -> usize {
        self.family.top_k()
    }

    /// Wall time by part of the forward pass, since the decoder was opened.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Start its own sequence over (every position forgotten).
    pub fn reset(&mut self) -> Result<()> {
        self.with_own(|dec, seq| dec.truncate(seq, 0))
    }

    /// `f` of its own sequence (taken out while `f` runs).
    fn with_own<R>(&mut self, f: impl FnOnce(&mut Self, &mut Sequence) -> R) -> R {
        let mut seq = std::mem::replace(&mut self.seq, Sequence::detached());
        let r = f(self, &mut seq);
        self.seq = seq;
        r
    }

    /// `seq` is one of this decoder's.
    fn owns(&self, seq: &Sequence) -> Result<()> {
        if seq.owner != self.id {
            return Err(DecodeError::Sequence(SequenceFault::Foreign));
        }
        Ok(())
    }

    /// A new, empty sequence of this model. Any number may exist beside the decoder's own;
    /// each holds its own KV caches and recurrent states (on the GPU when the decoder runs its
    /// whole forward pass there), and its bits never depend on the others.
    pub fn new_sequence(&mut self) -> Result<Sequence> {
        Ok(Sequence::new(
            self.id,
            self.family.name(),
            self.family.recurrent(),
            self.family.new_state()?,
        ))
    }

    /// A copy of `seq` that then goes its own way: both continue from its positions with the
    /// same bits as `seq` alone would. Fork before tokens you may take back from a recurrent
    /// model (its sequences truncate only to their length or to 0).
    pub fn fork(&mut self, seq: &Sequence) -> Result<Sequence> {
        self.owns(seq)?;
        let len = seq.start()?;
        let state = self.family.fork_state(&seq.state, len)?;
        let mut copy = Sequence::new(self.id, seq.family, seq.recurrent, state);
        copy.len = Some(len);
        Ok(copy)
    }

    /// Keep the first `n` positions of `seq` (the next token runs at position `n`): any prefix
    /// of a model that only attends; of one with recurrent state (Gated DeltaNet), only its
    /// length or 0. Truncating to 0 also makes a sequence whose pass failed usable again.
    pub fn truncate(&mut self, seq: &mut Sequence, n: usize) -> Result<()> {
        self.owns(seq)?;
        let t = seq.truncation(n)?;
        if t == Truncation::None {
            return Ok(());
        }
        seq.len = None;
        self.family.truncate_state(&mut seq.state, t)?;
        seq.len = Some(n);
        Ok(())
    }

    /// The aux file `name` (e.g. `tokenizer.json`) after checking its size and SHA-256 against
    /// the manifest: the tokenizer is part of the checkpoint too. The bytes returned are the ones
    /// checked, so use them rather than opening the path again (the file may have been swapped
    /// since). `Ok(None)` if the model has none.
    pub fn aux_file(&self, name: &str) -> Result<Option<AuxFile>> {
        read_aux(&self.dir, &self.manifest, name)
    }

    /// A GGUF-sourced model's token strings by id (`crate::gguf_model::token_strings`: every
    /// id its own, as llama.cpp decodes); `None` for another source.
    pub fn gguf_token_strings(&self) -> Option<Result<Vec<String>>> {
        (self.manifest.architecture.source_format == "gguf")
            .then(|| crate::gguf_model::token_strings(&self.manifest.architecture.config))
    }

    /// The tokenizer.json of a GGUF-sourced model, rebuilt from its `tokenizer.ggml.*` key/values
    /// (`crate::gguf_model::tokenizer_json`); `None` for another source (its tokenizer is the
    /// aux file `tokenizer.json`, [`Decoder::aux_file`]).
    pub fn gguf_tokenizer_json(&self) -> Option<Result<serde_json::Value>> {
        (self.manifest.architecture.source_format == "gguf")
            .then(|| crate::gguf_model::tokenizer_json(&self.manifest.architecture.config))
    }

    /// Run `tokens` of its own sequence from its position; the logits of the last one (or of
    /// each, when `all_logits`). A prompt runs as one batch or token by token per the options.
    pub fn feed(&mut self, tokens: &[u32], all_logits: bool) -> Result<Vec<Vec<f32>>> {
        self.with_own(|dec, seq| dec.feed_in(seq, tokens, all_logits))
    }

    /// Run `tokens` of `seq` from its position ([`Decoder::feed`] of another sequence).
    pub fn feed_in(
        &mut self,
        seq: &mut Sequence,
        tokens: &[u32],
        all_logits: bool,
    ) -> Result<Vec<Vec<f32>>> {
        self.owns(seq)?;
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        // Checked before the state is touched, so a bad id leaves the sequence as it was.
        let vocab = self.family.vocab_size();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(DecodeError::TokenOutOfRange { id, vocab });
        }
        let start = seq.start()?;
        let end = start.saturating_add(tokens.len());
        if let Some(limit) = self.context.filter(|&c| end > c) {
            return Err(DecodeError::Sequence(SequenceFault::ContextFull {
                limit,
                asked: end,
            }));
        }
        // Unknown until the pass ends: one that fails part-way leaves a recurrent state
        // advanced by some layers and not others.
        seq.len = None;
        let mut ctx = Ctx {
            isa: self.isa,
            tensors: &self.tensors,
            experts: &mut self.experts,
            profile: &mut self.profile,
            offload: self.offload.as_deref_mut().map(|o| o as _),
        };
        let family = &mut self.family;
        let state = &mut seq.state;
        let batch = self.batch_prompt;
        let chunk = match self.prompt_chunk {
            0 => tokens.len(),
            n => n,
        };
        let out = crate::team::install(&self.team, || -> Result<Vec<Vec<f32>>> {
            if batch {
                let mut all = Vec::new();
                let mut at = 0;
                for c in tokens.chunks(chunk) {
                    let last = at + c.len() == tokens.len();
                    let mut l = family.forward(&mut ctx, state, c, start + at, all_logits)?;
                    if all_logits || last {
                        all.append(&mut l);
                    }
                    at += c.len();
                }
                Ok(all)
            } else {
                let mut all = Vec::new();
                for (i, &t) in tokens.iter().enumerate() {
                    let mut l = family.forward(&mut ctx, state, &[t], start + i, true)?;
                    if all_logits || i + 1 == tokens.len() {
                        all.append(&mut l);
                    }
                }
                Ok(all)
            }
        });
        match out {
            Ok(out) => {
                seq.len = Some(end);
                Ok(out)
            }
            Err(e) => {
                // Attention alone: the caches keep their rows up to `start` (the next pass
                // rewrites from there), so the sequence stands where it stood.
                if !seq.recurrent
                    && family
                        .truncate_state(&mut seq.state, Truncation::Keep(start))
                        .is_ok()
                {
                    seq.len = Some(start);
                }
                Err(e)
            }
        }
    }

    /// Greedy decoding of its own sequence: run `prompt`, then choose `n` tokens, each the
    /// argmax of the logits (lowest id on ties) and fed back. `on_step(i, token, logits)` sees
    /// every step as it is decided (step 0's logits are the prompt's last position). Returns
    /// per-phase figures.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        n: usize,
        on_step: impl FnMut(usize, u32, &[f32]) -> Result<()>,
    ) -> Result<(PhaseStats, PhaseStats)> {
        self.with_own(|dec, seq| dec.generate_in(seq, prompt, n, on_step))
    }

    /// [`Decoder::generate`], ending after the first token `stop` holds (the model's
    /// end-of-sequence set, [`Decoder::eos_ids`]): that token is handed to `on_step`, and no
    /// position is computed after it.
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        n: usize,
        stop: impl Fn(u32) -> bool,
        on_step: impl FnMut(usize, u32, &[f32]) -> Result<()>,
    ) -> Result<(PhaseStats, PhaseStats)> {
        self.with_own(|dec, seq| dec.generate_in_until(seq, prompt, n, stop, on_step))
    }

    /// [`Decoder::generate`] of `seq`.
    pub fn generate_in(
        &mut self,
        seq: &mut Sequence,
        prompt: &[u32],
        n: usize,
        on_step: impl FnMut(usize, u32, &[f32]) -> Result<()>,
    ) -> Result<(PhaseStats, PhaseStats)> {
        self.generate_in_until(seq, prompt, n, |_| false, on_step)
    }

    /// [`Decoder::generate_until`] of `seq`.
    pub fn generate_in_until(
        &mut self,
        seq: &mut Sequence,
        prompt: &[u32],
        n: usize,
        stop: impl Fn(u32) -> bool,
        mut on_step: impl FnMut(usize, u32, &[f32]) -> Result<()>,
    ) -> Result<(PhaseStats, PhaseStats)> {
        if prompt.is_empty() {
            return Err(DecodeError::Options(OptionsFault::EmptyPrompt));
        }
        let mut prompt_phase = PhaseStats::default();
        let mut decode_phase = PhaseStats::default();
        if n == 0 {
            return Ok((prompt_phase, decode_phase));
        }
        let s0 = self.experts.stats();
        let t0 = Instant::now();
        let mut logits = self.feed_in(seq, prompt, false)?.pop().unwrap_or_default();
        prompt_phase.time = t0.elapsed();
        prompt_phase.tokens = prompt.len() as u64;
        let s1 = self.experts.stats();
        prompt_phase.experts = diff(s1, s0);
        let t1 = Instant::now();
        for i in 0..n {
            let tok = argmax(&logits);
            on_step(i, tok, &logits)?;
            if stop(tok) {
                break;
            }
            if i + 1 < n {
                logits = self.feed_in(seq, &[tok], false)?.pop().unwrap_or_default();
                decode_phase.tokens += 1;
            }
        }
        decode_phase.time = t1.elapsed();
        decode_phase.experts = diff(self.experts.stats(), s1);
        Ok((prompt_phase, decode_phase))
    }
}

/// What a JSON value is, in words.
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "list",
        serde_json::Value::Object(_) => "object",
    }
}

fn diff(a: ExpertStats, b: ExpertStats) -> ExpertStats {
    ExpertStats {
        reads: a.reads - b.reads,
        bytes_read: a.bytes_read - b.bytes_read,
        cache_hits: a.cache_hits - b.cache_hits,
        cache_misses: a.cache_misses - b.cache_misses,
        bytes_used: a.bytes_used - b.bytes_used,
    }
}

/// Index of the largest logit, the lowest index on ties, as torch's argmax: a NaN counts as the
/// largest (the first NaN wins), so a broken step is not hidden behind a plausible token.
pub fn argmax(logits: &[f32]) -> u32 {
    if let Some(i) = logits.iter().position(|v| v.is_nan()) {
        return i as u32;
    }
    let mut best = 0usize;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The whole-model GPU decoder when `device` asks for the GPU and the model takes it
/// ([`crate::gpu_resident::open`]; else why not in `declined`, unless the options asked for
/// it); with `Auto`, a GPU that cannot be used means `None` (a bad `TARFA_CUDA_TILE` is still an
/// error).
#[cfg(feature = "cuda")]
fn whole_model_gpu(
    config: &serde_json::Value,
    tensors: &TensorStore,
    experts: &mut ExpertStore,
    device: &crate::offload::Device,
    declined: &mut Option<String>,
) -> Result<Option<Box<dyn Family>>> {
    use crate::gpu_resident::Declined;
    use crate::offload::Device;
    let (o, auto) = match device {
        Device::Cpu => return Ok(None),
        Device::Cuda(o) => (o, false),
        Device::Auto(o) => (o, true),
    };
    match crate::gpu_resident::open(config, tensors, experts, o) {
        Ok(Ok(f)) => Ok(Some(Box::new(f) as Box<dyn Family>)),
        Ok(Err(d)) => {
            if d != Declined::Asked {
                *declined = Some(d.to_string());
            }
            Ok(None)
        }
        Err(e) if auto && !is_a_bad_setting(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Whether `e` is a setting the user got wrong (a bad `TARFA_CUDA_TILE`): said even under
/// `--device auto`, not taken for a GPU that cannot be used.
#[cfg(feature = "cuda")]
fn is_a_bad_setting(e: &DecodeError) -> bool {
    matches!(
        e,
        DecodeError::Gpu(tarfa_cuda::CudaError::BadTileGeometry { .. })
    )
}

#[cfg(not(feature = "cuda"))]
fn whole_model_gpu(
    _: &serde_json::Value,
    _: &TensorStore,
    _: &mut ExpertStore,
    _: &crate::offload::Device,
    _: &mut Option<String>,
) -> Result<Option<Box<dyn Family>>> {
    Ok(None)
}

/// An aux file of the model directory as [`Decoder::aux_file`] checked it.
#[derive(Debug, Clone)]
pub struct AuxFile {
    /// Where it is, for messages.
    pub path: PathBuf,
    /// Its bytes: the ones whose size and SHA-256 match the manifest.
    pub bytes: Vec<u8>,
}

/// The aux file `name` of the manifest `m` of `dir`, its size and SHA-256 checked; `None` when
/// the manifest lists none.
fn read_aux(dir: &Path, m: &Manifest, name: &str) -> Result<Option<AuxFile>> {
    let Some(entry) = m
        .files
        .iter()
        .find(|f| f.kind == FileKind::Aux && f.path == name)
    else {
        return Ok(None);
    };
    let path = dir.join(&entry.path);
    let bytes = read_regular_bounded(&path, entry.size)?;
    let got = hex::encode(Sha256::digest(&bytes));
    if got != entry.sha256 {
        return Err(DecodeError::NotInManifest {
            path,
            fault: ManifestMismatch::Sha256 {
                found: got,
                recorded: entry.sha256.clone(),
            },
        });
    }
    Ok(Some(AuxFile { path, bytes }))
}

/// The manifest's config — the one the decoder computes with — is the model directory's own
/// `config.json` (the converter copies both from the source): a config edited in one and not
/// the other (top-k, rope_theta, an epsilon, then the manifest re-digested) would compute
/// another model than the directory says it holds.
fn check_config_file(dir: &Path, m: &Manifest) -> Result<()> {
    let Some(f) = read_aux(dir, m, "config.json")? else {
        return Ok(());
    };
    let own: serde_json::Value =
        serde_json::from_slice(&f.bytes).map_err(|e| DecodeError::ConfigFileDiffers {
            dir: dir.to_path_buf(),
            keys: vec![format!("(config.json is not JSON: {e})")],
        })?;
    let keys = tarfa_format::manifest::config_differences(&m.architecture.config, &own, 8);
    if keys.is_empty() {
        return Ok(());
    }
    Err(DecodeError::ConfigFileDiffers {
        dir: dir.to_path_buf(),
        keys,
    })
}

/// Every layer `0..num_hidden_layers` of the config has its file in the manifest: a model converted
/// with `--layers` for part of its depth does not run (it would compute a different function).
fn check_layers_present(dir: &Path, m: &Manifest) -> Result<()> {
    // The decoder layers; MTP layers after them may be absent (they do not run here).
    let n = m.architecture.required_layers();
    let listed = m.missing_layers();
    let missing: Vec<u32> = (0..n)
        .filter(|&l| m.layer_file(l).is_none() || listed.contains(&l))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(DecodeError::Incomplete {
        dir: dir.to_path_buf(),
        missing,
        layers: n as usize,
    })
}

/// Read a regular file of `expected` bytes (no FIFO, no device, nothing past the limit) through
/// the one bounded reader every crate uses.
fn read_regular_bounded(path: &Path, expected: u64) -> Result<Vec<u8>> {
    let bytes = tarfa_format::fsio::read_regular(path, expected)
        .map_err(|e| DecodeError::Format(tarfa_format::Error::from(e)))?;
    if bytes.len() as u64 != expected {
        return Err(DecodeError::NotInManifest {
            path: path.to_path_buf(),
            fault: ManifestMismatch::Size { expected },
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    /// Under `--device auto` a GPU that cannot be used means the CPU, but a bad `TARFA_CUDA_TILE`
    /// is the user's to fix: it is said, not swallowed.
    #[cfg(feature = "cuda")]
    #[test]
    fn auto_swallows_a_missing_gpu_but_not_a_bad_tile_setting() {
        use crate::error::DecodeError;
        use tarfa_cuda::CudaError;
        let bad = DecodeError::Gpu(CudaError::BadTileGeometry {
            value: "7".into(),
            why: "no stage size".into(),
        });
        assert!(super::is_a_bad_setting(&bad));
        let absent = DecodeError::Gpu(CudaError::Absent("no CUDA device is visible".into()));
        assert!(!super::is_a_bad_setting(&absent));
    }

    use super::argmax;

    #[test]
    fn argmax_takes_the_lowest_index_on_ties_and_a_nan_first_like_torch() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[1.0, f32::NAN, 3.0, f32::NAN]), 1);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[]), 0);
    }
}
