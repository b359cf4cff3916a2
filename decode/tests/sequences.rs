//! Sequences apart from the model: several sequences of one decoder, forks and truncations give
//! every position the bits a fresh decoder running that sequence alone gives it, on every
//! family's fixture; what cannot be done (rewinding a recurrent state, another decoder's
//! sequence, truncating past the end) is refused and leaves the sequence usable.

mod common;

use tarfa_decode::error::SequenceFault;
use tarfa_decode::{DecodeError, Decoder, DecoderOptions, Sequence};

/// Every family's fixture: attention-only (qwen3_moe, mixtral's sliding window, glm4_moe's dense
/// and MoE layers) and recurrent (qwen3_5_moe's Gated DeltaNet layers).
const NAMES: &[&str] = &[
    "qwen3_moe_b",
    "mixtral",
    "glm4_moe_b",
    "qwen3_5_moe_text",
    "qwen3_next",
    "mimo_v2_flash",
    "deepseek_v3",
    "deepseek_v3_b",
    "glm5_next",
    "glm5_next_b",
];

fn opts() -> DecoderOptions {
    DecoderOptions {
        threads: 2,
        ..DecoderOptions::default()
    }
}

/// Sequences interleaved with each other and with the decoder's own, forked and truncated, on
/// the CPU: every position has the bits of a fresh decoder running that sequence alone
/// (`common::sequences_hold`; the GPU's tests run the same on the GPU decoder).
#[test]
fn sequences_interleaved_forked_and_truncated_each_get_the_bits_of_running_alone() {
    for &name in NAMES {
        common::sequences_hold(name, &mut common::open(&common::model(name), &opts()));
    }
}

fn feed(dec: &mut Decoder, seq: &mut Sequence, tokens: &[u32]) -> Vec<Vec<u32>> {
    common::bits(&dec.feed_in(seq, tokens, true).expect("feed"))
}

/// Another decoder's sequence, a token outside the vocabulary and a truncation past the end
/// are refused before anything is computed, and the sequence continues as if they had not been
/// asked (on the recurrent fixture, whose state a partial pass would leave unknown).
#[test]
fn a_sequence_of_another_decoder_a_bad_token_or_a_truncation_past_the_end_changes_nothing() {
    let name = "qwen3_5_moe_text";
    let (p, x, _) = common::sequence_prompts(name);
    let mut one = common::open(&common::model(name), &opts());
    let mut other = common::open(&common::model(name), &opts());
    let mut a = one.new_sequence().expect("sequence");
    feed(&mut one, &mut a, &p);
    for e in [
        other.feed_in(&mut a, &x, true).expect_err("foreign"),
        other.fork(&a).expect_err("foreign"),
        other.truncate(&mut a, 0).expect_err("foreign"),
    ] {
        assert!(
            matches!(e, DecodeError::Sequence(SequenceFault::Foreign)),
            "{e}"
        );
    }
    let e = one
        .feed_in(&mut a, &[1, u32::MAX], true)
        .expect_err("a token outside the vocabulary");
    assert!(
        matches!(e, DecodeError::TokenOutOfRange { id: u32::MAX, .. }),
        "{e}"
    );
    let e = one.truncate(&mut a, p.len() + 1).expect_err("past the end");
    assert!(
        matches!(e, DecodeError::Sequence(SequenceFault::Beyond { .. })),
        "{e}"
    );
    // Nothing moved: the sequence continues as if none of that had been asked.
    assert_eq!(a.len(), Some(p.len()));
    let want = common::alone(name, &[p.clone(), x.clone()].concat());
    assert_eq!(feed(&mut one, &mut a, &x), want[p.len()..]);
}
