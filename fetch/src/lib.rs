//! tarfa-fetch: splice chosen tensors — above all a model's MTP (multi-token prediction) head —
//! out of a remote or local checkpoint, fetching only their bytes with HTTP range requests.
//!
//! `tarfa fetch SOURCE --mtp -o draft.gguf` reads each GGUF header by range through the same
//! reader as local files ([`tarfa_gguf::header::read_header_from`] over an HTTP
//! [`ByteSource`](tarfa_gguf::ByteSource), [`http::RemoteFile`]), finds the MTP tensors, and
//! writes a GGUF holding just them: every key/value of the source except `split.*`, tensor
//! bytes identical, offsets laid out as ggml requires. Safetensors checkpoints (one file, or
//! shards with `model.safetensors.index.json`) give a safetensors file the same way.
//!
//! - [`location`]: SOURCE (http(s) URL, `hf://owner/repo[@rev]/path`, local path) and siblings.
//! - [`http`]: checked range requests, retries with backoff and jitter, `If-Range`, the token
//!   sent only to the hub (over https unless opted in) and never across a redirect, traffic
//!   counters.
//! - [`select`] and [`plan`]: what to fetch and where each byte goes.
//! - [`safetensors`]: the range-read safetensors header, checked by tarfa's one parser
//!   (`tarfa_format::safetensors`).
//! - [`transfer`]: parallel chunks, the resume journal, read-back check, atomic publish.
//!
//! # What the draft keeps: `block_count` and `nextn_predict_layers`
//!
//! The draft keeps `{arch}.block_count` and `{arch}.nextn_predict_layers` exactly as in the
//! source, and the MTP blocks keep their numbers (`blk.46.*` stays `blk.46.*`). That is what
//! llama.cpp's loaders expect of an MTP-only file: they take `n_layer = block_count −
//! nextn_predict_layers`, probe `blk.{n_layer}.nextn.eh_proj.weight` to see that the MTP head is
//! there, and treat a file without `blk.0.attn_norm.weight` as "MTP only" (trunk tensors not
//! required; the draft borrows them from its target, loaded with `-md`). Renumbering the blocks to
//! 0 or shrinking `block_count` would break both probes. The trunk tensors that some loaders
//! still want (`token_embd.weight`, `output.weight`, `output_norm.weight`) are not added by
//! `--mtp`; add them with `--tensors`.
//!
//! # What "transferred" counts
//!
//! [`http::Traffic`] counts every response body byte received (failed attempts included): the
//! header windows (doubling from [`plan::GGUF_PROBE`], so at most twice a header) and the tensor
//! chunks. On a clean run that is the sources' header bytes, the chosen tensors' bytes, and the
//! header windows' overshoot.

#![forbid(unsafe_code)]

pub mod error;
pub mod http;
pub mod location;
pub mod plan;
pub mod safetensors;
pub mod select;
pub mod transfer;

use std::path::Path;
use std::sync::Arc;

pub use error::{FetchError, IndexFault, Result, SourceArgFault};
pub use http::{HttpClient, HttpConfig, LowSpeed, RetryPolicy, Traffic};
pub use location::{Location, DEFAULT_HF_ENDPOINT};
pub use plan::{OutputFormat, Plan, PlannedTensor};
pub use select::Selection;
pub use transfer::{Progress, Silent, TransferOptions, TransferReport};

/// What a Git LFS pointer file starts with.
pub const LFS_PREFIX: &[u8] = b"version https://git-lfs.github.com/spec";

/// Everything `tarfa fetch` is told.
#[derive(Clone, Debug)]
pub struct FetchOptions {
    /// What to take.
    pub selection: Selection,
    /// HTTP settings (token, retries, timeouts).
    pub http: HttpConfig,
    /// Chunking and parallelism.
    pub transfer: TransferOptions,
    /// `HF_ENDPOINT`, or the hub: where `hf://` resolves, and the one origin the token goes to.
    pub hf_endpoint: String,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            selection: Selection::default(),
            http: HttpConfig::default(),
            transfer: TransferOptions::default(),
            hf_endpoint: DEFAULT_HF_ENDPOINT.into(),
        }
    }
}

/// A session: one client (and its traffic counters) for the headers and the data.
#[derive(Debug)]
pub struct Fetcher {
    client: Arc<HttpClient>,
    opts: FetchOptions,
}

/// What a finished fetch did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchReport {
    /// Tensors written.
    pub tensors: usize,
    /// Exact bytes of those tensors.
    pub tensor_bytes: u64,
    /// Length of the output file.
    pub output_len: u64,
    /// Sum of the true header lengths of the sources read.
    pub source_header_bytes: u64,
    /// Response body bytes received over HTTP, headers and data, retries included.
    pub bytes_transferred: u64,
    /// HTTP requests sent.
    pub requests: u64,
    /// Retries after transient faults.
    pub retries: u64,
    /// The transfer's own figures (chunks, resumed bytes).
    pub transfer: TransferReport,
}

impl Fetcher {
    /// A fetcher with `opts`.
    pub fn new(opts: FetchOptions) -> Fetcher {
        let client = Arc::new(HttpClient::new(
            opts.http.clone(),
            &opts.hf_endpoint,
            Arc::new(Traffic::default()),
        ));
        Fetcher { client, opts }
    }

    /// The traffic counters so far.
    pub fn traffic(&self) -> &Traffic {
        self.client.traffic()
    }

    /// Read the headers of `source` and decide what to fetch (`--list` stops here).
    pub fn plan(&self, source: &str) -> Result<Plan> {
        let loc = Location::parse(source, &self.opts.hf_endpoint)?;
        Plan::build(&loc, &self.opts.selection, &self.client)
    }

    /// Move `plan`'s bytes into `out` (resuming a killed run), published atomically.
    pub fn fetch(&self, plan: &Plan, out: &Path, progress: &dyn Progress) -> Result<FetchReport> {
        let transfer = transfer::run(plan, out, &self.opts.transfer, progress)?;
        let t = self.client.traffic();
        Ok(FetchReport {
            tensors: plan.tensors.len(),
            tensor_bytes: plan.tensor_bytes(),
            output_len: plan.total_len,
            source_header_bytes: plan.source_header_bytes,
            bytes_transferred: t.body_bytes(),
            requests: t.requests(),
            retries: t.retries(),
            transfer,
        })
    }
}
