//! Typed errors. A response that is not exactly what was asked for is its own variant, never data;
//! [`FetchError::is_transient`] says which ones a retry may cure.

use std::io;
use std::path::PathBuf;

/// Result with this crate's [`FetchError`].
pub type Result<T, E = FetchError> = std::result::Result<T, E>;

/// What is wrong with a SOURCE argument.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceArgFault {
    /// An `hf://` source without owner, repository and path, or with a component that is empty,
    /// `.`, `..` or holds `?`, `#`, `%` or `\`.
    #[error("expected hf://owner/repo[@revision]/path/in/repo")]
    NotHfPath,
    /// `HF_ENDPOINT` is not an http(s) URL.
    #[error("HF_ENDPOINT must be an http(s) URL")]
    EndpointNotHttp,
    /// An http(s) URL without a usable origin.
    #[error("not a usable URL")]
    NotAUrl,
    /// A scheme other than http, https and hf.
    #[error("only http://, https:// and hf:// URLs, or local paths")]
    UnknownScheme,
    /// Neither a GGUF nor a safetensors file, index or directory.
    #[error("expected a .gguf file (any part of a split set), a .safetensors file, a model.safetensors.index.json or a checkpoint directory")]
    UnknownKind,
    /// The index named is not there.
    #[error("not found")]
    NotFound,
}

