//! Tool calls parsed out of a reply (what `tarfa serve` gives as `tool_calls`), in the format the model's chat template teaches it (the
//! formats vLLM's `hermes`, `qwen3_coder` and `glm45` parsers read):
//!
//! - Hermes (Qwen2.5, Qwen3): `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`;
//! - Qwen3-Coder and Qwen3.5: `<tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n…
//!   </function>\n</tool_call>`;
//! - GLM-4.5 to 4.7: `<tool_call>f\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>\n…</tool_call>`.
//!
//! A reply's content is the text before its first `<tool_call>` (trailing whitespace dropped),
//! its calls the blocks from there. A reply that does not parse whole — a block unclosed (the
//! answer ran out of tokens), not in the format, or text after the calls — is content alone, as
//! it was written. The `arguments` are JSON text in the model's own words where it wrote JSON (a
//! Hermes call's object, a parameter that is JSON), and a parameter's string as a JSON string
//! where the tool's schema says it is a string or the text is not JSON.

use serde_json::Value;

/// Where every format's call begins.
pub const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// A chat template's tool-call format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// A JSON object in each `<tool_call>` block.
    Hermes,
    /// `<function=…>` with `<parameter=…>` blocks.
    QwenXml,
    /// The name, then `<arg_key>`/`<arg_value>` pairs.
    Glm,
}

impl ToolFormat {
    /// The format a template's source teaches, if it is one of these.
    pub fn of_template(source: &str) -> Option<ToolFormat> {
        if !source.contains(OPEN) {
            None
        } else if source.contains("<function=") && source.contains("<parameter=") {
            Some(ToolFormat::QwenXml)
        } else if source.contains("<arg_key>") {
            Some(ToolFormat::Glm)
        } else {
            Some(ToolFormat::Hermes)
        }
    }
}

/// One call: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function.
    pub name: String,
    /// Its arguments: a JSON object's text.
    pub arguments: String,
}

