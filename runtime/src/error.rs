//! Errors of the expert source. Each names what failed and where: layer, expert, file, offset.

use std::io;
use std::path::PathBuf;

/// Why streaming an expert failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The model directory or a layer file broke a JNF rule, or could not be read.
    #[error(transparent)]
    Format(#[from] tarfa_format::Error),
    /// A system call on a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Reading one expert's extent failed.
    #[error("reading expert (layer {layer}, expert {expert}) from {path} at offset {offset} (+{len} bytes): {source}")]
    Read {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// Its layer file.
        path: PathBuf,
        /// Extent offset in that file.
        offset: u64,
        /// Extent length.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// An expert's bytes do not hash to its recorded digest: the file changed on disk, or the
    /// read returned wrong bytes. The bytes are never handed out.
    #[error("expert (layer {layer}, expert {expert}) in {path} at offset {offset} (+{len} bytes): BLAKE3 mismatch, recorded {expected}, read {found}{}", region.as_ref().map(|r| format!("; region {r} differs")).unwrap_or_default())]
    Corrupt {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// Its layer file.
        path: PathBuf,
        /// Extent offset in that file.
        offset: u64,
        /// Extent length.
        len: usize,
        /// Recorded expert digest (BLAKE3), hex.
        expected: String,
        /// Digest of the bytes read, hex.
        found: String,
        /// The first region whose own BLAKE3 differs: its index, name and file offset.
        region: Option<String>,
    },
    /// A layer file whose root digest is not the one the manifest recorded.
    #[error("{path}: not the file the model's manifest names: its root digest {found} differs from the manifest's {recorded}; the directory was changed after conversion (tarfa verify names every fault)")]
    RootDigestMismatch {
        /// The layer file.
        path: String,
        /// Its root SHA-256 (hex).
        found: String,
        /// The manifest's (hex).
        recorded: String,
    },
    /// A layer file (with the manifest's digest) holding other layers than its name's.
    #[error("{path}: holds layers {first}..{} instead of layer {layer} alone", first + count)]
    WrongLayers {
        /// The layer file.
        path: String,
        /// Its first layer.
        first: u32,
        /// Its layer count.
        count: u32,
        /// The layer its manifest entry names.
        layer: u32,
    },
    /// A `(layer, expert)` the model does not have.
    #[error("the model has no expert (layer {layer}, expert {expert})")]
    NoSuchExpert {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
    },
    /// Every slot of the ring is held by the caller: nothing can be read until one is dropped.
    #[error("all {slots} ring slots are held by the caller; drop landed experts before asking for more, or open the source with more slots")]
    RingExhausted {
        /// Ring size.
        slots: u32,
    },
    /// The backend that was asked for (or required) cannot run here.
    #[error("{backend} backend unavailable: {reason}")]
    BackendUnavailable {
        /// The backend.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// A size that does not fit this platform's address space.
    #[error("{what} of {len} bytes does not fit in memory")]
    TooLarge {
        /// What.
        what: String,
        /// Its length.
        len: u64,
    },
    /// An environment variable names a backend there is not ([`crate::source::ENV_BACKEND`]).
    #[error("{var}={value:?} is not an I/O backend (expected auto, io_uring, pread or mmap)")]
    UnknownBackend {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// [`crate::SourceOptions::queue_depth`] is zero: nothing could ever be read.
    #[error("queue depth 0: at least one read must be in flight")]
    ZeroQueueDepth,
    /// Copying experts on to the GPU failed, or CUDA is absent.
    #[error(transparent)]
    Cuda(#[from] tarfa_cuda::CudaError),
}
