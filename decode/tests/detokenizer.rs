//! The incremental detokenizer (`tarfa_decode::text::Detokenizer`, which `tarfa run`,
//! `tarfa serve` and `tarfa chat` stream text with) gives the text of the whole decode, token
//! by token, on the decoders real models have: a byte-level BPE (Qwen, GLM, DeepSeek), a
//! SentencePiece BPE with byte fallback (Llama, Mistral), and the fixtures' Metaspace.

use serde_json::{json, Value};
use tarfa_decode::text::{Detokenizer, Text};

/// GPT-2's map of bytes to the printable characters a byte-level vocabulary spells them with.
fn byte_chars() -> Vec<char> {
    let printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).expect("char");
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).expect("char");
            n += 1;
        }
    }
    chars
}

fn tokenizer(model: Value, decoder: Value) -> Text {
    let doc = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null,
        "decoder": decoder, "model": model,
    });
    Text::from_tokenizer_json(doc.to_string().as_bytes()).expect("tokenizer")
}

fn bpe(vocab: &[String], byte_fallback: bool) -> Value {
    let v: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), json!(i)))
        .collect();
    json!({"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
           "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": byte_fallback,
           "ignore_merges": false, "vocab": v, "merges": []})
}

/// A byte-level vocabulary: the 256 bytes, then whole characters and words (ids 256…).
struct ByteLevel {
    text: Text,
    words: Vec<String>,
}

impl ByteLevel {
    fn new() -> ByteLevel {
        let chars = byte_chars();
        let words: Vec<String> = [" the", " é", "é", "€", "日本", " 😀", "\n\n"]
            .iter()
            .map(|w| w.to_string())
            .collect();
        let mut vocab: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        for w in &words {
            vocab.push(w.bytes().map(|b| chars[b as usize]).collect());
        }
        // A token that is a space and the first byte of a 3-byte character (GPT-2's "Ġâ"), id
        // 256 + words.len().
        vocab.push([chars[0x20], chars[0xE2]].iter().collect());
        let text = tokenizer(
            bpe(&vocab, false),
            json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
                   "use_regex": true}),
        );
        ByteLevel { text, words }
    }

    /// Ids spelling `s`: each piece a whole word of the vocabulary or its bytes one by one.
    fn ids(&self, s: &str, rng: &mut fastrand::Rng) -> Vec<u32> {
        let mut ids = Vec::new();
        let mut rest = s;
        'outer: while !rest.is_empty() {
            if rng.bool() {
                for (i, w) in self.words.iter().enumerate() {
                    if let Some(r) = rest.strip_prefix(w.as_str()) {
                        ids.push(256 + i as u32);
                        rest = r;
                        continue 'outer;
                    }
                }
            }
            let c = rest.chars().next().expect("char");
            for b in c.to_string().bytes() {
                ids.push(b as u32);
            }
            rest = &rest[c.len_utf8()..];
        }
        ids
    }
}

/// The text made token by token, and each token's part checked to extend the text.
fn incremental(text: &Text, ids: &[u32]) -> String {
    let mut d = Detokenizer::new();
    let mut out = String::new();
    for &id in ids {
        out.push_str(d.push(text, id));
        assert_eq!(out, d.text());
    }
    out.push_str(d.finish(text));
    assert_eq!(out, d.text());
    out
}

const PIECES: &[&str] = &[
    " the", "é", " é", "€", "日本", " 😀", "a", "b", "\n\n", " ", "x y", "ü", "😀😀", "\u{FFFD}",
];

fn random_text(rng: &mut fastrand::Rng) -> String {
    (0..rng.usize(0..24))
        .map(|_| PIECES[rng.usize(..PIECES.len())])
        .collect()
}

#[test]
fn byte_level_text_made_token_by_token_is_the_whole_decode() {
    let bl = ByteLevel::new();
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..2000 {
        let s = random_text(&mut rng);
        let ids = bl.ids(&s, &mut rng);
        let whole = bl.text.decode(&ids).expect("decode");
        assert_eq!(whole, s, "the vocabulary spells {s:?}: {ids:?}");
        assert_eq!(incremental(&bl.text, &ids), whole, "ids {ids:?}");
    }
}

