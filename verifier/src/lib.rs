//! # tarfa-verifier
//!
//! Re-reads every byte of a JNF model directory and its source checkpoint and names the file,
//! tensor, expert and byte of any fault (`tarfa verify`). It is built in its own issue on top of
//! [`tarfa_format::JnfReader::verify_data`], which already checks one file's hashes and padding;
//! until then this crate holds no code.
