//! Command-line types: every flag of `tarfa`, in one place.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The most compute threads any command takes (a typo guard: more threads than this only slow a
/// machine down, and 100,000 exhausted it).
pub const MAX_THREADS: u64 = 1024;

/// The most GiB a cache or VRAM flag takes (a typo guard: 1 PiB).
pub const MAX_GIB: f64 = 1_048_576.0;

/// A whole-number flag's parser: `lo..=hi`, the range stated in the flag's help. Out of range is
/// clap's usage error (exit 2), naming the flag and the range, before any work.
fn count<T>(lo: u64, hi: u64) -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    clap::builder::RangedU64ValueParser::<T>::new().range(lo..=hi)
}

/// A number-with-a-fraction flag's parser: finite, in `lo..=hi` (`lo` itself excluded when
/// `open_low`), the range stated in the flag's help. NaN, an infinity or a value outside is
/// clap's usage error (exit 2), naming the flag, before any work.
fn real(lo: f64, hi: f64, open_low: bool) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |s: &str| {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("not a number: {s:?}"))?;
        let low_ok = if open_low { v > lo } else { v >= lo };
        if v.is_finite() && low_ok && v <= hi {
            Ok(v)
        } else if open_low {
            Err(format!(
                "{v} is not in ({lo}, {hi}]: above {lo}, at most {hi}"
            ))
        } else {
            Err(format!("{v} is not in {lo}..={hi}"))
        }
    }
}