#[test]
fn a_character_split_across_tokens_is_held_back_until_complete() {
    let bl = ByteLevel::new();
    let mut d = Detokenizer::new();
    // "é" is C3 A9, "€" E2 82 AC: nothing shows until the character is whole.
    assert_eq!(d.push(&bl.text, 0xC3), "");
    assert_eq!(d.push(&bl.text, 0xA9), "é");
    assert_eq!(d.push(&bl.text, 0xE2), "");
    assert_eq!(d.push(&bl.text, 0x82), "");
    assert_eq!(d.push(&bl.text, 0xAC), "€");
    assert_eq!(d.push(&bl.text, b'a' as u32), "a");
    // An answer that ends inside a character ends with the decode's U+FFFD.
    assert_eq!(d.push(&bl.text, 0xF0), "");
    assert_eq!(d.finish(&bl.text), "\u{FFFD}");
    assert_eq!(d.text(), "é€a\u{FFFD}");
}

#[test]
fn invalid_bytes_are_the_whole_decodes_replacement_characters() {
    let bl = ByteLevel::new();
    for ids in [
        vec![0x80, b'a' as u32, 0xBF, 0xBF],
        vec![0xE2, 0x82, b'x' as u32, 0xC3, 0xA9],
        vec![0xFF, 0xFE, 0xC3, b' ' as u32],
        vec![0xC3, 0xC3, 0xA9],
    ] {
        let whole = bl.text.decode(&ids).expect("decode");
        assert!(whole.contains('\u{FFFD}'), "{whole:?}");
        assert_eq!(incremental(&bl.text, &ids), whole, "ids {ids:?}");
    }
}

/// Llama's and Mistral's SentencePiece BPE: `▁` for spaces, `<0xNN>` byte tokens for what the
/// vocabulary lacks, and a decoder that drops the text's first space.
fn sentencepiece() -> (Text, Vec<String>) {
    let mut vocab: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
    for w in ["▁", "▁the", "a", "b", "▁a", "é", "x", "▁y", "\n"] {
        vocab.push(w.to_string());
    }
    let text = tokenizer(
        bpe(&vocab, true),
        json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]}),
    );
    (text, vocab)
}

#[test]
fn sentencepiece_text_made_token_by_token_is_the_whole_decode() {
    let (text, vocab) = sentencepiece();
    let mut rng = fastrand::Rng::with_seed(11);
    let words: Vec<(u32, String)> = vocab
        .iter()
        .enumerate()
        .skip(256)
        .map(|(i, w)| (i as u32, w.replace('▁', " ")))
        .collect();
    for _ in 0..2000 {
        // Words of the vocabulary and characters it lacks, in bytes.
        let mut ids = Vec::new();
        for _ in 0..rng.usize(0..20) {
            if rng.bool() {
                ids.push(words[rng.usize(..words.len())].0);
            } else {
                let c = ["€", "😀", "ü", "日"][rng.usize(..4)];
                ids.extend(c.bytes().map(|b| b as u32));
            }
        }
        let whole = text.decode(&ids).expect("decode");
        assert!(!whole.contains('\u{FFFD}'), "{whole:?}");
        assert_eq!(incremental(&text, &ids), whole, "ids {ids:?}");
    }
    // The first space of the text is dropped, as the whole decode drops it; later ones stay.
    let the = words.iter().find(|w| w.1 == " the").expect("▁the").0;
    assert_eq!(incremental(&text, &[the, the]), "the the");
}

/// The one case the text differs from the whole decode (said in `Detokenizer`'s docs): a
/// byte-fallback run valid when shown ("é") that a later byte makes invalid — the whole decode
/// turns the run into U+FFFD, while what was shown stays and the new byte's own text follows.
#[test]
fn a_byte_fallback_run_made_invalid_later_keeps_what_was_shown() {
    let (text, vocab) = sentencepiece();
    let x = vocab.iter().position(|w| w == "x").expect("x") as u32;
    let ids = [0xC3, 0xA9, 0x80, x];
    assert_eq!(
        text.decode(&ids).expect("decode"),
        "\u{FFFD}\u{FFFD}\u{FFFD}x"
    );
    assert_eq!(incremental(&text, &ids), "é\u{FFFD}x");
}