impl ToolCall {
    /// OpenAI's `tool_calls` entry of the `k`th call of choice `choice`: its id a hash (FNV-1a)
    /// of what it is, where, and `context` (a hash of the prompt: the same call in a later turn
    /// of the conversation gets another id), so the same request gives the same bytes.
    pub fn json(&self, context: u64, choice: usize, k: usize) -> Value {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let key = format!(
            "{context}\0{choice}\0{k}\0{}\0{}",
            self.name, self.arguments
        );
        for b in key.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        serde_json::json!({
            "id": format!("call_{h:016x}"),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// A reply's content and its calls; `None` when it has no call that parses (it is content).
pub fn parse(format: ToolFormat, text: &str, tools: &[Value]) -> Option<(String, Vec<ToolCall>)> {
    let start = text.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[start..];
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let inner = rest.strip_prefix(OPEN)?;
        let end = inner.find(CLOSE)?;
        calls.push(call(format, &inner[..end], tools)?);
        rest = &inner[end + CLOSE.len()..];
    }
    Some((text[..start].trim_end().to_string(), calls))
}

/// Of a reply being streamed, how much of its content may be sent now: the text before a call
/// (its trailing whitespace held back: a call may follow it) less what may begin one.
pub fn streamable(text: &str) -> usize {
    let before = match text.find(OPEN) {
        Some(at) => &text[..at],
        None => {
            // The longest end of the text that may begin a call (OPEN is ASCII: any length of
            // it ends on a character boundary).
            let held = (1..OPEN.len())
                .rev()
                .find(|&n| text.ends_with(&OPEN[..n]))
                .unwrap_or(0);
            &text[..text.len() - held]
        }
    };
    before.trim_end().len()
}

fn call(format: ToolFormat, block: &str, tools: &[Value]) -> Option<ToolCall> {
    match format {
        ToolFormat::Hermes => hermes(block),
        ToolFormat::QwenXml => qwen_xml(block, tools),
        ToolFormat::Glm => glm(block, tools),
    }
}

fn hermes(block: &str) -> Option<ToolCall> {
    #[derive(serde::Deserialize)]
    struct Call<'a> {
        name: String,
        #[serde(borrow, alias = "parameters")]
        arguments: Option<&'a serde_json::value::RawValue>,
    }
    let c: Call<'_> = serde_json::from_str(block.trim()).ok()?;
    let arguments = match c.arguments {
        // A model that wrote its arguments as a JSON string of an object: that object.
        Some(raw) => match serde_json::from_str::<Value>(raw.get()).ok()? {
            Value::Object(_) => raw.get().to_string(),
            Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
            _ => return None,
        },
        None => "{}".to_string(),
    };
    Some(ToolCall {
        name: c.name,
        arguments,
    })
}

fn qwen_xml(block: &str, tools: &[Value]) -> Option<ToolCall> {
    let body = block.trim().strip_prefix("<function=")?;
    let (name, mut rest) = body.split_once('>')?;
    rest = rest.trim_end().strip_suffix("</function>")?;
    let mut args = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let p = rest.strip_prefix("<parameter=")?;
        let (key, after) = p.split_once('>')?;
        let end = after.find("</parameter>")?;
        let v = &after[..end];
        // The value is between a newline after the tag and one before the closing tag.
        let v = v.strip_prefix('\n').unwrap_or(v);
        let v = v.strip_suffix('\n').unwrap_or(v);
        args.push((key.trim().to_string(), v.to_string()));
        rest = &after[end + "</parameter>".len()..];
    }
    let name = name.trim().to_string();
    let arguments = object(&name, &args, tools);
    Some(ToolCall { name, arguments })
}

fn glm(block: &str, tools: &[Value]) -> Option<ToolCall> {
    let block = block.trim();
    let name_end = block.find("<arg_key>").unwrap_or(block.len());
    let name = block[..name_end].trim().to_string();
    if name.is_empty() || name.contains('<') {
        return None;
    }
    let mut rest = &block[name_end..];
    let mut args = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let k = rest.strip_prefix("<arg_key>")?;
        let (key, after) = k.split_once("</arg_key>")?;
        let v = after.trim_start().strip_prefix("<arg_value>")?;
        let (value, after) = v.split_once("</arg_value>")?;
        args.push((key.trim().to_string(), value.to_string()));
        rest = after;
    }
    let arguments = object(&name, &args, tools);
    Some(ToolCall { name, arguments })
}