/// tarfa: run huge Mixture-of-Experts checkpoints exactly. JNF v1 files, their converter,
/// verifier and runtime.
#[derive(Debug, Parser)]
#[command(name = "tarfa", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Summarise a JNF file, a model directory or a GGUF file: layers, experts, dtypes, sizes,
    /// hashes, provenance. Opening a file checks its whole structure (not its data; see `verify`).
    ///
    /// Examples:
    ///   tarfa inspect model/
    ///   tarfa inspect model/layer-00000.jnf
    ///   tarfa inspect model.gguf --json
    #[command(verbatim_doc_comment)]
    Inspect(InspectArgs),
    /// Convert a Hugging Face safetensors checkpoint (a directory: one model.safetensors or
    /// shards with model.safetensors.index.json) or a GGUF file (for a split set, any part) into
    /// a JNF model directory, one layer range at a time. Rerunning skips layers already present
    /// and checked; a killed run resumes.
    ///
    /// Examples:
    ///   tarfa convert Qwen3-30B-A3B/ -o model/ --verify
    ///   tarfa convert Qwen3-30B-A3B/ -o model/ --layers 0-11
    ///   tarfa convert model-00001-of-00003.gguf -o model/ --json
    #[command(verbatim_doc_comment)]
    Convert(ConvertArgs),
    /// Re-read every byte of a JNF model directory: recompute every region, expert, index and
    /// root hash, check padding, hold the manifest to the directory, and compare every region
    /// byte for byte with the source checkpoint (--source). A model missing layers of its config
    /// or its trunk (or, with --source, any source tensor) is reported incomplete, naming what
    /// is missing. Exit 0: no fault; 1: faults found (each named); 2: could not run (a --layers
    /// or --sample that selects no file included).
    ///
    /// Examples:
    ///   tarfa verify model/
    ///   tarfa verify model/ --source Qwen3-30B-A3B/
    ///   tarfa verify model/ --sample 1/10 --json
    #[command(verbatim_doc_comment)]
    Verify(VerifyArgs),
    /// Fetch only chosen tensors — the MTP head with --mtp — of a remote or local GGUF (any part
    /// of a split set) or safetensors checkpoint, with checked HTTP range requests, into one GGUF
    /// (or safetensors) file. Resumes a killed run; `--list` shows what would be fetched.
    ///
    /// Examples:
    ///   tarfa fetch hf://owner/repo/model-00001-of-00003.gguf --mtp --list
    ///   tarfa fetch hf://owner/repo/model-00001-of-00003.gguf --mtp -o mtp.gguf
    ///   tarfa fetch https://host/model.gguf --tensors 'blk.0.*' -o blk0.gguf --jobs 8
    #[command(verbatim_doc_comment)]
    Fetch(FetchArgs),
    /// Measure expert streaming: decode-shaped reads (top-k random experts of every layer per
    /// token) through each I/O backend at each queue depth, cold cache, in GB/s, beside fio's
    /// random read of the same files at the same block size and depth when fio is installed.
    ///
    /// Examples:
    ///   tarfa bench-io model/
    ///   tarfa bench-io model/ --backend io_uring --qd 64 --gib 4 --json
    #[command(verbatim_doc_comment)]
    BenchIo(BenchIoArgs),
    /// Measure decoding against its bounds in one run: resident (all experts in RAM) against the
    /// memory bound (this machine's read bandwidth, measured now, ÷ bytes touched per token) and
    /// streamed from a cold cache against the storage bound (fio's random read at the expert
    /// size and top-k depth, measured now, ÷ expert bytes read per token); with --modes gpu, the
    /// model in VRAM against the HBM bound. Each run's logits must be bit-identical to the
    /// first's, across modes too.
    BenchDecode(BenchDecodeArgs),
    /// Run a model exactly: greedy decoding of a JNF model directory on the CPU, experts streamed
    /// from disk (checked as they land) or resident. The logits do not depend on the I/O backend,
    /// queue depth, cache size, thread count, instruction set or prompt batching.
    ///
    /// Examples:
    ///   tarfa run model/ --prompt "The quick brown fox" -n 32
    ///   tarfa run model/ --tokens 1,2,3 -n 8 --logits-out logits.npy
    ///   tarfa run model/ --prompt "hello" --experts resident --threads 4 --json
    #[command(verbatim_doc_comment)]
    Run(Box<RunArgs>),
    /// Serve a model over HTTP with OpenAI's API, exactly: a request's tokens and text are the
    /// same bytes whatever else the server runs beside it (each sequence computed alone; greedy,
    /// or sampling keyed by the request's seed). Routes: POST /v1/chat/completions (the model's
    /// chat template), POST /apply-template, POST /v1/completions, GET /v1/models, GET /health (503 while the
    /// model loads), GET /metrics (Prometheus), POST /tokenize, POST /detokenize, and a chat page
    /// at GET / (open it in a browser; --no-webui turns it off).
    ///
    /// Examples:
    ///   tarfa serve model/
    ///   tarfa serve model/ --port 8089 --parallel 4 --api-key "$KEY"
    ///   curl -s localhost:8089/v1/completions -d '{"prompt": "The quick brown fox", "max_tokens": 16}'
    #[command(verbatim_doc_comment)]
    Serve(Box<ServeArgs>),
    /// Chat with a model in the terminal, on its chat template (as transformers renders it),
    /// the answer streamed as it is generated: greedy unless --temp is above 0 (seeded, counter-based
    /// sampling). Ctrl-C stops an answer (not the program); /reset starts a new conversation,
    /// /stats prints the last answer's figures, /quit (or Ctrl-D) ends.
    ///
    /// Examples:
    ///   tarfa chat model/
    ///   tarfa chat model/ --system "Answer in one sentence." --temp 0.7 --seed 1
    ///   echo "Hello" | tarfa chat model/ -n 64
    #[command(verbatim_doc_comment)]
    Chat(Box<ChatArgs>),
    /// Print a shell completion script on stdout.
    ///
    /// Examples:
    ///   tarfa completions bash > ~/.local/share/bash-completion/completions/tarfa
    ///   tarfa completions zsh > ~/.zfunc/_tarfa
    ///   tarfa completions fish > ~/.config/fish/completions/tarfa.fish
    #[command(verbatim_doc_comment)]
    Completions(CompletionsArgs),
    /// Print the man page (roff) on stdout: tarfa(1), or with --command, tarfa-COMMAND(1).
    ///
    /// Examples:
    ///   tarfa man | man -l -
    ///   tarfa man > /usr/local/share/man/man1/tarfa.1
    ///   tarfa man --command convert > tarfa-convert.1
    #[command(verbatim_doc_comment)]
    Man(ManArgs),
}

/// `tarfa completions`.
#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    /// The shell.
    pub shell: clap_complete::Shell,
}

/// `tarfa man`.
#[derive(Debug, clap::Args)]
pub struct ManArgs {
    /// The page of this subcommand (e.g. `convert`) instead of tarfa(1).
    #[arg(long, value_name = "COMMAND")]
    pub command: Option<String>,
}

