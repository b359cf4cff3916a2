//! A model's text: its tokenizer (the model directory's `tokenizer.json`, checked against the
//! manifest, or the one rebuilt from a GGUF's `tokenizer.ggml.*` key/values) and the decoding
//! of ids to text. `tarfa run` and `tarfa serve` both read text through it.

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
            let tk = tokenizers::Tokenizer::from_bytes(&f.bytes)
                .map_err(|e| NoText::Broken(format!("{}: {e}", f.path.display())))?;
            return Ok(Text { tk, own: None });
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

    /// Each id's own piece of text, for `/tokenize`'s pieces.
    pub fn piece(&self, id: u32) -> Option<String> {
        self.decode(&[id])
    }
}

/// Of a generation decoded so far (`decoded`; `printed` of it already out), the text that may
/// be out now: all of it when `last`, else all but a trailing incomplete UTF-8 sequence — which
/// a byte-level tokenizer decodes as U+FFFD until the next token completes the character —;
/// `None` if it does not extend what is printed.
pub fn streamed<'a>(printed: &str, decoded: &'a str, last: bool) -> Option<&'a str> {
    let stable = if last {
        decoded
    } else {
        decoded.trim_end_matches('\u{FFFD}')
    };
    stable.starts_with(printed).then_some(stable)
}
