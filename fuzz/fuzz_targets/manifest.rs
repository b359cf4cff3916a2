//! Arbitrary bytes as `manifest.json`: parsing and checking must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarfa_format::manifest::Manifest;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = serde_json::from_slice::<Manifest>(data) {
        let _ = m.check();
    }
});
