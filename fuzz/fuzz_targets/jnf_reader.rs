//! Arbitrary bytes as a JNF file: open must refuse or accept without panicking, and an accepted
//! file must survive every read API.
#![no_main]

use std::os::unix::fs::FileExt;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tarfa_format::JnfReader;
use tarfa_format_fuzz::{exercise, Scratch};

static SCRATCH: OnceLock<Scratch> = OnceLock::new();

fuzz_target!(|data: &[u8]| {
    let scratch = SCRATCH.get_or_init(|| Scratch::new("reader"));
    scratch.reset().write_all_at(data, 0).expect("write input");
    if let Ok(r) = JnfReader::open(scratch.path()) {
        exercise(&r);
    }
});
