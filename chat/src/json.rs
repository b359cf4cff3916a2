//! The values a template sees, as Python's `json.loads` gives them, and Python's spellings of them:
//! `json.dumps` (the `tojson` filter) and `str()`/`repr()` (what `{{ value }}` prints).
//!
//! Key order matters: transformers hands templates Python dicts, which keep insertion order, and
//! `tojson` of a tool's schema writes the keys in that order. A `serde_json::Value` without its
//! `preserve_order` feature has already sorted them, so [`ChatJson::parse`] reads JSON text itself.

use std::fmt::{self, Write as _};

use minijinja::value::{Value, ValueKind};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::TemplateError;

/// A JSON value with its objects' keys in document order, as Python's `json.loads` keeps them
/// (a repeated key keeps its first position and takes its last value, as a Python dict does).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatJson(pub(crate) Node);

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    I64(i64),
    U64(u64),
    F64(f64),
    Str(String),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

impl ChatJson {
    /// Parses JSON text, keeping every object's key order.
    pub fn parse(text: &str) -> Result<ChatJson, TemplateError> {
        serde_json::from_str::<Node>(text)
            .map(ChatJson)
            .map_err(|e| TemplateError::Input(format!("not valid JSON: {e}")))
    }

    /// Whether this is JSON `null` (transformers drops a message key whose value is `None`).
    pub fn is_null(&self) -> bool {
        matches!(self.0, Node::Null)
    }

    /// The text of a JSON string (`None` for any other value).
    pub fn as_str(&self) -> Option<&str> {
        match &self.0 {
            Node::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An object's entries in order (`None` if this is not an object): how a request's
    /// `chat_template_kwargs` become [`crate::RenderOptions::kwargs`].
    pub fn object_entries(&self) -> Option<Vec<(String, ChatJson)>> {
        match &self.0 {
            Node::Object(pairs) => Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.clone(), ChatJson(v.clone())))
                    .collect(),
            ),
            _ => None,
        }
    }

    /// A list of chat messages with each assistant message's `null` or missing `content` made
    /// `""`, as vLLM and llama-server take an OpenAI client's tool-calling turn
    /// (`{"role": "assistant", "content": null, "tool_calls": [...]}`): templates concatenate
    /// `message.content`, which a `None` would fail. Anything else is returned as it is.
    pub fn with_assistant_content(&self) -> ChatJson {
        let Node::Array(items) = &self.0 else {
            return self.clone();
        };
        let items = items
            .iter()
            .map(|m| match m {
                Node::Object(pairs)
                    if pairs
                        .iter()
                        .any(|(k, v)| k == "role" && *v == Node::Str("assistant".into())) =>
                {
                    let mut pairs = pairs.clone();
                    match pairs.iter_mut().find(|(k, _)| k == "content") {
                        Some((_, v)) if *v == Node::Null => *v = Node::Str(String::new()),
                        Some(_) => {}
                        None => pairs.push(("content".into(), Node::Str(String::new()))),
                    }
                    Node::Object(pairs)
                }
                other => other.clone(),
            })
            .collect();
        ChatJson(Node::Array(items))
    }

    /// The value a template sees.
    pub(crate) fn to_value(&self) -> Value {
        self.0.to_value()
    }
}

impl<'de> Deserialize<'de> for ChatJson {
    /// Reads JSON keeping key order, as [`ChatJson::parse`] does (for a field of a larger document).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChatJson, D::Error> {
        Node::deserialize(d).map(ChatJson)
    }
}

impl From<&serde_json::Value> for ChatJson {
    /// Converts a `serde_json::Value`; its objects' keys come in the order that value keeps them
    /// (sorted, unless serde_json's `preserve_order` feature is on). Use [`ChatJson::parse`] on
    /// the request's text where the order must be the client's.
    fn from(v: &serde_json::Value) -> ChatJson {
        fn node(v: &serde_json::Value) -> Node {
            match v {
                serde_json::Value::Null => Node::Null,
                serde_json::Value::Bool(b) => Node::Bool(*b),
                serde_json::Value::Number(n) => {
                    if let Some(i) = n.as_i64() {
                        Node::I64(i)
                    } else if let Some(u) = n.as_u64() {
                        Node::U64(u)
                    } else {
                        Node::F64(n.as_f64().unwrap_or(f64::NAN))
                    }
                }
                serde_json::Value::String(s) => Node::Str(s.clone()),
                serde_json::Value::Array(a) => Node::Array(a.iter().map(node).collect()),
                serde_json::Value::Object(o) => {
                    Node::Object(o.iter().map(|(k, v)| (k.clone(), node(v))).collect())
                }
            }
        }
        ChatJson(node(v))
    }
}

