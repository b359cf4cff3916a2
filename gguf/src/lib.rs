//! tarfa-gguf: a hardened GGUF v3 reader and writer.
//!
//! GGUF files come from strangers, so the reader treats every byte as hostile: each count and
//! length is bounded by the bytes left before anything is allocated, all arithmetic is checked,
//! and every rule ggml's own loader enforces (n_dims ≤ 4, power-of-two alignment, offsets equal
//! to the running padded sum, unique keys and names, known ggml types) is one [`Violation`]
//! variant that names what broke and where. A split set whose names or `split.*` keys disagree
//! is [`Violation::SplitMismatch`] with its [`SplitFault`] (a missing part, a part numbered
//! twice, tensor totals that do not add up, …); a per-expert slice that cannot be cut is
//! [`Violation::ExpertSlice`] with its [`ExpertSliceFault`]. Since a file's length is only
//! claimed (sparse files, a server's Content-Range), the header is also capped at
//! [`MAX_HEADER_LEN`] (1 GiB) and one string at [`MAX_STRING_LEN`] (64 MiB),
//! [`Violation::LimitExceeded`] past them. Git LFS pointers and saved HTML pages are recognised
//! and named, since they are what most often sits where a model should.
//!
//! - [`source`]: the [`ByteSource`] the reader reads from (a local file now, HTTP ranges later).
//! - [`header`]: the incremental header parser ([`parse_header`] answers "need more bytes" for a
//!   window that ends inside the header) and [`read_header`] that grows the window.
//! - [`reader`]: [`GgufFile`], split sets as one [`GgufModel`], per-expert byte ranges.
//! - [`writer`]: [`GgufWriter`], which re-parses its own header before writing data.
//!
//! Versions: 3 is read and written; 2 is read too (its layout is the same as 3's: v3 only
//! added big-endian files, which are refused either way); 1 and anything newer than 3 are
//! refused. The ggml type table is [`tarfa_format::Dtype`]; ids not in it are refused.

#![forbid(unsafe_code)]

pub mod error;
pub mod header;
pub mod reader;
pub mod source;
pub mod value;
pub mod writer;

pub use error::{Error, ExpertSliceFault, Result, SplitFault, Violation};
pub use header::{
    parse_header, read_header, Header, HeaderParse, TensorInfo, DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH,
    MAX_DIMS, MAX_HEADER_LEN, MAX_STRING_LEN, MAX_TENSOR_NAME,
};
pub use reader::{expert_range, split_keys, GgufFile, GgufModel, SplitKeys, TensorRef};
pub use source::{ByteSource, FileSource, MemSource};
pub use tarfa_format::Dtype;
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, TensorSpec};