/// `tarfa bench-decode`.
#[derive(Debug, clap::Args)]
pub struct BenchDecodeArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// Modes, comma-separated: resident, stream, gpu (a build with `--features cuda`: the whole
    /// model in VRAM, against the HBM bound), gpu-stream (`--features cuda`: experts streamed
    /// from a cold cache to the GPU for each use, against the storage bound). Every mode's logits
    /// are checked against the first run's, across modes.
    #[arg(long, default_value = "resident,stream")]
    pub modes: String,
    /// Prompt tokens (deterministic ids), 1..=1048576 (and within the model's context).
    #[arg(long, default_value_t = 8, value_parser = count::<usize>(1, 1 << 20))]
    pub prompt_tokens: usize,
    /// Tokens generated per run (greedy), 2..=1048576; as `run`'s -n.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 32, value_parser = count::<usize>(2, 1 << 20))]
    pub tokens: usize,
    /// The old name of -n/--max-tokens (`--tokens` is `run`'s prompt ids): taken, with a warning.
    #[arg(long = "tokens", value_name = "N", hide = true, conflicts_with = "tokens", value_parser = count::<usize>(2, 1 << 20))]
    pub old_tokens: Option<usize>,
    /// Runs per mode (medians are reported), 1..=1000.
    #[arg(long, default_value_t = 3, value_parser = count::<usize>(1, 1000))]
    pub runs: usize,
    /// Compute threads, 1..=1024 (default: one per core).
    #[arg(short = 't', long, value_parser = count::<usize>(1, MAX_THREADS))]
    pub threads: Option<usize>,
    /// GiB summed by the memory-bandwidth probe (at least 8 MiB are), above 0, at most 256 (and
    /// under 80% of the memory available now).
    #[arg(long, default_value_t = 2.0, value_parser = real(0.0, 256.0, true))]
    pub mem_gib: f64,
    /// GiB read by each fio run of the storage probe, above 0, at most 1024.
    #[arg(long, default_value_t = 2.0, value_parser = real(0.0, 1024.0, true))]
    pub fio_gib: f64,
    /// Skip fio (no storage bound).
    #[arg(long)]
    pub no_fio: bool,
    /// The GPU's memory bandwidth in GB/s for the gpu mode's bound (default: the H200's datasheet
    /// figure, 4.8 TB/s); above 0, at most 1000000.
    #[arg(long, default_value_t = 4800.0, value_parser = real(0.0, 1e6, true))]
    pub hbm_gbps: f64,
    /// llama-bench's JSON (`llama-bench -o json -p P -n N`, the same P as --prompt-tokens and N as
    /// -n) to print each mode's prompt and decode tokens/s as ratios to llama.cpp's: the CPU
    /// modes against its CPU tests, the GPU modes against its GPU ones (-ngl above 0). May be
    /// given twice (a CPU and a CUDA build's files).
    #[arg(long, value_name = "FILE")]
    pub peer: Vec<PathBuf>,
    /// One JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `tarfa run`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_file", "tokens"])))]
pub struct RunArgs {
    /// The model directory (a `tarfa convert` output).
    pub dir: PathBuf,
    /// Prompt text, tokenized with the model's tokenizer.json as transformers' `tokenizer(text)`
    /// does (its special tokens, e.g. a BOS, where the tokenizer adds them).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Read the prompt text from FILE (`-`: standard input), UTF-8, at most 64 MiB.
    #[arg(short = 'f', long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Prompt token ids, comma-separated; the generated ids are printed space-separated.
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Tokens to generate (greedy), at most: the run stops after the model's end-of-sequence
    /// token (generation_config.json's eos_token_id, the config's, or a GGUF's end-of-generation
    /// ids) unless --ignore-eos.
    #[arg(short = 'n', long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    /// Go on past the end-of-sequence token: exactly -n tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Positions this run may take, prompt and generated tokens together (llama.cpp's -c), at
    /// most the model's context (max_position_embeddings), which is the default. A run needing
    /// more is refused before any token is computed.
    #[arg(short = 'c', long = "ctx-size", value_name = "N", value_parser = count::<usize>(1, u32::MAX as u64))]
    pub ctx_size: Option<usize>,
    /// Sampling flags of other tools, refused by name: `tarfa run` is greedy.
    #[command(flatten)]
    pub sampling: SamplingFlags,
    /// Write the fp32 logits of every generated step as a .npy array [steps, vocab], each row
    /// as it is computed (published atomically at the end). Checked before the model is loaded:
    /// never in the model directory, a symbolic link or a directory; a character device or a
    /// named pipe (`/dev/null`, a FIFO) is written into, never replaced.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Print one JSON document (tokens, text, figures) on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Where and how the model runs.
    #[command(flatten)]
    pub model: ModelFlags,
}

