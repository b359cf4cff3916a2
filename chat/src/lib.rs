//! Chat templates rendered exactly as transformers' `apply_chat_template` renders them, and a
//! reply's `<think>` reasoning split from its answer — the prompt side of `tarfa serve` and
//! `tarfa chat`.
//!
//! ```
//! use tarfa_chat::{ChatJson, ChatTemplate, RenderOptions, SpecialTokens};
//!
//! let template = ChatTemplate::new(
//!     "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}\
//!      {% if add_generation_prompt %}<|assistant|>{% endif %}",
//!     SpecialTokens::new().with("eos_token", "</s>"),
//! )?;
//! let messages = ChatJson::parse(r#"[{"role": "user", "content": "Hi"}]"#)?;
//! let opts = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
//! assert_eq!(template.render(&messages, &opts)?, "<|user|>Hi</s><|assistant|>");
//! # Ok::<(), tarfa_chat::TemplateError>(())
//! ```
//!
//! The environment is transformers 5's (`chat_template_utils.py`): minijinja with `trim_blocks`
//! and `lstrip_blocks`, `{% break %}`/`{% continue %}`, Python's string and dict methods
//! (minijinja-contrib's pycompat), `raise_exception(msg)` ([`TemplateError::Raised`] with the
//! template's message), `strftime_now(fmt)`, `tojson` as Python's `json.dumps` with transformers'
//! arguments, values printed with Python's `str()` (`True`, `None`, `{'a': 1}`), undefined values
//! empty and falsy as jinja2's default `Undefined`. A template that fails to parse or render is an
//! error naming the line; there is no fallback rendering.
//!
//! Known differences from transformers (none met by the golden cases):
//! - A JSON integer outside the 64-bit range is read as a float (`1.2345678901234568e+22`), where
//!   Python keeps the integer's digits.
//! - Objects that only jinja2 has (namespaces, loops, macros) print in minijinja's spelling; Python
//!   values (dicts, lists, strings, numbers, booleans, None) print and `tojson` as Python does.
//! - Where transformers fails outside `raise_exception` (a `TypeError` inside a filter), the render
//!   fails here too, with minijinja's wording.
//! - `strftime_now` formats with chrono's strftime, which agrees with C's on the usual specifiers.
//!
//! Proof: `tests/golden.rs` renders every case under `fixtures/templates/golden/` (written by
//! `fixtures/templates/make_goldens.py` with transformers itself) and compares byte for byte.

#![forbid(unsafe_code)]

mod error;
mod json;
mod reasoning;
mod template;
pub mod tools;

pub use error::TemplateError;
pub use json::ChatJson;
pub use reasoning::split_reasoning;
pub use template::{
    ChatTemplate, RenderOptions, SpecialTokens, MAX_OUTPUT_BYTES, MAX_TEMPLATE_BYTES,
};
