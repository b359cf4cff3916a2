//! A chat template compiled in an environment built as transformers builds its own
//! (`transformers/utils/chat_template_utils.py`, `_cached_compile_jinja_template`), and rendered
//! with the variables `PreTrainedTokenizerBase.apply_chat_template` passes.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io;

use chrono::NaiveDateTime;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};

use crate::json::{dumps, py_str, ChatJson, DumpOptions, Node};
use crate::TemplateError;

/// The largest template source accepted, in bytes (real templates are under 20 KiB).
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;
/// The largest rendered prompt, in bytes; past it rendering stops with [`TemplateError::TooLarge`].
pub const MAX_OUTPUT_BYTES: usize = 64 << 20;

/// transformers' named special tokens (`SPECIAL_TOKENS_ATTRIBUTES`), passed to every template
/// under these names when the tokenizer sets them.
const SPECIAL_TOKEN_NAMES: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Variables the renderer sets itself; a kwarg of the same name is refused, as Python refuses a
/// keyword argument given twice.
const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The tokenizer's special tokens as the template sees them (`bos_token`, `eos_token`, …):
/// transformers passes its `special_tokens_map` to every render, under the caller's kwargs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecialTokens {
    tokens: Vec<(String, String)>,
}

impl SpecialTokens {
    /// No special tokens.
    pub fn new() -> SpecialTokens {
        SpecialTokens::default()
    }

    /// Sets `name` (e.g. `"bos_token"`) to `token`, replacing an earlier value.
    pub fn with(mut self, name: &str, token: &str) -> SpecialTokens {
        match self.tokens.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = token.to_string(),
            None => self.tokens.push((name.to_string(), token.to_string())),
        }
        self
    }

    /// The token named `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.tokens
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
    }

    /// The named special tokens of a `tokenizer_config.json`: `bos_token` … `mask_token` (a string,
    /// or an AddedToken object's `content`), plus the names of an `extra_special_tokens` object
    /// (transformers 5 adds those to its named tokens). `null` or absent ones are not set.
    pub fn from_tokenizer_config(
        config: &serde_json::Value,
    ) -> Result<SpecialTokens, TemplateError> {
        fn token(name: &str, v: &serde_json::Value) -> Result<Option<String>, TemplateError> {
            match v {
                serde_json::Value::Null => Ok(None),
                serde_json::Value::String(s) => Ok(Some(s.clone())),
                serde_json::Value::Object(o) => match o.get("content") {
                    Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(TemplateError::Config(format!(
                        "{name} is an object without a string \"content\""
                    ))),
                },
                _ => Err(TemplateError::Config(format!(
                    "{name} is neither a string nor an AddedToken object"
                ))),
            }
        }
        let mut out = SpecialTokens::new();
        for name in SPECIAL_TOKEN_NAMES {
            if let Some(v) = config.get(name) {
                if let Some(t) = token(name, v)? {
                    out = out.with(name, &t);
                }
            }
        }
        if let Some(serde_json::Value::Object(extra)) = config.get("extra_special_tokens") {
            for (name, v) in extra {
                if let Some(t) = token(name, v)? {
                    out = out.with(name, &t);
                }
            }
        }
        Ok(out)
    }
}

/// What a render is asked for, beside the messages: `apply_chat_template`'s arguments.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the assistant's header so the model answers (`add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// Tools as JSON schemas (an array of objects, e.g. OpenAI's `{"type": "function", …}`), passed
    /// as given; `None` passes `tools=None` (defined, and none).
    pub tools: Option<ChatJson>,
    /// Documents for retrieval-augmented templates (an array of objects); `None` passes `None`.
    pub documents: Option<ChatJson>,
    /// Further template variables (`chat_template_kwargs`, e.g. `enable_thinking`); they override
    /// a special token of the same name, as transformers' `{**special_tokens_map, **kwargs}` does.
    pub kwargs: Vec<(String, ChatJson)>,
    /// The time `strftime_now` formats; `None` is the local time now (Python's `datetime.now()`).
    pub now: Option<NaiveDateTime>,
}