/// `tarfa serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The model directory (a `tarfa convert` output).
    pub dir: PathBuf,
    /// Address to listen on (loopback by default: reachable from this machine only).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    /// Port to listen on (0: any free port, printed when listening).
    #[arg(long, default_value_t = 8089)]
    pub port: u16,
    /// Sequences generated at once, 1..=256; each takes a step in turn.
    #[arg(long, default_value_t = 1, value_parser = count::<usize>(1, 256))]
    pub parallel: usize,
    /// Requests waiting for a slot, 0..=65536; one more is refused with 503 and Retry-After.
    #[arg(long, default_value_t = 64, value_parser = count::<usize>(0, 1 << 16))]
    pub queue: usize,
    /// Positions a sequence may take, prompt and answer together (default and most: the
    /// model's context).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", value_parser = count::<usize>(1, u32::MAX as u64))]
    pub ctx_size: Option<usize>,
    /// Every route but /health and the chat page at / needs `Authorization: Bearer KEY` (also
    /// TARFA_API_KEY); the page asks for the key and sends it.
    #[arg(long, env = "TARFA_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// No chat page at / (then / is an unknown route, 404).
    #[arg(long)]
    pub no_webui: bool,
    /// Largest request body in bytes, 1..=268435456; larger is refused with 413.
    #[arg(long, default_value_t = 8 << 20, value_parser = count::<usize>(1, 1 << 28))]
    pub max_body: usize,
    /// Connections open at once, 1..=65536; one more is answered 503 (Retry-After) and closed.
    /// Each holds a file descriptor: keep it under `ulimit -n`.
    #[arg(long, default_value_t = 512, value_parser = count::<usize>(1, 1 << 16))]
    pub max_connections: usize,
    /// Seconds a request's headers may take to arrive, and then its body, 1..=3600; a slower
    /// client (one that opens connections and sends nothing, or a byte at a time) loses its
    /// connection (a late body is answered 408).
    #[arg(long, value_name = "SECONDS", default_value_t = 30, value_parser = count::<u64>(1, 3600))]
    pub read_timeout: u64,
    /// Largest max_tokens a request may ask for, 1..=1048576.
    #[arg(long, default_value_t = 1 << 16, value_parser = count::<usize>(1, 1 << 20))]
    pub max_tokens_limit: usize,
    /// The model's name in /v1/models and responses (default: the directory's name).
    #[arg(long)]
    pub alias: Option<String>,
    /// Finished sequences kept so a later prompt sharing a prefix computes only the rest,
    /// 0..=1024 (0: no prompt cache). Each holds its KV cache (and DeltaNet state) in memory.
    /// Reusing a prefix changes no bit.
    #[arg(long, default_value_t = 8, value_parser = count::<usize>(0, 1024))]
    pub prompt_cache: usize,
    /// Where and how the model runs.
    #[command(flatten)]
    pub model: ModelFlags,
}

/// `tarfa chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The model directory (a `tarfa convert` output with a chat template).
    pub dir: PathBuf,
    /// A system message that opens the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens an answer may take at most (default: until the end-of-sequence token or the
    /// context).
    #[arg(short = 'n', long = "max-tokens", value_parser = count::<usize>(1, u32::MAX as u64))]
    pub max_tokens: Option<usize>,
    /// Positions the conversation may take (default and most: the model's context).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", value_parser = count::<usize>(1, u32::MAX as u64))]
    pub ctx_size: Option<usize>,
    /// Sampling temperature, 0..=100 (0, the default: greedy).
    #[arg(long = "temp", alias = "temperature", default_value_t = 0.0, value_parser = real(0.0, 100.0, false))]
    pub temperature: f64,
    /// Keep the k likeliest tokens when sampling (0: all).
    #[arg(long, default_value_t = 0, value_parser = count::<usize>(0, 1 << 24))]
    pub top_k: usize,
    /// Keep the likeliest tokens whose probability reaches this when sampling, above 0, at
    /// most 1.
    #[arg(long, default_value_t = 1.0, value_parser = real(0.0, 1.0, true))]
    pub top_p: f64,
    /// Keep the tokens at least this share of the likeliest's probability, 0..=1.
    #[arg(long, default_value_t = 0.0, value_parser = real(0.0, 1.0, false))]
    pub min_p: f64,
    /// The sampling generator's seed (default: from the clock, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Variables for the chat template, as a JSON object (e.g. '{"enable_thinking": false}').
    #[arg(long, value_name = "JSON")]
    pub chat_template_kwargs: Option<String>,
    /// Where and how the model runs.
    #[command(flatten)]
    pub model: ModelFlags,
}