/// Why a fetch stopped.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// SOURCE is not an http(s) URL, an `hf://owner/repo[@rev]/path` or a local path we can read.
    #[error("{source_arg}: {fault}")]
    BadSource {
        /// The SOURCE argument.
        source_arg: String,
        /// What is wrong with it.
        fault: SourceArgFault,
    },
    /// A connection, timeout or transport failure (retried before it is reported).
    #[error("{url}: {source}")]
    Transport {
        /// The URL asked.
        url: String,
        /// The transport's error (a `ureq::Error` or an `io::Error`).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A status that is not the one asked for: 5xx and 429 are retried, 4xx are not.
    #[error("{url}: HTTP {status} to {request}{}", status_hint(*status))]
    Status {
        /// The URL asked.
        url: String,
        /// The status code.
        status: u16,
        /// What was asked.
        request: Request,
    },
    /// The server answered a range request with the whole file (200): it ignores `Range`.
    #[error("{url}: asked for bytes {start}-{end} and got HTTP 200 (the whole file): the server ignores range requests; refusing to download {} to take a slice", match len { Some(l) => format!("all {l} bytes"), None => "the whole file".into() })]
    RangeIgnored {
        /// The URL.
        url: String,
        /// First byte asked.
        start: u64,
        /// Last byte asked (inclusive).
        end: u64,
        /// The advertised length (`Content-Length`), if any.
        len: Option<String>,
    },
    /// The remote file is no longer the one whose header was read (ETag / Last-Modified / length
    /// changed): its bytes are never spliced with the earlier ones.
    #[error("{url}: the remote file changed during the fetch ({change}); nothing was spliced")]
    RemoteChanged {
        /// The URL.
        url: String,
        /// Which validator changed, old and new.
        change: RemoteChange,
    },
    /// A 206 whose framing is not exactly what was asked: a different `Content-Range`, a missing
    /// one, a body of another length, a `Content-Encoding`, an HTML page.
    #[error("{url}: bad response to bytes {start}-{end}: {fault}")]
    BadResponse {
        /// The URL.
        url: String,
        /// First byte asked.
        start: u64,
        /// Last byte asked (inclusive).
        end: u64,
        /// What was wrong.
        fault: ResponseFault,
    },
    /// The body ended before the length the response announced (connection dropped).
    #[error("{url}: body of bytes {start}-{end} ended after {got} of {want} bytes")]
    ShortBody {
        /// The URL.
        url: String,
        /// First byte asked.
        start: u64,
        /// Last byte asked (inclusive).
        end: u64,
        /// Bytes received.
        got: u64,
        /// Bytes announced.
        want: u64,
    },
    /// A body arrived slower than the low-speed limit for a whole period (retried).
    #[error("{url}: bytes {start}-{end} arrived at {rate} bytes/s, below the low-speed limit of {limit} bytes/s over {secs} s (--speed-limit, --speed-time)")]
    TooSlow {
        /// The URL.
        url: String,
        /// First byte asked.
        start: u64,
        /// Last byte asked (inclusive).
        end: u64,
        /// The rate over the last period, bytes per second.
        rate: u64,
        /// The limit, bytes per second.
        limit: u64,
        /// The period, seconds.
        secs: f64,
    },
    /// What sits at the URL is a Git LFS pointer or an HTML page, not the model file.
    #[error("{url}: {what}, not a model file{}", hint.map_or(String::new(), |h| format!("\nhint: {h}")))]
    NotAModel {
        /// The URL or path.
        url: String,
        /// A Git LFS pointer or an HTML page.
        what: NotModelKind,
        /// Why it is there and what to do, where that is known.
        hint: Option<NotModelHint>,
    },
    /// Too many redirects, or a redirect without a usable `Location`.
    #[error("{url}: {fault}")]
    Redirect {
        /// The URL.
        url: String,
        /// What went wrong.
        fault: RedirectFault,
    },
    /// The GGUF header broke a rule (or could not be read).
    #[error(transparent)]
    Gguf(#[from] tarfa_gguf::Error),
    /// A safetensors header broke a rule of `tarfa_format::safetensors`.
    #[error("{file}: {fault}")]
    BadHeader {
        /// The URL or path.
        file: String,
        /// The rule broken (not a `source`: its text is already in this one).
        fault: tarfa_format::safetensors::HeaderFault,
    },
    /// A safetensors index or config.json broke a rule.
    #[error("{file}: {fault}")]
    BadIndex {
        /// The URL or path.
        file: String,
        /// The rule broken.
        fault: IndexFault,
    },
    /// Nothing to fetch: no MTP tensors, or no tensor matched the globs.
    #[error("{source_arg}: {why}")]
    NothingSelected {
        /// The SOURCE.
        source_arg: String,
        /// Why, with what the model declares.
        why: SelectFault,
    },
    /// A local file operation failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// A local file to read is not a regular file (a FIFO, a device, a directory), is over its
    /// size limit, or cannot be opened.
    #[error(transparent)]
    File(#[from] tarfa_format::fsio::FsError),
    /// The output (or its partial file or journal) is, or links to, a file of the source
    /// checkpoint: publishing would replace the source. Refused before anything is written.
    #[error("{}: this is the source file {} (same device and inode); tarfa fetch never writes over its input: give -o a new path", path.display(), input.display())]
    OutputIsInput {
        /// The path tarfa would write (`-o`, or the partial file or journal beside it).
        path: PathBuf,
        /// The source file it names.
        input: PathBuf,
    },
    /// Another `tarfa fetch` holds the partial file.
    #[error("{}: another tarfa fetch is writing this file", path.display())]
    Locked {
        /// The partial file.
        path: PathBuf,
    },
    /// `-o` names a directory (or ends with `/`): the output is one file.
    #[error("{}: -o names a directory; tarfa fetch writes one file: give its name (e.g. {}/mtp.gguf)", path.display(), path.display())]
    OutputIsDirectory {
        /// The `-o` argument.
        path: PathBuf,
    },
    /// The output's filesystem has not the room for what is left to fetch.
    #[error("{}: not enough free space: needs {needed} bytes ({left} left to write of the {total}-byte output, and {margin} kept free so that the filesystem is never filled to its last byte), {available} available; nothing was fetched (free space, or give -o on another filesystem)", dir.display())]
    NoSpace {
        /// The directory the output is written in.
        dir: PathBuf,
        /// Bytes needed: `left + margin`.
        needed: u64,
        /// The output's length.
        total: u64,
        /// Bytes of it not yet on disk (a partial file from a killed run holds the rest).
        left: u64,
        /// Bytes kept free beyond those.
        margin: u64,
        /// Bytes available.
        available: u64,
    },
    /// The written file's header does not place the tensors where the plan put them.
    #[error("{}: the written header does not place the tensors where the plan did", path.display())]
    BadOutput {
        /// The partial file.
        path: PathBuf,
    },
    /// A finished chunk's bytes on disk no longer hash to what the journal recorded when it landed.
    #[error("{}: bytes {start}..{end} no longer match the BLAKE3 recorded when they were fetched", path.display())]
    Corrupt {
        /// The partial file.
        path: PathBuf,
        /// Start of the chunk in the output.
        start: u64,
        /// End of the chunk in the output.
        end: u64,
    },
}

impl FetchError {
    /// True for faults a retry may cure: transport failures, dropped bodies, 5xx, 408 and 429.
    pub fn is_transient(&self) -> bool {
        match self {
            FetchError::Transport { .. }
            | FetchError::ShortBody { .. }
            | FetchError::TooSlow { .. } => true,
            FetchError::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            _ => false,
        }
    }

    /// True when the input, not the machine or the network, is at fault: a broken header, an
    /// LFS pointer, nothing to fetch, a remote that changed or answers wrongly.
    pub fn is_invalid_input(&self) -> bool {
        match self {
            FetchError::Gguf(e) => e.violation().is_some(),
            FetchError::BadIndex { .. }
            | FetchError::BadHeader { .. }
            | FetchError::NotAModel { .. }
            | FetchError::NothingSelected { .. }
            | FetchError::RemoteChanged { .. } => true,
            FetchError::File(e) => !matches!(e, tarfa_format::fsio::FsError::Io { .. }),
            _ => false,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| FetchError::Io { path, op, source }
    }

    /// Wrap as an `io::Error`, for the [`tarfa_gguf::ByteSource`] interface.
    pub(crate) fn into_io(self) -> io::Error {
        io::Error::other(self)
    }

    /// Recover a [`FetchError`] carried through an `io::Error` or a GGUF I/O error.
    pub(crate) fn from_gguf(e: tarfa_gguf::Error) -> FetchError {
        match e {
            tarfa_gguf::Error::Io {
                source,
                file,
                offset,
                len,
            } => match source.downcast::<FetchError>() {
                Ok(f) => f,
                Err(source) => FetchError::Gguf(tarfa_gguf::Error::Io {
                    file,
                    offset,
                    len,
                    source,
                }),
            },
            tarfa_gguf::Error::Invalid { file, violation } => match violation {
                tarfa_gguf::Violation::LfsPointer => FetchError::NotAModel {
                    url: file,
                    what: NotModelKind::LfsPointer,
                    hint: Some(NotModelHint::ClonedWithoutLfs),
                },
                tarfa_gguf::Violation::HtmlPage => FetchError::NotAModel {
                    url: file,
                    what: NotModelKind::HtmlPage,
                    hint: Some(NotModelHint::BlobPage),
                },
                violation => FetchError::Gguf(tarfa_gguf::Error::Invalid { file, violation }),
            },
            e => FetchError::Gguf(e),
        }
    }

    /// Recover a [`FetchError`] carried through an `io::Error`.
    pub(crate) fn from_io(e: io::Error, path: &std::path::Path, op: &'static str) -> FetchError {
        match e.downcast::<FetchError>() {
            Ok(f) => f,
            Err(source) => FetchError::Io {
                path: path.to_path_buf(),
                op,
                source,
            },
        }
    }
}

/// Why a safetensors index (or `config.json`) was refused: one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexFault {
    /// Not JSON.
    #[error("not valid JSON: {detail}")]
    NotJson {
        /// The JSON parser's message (line and column).
        detail: String,
    },
    /// No `weight_map` object.
    #[error("no weight_map object")]
    NoWeightMap,
    /// A `weight_map` value that is not a plain relative file name.
    #[error("tensor {tensor}: shard {shard} is not a relative file name")]
    ShardName {
        /// The tensor.
        tensor: String,
        /// The value, as JSON.
        shard: String,
    },
    /// The index puts a tensor in a shard whose header lacks it.
    #[error("the index puts tensor {tensor} in this shard, but its header lacks it")]
    TensorMissing {
        /// The tensor.
        tensor: String,
    },
}

/// The `hint:` for a status, or nothing.
fn status_hint(status: u16) -> &'static str {
    match status {
        401 | 403 => {
            "\nhint: the file may be gated or private: accept its terms on the hub and set HF_TOKEN (sent only to the hub, https://huggingface.co or HF_ENDPOINT, and over plain http only with TARFA_TOKEN_OVER_HTTP=1)"
        }
        404 => "\nhint: check the repository, revision and path (hf://owner/repo[@revision]/path)",
        416 => "\nhint: the server says the range lies outside the file",
        _ => "",
    }
}

/// What a request asked, as a [`FetchError::Status`] names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Request {
    /// A GET of a whole small file.
    #[error("GET")]
    Get,
    /// A range request.
    #[error("bytes {start}-{end}")]
    Range {
        /// First byte.
        start: u64,
        /// Last byte (inclusive).
        end: u64,
    },
}

