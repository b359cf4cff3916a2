//! The decoder's parsers of outside bytes: an architecture config (any JSON, as a manifest
//! carries it) and a `.npy` file. Neither may panic; a parsed config's RoPE table must build.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarfa_decode::family::qwen3_moe::Qwen3MoeConfig;

fuzz_target!(|data: &[u8]| {
    let _ = tarfa_decode::npy::decode(data);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(c) = Qwen3MoeConfig::parse(&v) {
            // Bounded work: a few positions of a table of at most head_dim/2 frequencies.
            if c.rope.rotary_dim <= 4096 {
                let mut r = tarfa_decode::rope::Rope::new(c.rope.theta, c.rope.rotary_dim);
                r.ensure(3);
            }
        }
    }
});