/// How a model runs: threads, experts, I/O, kernels and device — the flags `run` and `serve`
/// share.
#[derive(Debug, clap::Args)]
pub struct ModelFlags {
    /// Compute threads, 1..=1024 (default: one per core).
    #[arg(short = 't', long, value_parser = count::<usize>(1, MAX_THREADS))]
    pub threads: Option<usize>,
    /// Experts: `stream` (read from disk when selected, a RAM cache of --cache-gib) or `resident`
    /// (all read and checked at start).
    #[arg(long, default_value = "stream")]
    pub experts: String,
    /// RAM expert cache for `--experts stream`, in GiB, 0..=1048576 (0: none).
    #[arg(long, default_value_t = 0.0, value_parser = real(0.0, MAX_GIB, false))]
    pub cache_gib: f64,
    /// I/O backend: auto, io_uring, pread, mmap (TARFA_IO_BACKEND).
    #[arg(long)]
    pub backend: Option<String>,
    /// Expert reads in flight, 0..=4096 (0: twice the model's top-k, at least 8); more than
    /// the model's largest layer has experts is reduced to that, with a warning.
    #[arg(long, default_value_t = 0, value_parser = count::<u32>(0, 4096))]
    pub qd: u32,
    /// Ring slots, each the size of the largest expert, 0..=65536 (0: the queue depth + 8, with
    /// --qd or without); more than the largest layer's experts + 16 is reduced to that, with a
    /// warning.
    #[arg(long, default_value_t = 0, value_parser = count::<u32>(0, 1 << 16))]
    pub ring_slots: u32,
    /// Kernel path: auto, scalar, avx2, avx512 (TARFA_ISA). Any choice gives the same bits.
    #[arg(long)]
    pub isa: Option<String>,
    /// Run the prompt token by token instead of as one batch (the same bits; for testing).
    #[arg(long)]
    pub no_batch_prompt: bool,
    /// Prompt chunk size, 1..=1048576 (default: the whole prompt as one batch): a longer prompt
    /// runs in batches of N tokens, each after the one before (llama.cpp's -b). Any N gives the
    /// same bits.
    #[arg(short = 'b', long = "batch", value_name = "N", value_parser = count::<usize>(1, 1 << 20))]
    pub batch: Option<usize>,
    /// Where the model runs: `cpu`, `cuda` (the GPU: the whole forward pass of a Qwen3-MoE,
    /// GLM-4.5-MoE or Mixtral model that fits, else the routed experts and matrix products for
    /// the CPU's layers; an error if this build or machine has none) or `auto` (the GPU when
    /// usable). The same bits on every device; the GPU flags below apply only with it.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// VRAM for the model, in GiB (default: the free VRAM). With the whole forward pass on the
    /// GPU, it bounds the weights and DeltaNet state kept there (the activations, KV caches and
    /// the CUDA context take about 1 GiB more), and a model that does not fit keeps the routed
    /// experts of its first layers on the CPU, as few as needed (see --n-cpu-moe). Offloading
    /// from the CPU's layers (a family or weight the whole pass does not take,
    /// --gpu-offload-only), it is the expert cache's size (less 1 GiB by default; 0: copy each
    /// expert for each use), resident trunk matrices taken out of it; a trunk matrix that does
    /// not fit runs on the CPU. The same bits either way. 0..=1048576.
    #[arg(long, value_parser = real(0.0, MAX_GIB, false))]
    pub vram_gib: Option<f64>,
    /// With the whole forward pass on the GPU: compute the routed experts of layers 0..N on the
    /// CPU (read from RAM or disk per --experts; a dense layer among them has none), everything
    /// else on the GPU — llama.cpp's --n-cpu-moe, counted as it counts. Default: as few as the
    /// VRAM needs (0 when the model fits); more layers than the model has, or too few for the
    /// VRAM, is an error. The same bits for every N.
    #[arg(long, value_name = "N")]
    pub n_cpu_moe: Option<usize>,
    /// Share of the experts computed on the GPU (0..=1, fixed per expert; the rest on the CPU;
    /// default 1).
    #[arg(long, value_parser = real(0.0, 1.0, false))]
    pub gpu_experts: Option<f64>,
    /// With --device cuda: keep the trunk's and layers' matrix products (attention projections,
    /// routers, dense and shared MLPs, lm_head) on the CPU; by default they run on the GPU too,
    /// their weights resident in VRAM.
    #[arg(long)]
    pub cpu_trunk: bool,
    /// With --device cuda: keep the layers on the CPU and offload only the experts and matrix
    /// products to the GPU, even for a model whose whole forward pass the GPU can run. By
    /// default a BF16/F32 Qwen3-MoE, GLM-4.5-MoE or Mixtral model that fits in VRAM runs wholly
    /// on the GPU (attention, norms, router, experts, combine; the activations stay there). The
    /// same bits either way.
    #[arg(long)]
    pub gpu_offload_only: bool,
    /// With the whole forward pass on the GPU: launch each token's kernels one by one instead of
    /// replaying a captured CUDA graph (the same kernels and bits; for measuring).
    #[arg(long)]
    pub no_cuda_graphs: bool,
}