/// The JSON text of an object of `args` in their order (Python's `json.dumps` separators, as
/// vLLM's parsers write it): each value a JSON string where the tool's schema says "string", or
/// where it has no schema or the text is not JSON; else the value's JSON text itself.
fn object(function: &str, args: &[(String, String)], tools: &[Value]) -> String {
    let schema_type = |key: &str| -> Option<String> {
        tools
            .iter()
            .filter_map(|t| t.get("function"))
            .find(|f| f.get("name").and_then(Value::as_str) == Some(function))?
            .get("parameters")?
            .get("properties")?
            .get(key)?
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    let quoted = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string());
    let fields: Vec<String> = args
        .iter()
        .map(|(k, v)| {
            let value = match schema_type(k).as_deref() {
                None | Some("string") => quoted(v),
                Some(_) => {
                    let t = v.trim();
                    if serde_json::from_str::<Value>(t).is_ok() {
                        t.to_string()
                    } else {
                        quoted(v)
                    }
                }
            };
            format!("{}: {value}", quoted(k))
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"},
                "units": {"type": "object"}, "code": {"type": "string"}}}}}),
        ]
    }

    #[test]
    fn the_formats_are_told_apart_by_their_templates() {
        let t = |name: &str| {
            let p = format!(
                "{}/../fixtures/templates/{name}.jinja",
                env!("CARGO_MANIFEST_DIR")
            );
            ToolFormat::of_template(&std::fs::read_to_string(p).expect("template"))
        };
        assert_eq!(t("Qwen-Qwen3-0.6B"), Some(ToolFormat::Hermes));
        assert_eq!(t("Qwen3.5-4B"), Some(ToolFormat::QwenXml));
        assert_eq!(t("GLM-4.6"), Some(ToolFormat::Glm));
        assert_eq!(t("Mistral-Small-3.2-24B-Instruct-2506"), None);
        assert_eq!(t("openai-gpt-oss-120b"), None);
    }

    #[test]
    fn hermes_calls_keep_the_models_json() {
        let text = "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(ToolFormat::Hermes, text, &weather()).expect("calls");
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        // The model's key order and spacing, not a re-serialisation (which would sort keys).
        assert_eq!(calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");
        assert_eq!(calls[1].arguments, "{}");
        // Arguments written as a JSON string of an object.
        let (_, c) = parse(
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
            &[],
        )
        .expect("call");
        assert_eq!(c[0].arguments, "{\"a\": 1}");
    }

    #[test]
    fn qwen_xml_parameters_follow_the_tools_schema() {
        let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=units>\n{\"t\": \"C\"}\n</parameter>\n<parameter=code>\n007\n</parameter>\n<parameter=extra>\n1\n</parameter>\n</function>\n</tool_call>";
        let (content, calls) = parse(ToolFormat::QwenXml, text, &weather()).expect("calls");
        assert_eq!(content, "");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            "{\"city\": \"São Paulo\", \"days\": 3, \"units\": {\"t\": \"C\"}, \"code\": \"007\", \"extra\": \"1\"}"
        );
        let v: Value = serde_json::from_str(&calls[0].arguments).expect("JSON");
        assert_eq!(v["days"], 3);
    }

    #[test]
    fn glm_arguments_follow_the_tools_schema() {
        let text = "I'll look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo \"N\"</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
        let (content, calls) = parse(ToolFormat::Glm, text, &weather()).expect("calls");
        assert_eq!(content, "I'll look.");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            "{\"city\": \"Oslo \\\"N\\\"\", \"days\": 2}"
        );
        let (_, c) = parse(ToolFormat::Glm, "<tool_call>now</tool_call>", &[]).expect("call");
        assert_eq!(c[0].arguments, "{}");
    }

    #[test]
    fn a_reply_that_does_not_parse_whole_is_content() {
        for (f, text) in [
            (ToolFormat::Hermes, "plain answer"),
            // Ran out of tokens inside the call.
            (ToolFormat::Hermes, "<tool_call>\n{\"name\": \"f\", \"argu"),
            (ToolFormat::Hermes, "<tool_call>not json</tool_call>"),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\"}</tool_call> and then text",
            ),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            ),
            (
                ToolFormat::QwenXml,
                "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>",
            ),
            (
                ToolFormat::Glm,
                "<tool_call>f\n<arg_key>a</arg_key>\n</tool_call>",
            ),
            (
                ToolFormat::Glm,
                "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
            ),
        ] {
            assert_eq!(parse(f, text, &[]), None, "{text:?}");
        }
    }

    #[test]
    fn a_stream_sends_content_only_up_to_where_a_call_may_begin() {
        assert_eq!(streamable("Sure"), 4);
        assert_eq!(streamable("Sure.\n\n"), 5);
        assert_eq!(streamable("Sure. <tool_c"), 5);
        assert_eq!(streamable("Sure. <tool_call>{\"na"), 5);
        assert_eq!(streamable("a < b"), 5);
        // What streams is always the beginning of the content a whole reply gives.
        let text = "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let (content, _) = parse(ToolFormat::Hermes, text, &[]).expect("call");
        let mut sent = 0;
        for (i, _) in text.char_indices().chain([(text.len(), ' ')]) {
            let n = streamable(&text[..i]);
            assert!(n >= sent && content.len() >= n.min(content.len()));
            sent = n;
        }
        assert_eq!(sent, content.len());
    }
}
