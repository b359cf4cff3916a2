//! What `tarfa serve` reads from a client or a model on the chat route: a request's JSON
//! (`tarfa_chat::ChatJson`, read keeping key order) rendered as messages by real chat templates
//! (Qwen3's, Qwen3.5's, GLM-4.6's: minijinja with transformers' environment), and a reply's text
//! read for tool calls in each format. None may panic; a reply's calls each carry a JSON object
//! of arguments, its content is the text before them, and what a stream sends of each prefix
//! never shrinks and never passes the content of the whole reply.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tarfa_chat::tools::{self, ToolFormat};
use tarfa_chat::{ChatJson, ChatTemplate, RenderOptions, SpecialTokens};

const TEMPLATES: [&str; 3] = [
    include_str!("../../fixtures/templates/Qwen-Qwen3-0.6B.jinja"),
    include_str!("../../fixtures/templates/Qwen3.5-4B.jinja"),
    include_str!("../../fixtures/templates/GLM-4.6.jinja"),
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // A reply.
    let schema = serde_json::json!([{"type": "function", "function": {"name": "f",
        "parameters": {"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}}}]);
    let schema = schema.as_array().expect("list");
    for format in [ToolFormat::Hermes, ToolFormat::QwenXml, ToolFormat::Glm] {
        if let Some((content, calls)) = tools::parse(format, text, schema) {
            assert!(text.starts_with(content.as_str()), "{content:?}");
            assert!(!calls.is_empty());
            for c in calls {
                let v: serde_json::Value =
                    serde_json::from_str(&c.arguments).expect("arguments are JSON");
                assert!(v.is_object(), "{}", c.arguments);
            }
        }
    }
    // What a stream sends of each prefix (its first 512 bytes, at character boundaries) never
    // shrinks, and never goes past the content a whole reply gives when its calls parse.
    let whole = tools::parse(ToolFormat::Hermes, text, schema).map(|(c, _)| c.len());
    let mut sent = 0;
    for end in (0..=text.len().min(512)).filter(|&i| text.is_char_boundary(i)) {
        let n = tools::streamable(&text[..end]);
        assert!(text.is_char_boundary(n) && n <= end);
        assert!(n >= sent, "{n} after {sent}");
        if let Some(c) = whole {
            assert!(n <= c, "{n} past the content's {c}");
        }
        sent = n;
    }
    // A request's messages, through real templates.
    if let Ok(messages) = ChatJson::parse(text) {
        for source in TEMPLATES {
            let t = ChatTemplate::new(source, SpecialTokens::new()).expect("the template loads");
            let opts = RenderOptions {
                add_generation_prompt: true,
                ..RenderOptions::default()
            };
            let _ = t.render(&messages, &opts);
        }
    }
});