/// Flags of sampling decoders (llama.cpp's, vLLM's), which `tarfa run` does not take: it
/// decodes greedily (the highest logit; ties to the lowest id), so each is refused by name
/// rather than suggested as the nearest flag of another meaning. `--temp 0`, greedy in
/// llama.cpp, is taken.
#[derive(Debug, Default, clap::Args)]
pub struct SamplingFlags {
    #[arg(
        long = "temp",
        alias = "temperature",
        hide = true,
        allow_hyphen_values = true
    )]
    pub temperature: Option<String>,
    #[arg(long = "top-p", hide = true, allow_hyphen_values = true)]
    pub top_p: Option<String>,
    #[arg(long = "top-k", hide = true, allow_hyphen_values = true)]
    pub top_k: Option<String>,
    #[arg(long = "min-p", hide = true, allow_hyphen_values = true)]
    pub min_p: Option<String>,
    #[arg(long = "seed", hide = true, allow_hyphen_values = true)]
    pub seed: Option<String>,
    #[arg(long = "repeat-penalty", hide = true, allow_hyphen_values = true)]
    pub repeat_penalty: Option<String>,
}

impl SamplingFlags {
    /// The first sampling flag given, as its name and value (`--temp 0` is greedy: not one).
    pub fn given(&self) -> Option<(&'static str, &str)> {
        let greedy_temp = |t: &str| t.trim().parse::<f64>().is_ok_and(|v| v == 0.0);
        [
            (
                "--temp",
                self.temperature.as_deref().filter(|t| !greedy_temp(t)),
            ),
            ("--top-p", self.top_p.as_deref()),
            ("--top-k", self.top_k.as_deref()),
            ("--min-p", self.min_p.as_deref()),
            ("--seed", self.seed.as_deref()),
            ("--repeat-penalty", self.repeat_penalty.as_deref()),
        ]
        .into_iter()
        .find_map(|(name, v)| Some((name, v?)))
    }
}

impl Cli {
    /// The old spelling of a renamed flag (one meaning per flag name across commands) moved to
    /// its new name, with a warning on stderr.
    pub fn settle_renamed(&mut self) {
        let warn = |cmd: &str, old: &str, new: &str, why: &str| {
            eprintln!("warning: {cmd} {old} is now {new} ({why}); {old} will go");
        };
        match &mut self.command {
            Command::BenchDecode(a) => {
                if let Some(t) = a.old_tokens.take() {
                    warn(
                        "bench-decode",
                        "--tokens",
                        "-n/--max-tokens",
                        "as in run, where --tokens gives the prompt's ids",
                    );
                    a.tokens = t;
                }
            }
            Command::BenchIo(a) => {
                if let Some(t) = a.old_tokens.take() {
                    warn(
                        "bench-io",
                        "--tokens",
                        "--steps",
                        "run's --tokens gives the prompt's ids",
                    );
                    a.tokens = Some(t);
                }
                if let Some(v) = a.old_verify.take() {
                    warn(
                        "bench-io",
                        "--verify",
                        "--check",
                        "convert's --verify re-reads what it wrote",
                    );
                    a.verify = v;
                }
            }
            _ => {}
        }
    }
}

