//! The one error type: what failed and, for a template's own fault, the line.

/// Why a chat template could not be loaded or rendered. Nothing falls back: a template that fails
/// is reported, never replaced by another rendering.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template does not parse (jinja syntax), or names an unknown filter or test.
    #[error("chat template does not parse (line {line:?}): {detail}")]
    Syntax {
        /// The template's 1-based line, where minijinja gives one.
        line: Option<usize>,
        /// minijinja's message.
        detail: String,
    },
    /// The template called `raise_exception(message)`: transformers refuses the conversation with
    /// exactly this message (a `jinja2.exceptions.TemplateError`).
    #[error("chat template refused the conversation (line {line:?}): {message}")]
    Raised {
        /// The template's own message, verbatim.
        message: String,
        /// The line of the `raise_exception` call.
        line: Option<usize>,
    },
    /// Rendering failed inside the template (a type error, a bad filter argument, an undefined
    /// value used as an object, the output over [`crate::MAX_OUTPUT_BYTES`]).
    #[error("chat template failed while rendering (line {line:?}): {detail}")]
    Render {
        /// The template's 1-based line, where minijinja gives one.
        line: Option<usize>,
        /// What went wrong.
        detail: String,
    },
    /// The inputs are not what transformers accepts (an empty conversation, a message that is not
    /// an object, a tool that is not a JSON schema, invalid JSON).
    #[error("chat input refused: {0}")]
    Input(String),
    /// The tokenizer config's `chat_template` (or a special token) is not in a shape transformers
    /// reads, or names templates without a default.
    #[error("tokenizer config: {0}")]
    Config(String),
    /// A template or a rendering past its bound.
    #[error("{what} is {actual} bytes, over the limit of {limit}")]
    TooLarge {
        /// "chat template" or "rendered prompt".
        what: &'static str,
        /// The bound.
        limit: usize,
        /// The size met (for the output: the size when the bound was crossed).
        actual: usize,
    },
}

impl TemplateError {
    /// The template line the error points at, if it is the template's fault and minijinja knows.
    pub fn line(&self) -> Option<usize> {
        match self {
            TemplateError::Syntax { line, .. }
            | TemplateError::Raised { line, .. }
            | TemplateError::Render { line, .. } => *line,
            _ => None,
        }
    }
}
