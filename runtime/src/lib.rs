//! # tarfa-runtime
//!
//! Streams expert extents from NVMe (io_uring, O_DIRECT) into a pinned ring and decodes exactly.
//! It is built in its own issues on top of [`tarfa_format::JnfReader`]'s O(1)
//! `(layer, expert, projection)` lookup; until then this crate holds no code.