/// `tarfa bench-io`.
#[derive(Debug, clap::Args)]
pub struct BenchIoArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// Backends to sweep, comma-separated (io_uring, pread, mmap).
    #[arg(long, default_value = "io_uring,pread,mmap")]
    pub backend: String,
    /// Queue depths to sweep, comma-separated.
    #[arg(long, default_value = "1,32,64,256")]
    pub qd: String,
    /// BLAKE3 check of each expert: on, off, or both (one row each).
    #[arg(long = "check", default_value = "both", value_name = "on|off|both")]
    pub verify: String,
    /// The old name of --check (`--verify` is convert's re-read of its output): taken, with a
    /// warning.
    #[arg(
        long = "verify",
        value_name = "on|off|both",
        hide = true,
        conflicts_with = "verify"
    )]
    pub old_verify: Option<String>,
    /// Experts per layer per step, 1..=1024 (default: the config's num_experts_per_tok, else 8).
    #[arg(long, value_parser = count::<u32>(1, 1024))]
    pub top_k: Option<u32>,
    /// Decode steps per run (the top-k of every layer each), at least 1, at most 2^32 unless
    /// --budget bounds the sweep's time (default: enough for --gib).
    #[arg(long = "steps", value_parser = count::<u64>(1, u64::MAX))]
    pub tokens: Option<u64>,
    /// The old name of --steps (`--tokens` is `run`'s prompt ids): taken, with a warning.
    #[arg(long = "tokens", value_name = "N", hide = true, conflicts_with = "tokens", value_parser = count::<u64>(1, u64::MAX))]
    pub old_tokens: Option<u64>,
    /// GiB read per run when --steps is not given (default: the model's expert bytes, at most
    /// 1 GiB); above 0, at most 1024 unless --budget bounds the sweep's time.
    #[arg(long, value_parser = real(0.0, f64::MAX, true))]
    pub gib: Option<f64>,
    /// Seconds for the whole sweep, shared equally by its timed runs (fio's included); a run
    /// whose share is spent ends after the token it is on, and says so. Default: 60 when the
    /// work is the default, none when --steps or --gib is given. 0..=1000000; 0: none.
    #[arg(long, value_name = "SECS", value_parser = real(0.0, 1e6, false))]
    pub budget: Option<f64>,
    /// Ring slots, 1..=65536 (default: the queue depth + 16).
    #[arg(long, value_parser = count::<u32>(1, 1 << 16))]
    pub slots: Option<u32>,
    /// Runs of each measurement, 1..=1000; the median is printed.
    #[arg(long, default_value_t = 3, value_parser = count::<usize>(1, 1000))]
    pub runs: usize,
    /// Seed of the random expert choice.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Do not drop the page cache before each run (dropping needs root).
    #[arg(long)]
    pub no_drop_caches: bool,
    /// Do not run fio.
    #[arg(long)]
    pub no_fio: bool,
    /// Print CSV on stdout instead of the table.
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
    /// Print one JSON document on stdout (settings and every row) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also stream each landed, checked expert on to GPU 0 (ring registered with
    /// cuMemHostRegister, async copies): disk→VRAM next to disk→pinned, their ratio, and the
    /// pure host-to-device rate of the registered ring. Needs a build with `--features cuda`.
    #[arg(long)]
    pub to_gpu: bool,
    /// With --to-gpu: whole-ring host-to-device copies timed for the pure H2D figure, 1..=100000.
    #[arg(long, default_value_t = 20, value_parser = count::<usize>(1, 100_000))]
    pub h2d_repeats: usize,
    /// No progress output (each run with an ETA, on stderr).
    #[arg(short, long)]
    pub quiet: bool,
}

