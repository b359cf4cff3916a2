//! Arbitrary index bytes inside a file whose header and footer hashes are recomputed, so the
//! mutations reach `validate::check_index_from` instead of dying at the index hash.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tarfa_format::JnfReader;
use tarfa_format_fuzz::{exercise, IndexInput, Scratch};

static SCRATCH: OnceLock<Scratch> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let Some(input) = IndexInput::decode(data) else {
        return;
    };
    let scratch = SCRATCH.get_or_init(|| Scratch::new("index"));
    input.write_file(scratch.reset());
    if let Ok(r) = JnfReader::open(scratch.path()) {
        exercise(&r);
    }
});