/// A compiled chat template: one, or several by name as a tokenizer config's list holds them.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    names: Vec<String>,
    specials: SpecialTokens,
}

thread_local! {
    /// The clock `strftime_now` reads during one render on this thread (`None`: the local time).
    static RENDER_NOW: Cell<Option<NaiveDateTime>> = const { Cell::new(None) };
}

/// Marks a `raise_exception` error so the template's own message comes back verbatim.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[…, loopcontrols]);
    // jinja2's defaults: no autoescape, a template's single trailing newline dropped, lenient undefined.
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build();
    // The default delimiters always build; should that ever change, the defaults stay.
    if let Ok(syntax) = syntax {
        env.set_syntax(syntax);
    }
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // jinja2 prints a value with Python's str(): True, None, {'a': 1}.
    env.set_formatter(|out, _state, value| {
        out.write_str(&py_str(value)).map_err(|_| {
            Error::new(
                ErrorKind::WriteFailure,
                "writing the rendered prompt failed",
            )
        })
    });
    env.add_filter("string", |v: &Value| Value::from(py_str(v)));
    env.add_filter("tojson", tojson);
    env.add_function(
        "raise_exception",
        |message: &Value| -> Result<Value, Error> {
            let message = py_str(message);
            Err(Error::new(ErrorKind::InvalidOperation, message.clone())
                .with_source(Raised(message)))
        },
    );
    env.add_function("strftime_now", strftime_now);
    env
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`; `ensure_ascii` and `indent` by position or name, `separators` and `sort_keys`
/// by name (templates pass them so).
fn tojson(
    value: &Value,
    ensure_ascii: Option<Value>,
    indent: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let pick = |positional: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or(positional))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(None, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) if v.kind() == ValueKind::String => {
            Some(v.as_str().unwrap_or_default().to_string())
        }
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(n.max(0) as usize)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: indent must be an int or a str, not {}", v.kind()),
                ))
            }
        },
    };
    let separators = match pick(None, "separators")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => Some((
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    let opts = DumpOptions {
        ensure_ascii,
        indent,
        separators,
        sort_keys,
    };
    dumps(value, &opts)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))
}

/// transformers' `strftime_now(format)`: `datetime.now().strftime(format)`.
fn strftime_now(format: &str) -> Result<Value, Error> {
    let now = RENDER_NOW
        .with(Cell::get)
        .unwrap_or_else(|| chrono::Local::now().naive_local());
    let mut out = String::new();
    write!(out, "{}", now.format(format)).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: the format {format:?} is not one strftime reads"),
        )
    })?;
    Ok(Value::from(out))
}

/// Sets the render clock for this thread and clears it when dropped (also on an error).
struct ClockGuard;

impl ClockGuard {
    fn set(now: Option<NaiveDateTime>) -> ClockGuard {
        RENDER_NOW.with(|c| c.set(now));
        ClockGuard
    }
}

impl Drop for ClockGuard {
    fn drop(&mut self) {
        RENDER_NOW.with(|c| c.set(None));
    }
}

/// An `io::Write` that refuses to grow past [`MAX_OUTPUT_BYTES`].
struct BoundedOutput {
    bytes: Vec<u8>,
    limit: usize,
    crossed_at: Option<usize>,
}

impl io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let total = self.bytes.len().saturating_add(buf.len());
        if total > self.limit {
            self.crossed_at = Some(total);
            return Err(io::Error::other("rendered prompt over its bound"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn render_error(err: &Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<Raised>() {
            return TemplateError::Raised {
                message: raised.0.clone(),
                line: err.line(),
            };
        }
        source = e.source();
    }
    TemplateError::Render {
        line: err.line(),
        detail: err.to_string(),
    }
}

fn syntax_error(err: &Error) -> TemplateError {
    TemplateError::Syntax {
        line: err.line(),
        detail: err.to_string(),
    }
}

impl ChatTemplate {
    /// Compiles one template (the `default`); a syntax error names its line.
    pub fn new(source: &str, specials: SpecialTokens) -> Result<ChatTemplate, TemplateError> {
        ChatTemplate::named(vec![("default".to_string(), source.to_string())], specials)
    }

    /// Compiles several templates by name, as a tokenizer config's list of `{name, template}`
    /// holds them; [`ChatTemplate::render`] picks `tool_use` when tools are given and it exists,
    /// else `default`.
    pub fn named(
        templates: Vec<(String, String)>,
        specials: SpecialTokens,
    ) -> Result<ChatTemplate, TemplateError> {
        let mut env = environment();
        let mut names = Vec::new();
        for (name, source) in templates {
            if source.len() > MAX_TEMPLATE_BYTES {
                return Err(TemplateError::TooLarge {
                    what: "chat template",
                    limit: MAX_TEMPLATE_BYTES,
                    actual: source.len(),
                });
            }
            env.add_template_owned(name.clone(), source)
                .map_err(|e| syntax_error(&e))?;
            names.push(name);
        }
        Ok(ChatTemplate {
            env,
            names,
            specials,
        })
    }

    /// The model's chat template as transformers' `AutoTokenizer` finds it: a `chat_template.jinja`
    /// file (its text in `jinja_file`) wins over the tokenizer config's `chat_template`, which is a
    /// string or a list of `{"name", "template"}` objects. `Ok(None)`: the model has no template.
    ///
    /// A `chat_template.json` is not read here: in transformers 5 only `AutoProcessor` (multimodal
    /// processors) reads that legacy file, never the tokenizer. A `chat_templates/` directory of
    /// extra named templates is not read either.
    pub fn from_tokenizer_config(
        config: &serde_json::Value,
        jinja_file: Option<&str>,
    ) -> Result<Option<ChatTemplate>, TemplateError> {
        let specials = SpecialTokens::from_tokenizer_config(config)?;
        if let Some(source) = jinja_file {
            return ChatTemplate::new(source, specials).map(Some);
        }
        match config.get("chat_template") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => ChatTemplate::new(s, specials).map(Some),
            Some(serde_json::Value::Array(list)) => {
                let mut templates = Vec::new();
                for entry in list {
                    match (
                        entry.get("name").and_then(|v| v.as_str()),
                        entry.get("template").and_then(|v| v.as_str()),
                    ) {
                        (Some(name), Some(template)) => {
                            templates.push((name.to_string(), template.to_string()));
                        }
                        _ => return Err(TemplateError::Config(
                            "chat_template list entries must be {\"name\": str, \"template\": str}"
                                .into(),
                        )),
                    }
                }
                ChatTemplate::named(templates, specials).map(Some)
            }
            Some(_) => Err(TemplateError::Config(
                "chat_template must be a string or a list of {name, template}".into(),
            )),
        }
    }

    /// The special tokens every render passes.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.specials
    }

    /// Renders `messages` (a JSON array of message objects) as transformers'
    /// `apply_chat_template(messages, tools=…, documents=…, add_generation_prompt=…, tokenize=False,
    /// **kwargs)` does: the conversation must not be empty; a message key whose value is `null` is
    /// dropped; a message's reasoning (`reasoning_content`, `thinking` or `reasoning`) is passed under
    /// both `reasoning_content` and `thinking`; `bos_token` and the other special tokens are set.
    pub fn render(
        &self,
        messages: &ChatJson,
        opts: &RenderOptions,
    ) -> Result<String, TemplateError> {
        let name = self.pick(opts.tools.is_some())?;
        let template = self.env.get_template(name).map_err(|e| syntax_error(&e))?;

        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), conversation(messages)?),
            (
                "tools".into(),
                list_of_objects(opts.tools.as_ref(), "tools")?,
            ),
            (
                "documents".into(),
                list_of_objects(opts.documents.as_ref(), "documents")?,
            ),
            (
                "add_generation_prompt".into(),
                Value::from(opts.add_generation_prompt),
            ),
        ];
        for (name, token) in &self.specials.tokens {
            if !opts.kwargs.iter().any(|(k, _)| k == name) {
                ctx.push((name.clone(), Value::from(token.as_str())));
            }
        }
        for (name, value) in &opts.kwargs {
            if RESERVED.contains(&name.as_str()) {
                return Err(TemplateError::Input(format!(
                    "the kwarg {name:?} is set by the renderer itself"
                )));
            }
            ctx.push((name.clone(), value.to_value()));
        }
        let ctx = Value::from(
            ctx.into_iter()
                .map(|(k, v)| (Value::from(k), v))
                .collect::<indexmap::IndexMap<Value, Value>>(),
        );

        let _clock = ClockGuard::set(opts.now);
        let mut out = BoundedOutput {
            bytes: Vec::new(),
            limit: MAX_OUTPUT_BYTES,
            crossed_at: None,
        };
        let result = template.render_captured_to(ctx, &mut out);
        if let Some(actual) = out.crossed_at {
            return Err(TemplateError::TooLarge {
                what: "rendered prompt",
                limit: MAX_OUTPUT_BYTES,
                actual,
            });
        }
        result.map_err(|e| render_error(&e))?;
        String::from_utf8(out.bytes).map_err(|e| TemplateError::Render {
            line: None,
            detail: format!("the rendered prompt is not UTF-8: {e}"),
        })
    }

    /// transformers' `get_chat_template`: `tool_use` when tools are given and it exists, else
    /// `default`, else an error naming the templates there are.
    fn pick(&self, with_tools: bool) -> Result<&str, TemplateError> {
        if with_tools {
            if let Some(n) = self.names.iter().find(|n| *n == "tool_use") {
                return Ok(n);
            }
        }
        if let Some(n) = self.names.iter().find(|n| *n == "default") {
            return Ok(n);
        }
        let mut names = self.names.clone();
        names.sort();
        Err(TemplateError::Config(format!(
            "the model has several chat templates and no \"default\": {names:?}"
        )))
    }
}