#[test]
fn the_fixtures_tokenizers_text_made_token_by_token_is_the_whole_decode() {
    for model in ["mixtral", "qwen3_moe", "glm4_moe"] {
        let path = format!(
            "{}/../fixtures/hf/{model}/tokenizer.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = Text::from_tokenizer_json(&std::fs::read(&path).expect("read")).expect("load");
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..500 {
            // Ids past the vocabulary (a model's padded logits) have no text, here as whole.
            let ids: Vec<u32> = (0..rng.usize(0..40)).map(|_| rng.u32(0..140)).collect();
            let whole = text.decode(&ids).expect("decode");
            assert_eq!(incremental(&text, &ids), whole, "{model}: ids {ids:?}");
        }
    }
}

/// A long run of U+FFFD (the character itself, three byte tokens each) then a character split
/// across tokens: the run is made in bounded windows, and the text is still the whole decode,
/// wherever the bound falls in the run.
#[test]
fn a_long_run_of_replacement_characters_is_the_whole_decode() {
    let bl = ByteLevel::new();
    for run in [20, 21, 22, 23, 50, 100] {
        for tail in [&[0xF0, 0x9F, 0x98, 0x80][..], &[b'a' as u32], &[0xE2, 0x82]] {
            let mut ids: Vec<u32> = (0..run).flat_map(|_| [0xEF, 0xBF, 0xBD]).collect();
            ids.extend_from_slice(tail);
            ids.push(0x80);
            let whole = bl.text.decode(&ids).expect("decode");
            assert_eq!(
                incremental(&bl.text, &ids),
                whole,
                "run {run}, tail {tail:?}"
            );
        }
    }
}

/// A token's bytes (OpenAI's logprob `bytes`) and piece: a part of a character is its own
/// bytes, not U+FFFD; a token's leading space is kept where the text's first token drops it.
#[test]
fn a_tokens_bytes_are_its_own_not_its_decode() {
    let bl = ByteLevel::new();
    assert_eq!(bl.text.token_bytes(0xE2), Some(vec![0xE2]));
    assert_eq!(bl.text.piece(0xE2).as_deref(), Some("\u{FFFD}"));
    assert_eq!(bl.text.token_bytes(b'a' as u32), Some(b"a".to_vec()));
    assert_eq!(bl.text.token_bytes(b' ' as u32), Some(b" ".to_vec()));
    assert_eq!(bl.text.token_bytes(256), Some(b" the".to_vec()));
    assert_eq!(bl.text.token_bytes(257), Some(" é".as_bytes().to_vec()));
    assert_eq!(bl.text.token_bytes(100_000), None);
    // Every byte token is its byte: the map is the whole of GPT-2's.
    for b in 0..=255u8 {
        assert_eq!(bl.text.token_bytes(b as u32), Some(vec![b]), "byte {b}");
    }
    let (sp, vocab) = sentencepiece();
    let id = |w: &str| {
        vocab
            .iter()
            .position(|v| v == w)
            .expect("in the vocabulary") as u32
    };
    assert_eq!(sp.token_bytes(0xC3), Some(vec![0xC3]));
    assert_eq!(sp.token_bytes(id("▁the")), Some(b" the".to_vec()));
    assert_eq!(sp.piece(id("▁the")).as_deref(), Some(" the"));
    assert_eq!(sp.decode(&[id("▁the")]).as_deref(), Some("the"));
    assert_eq!(sp.token_bytes(id("é")), Some("é".as_bytes().to_vec()));
}

/// Shown text stays shown across the bound: a long run of tokens that each end in the first byte
/// of a character (" \xE2", GPT-2's "Ġâ"), which the next token's space makes U+FFFD, then the
/// last one completed ("€"). The text is the whole decode's, nothing repeated — for runs up to
/// four times the bound (past it the run is shown as it decodes: the documented difference).
#[test]
fn a_long_run_ending_in_an_incomplete_character_is_not_repeated() {
    let bl = ByteLevel::new();
    let space_e2 = 256 + bl.words.len() as u32;
    assert_eq!(bl.text.token_bytes(space_e2), Some(vec![0x20, 0xE2]));
    for run in [10, 60, 64, 65, 100, 250] {
        let mut ids = vec![b'a' as u32];
        ids.extend(std::iter::repeat_n(space_e2, run));
        ids.extend([0x82, 0xAC, b'z' as u32]);
        let whole = bl.text.decode(&ids).expect("decode");
        assert_eq!(incremental(&bl.text, &ids), whole, "run {run}");
    }
}

/// Ids past the vocabulary (a model's padded logits) add no text and do not begin a window: a
/// Metaspace tokenizer that drops the text's first space (prepend_scheme "first") keeps the
/// space of the token after one.
#[test]
fn ids_past_the_vocabulary_neither_add_text_nor_drop_a_space() {
    let vocab: Vec<String> = ["▁Hi", "▁hello", "a", "▁"]
        .iter()
        .map(|w| w.to_string())
        .collect();
    let text = tokenizer(
        bpe(&vocab, false),
        json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}),
    );
    assert!(!text.has_token(999) && text.has_token(1));
    for ids in [
        vec![0, 999, 1],
        vec![0, 999, 999, 1, 2],
        vec![999, 0, 1],
        vec![0, 1, 999],
    ] {
        let whole = text.decode(&ids).expect("decode");
        assert_eq!(incremental(&text, &ids), whole, "ids {ids:?}");
    }
    assert_eq!(incremental(&text, &[0, 999, 1]), "Hi hello");
}
