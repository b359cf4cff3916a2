//! A model's text: its tokenizer (the model directory's `tokenizer.json`, checked against the
//! manifest, or the one rebuilt from a GGUF's `tokenizer.ggml.*` key/values) and the decoding
//! of ids to text. `tarfa run` and `tarfa serve` both read text through it.

use tokenizers::DecoderWrapper;

use crate::session::Decoder;

/// The model's tokenizer, and for a GGUF-sourced model each id's own string.
pub struct Text {
    tk: tokenizers::Tokenizer,
    /// A GGUF's `tokenizer.ggml.tokens`: the rebuilt vocabulary maps each string to one id, so
    /// the later id of a string two ids share has none there and the tokenizer's decode dropped
    /// it from the text; decoding each id's own string, as llama.cpp does, keeps it.
    own: Option<Vec<String>>,
}

impl std::fmt::Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Text")
            .field("vocab", &self.tk.get_vocab_size(true))
            .field("gguf_strings", &self.own.as_ref().map(Vec::len))
            .finish()
    }
}

/// Why a model has no text: no tokenizer at all, or one that does not load.
#[derive(Debug, thiserror::Error)]
pub enum NoText {
    /// Neither a `tokenizer.json` nor a GGUF's tokenizer key/values.
    #[error("the model has no tokenizer.json")]
    NoTokenizer,
    /// A file or key/value that does not make a tokenizer.
    #[error("{0}")]
    Broken(String),
    /// The decoder's own error (a tokenizer.json that fails its check, say).
    #[error(transparent)]
    Decode(#[from] crate::error::DecodeError),
}

impl Text {
    /// The tokenizer of `dec`'s model.
    pub fn of(dec: &Decoder) -> Result<Text, NoText> {
        if let Some(f) = dec.aux_file("tokenizer.json")? {
            // The bytes checked against the manifest, not the path opened again.
            return Text::from_tokenizer_json(&f.bytes)
                .map_err(|e| NoText::Broken(format!("{}: {e}", f.path.display())));
        }
        match dec.gguf_tokenizer_json() {
            Some(Ok(json)) => {
                let tk = serde_json::to_string(&json)
                    .map_err(|e| NoText::Broken(e.to_string()))?
                    .parse::<tokenizers::Tokenizer>()
                    .map_err(|e| {
                        NoText::Broken(format!(
                            "the tokenizer rebuilt from the GGUF's tokenizer.ggml.* keys does not load: {e}"
                        ))
                    })?;
                let own = dec.gguf_token_strings().transpose()?;
                Ok(Text { tk, own })
            }
            Some(Err(e)) => Err(NoText::Broken(format!(
                "no tokenizer can be rebuilt from the GGUF's key/values: {e}"
            ))),
            None => Err(NoText::NoTokenizer),
        }
    }

    /// The tokenizer of a `tokenizer.json`'s bytes.
    pub fn from_tokenizer_json(bytes: &[u8]) -> Result<Text, String> {
        let tk = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| e.to_string())?;
        Ok(Text { tk, own: None })
    }

    /// Whether `id` is a token of the vocabulary (a model's logits may have more ids).
    pub fn has_token(&self, id: u32) -> bool {
        match &self.own {
            Some(own) => own.get(id as usize).is_some(),
            None => self.tk.id_to_token(id).is_some(),
        }
    }

