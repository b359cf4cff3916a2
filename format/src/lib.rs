//! # tarfa-format: JNF v1
//!
//! JNF is tarfa's on-disk format for Mixture-of-Experts checkpoints: every expert of every layer
//! is one 4096-byte-aligned, contiguous, independently addressable and hashed extent, so the
//! runtime fetches it with a single `O_DIRECT` read and checks it as it lands. The normative text
//! is `spec/JNF_V1.md`; this crate is its implementation:
//!
//! - [`dtype`]: the element-type table (every ggml type by id, plus safetensors dtypes);
//! - [`layout`]: the bytes of the header page, footer and index records;
//! - [`validate`]: every MUST of the spec, shared by reader and writer;
//! - [`reader::JnfReader`]: the strict reader (`pread`; the runtime maps its file for `mmap`);
//!   [`reader::scan_index`], the same checks in one pass that keeps no region record;
//! - [`writer::JnfWriter`]: the streaming, typestate-ordered writer (its index records spilled to
//!   unnamed temporary files, never all in memory);
//! - [`fsio`]: every read of a named file: regular files only, bounded;
//! - [`publish`]: atomic publishing (temp, fsync, rename, fsync the directory);
//! - [`manifest`]: the model manifest that ties a directory of JNF files to its checkpoint;
//! - [`source_path`]: the one rule for a source file's path (`src_file`, the manifest's sources);
//! - [`summary`]: what `tarfa inspect` reports, as data;
//! - `golden` (feature `testkit`): the generator of the golden test vectors in `fixtures/golden/`.
//!
//! ```
//! use tarfa_format::{Dtype, FileLayout, JnfReader, JnfWriter, RegionSpec, Role};
//! # let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("layer-00000.jnf");
//! let spec = |name: &str| RegionSpec {
//!     name: name.into(), dtype: Dtype::BF16, shape: vec![2, 4], layer: Some(0), source: None,
//! };
//! let mut w = JnfWriter::create(&path, FileLayout::layer(0, 1))?;
//! w.tensor(&spec("attn_norm"), &mut &[0u8; 16][..])?;
//! let mut e = w.begin_expert(0, 0)?;
//! e.projection(Role::Gate, &spec("e0.gate"), &mut &[1u8; 16][..])?;
//! e.projection(Role::Down, &spec("e0.down"), &mut &[2u8; 16][..])?;
//! let written = e.end_expert()?.finish()?;
//!
//! let r = JnfReader::open(&path)?;
//! r.verify_data()?;
//! let down = r.projection(0, 0, Role::Down).unwrap();
//! assert_eq!(r.read_region(down)?, vec![2u8; 16]);
//! assert_eq!(written.file_len % 4096, 0);
//! # Ok::<(), tarfa_format::Error>(())
//! ```

#![forbid(unsafe_code)]

// Offsets and lengths are u64 on disk and index memory as usize: tarfa targets 64-bit Linux.
const _: () = assert!(usize::BITS == 64, "tarfa-format needs a 64-bit target");

pub mod aligned;
pub mod dtype;
pub mod error;
pub mod fsio;
#[cfg(feature = "testkit")]
pub mod golden;
pub mod hash;
pub mod jcs;
pub mod layout;
pub mod manifest;
pub mod publish;
pub mod reader;
pub mod safetensors;
pub mod source_path;
mod strindex;
pub mod summary;
pub mod validate;
pub mod writer;

pub use dtype::Dtype;
pub use error::{Error, OutputFault, Result, Violation};
pub use hash::DualHash;
pub use layout::{Role, ALIGN};
pub use reader::JnfReader;
pub use writer::{FileLayout, JnfWriter, Provenance, RegionSpec, WrittenFile};
