//! `tarfa_decode::text::Detokenizer` against the tokenizer's whole decode: the text made token by
//! token must be the decode of all the ids, for any ids (up to 256 of them: the bound within which
//! the documented differences cannot arise), on a byte-level BPE (GPT-2's byte alphabet and a few
//! multi-byte tokens, ids past the vocabulary included) and on the fixtures' Metaspace tokenizer.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use tarfa_decode::text::{Detokenizer, Text};

/// GPT-2's byte-level vocabulary (the 256 bytes) and some whole characters and words.
fn byte_level() -> &'static Text {
    static T: OnceLock<Text> = OnceLock::new();
    T.get_or_init(|| {
        let printable = |b: u32| matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut chars = vec!['\0'; 256];
        let mut next = 256;
        for b in 0..256u32 {
            chars[b as usize] = if printable(b) {
                char::from_u32(b).expect("char")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("char")
            };
        }
        let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        for w in [" the", " é", "é", "€", "日本", " 😀", "\n\n"] {
            vocab.push(w.bytes().map(|b| chars[b as usize]).collect());
        }
        vocab.push([chars[0x20], chars[0xE2]].iter().collect());
        let v: serde_json::Map<String, serde_json::Value> = vocab
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), serde_json::json!(i)))
            .collect();
        let doc = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                        "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null,
                      "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                      "vocab": v, "merges": []},
        });
        Text::from_tokenizer_json(doc.to_string().as_bytes()).expect("tokenizer")
    })
}

fn metaspace() -> &'static Text {
    static T: OnceLock<Text> = OnceLock::new();
    T.get_or_init(|| {
        Text::from_tokenizer_json(include_bytes!("../../fixtures/hf/qwen3_moe/tokenizer.json"))
            .expect("tokenizer")
    })
}

fuzz_target!(|data: &[u8]| {
    // Each id a byte of the input after the first (which picks the tokenizer): the byte-level
    // vocabulary's 264 ids and a few past it, or the fixture's 128 and a few past it.
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (text, span) = if pick % 2 == 0 {
        (byte_level(), 270u32)
    } else {
        (metaspace(), 140u32)
    };
    let ids: Vec<u32> = rest
        .chunks(2)
        .take(256)
        .map(|c| u32::from(c[0]) | u32::from(*c.get(1).unwrap_or(&0)) << 8)
        .map(|x| x % span)
        .collect();
    let mut d = Detokenizer::new();
    let mut made = String::new();
    for &id in &ids {
        made.push_str(d.push(text, id));
    }
    made.push_str(d.finish(text));
    assert_eq!(made, d.text());
    let known: Vec<u32> = ids.iter().copied().filter(|&i| text.has_token(i)).collect();
    let whole = text.decode(&known).expect("decode");
    assert_eq!(made, whole, "ids {ids:?}");
});