    /// The ids of `text`, as transformers' `tokenizer(text)` makes them when `special` (the
    /// tokenizer's post-processor adds its special tokens: a BOS for Llama/Mistral tokenizers,
    /// none for Qwen's), or the bare text's ids.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, String> {
        self.tk
            .encode(text, special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| e.to_string())
    }

    /// The text of `ids` (special tokens included); `None` where it cannot be made.
    pub fn decode(&self, ids: &[u32]) -> Option<String> {
        use tokenizers::Decoder as _;
        let Some(own) = &self.own else {
            return self.tk.decode(ids, false).ok();
        };
        let pieces = ids
            .iter()
            .map(|&i| own.get(i as usize).cloned())
            .collect::<Option<Vec<String>>>()?;
        match self.tk.get_decoder() {
            Some(d) => d.decode(pieces).ok(),
            None => Some(pieces.concat()),
        }
    }

    /// A token's text as it reads within a text (its leading space kept, which a decoder drops
    /// from a text's first token), `None` for an id with no text: the token's bytes read as
    /// UTF-8, U+FFFD for a part of a character.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.token_bytes(id)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// A token's bytes within a text, before they are read as UTF-8: a byte-level token's bytes
    /// (GPT-2's map of characters to bytes), a byte-fallback token's byte (`<0xE2>`), else its
    /// text after another token — where a decoder drops the first token's leading space, a
    /// token's own text keeps it ("▁the" is " the"). What OpenAI's logprobs call `bytes`.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let token = match &self.own {
            Some(own) => own.get(id as usize)?.clone(),
            None => self.tk.id_to_token(id)?,
        };
        let decoders = match self.tk.get_decoder() {
            Some(DecoderWrapper::Sequence(s)) => s.get_decoders().iter().collect(),
            Some(d) => vec![d],
            None => Vec::new(),
        };
        if decoders
            .iter()
            .any(|d| matches!(d, DecoderWrapper::ByteLevel(_)))
        {
            // As the byte-level decoder reads a token: a character outside the map makes the
            // token its own UTF-8.
            let map = byte_level_bytes();
            return Some(
                token
                    .chars()
                    .map(|c| map.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| token.clone().into_bytes()),
            );
        }
        if decoders
            .iter()
            .any(|d| matches!(d, DecoderWrapper::ByteFallback(_)))
        {
            if let Some(b) = token
                .strip_prefix("<0x")
                .and_then(|h| h.strip_suffix('>'))
                .filter(|h| h.len() == 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                return Some(vec![b]);
            }
        }
        // Per-token decoders treat the first token apart: the token after itself is its text.
        let one = self.decode(&[id])?;
        let two = self.decode(&[id, id])?;
        Some(match two.strip_prefix(one.as_str()) {
            Some(own) if !own.is_empty() => own.as_bytes().to_vec(),
            _ => one.into_bytes(),
        })
    }
}

/// GPT-2's byte-level alphabet read back: each printable character to its byte.
fn byte_level_bytes() -> &'static std::collections::HashMap<char, u8> {
    static MAP: std::sync::OnceLock<std::collections::HashMap<char, u8>> =
        std::sync::OnceLock::new();
    MAP.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut next = 256u32;
        (0..=255u8)
            .map(|b| {
                let c = if printable(b) {
                    char::from(b)
                } else {
                    next += 1;
                    char::from_u32(next - 1).unwrap_or('\0')
                };
                (c, b)
            })
            .collect()
    })
}

/// The most tokens text is held back over while it ends in U+FFFD. An incomplete character
/// decodes as U+FFFD until the token that completes it; so does a U+FFFD the text really has
/// (invalid UTF-8 among the bytes, or the character itself), which no token changes. Past this
/// bound the text is made up to the last 3 tokens (an incomplete character has at most 3 of its
/// bytes there) where that text goes on from what was shown, which bounds the work a token costs
/// and changes no text; where it does not, the run waits, up to four times the bound, and is
/// then shown as it decodes.
const MAX_PENDING: usize = 64;