/// `tarfa fetch`.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {
    /// An http(s) URL, `hf://owner/repo[@revision]/path`, or a local path: a `.gguf` (any part of
    /// a split set), a `.safetensors` file, a `model.safetensors.index.json` or a checkpoint
    /// directory. HF_ENDPOINT replaces the hub's address (https://huggingface.co). HF_TOKEN is
    /// sent as a bearer token only to the hub's scheme, host and port, only over https unless
    /// TARFA_TOKEN_OVER_HTTP=1, and never to a host it redirects to; any other URL gets none.
    pub source: String,
    /// Take the MTP (multi-token prediction) head: GGUF blocks past block_count −
    /// nextn_predict_layers and `mtp.*`; safetensors `model.layers.{num_hidden_layers}.*` and `mtp.*`.
    #[arg(long)]
    pub mtp: bool,
    /// Also take tensors whose names match GLOB (`*`, `?`); repeatable.
    #[arg(long = "tensors", value_name = "GLOB")]
    pub tensors: Vec<String>,
    /// Print what would be fetched and how many bytes; fetch nothing.
    #[arg(long)]
    pub list: bool,
    /// The file to write (published atomically; a partial file and journal sit beside it
    /// meanwhile). Never a file of a local source, nor a link to one: refused before anything
    /// is written.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Parallel range requests, 1..=64.
    #[arg(long, default_value_t = 4, value_parser = count::<usize>(1, 64))]
    pub jobs: usize,
    /// Bytes per range request (K, M, G suffixes).
    #[arg(long, default_value = "8M")]
    pub chunk_size: String,
    /// Attempts per request on 5xx, timeouts, dropped connections and bodies slower than the
    /// low-speed limit, 0..=1000.
    #[arg(long, default_value_t = 8, value_parser = count::<u32>(0, 1000))]
    pub retries: u32,
    /// Delay before the first retry, in milliseconds (doubled each time, with jitter), 0..=600000.
    #[arg(long, default_value_t = 300, value_parser = count::<u64>(0, 600_000))]
    pub retry_delay_ms: u64,
    /// Seconds to wait for a connection, a response, or the next bytes of a body, 1..=86400.
    #[arg(long, default_value_t = 30, value_parser = count::<u64>(1, 86_400))]
    pub timeout: u64,
    /// Low-speed limit, bytes per second (K, M suffixes; 0: none): a response body slower than
    /// this over --speed-time seconds is dropped and retried, as curl's --speed-limit.
    #[arg(long, default_value = "1K", value_name = "BYTES")]
    pub speed_limit: String,
    /// The period the low-speed limit is averaged over, seconds, 1..=86400.
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = count::<u64>(1, 86_400))]
    pub speed_time: u64,
    /// No progress bar.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the summary (or the --list) as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `tarfa verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The model directory.
    pub dir: PathBuf,
    /// The source checkpoint directory (or a GGUF file, standing for its directory), to compare
    /// every region with the bytes it came from.
    #[arg(long)]
    pub source: Option<PathBuf>,
    /// Read only these layers' files in full (inclusive, e.g. `0-11`); every file's structure,
    /// the manifest and the model's completeness are still checked. Selecting no layer of the
    /// model is an error.
    #[arg(long, value_name = "A-B")]
    pub layers: Option<String>,
    /// Read only group n of N groups of files (e.g. `1/10`); runs with n = 1..N read all. A group
    /// with no file (N above the number of files) is an error.
    #[arg(long, value_name = "n/N")]
    pub sample: Option<String>,
    /// Read through the page cache instead of with O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// No progress output.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `tarfa convert`.
#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// The checkpoint directory, or a `.gguf` file (for a split set, any part).
    pub source: PathBuf,
    /// The model directory to write (created if missing): new, empty, or this source's own
    /// earlier output. Never the source's directory (a GGUF's included); a directory holding any
    /// file tarfa did not write is refused, naming it.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Inclusive layer range to convert, e.g. `0-11` or `7` (default: every layer). The trunk
    /// (embeddings, final norm, head) is written by every run that lacks it.
    #[arg(long, value_name = "A-B")]
    pub layers: Option<String>,
    /// Write through the page cache instead of with O_DIRECT.
    #[arg(long)]
    pub buffered: bool,
    /// Files converted at once, 0..=64 (0, the default: half the cores, at most 4). The output
    /// bytes are the same for any value.
    #[arg(short, long, default_value_t = 0, hide_default_value = true, value_parser = count::<usize>(0, 64))]
    pub jobs: usize,
    /// No progress output (errors and the summary still print).
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// After converting, verify what was emitted against the source: every byte re-read with
    /// O_DIRECT, every hash recomputed, every region compared with its source bytes. With
    /// --layers it checks that piece: the layers not asked for are not reported missing.
    #[arg(long)]
    pub verify: bool,
}

/// `tarfa inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// A `.jnf` file, a model directory holding `manifest.json`, or a `.gguf` file (for a split
    /// set, any part: the others are opened beside it).
    pub path: PathBuf,
    /// Print JSON on stdout instead of the readable summary.
    #[arg(long)]
    pub json: bool,
    /// List every region of each file (the default for a single file, not for a directory).
    #[arg(long)]
    pub regions: bool,
}

/// The parser: [`Cli`]'s, with the examples of `bench-decode` (whose doc comment is kept as it
/// is) added here.
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    Cli::command().mut_subcommand("bench-decode", |c| {
        c.after_long_help(
            "Examples:\n  tarfa bench-decode model/\n  tarfa bench-decode model/ --modes resident --runs 5 -n 64 --json\n  tarfa bench-decode model/ --modes resident,gpu -n 128   # a cuda build",
        )
    })
}
