//! Converter errors: each names the file, and the tensor, layer or expert where there is one.

use std::path::PathBuf;

/// Why a conversion stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// A shard named by the index (or the single file) does not exist.
    #[error("{}: missing shard (listed in model.safetensors.index.json, not on disk)", path.display())]
    MissingShard {
        /// The shard's path.
        path: PathBuf,
    },
    /// A Git LFS pointer where weights should be.
    #[error("{}: this is a Git LFS pointer file, not the weights; fetch the real file (git lfs pull) and retry", path.display())]
    LfsPointer {
        /// The pointer file.
        path: PathBuf,
    },
    /// A shard whose header or length is wrong.
    #[error("{}: {detail}", path.display())]
    BadShard {
        /// The shard.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// One tensor's header entry is wrong.
    #[error("{}: tensor '{tensor}': {detail}", path.display())]
    BadTensor {
        /// The shard.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// What is wrong.
        detail: String,
    },
    /// The checkpoint as a whole cannot be converted (layout, names, config).
    #[error("{}: {detail}", path.display())]
    BadSource {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The experts of a layer do not form a complete, uniform grid.
    #[error("layer {layer}: {detail}")]
    BadExperts {
        /// The layer.
        layer: u32,
        /// What is wrong.
        detail: String,
    },
    /// A layer's experts need more index records than a JNF file can hold (spec §6:
    /// `MAX_REGIONS`, and `288·R + 96·E ≤ MAX_INDEX_LEN`); refused before anything is allocated
    /// for them or written.
    #[error("{file}: tensor '{tensor}' and the rest: {experts} experts, {regions} regions, {bytes} bytes of index records; a JNF file holds at most {} regions and {} index bytes", tarfa_format::validate::MAX_REGIONS, tarfa_format::validate::MAX_INDEX_LEN)]
    IndexTooLarge {
        /// The JNF file that would hold them (`trunk.jnf`, `layer-00007.jnf`).
        file: String,
        /// The first expert tensor of the layer (the first tensor of a file without experts).
        tensor: String,
        /// Experts claimed.
        experts: u64,
        /// Regions the layer's file would hold.
        regions: u64,
        /// Bytes of region and expert records, strings not counted.
        bytes: u64,
    },
    /// Not enough free space for the next file.
    #[error("{}: not enough free space for {what}: needs {needed} bytes ({file} for the file at most, {held} promised to files being written beside it, and {margin} kept free so that the filesystem is never filled to its last byte), {available} available; nothing of it was written (free space, or convert fewer layers with --layers)", dir.display())]
    NoSpace {
        /// The output directory.
        dir: PathBuf,
        /// What was about to be written.
        what: String,
        /// Bytes needed: `file + held + margin`.
        needed: u64,
        /// The file's own size, at most.
        file: u64,
        /// Bytes promised to files being written at the same time.
        held: u64,
        /// Bytes kept free beyond those.
        margin: u64,
        /// Bytes available.
        available: u64,
    },
    /// The output directory cannot be used.
    #[error("{}: {detail}", path.display())]
    BadOutput {
        /// The output directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// Layers an earlier run converted hold bytes the source no longer has (spec §8.2): the
    /// source changed under the same headers since. A model directory never mixes two versions
    /// of a source, so the run stops before writing anything.
    #[error("{}: its bytes changed since an earlier run converted layer {layer} from it: {file} holds tensor '{tensor}' as it was, and the source now has other bytes there (its header is the same, so only data changed: a fine-tune, a re-download). Layers in this directory made from the earlier bytes: {layers}. A model directory never mixes two versions of a source, so nothing was written: reconvert those layers too (include them in --layers, or convert without --layers), or convert into a new directory", shard.display())]
    SourceChanged {
        /// The source file whose bytes changed.
        shard: PathBuf,
        /// The earliest layer made from its earlier bytes.
        layer: u32,
        /// That layer's file.
        file: String,
        /// The first source tensor of it whose bytes differ now.
        tensor: String,
        /// Every layer found made from earlier bytes, as ranges (`0-3, 7`).
        layers: String,
    },
    /// Arguments that make no sense.
    #[error("{0}")]
    Usage(String),
    /// A file to read is not a regular file (a FIFO, a device, a directory), is over its size
    /// limit, or cannot be opened.
    #[error(transparent)]
    File(#[from] tarfa_format::fsio::FsError),
    /// A GGUF source breaks a GGUF rule, or reading it failed.
    #[error(transparent)]
    Gguf(#[from] tarfa_gguf::Error),
    /// Writing or reading JNF failed.
    #[error(transparent)]
    Format(#[from] tarfa_format::Error),
    /// An I/O call failed.
    #[error("{}: {op}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What we were doing.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
}