/// A generation's text, made token by token in time linear in its length: each token's text is
/// the decode of a small window (the tokens of the text made last, for context, then the new
/// ones) less the decode of the window's context — the way vLLM and text-generation-inference
/// detokenize, not the decode of the whole answer at every token.
///
/// The text is the tokenizer's decode of every id pushed (`Text::decode`), for every decoder a
/// tokenizer.json or a GGUF has (byte-level, Metaspace, byte fallback, WordPiece: their
/// decoders act per token, but for the first token's leading space, which the window's context
/// absorbs, and for bytes joined into characters, which are held back while the text ends in an
/// incomplete character: U+FFFD). One case differs, in invalid UTF-8: a byte-fallback run of
/// bytes that was valid UTF-8 when shown and that later bytes make invalid (the whole decode then
/// turns the shown characters into U+FFFD too, while here what was shown stays and the new bytes'
/// own text follows), and a run of more than four times [`MAX_PENDING`] tokens whose text never
/// stops ending in an incomplete character. Ids with no text (beyond the tokenizer's vocabulary) add none, as in the whole
/// decode.
#[derive(Debug, Clone, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    /// Where the window begins: the first of the tokens whose text was made last.
    prefix: usize,
    /// Where the tokens with text still to make begin.
    read: usize,
    /// The decode of `ids[prefix..read]`.
    base: String,
    /// Text made so far of `ids[read..]` (all of it but a trailing incomplete character).
    pending: usize,
    text: String,
}

impl Detokenizer {
    /// No text yet.
    pub fn new() -> Detokenizer {
        Detokenizer::default()
    }

    /// The text made so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Add `id`; the text it made (empty while a character is incomplete).
    pub fn push(&mut self, text: &Text, id: u32) -> &str {
        if !text.has_token(id) {
            // An id with no token (past the tokenizer's vocabulary: a model's padded logits):
            // the whole decode leaves it out, so does the window (where it would otherwise
            // begin a window and make the next token's leading space a first token's).
            return "";
        }
        self.ids.push(id);
        self.make(text, false)
    }

    /// The end: the text still held back (an incomplete character, as the decode gives it).
    pub fn finish(&mut self, text: &Text) -> &str {
        self.make(text, true)
    }

    fn make(&mut self, text: &Text, last: bool) -> &str {
        let start = self.text.len();
        if self.read == self.ids.len() {
            return "";
        }
        let mut end = self.ids.len();
        let mut decoded = text.decode(&self.ids[self.prefix..]).unwrap_or_default();
        let mut complete = last || !decoded.ends_with('\u{FFFD}');
        if !complete && end - self.read > MAX_PENDING {
            // A long run ending in U+FFFD: its text is made up to the last 3 tokens, which may
            // hold the beginning of a character still to complete (at most 3 of its bytes) —
            // where that text goes on from what was shown; what is before them is final. Where
            // it does not (text was shown for those tokens), the run waits for its end, up to
            // four times the bound.
            let shown_from = self.text.len() - self.pending;
            let e = end - 3;
            let d = text.decode(&self.ids[self.prefix..e]).unwrap_or_default();
            let goes_on = d
                .strip_prefix(self.base.as_str())
                .is_some_and(|rest| rest.starts_with(&self.text[shown_from..]));
            if goes_on {
                (end, decoded, complete) = (e, d, true);
            } else if end - self.read > 4 * MAX_PENDING {
                complete = true;
            }
        }
        let stable = if complete {
            decoded.as_str()
        } else {
            decoded.trim_end_matches('\u{FFFD}')
        };
        let shown = &self.text[self.text.len() - self.pending..];
        let made = stable
            .strip_prefix(self.base.as_str())
            .filter(|rest| rest.starts_with(shown));
        match made {
            Some(rest) => {
                self.text.push_str(&rest[self.pending..]);
                self.pending = rest.len();
            }
            None if complete => {
                // The new tokens changed text already made (a byte-fallback run made invalid):
                // what was made stays, and the new tokens' own text follows it.
                let own = text.decode(&self.ids[self.read..end]).unwrap_or_default();
                let from = if own.starts_with(shown) {
                    shown.len()
                } else {
                    0
                };
                let own = own[from..].to_string();
                self.text.push_str(&own);
            }
            None => {}
        }
        if complete {
            self.base = text.decode(&self.ids[self.read..end]).unwrap_or_default();
            self.prefix = self.read;
            self.read = end;
            self.pending = 0;
        }
        &self.text[start..]
    }
}