/// The conversation as transformers normalizes it (`_normalize_chat_messages`,
/// `_alias_reasoning_fields`).
fn conversation(messages: &ChatJson) -> Result<Value, TemplateError> {
    let Node::Array(list) = &messages.0 else {
        return Err(TemplateError::Input("messages must be a JSON array".into()));
    };
    if list.is_empty() {
        return Err(TemplateError::Input(
            "Cannot apply chat template to an empty conversation. Provide at least one message."
                .into(),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, message) in list.iter().enumerate() {
        let Node::Object(pairs) = message else {
            return Err(TemplateError::Input(format!(
                "message {i} is not an object (transformers: chat messages should be dicts)"
            )));
        };
        let pairs: Vec<(String, Node)> = pairs
            .iter()
            .filter(|(_, v)| *v != Node::Null)
            .cloned()
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|key| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()));
        let pairs = match reasoning {
            // {"thinking": r, **message, "reasoning_content": r}
            Some(r) => {
                let mut aliased = vec![("thinking".to_string(), r.clone())];
                for (k, v) in pairs {
                    Node::insert(&mut aliased, k, v);
                }
                Node::insert(&mut aliased, "reasoning_content".into(), r);
                aliased
            }
            None => pairs,
        };
        out.push(ChatJson(Node::Object(pairs)).to_value());
    }
    Ok(Value::from(out))
}

/// `tools` / `documents`: `None`, or a list whose every item is an object.
fn list_of_objects(value: Option<&ChatJson>, what: &str) -> Result<Value, TemplateError> {
    let Some(value) = value else {
        return Ok(Value::from(()));
    };
    match &value.0 {
        Node::Array(items) if items.iter().all(|i| matches!(i, Node::Object(_))) => {
            Ok(value.to_value())
        }
        _ => Err(TemplateError::Input(format!(
            "{what} must be a JSON array of objects (JSON schemas for tools)"
        ))),
    }
}
