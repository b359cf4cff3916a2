//! `ChatTemplate::from_tokenizer_config` finds the template where transformers' AutoTokenizer does.

use serde_json::json;
use tarfa_chat::{ChatJson, ChatTemplate, RenderOptions, TemplateError};

fn user() -> ChatJson {
    ChatJson::parse(r#"[{"role": "user", "content": "hi"}]"#).expect("json")
}

#[test]
fn a_chat_template_jinja_file_wins_over_the_config() {
    let config =
        json!({"chat_template": "config", "bos_token": {"content": "<s>", "lstrip": false}});
    let t = ChatTemplate::from_tokenizer_config(&config, Some("file {{ bos_token }}"))
        .expect("ok")
        .expect("a template");
    assert_eq!(
        t.render(&user(), &RenderOptions::default())
            .expect("renders"),
        "file <s>"
    );
}

#[test]
fn a_config_string_is_the_template_and_none_is_no_template() {
    let t = ChatTemplate::from_tokenizer_config(
        &json!({"chat_template": "s {{ eos_token }}", "eos_token": "</s>"}),
        None,
    )
    .expect("ok")
    .expect("a template");
    assert_eq!(
        t.render(&user(), &RenderOptions::default())
            .expect("renders"),
        "s </s>"
    );
    assert!(
        ChatTemplate::from_tokenizer_config(&json!({"chat_template": null}), None)
            .expect("ok")
            .is_none()
    );
    assert!(ChatTemplate::from_tokenizer_config(&json!({}), None)
        .expect("ok")
        .is_none());
}

#[test]
fn a_named_list_uses_default_and_tool_use_when_tools_are_given() {
    let config = json!({"chat_template": [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "plain"},
    ]});
    let t = ChatTemplate::from_tokenizer_config(&config, None)
        .expect("ok")
        .expect("a template");
    assert_eq!(
        t.render(&user(), &RenderOptions::default())
            .expect("renders"),
        "plain"
    );
    let with_tools = RenderOptions {
        tools: Some(ChatJson::parse(r#"[{"type": "function"}]"#).expect("json")),
        ..RenderOptions::default()
    };
    assert_eq!(t.render(&user(), &with_tools).expect("renders"), "tools");
}

#[test]
fn a_named_list_without_default_is_an_error_at_render() {
    let config = json!({"chat_template": [{"name": "rag", "template": "x"}]});
    let t = ChatTemplate::from_tokenizer_config(&config, None)
        .expect("ok")
        .expect("a template");
    assert!(matches!(
        t.render(&user(), &RenderOptions::default()),
        Err(TemplateError::Config(_))
    ));
}

#[test]
fn a_chat_template_of_another_shape_is_refused() {
    assert!(matches!(
        ChatTemplate::from_tokenizer_config(&json!({"chat_template": 3}), None),
        Err(TemplateError::Config(_))
    ));
}