/// How a remote file showed it is no longer the one whose header was read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteChange {
    /// Another `ETag`.
    #[error("ETag was {was}, now {now}")]
    ETag {
        /// The first one.
        was: String,
        /// The one now.
        now: String,
    },
    /// Another `Last-Modified`.
    #[error("Last-Modified was {was}, now {now}")]
    LastModified {
        /// The first one.
        was: String,
        /// The one now.
        now: String,
    },
    /// Another length, in a 200's `Content-Length`.
    #[error("length was {was}, now {now}")]
    Length {
        /// The first one.
        was: u64,
        /// The one now.
        now: u64,
    },
    /// Another length, in a 206's `Content-Range`.
    #[error("length was {was}, Content-Range now says {now}")]
    RangeTotal {
        /// The first one.
        was: u64,
        /// The one now.
        now: u64,
    },
}

/// How a response's framing is not what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResponseFault {
    /// A small file over its limit.
    #[error("more than {limit} bytes; refusing a file this large here")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// A 206 without `Content-Range`.
    #[error("no Content-Range")]
    NoContentRange,
    /// A `Content-Range` that does not parse.
    #[error("Content-Range {value:?}")]
    BadContentRange {
        /// The header's value.
        value: String,
    },
    /// A `Content-Range` of another range than asked.
    #[error("Content-Range {value:?} is not the range asked")]
    OtherRange {
        /// The header's value.
        value: String,
    },
    /// A `Content-Length` other than the range's length.
    #[error("Content-Length {value} for a {want}-byte range")]
    ContentLength {
        /// The header's value.
        value: String,
        /// The range's length.
        want: u64,
    },
    /// A content coding other than identity.
    #[error("Content-Encoding {value} (asked for identity)")]
    ContentEncoding {
        /// The header's value.
        value: String,
    },
    /// An HTML page.
    #[error("an HTML page (text/html), not file bytes")]
    Html,
    /// More body than the range.
    #[error("the body is longer than the range asked")]
    BodyTooLong,
}

