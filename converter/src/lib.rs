//! # tarfa-converter
//!
//! Turns Hugging Face safetensors checkpoints into JNF v1 model directories, one layer range at a
//! time (`tarfa convert SRC -o OUT --layers A-B`):
//!
//! - [`source`]: reads shard headers strictly (`model.safetensors` or a sharded index) and streams
//!   tensor bytes by `pread`;
//! - [`plan`]: decides from names and shapes which bytes become which region: per-expert and fused
//!   expert layouts, plain layer tensors, MTP layers, the trunk;
//! - [`convert`]: writes trunk and layer files through [`tarfa_format::JnfWriter`], skips layers
//!   already present and checked, checks free space first, and publishes the manifest last;
//! - [`testkit`]: generated checkpoints for tests and benchmarks.
//!
//! GGUF sources are added by their own issue.

pub mod convert;
pub mod error;
pub mod plan;
pub mod source;
pub mod testkit;

pub use convert::{convert, parse_layer_range, Options, Outcome, Progress, Quiet, Summary};
pub use error::ConvertError;