impl From<bool> for ChatJson {
    fn from(b: bool) -> ChatJson {
        ChatJson(Node::Bool(b))
    }
}

impl From<&str> for ChatJson {
    fn from(s: &str) -> ChatJson {
        ChatJson(Node::Str(s.to_string()))
    }
}

impl Node {
    fn to_value(&self) -> Value {
        match self {
            Node::Null => Value::from(()),
            Node::Bool(b) => Value::from(*b),
            Node::I64(i) => Value::from(*i),
            Node::U64(u) => Value::from(*u),
            Node::F64(f) => Value::from(*f),
            Node::Str(s) => Value::from(s.as_str()),
            Node::Array(items) => Value::from(items.iter().map(Node::to_value).collect::<Vec<_>>()),
            Node::Object(pairs) => Value::from(
                pairs
                    .iter()
                    .map(|(k, v)| (Value::from(k.as_str()), v.to_value()))
                    .collect::<indexmap::IndexMap<Value, Value>>(),
            ),
        }
    }

    /// Inserts as a Python dict does: an existing key keeps its position and takes the value.
    pub(crate) fn insert(pairs: &mut Vec<(String, Node)>, key: String, value: Node) {
        match pairs.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => pairs.push((key, value)),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Null)
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Node, E> {
                Ok(Node::Bool(b))
            }
            fn visit_i64<E: de::Error>(self, i: i64) -> Result<Node, E> {
                Ok(Node::I64(i))
            }
            fn visit_u64<E: de::Error>(self, u: u64) -> Result<Node, E> {
                Ok(Node::U64(u))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> Result<Node, E> {
                Ok(Node::F64(f))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Node, E> {
                Ok(Node::Str(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Node, E> {
                Ok(Node::Str(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Node>()? {
                    items.push(item);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut pairs = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, Node>()? {
                    Node::insert(&mut pairs, k, v);
                }
                Ok(Node::Object(pairs))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

/// `json.dumps`'s options as transformers' `tojson` filter passes them (its defaults:
/// `ensure_ascii=False, indent=None, separators=None, sort_keys=False`).
#[derive(Debug, Clone, Default)]
pub(crate) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: a newline and `s` per level (an int indent is that many spaces).
    pub indent: Option<String>,
    /// `(item, key)`; `None`: `(", ", ": ")`, or `(",", ": ")` with an indent, as Python picks.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// Python's `json.dumps(value, **opts)`.
pub(crate) fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, String> {
    let (item_sep, key_sep) = match (&opts.separators, &opts.indent) {
        (Some((i, k)), _) => (i.clone(), k.clone()),
        (None, Some(_)) => (",".to_string(), ": ".to_string()),
        (None, None) => (", ".to_string(), ": ".to_string()),
    };
    let mut out = String::new();
    dump_into(&mut out, value, opts, &item_sep, &key_sep, 0)?;
    Ok(out)
}

fn newline_indent(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(unit) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(unit);
        }
    }
}

fn dump_into(
    out: &mut String,
    value: &Value,
    opts: &DumpOptions,
    item_sep: &str,
    key_sep: &str,
    level: usize,
) -> Result<(), String> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&json_number(value)),
        ValueKind::String => {
            json_string(out, value.as_str().unwrap_or_default(), opts.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter().map_err(|e| e.to_string())?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(out, opts, level + 1);
                dump_into(out, item, opts, item_sep, key_sep, level + 1)?;
            }
            newline_indent(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut pairs = Vec::new();
            for key in value.try_iter().map_err(|e| e.to_string())? {
                let item = value.get_item(&key).map_err(|e| e.to_string())?;
                pairs.push((json_key(&key)?, item));
            }
            if opts.sort_keys {
                pairs.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline_indent(out, opts, level + 1);
                json_string(out, key, opts.ensure_ascii);
                out.push_str(key_sep);
                dump_into(out, item, opts, item_sep, key_sep, level + 1)?;
            }
            newline_indent(out, opts, level);
            out.push('}');
        }
        ValueKind::Undefined => {
            return Err("Object of type Undefined is not JSON serializable".into())
        }
        other => return Err(format!("Object of type {other} is not JSON serializable")),
    }
    Ok(())
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers, booleans and None spelled.
fn json_key(key: &Value) -> Result<String, String> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_string()),
        ValueKind::Number => Ok(json_number(key)),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        other => Err(format!(
            "keys must be str, int, float, bool or None, not {other}"
        )),
    }
}

fn json_number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) if f.is_nan() => "NaN".to_string(),
        Ok(f) if f.is_infinite() => if f > 0.0 { "Infinity" } else { "-Infinity" }.to_string(),
        Ok(f) => py_float_repr(f),
        Err(_) => v.to_string(),
    }
}

/// A string as `json.dumps` writes it (`ensure_ascii` escapes everything past U+007F as `\uxxxx`,
/// astral characters as a surrogate pair; both spell other control characters as `\u00xx`).
pub(crate) fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)` for a finite float: the shortest digits that read back to it, fixed
/// notation for exponents in [-4, 16), else `d.ddde+XX`.
pub(crate) fn py_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does.
    let sci = format!("{f:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if (point as usize) >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            let (int, frac) = digits.split_at(point as usize);
            format!("{int}.{frac}")
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mant}e{esign}{:02}", exp.abs())
    }
}

/// Python's `str(value)`: what `{{ value }}` prints in jinja2 (an undefined value prints nothing).
pub(crate) fn py_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        _ => py_repr(v),
    }
}

/// Python's `repr(value)` for the JSON-shaped values templates hold.
pub(crate) fn py_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::Undefined => String::new(),
        ValueKind::None => "None".into(),
        ValueKind::Bool => if v.is_true() { "True" } else { "False" }.into(),
        ValueKind::Number => {
            if v.is_integer() {
                v.to_string()
            } else {
                f64::try_from(v.clone())
                    .map(py_float_repr)
                    .unwrap_or_else(|_| v.to_string())
            }
        }
        ValueKind::String => py_str_repr(v.as_str().unwrap_or_default()),
        ValueKind::Seq => match v.try_iter() {
            Ok(items) => {
                let inner: Vec<String> = items.map(|i| py_repr(&i)).collect();
                if v.is_tuple() {
                    if inner.len() == 1 {
                        format!("({},)", inner[0])
                    } else {
                        format!("({})", inner.join(", "))
                    }
                } else {
                    format!("[{}]", inner.join(", "))
                }
            }
            Err(_) => v.to_string(),
        },
        ValueKind::Map
            if v.as_object()
                .is_some_and(|o| o.repr() == minijinja::value::ObjectRepr::Map) =>
        {
            match v.try_iter() {
                Ok(keys) => {
                    let inner: Vec<String> = keys
                        .map(|k| {
                            let item = v.get_item(&k).unwrap_or_default();
                            format!("{}: {}", py_repr(&k), py_repr(&item))
                        })
                        .collect();
                    format!("{{{}}}", inner.join(", "))
                }
                Err(_) => v.to_string(),
            }
        }
        // Namespaces, loops, macros: minijinja's own spelling (jinja2's differs; templates don't print them).
        _ => v.to_string(),
    }
}

/// Python's `repr(str)`: single quotes unless the text holds a `'` and no `"`.
fn py_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_pythons_spelling() {
        for (f, want) in [
            (1.0, "1.0"),
            (-0.5, "-0.5"),
            (21.5, "21.5"),
            (0.1, "0.1"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456789012345.6, "123456789012345.6"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.25e-7, "1.25e-07"),
            (1e300, "1e+300"),
        ] {
            assert_eq!(py_float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn parse_keeps_key_order_and_a_repeated_key_keeps_its_first_place() {
        let j = ChatJson::parse(r#"{"b": 1, "a": 2, "b": 3}"#).expect("json");
        assert_eq!(
            j.0,
            Node::Object(vec![("b".into(), Node::U64(3)), ("a".into(), Node::U64(2))])
        );
    }

    #[test]
    fn repr_of_a_dict_is_pythons() {
        let j = ChatJson::parse(r#"{"s": "it's", "n": null, "t": true, "l": [1, 2.5, "x"]}"#)
            .expect("json");
        assert_eq!(
            py_repr(&j.to_value()),
            r#"{'s': "it's", 'n': None, 't': True, 'l': [1, 2.5, 'x']}"#
        );
    }
}