/// Why a redirect could not be followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedirectFault {
    /// A redirect status without `Location`.
    #[error("HTTP {status} without a Location")]
    NoLocation {
        /// The status.
        status: u16,
    },
    /// A `Location` that is not a usable URL.
    #[error("unusable Location {location:?}")]
    BadLocation {
        /// The header's value.
        location: String,
    },
    /// More redirects than followed.
    #[error("more than {max} redirects")]
    TooMany {
        /// Redirects followed.
        max: usize,
    },
}

/// What sits where a model file was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotModelKind {
    /// A Git LFS pointer.
    #[error("a Git LFS pointer")]
    LfsPointer,
    /// An HTML page.
    #[error("an HTML page")]
    HtmlPage,
}

/// Why a [`NotModelKind`] is there, and what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotModelHint {
    /// A repository cloned without its LFS objects, read over the network.
    #[error(
        "the repository was cloned without `git lfs pull`; use the hub's resolve URL or hf://"
    )]
    ClonedWithoutLfs,
    /// A local clone without its LFS objects.
    #[error("run `git lfs pull` in the clone")]
    LocalLfsPull,
    /// A hub page URL instead of the file's.
    #[error("a /blob/ page URL was given; use /resolve/ (or hf://owner/repo/path)")]
    BlobPage,
}

/// Why nothing was selected to fetch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectFault {
    /// Neither `--mtp` nor `--tensors`.
    #[error("nothing asked: give --mtp and/or --tensors GLOB")]
    NothingAsked,
    /// A `--tensors` glob that matches no tensor.
    #[error("--tensors {glob:?} matches no tensor")]
    GlobMatchesNone {
        /// The glob.
        glob: String,
    },
    /// A GGUF that declares MTP blocks, one of which has no tensors.
    #[error("{key} declares MTP blocks {first}..{last} but block {block} has no tensors: the converter dropped the MTP head (llama.cpp's DeepSeek converters do)")]
    MtpBlockEmpty {
        /// The `nextn_predict_layers` key.
        key: String,
        /// First MTP block.
        first: u64,
        /// Last MTP block.
        last: u64,
        /// The block without tensors.
        block: u64,
    },
    /// A GGUF with no MTP head.
    #[error("no MTP head: {key} is absent or 0 (or not below {arch}.block_count) and there are no mtp.* tensors")]
    NoGgufMtp {
        /// The `nextn_predict_layers` key.
        key: String,
        /// The architecture.
        arch: String,
    },
    /// A safetensors checkpoint with no MTP layers past `num_hidden_layers` and no `mtp.*`.
    #[error("no model.layers.{layers}.* (num_hidden_layers = {layers}) and no mtp.* tensors: this checkpoint has no MTP head")]
    NoMtpLayers {
        /// `num_hidden_layers`.
        layers: u64,
    },
    /// A safetensors checkpoint with no `mtp.*` and no config to tell the MTP layers.
    #[error("no mtp.* tensors, and no config.json with num_hidden_layers beside it to tell the MTP layers")]
    NoMtpNoConfig,
}
