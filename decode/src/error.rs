//! Why a model could not be loaded or decoded. Each variant names what and where.

use std::path::PathBuf;

/// A decode error.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// A JNF file broke a rule of the format, or could not be read.
    #[error(transparent)]
    Format(#[from] tarfa_format::Error),
    /// Streaming an expert failed: a read error, or bytes that do not hash to the record.
    #[error(transparent)]
    Stream(#[from] tarfa_runtime::StreamError),
    /// The GPU could not be used or failed.
    #[error("GPU: {0}")]
    Gpu(#[from] tarfa_runtime::CudaError),
    /// A file of the model directory is not the one its manifest records.
    #[error("{path}: not the file the model's manifest names: {detail}; the directory was changed after conversion (tarfa verify names every fault)")]
    NotInManifest {
        /// The file.
        path: PathBuf,
        /// What differs.
        detail: String,
    },
    /// The architecture config lacks a key, or holds a value this decoder cannot honour.
    #[error("config.json: {key}: {detail}")]
    Config {
        /// The config key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// The model's family has no decoder (yet).
    #[error("no decoder for model_type {model_type:?} (tarfa runs: {supported})")]
    UnsupportedFamily {
        /// `model_type` of the config.
        model_type: String,
        /// The families this build decodes.
        supported: String,
    },
    /// A tensor the family needs is not in the model directory.
    #[error("tensor {name} is missing from the model directory (layer files and trunk.jnf)")]
    MissingTensor {
        /// Its name.
        name: String,
    },
    /// A tensor has the wrong shape or an element type the decoder does not compute with.
    #[error("tensor {name}: {detail}")]
    BadTensor {
        /// Its name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// An expert's regions are not what the family needs.
    #[error("expert (layer {layer}, expert {expert}): {detail}")]
    BadExpert {
        /// Layer.
        layer: u32,
        /// Expert.
        expert: u32,
        /// What is wrong.
        detail: String,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (vocab_size {vocab})")]
    TokenOutOfRange {
        /// The id.
        id: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// A position past what the decoder was asked to hold.
    #[error("position {pos} is past the context limit {limit}")]
    ContextFull {
        /// The position.
        pos: usize,
        /// The limit.
        limit: usize,
    },
    /// A system call on a file failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// Invalid options (thread count, instruction set, cache size).
    #[error("{0}")]
    Options(String),
    /// A GGUF-sourced model's key/values (kept in the manifest) lack a key, hold a value this
    /// decoder cannot honour, or name an architecture it does not run.
    #[error("GGUF key {key}: {detail}")]
    Gguf {
        /// The GGUF key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// Result of decoding.
pub type Result<T> = std::result::Result<T, DecodeError>;
