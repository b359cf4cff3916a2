//! The decoder's parsers of outside bytes: an architecture config (any JSON, as a manifest
//! carries it) and a `.npy` file. Neither may panic; a parsed config's RoPE table must build.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarfa_decode::family::{glm4_moe, mixtral, qwen3_5_moe, qwen3_moe};

fuzz_target!(|data: &[u8]| {
    let _ = tarfa_decode::npy::decode(data);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        // Every family's parser on the same JSON (each reads the keys it knows).
        let _ = mixtral::MixtralConfig::parse(&v);
        let _ = glm4_moe::Glm4MoeConfig::parse(&v);
        let _ = qwen3_5_moe::Qwen3_5MoeConfig::parse(&v);
        if let Ok(c) = qwen3_moe::Qwen3MoeConfig::parse(&v) {
            // Bounded work: a few positions of a table of at most head_dim/2 frequencies.
            if c.rope.rotary_dim <= 4096 {
                let mut r = tarfa_decode::rope::Rope::new(c.rope.theta, c.rope.rotary_dim);
                r.ensure(3);
            }
        }
    }
});
