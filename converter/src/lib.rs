//! # tarfa-converter
//!
//! Turns Hugging Face safetensors checkpoints and GGUF models into JNF v1 model directories, one
//! layer range at a time (`tarfa convert SRC -o OUT --layers A-B`):
//!
//! - [`source`]: reads shard headers strictly (`model.safetensors` or a sharded index) and streams
//!   tensor bytes by `pread`;
//! - [`plan`]: decides from names and shapes which bytes become which region: per-expert and fused
//!   expert layouts (a fused layer kept as its stacks, each expert's items made when written),
//!   plain layer tensors, MTP layers, the trunk;
//! - [`convert`]: writes trunk and layer files through [`tarfa_format::JnfWriter`], skips layers
//!   already present and checked (their hashes, and their source bytes as they are now), checks free space first, and publishes the manifest last;
//! - [`gguf_source`], [`gguf_plan`]: the same for a GGUF file or split set: parts as shards,
//!   key/values as the config, `blk.N.ffn_*_exps` stacks cut per expert;
//! - `output_dir`: what a conversion may find in its output directory (only files it wrote), the
//!   lock, and the removal of a killed run's temporary files;
//! - `testkit` (feature `testkit`): generated checkpoints for tests and benchmarks.

#![forbid(unsafe_code)]

pub mod convert;
pub mod error;
pub mod gguf_plan;
pub mod gguf_source;
mod output_dir;
pub mod plan;
pub mod source;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use convert::{convert, parse_layer_range, Options, Outcome, Progress, Quiet, Summary};
pub use error::{ConvertError, ExpertFault, ForeignFile, OutputFault, SourceFault};
