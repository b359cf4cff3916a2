//! The environment matches transformers' on each feature, with expected strings produced by
//! transformers 5.25.0's `render_jinja_template` (jinja2 3.1.6) for the same template and input.

use tarfa_chat::{
    ChatJson, ChatTemplate, RenderOptions, SpecialTokens, TemplateError, MAX_OUTPUT_BYTES,
    MAX_TEMPLATE_BYTES,
};

/// The value the tojson/str cases render: non-ASCII (BMP and astral), nesting, escapes, empties,
/// floats in both of Python's notations.
const VALUE: &str = r#"{"name": "Zürich ☃ 😀", "nested": {"b": [1, 2.5, null, true], "a": {"q": "\"\\\n\t\u0001"}}, "e": [], "o": {}, "f": 1e16, "g": 1e-5}"#;

fn render(source: &str, messages: &str) -> Result<String, TemplateError> {
    let t = ChatTemplate::new(source, SpecialTokens::new())?;
    t.render(
        &ChatJson::parse(messages).expect("messages json"),
        &RenderOptions::default(),
    )
}

fn with_value(source: &str) -> String {
    render(source, &format!(r#"[{{"role": "user", "v": {VALUE}}}]"#)).expect("renders")
}

#[test]
fn tojson_is_json_dumps_with_transformers_defaults() {
    assert_eq!(
        with_value("{{ messages[0].v|tojson }}"),
        "{\"name\": \"Zürich ☃ 😀\", \"nested\": {\"b\": [1, 2.5, null, true], \"a\": {\"q\": \"\\\"\\\\\\n\\t\\u0001\"}}, \"e\": [], \"o\": {}, \"f\": 1e+16, \"g\": 1e-05}"
    );
}

#[test]
fn tojson_indent_is_json_dumps_indent() {
    assert_eq!(
        with_value("{{ messages[0].v|tojson(indent=2) }}"),
        "{\n  \"name\": \"Zürich ☃ 😀\",\n  \"nested\": {\n    \"b\": [\n      1,\n      2.5,\n      null,\n      true\n    ],\n    \"a\": {\n      \"q\": \"\\\"\\\\\\n\\t\\u0001\"\n    }\n  },\n  \"e\": [],\n  \"o\": {},\n  \"f\": 1e+16,\n  \"g\": 1e-05\n}"
    );
}

#[test]
fn tojson_ensure_ascii_escapes_as_python_with_surrogate_pairs() {
    assert_eq!(
        with_value("{{ messages[0].v|tojson(ensure_ascii=True) }}"),
        "{\"name\": \"Z\\u00fcrich \\u2603 \\ud83d\\ude00\", \"nested\": {\"b\": [1, 2.5, null, true], \"a\": {\"q\": \"\\\"\\\\\\n\\t\\u0001\"}}, \"e\": [], \"o\": {}, \"f\": 1e+16, \"g\": 1e-05}"
    );
}

#[test]
fn tojson_separators_and_sort_keys_are_json_dumps_ones() {
    assert_eq!(
        with_value("{{ messages[0].v|tojson(separators=(',', ':'), sort_keys=True) }}"),
        "{\"e\":[],\"f\":1e+16,\"g\":1e-05,\"name\":\"Zürich ☃ 😀\",\"nested\":{\"a\":{\"q\":\"\\\"\\\\\\n\\t\\u0001\"},\"b\":[1,2.5,null,true]},\"o\":{}}"
    );
}

#[test]
fn printed_values_are_pythons_str() {
    assert_eq!(
        with_value(
            "{{ messages[0].v }}|{{ true }}|{{ none }}|{{ 1.0 }}|{{ messages[0].v.nested.b|string }}"
        ),
        "{'name': 'Zürich ☃ 😀', 'nested': {'b': [1, 2.5, None, True], 'a': {'q': '\"\\\\\\n\\t\\x01'}}, 'e': [], 'o': {}, 'f': 1e+16, 'g': 1e-05}|True|None|1.0|[1, 2.5, None, True]"
    );
}

#[test]
fn undefined_is_empty_and_falsy_but_its_attribute_is_an_error_as_in_jinja2() {
    let user = r#"[{"role": "user"}]"#;
    assert_eq!(
        render(
            "[{{ nothing }}]{% if nothing %}yes{% else %}no{% endif %}[{{ nothing|length }}]",
            user
        )
        .expect("renders"),
        "[]no[0]"
    );
    // jinja2: UndefinedError 'nothing' is undefined; an attribute of none is undefined (empty).
    assert!(matches!(
        render("{{ nothing.attr }}", user),
        Err(TemplateError::Render { line: Some(1), .. })
    ));
    assert_eq!(render("{{ none.attr }}", user).expect("renders"), "");
}

#[test]
fn a_null_message_key_is_dropped_and_reasoning_is_aliased_as_transformers_does() {
    assert_eq!(
        render(
            "{{ messages[0].content is defined }}",
            r#"[{"role": "user", "content": null}]"#
        )
        .expect("renders"),
        "False"
    );
    assert_eq!(
        render(
            "{{ messages[0]|tojson }}",
            r#"[{"role": "assistant", "content": "x", "reasoning": "r"}]"#
        )
        .expect("renders"),
        r#"{"thinking": "r", "role": "assistant", "content": "x", "reasoning": "r", "reasoning_content": "r"}"#
    );
}

#[test]
fn raise_exception_surfaces_the_templates_message_and_line() {
    let source = "{% for m in messages %}\n{% if m.role == 'tool' %}\n{{ raise_exception('Tools are not supported: ' ~ m.role) }}\n{% endif %}\n{% endfor %}";
    match render(source, r#"[{"role": "tool", "content": "x"}]"#) {
        Err(TemplateError::Raised { message, line }) => {
            assert_eq!(message, "Tools are not supported: tool");
            assert_eq!(line, Some(3));
        }
        other => panic!("expected Raised, got {other:?}"),
    }
}

#[test]
fn a_broken_template_is_an_error_naming_its_line() {
    let source = "{% for m in messages %}\n{{ m.content }}\n{% if m.role %}\n{% endfor %}";
    let err = ChatTemplate::new(source, SpecialTokens::new()).expect_err("does not parse");
    assert!(matches!(err, TemplateError::Syntax { .. }), "{err:?}");
    assert_eq!(err.line(), Some(4), "{err}");
    assert!(err.to_string().contains("line Some(4)"), "{err}");
}

#[test]
fn a_render_error_names_its_line() {
    let source = "ok\n{{ messages[0].content|tojson(indent=[1]) }}";
    let err = render(source, r#"[{"role": "user", "content": "x"}]"#).expect_err("bad indent");
    assert!(matches!(err, TemplateError::Render { .. }), "{err:?}");
    assert_eq!(err.line(), Some(2), "{err}");
}

#[test]
fn an_empty_conversation_is_refused_as_transformers_refuses_it() {
    assert!(matches!(
        render("{{ messages }}", "[]"),
        Err(TemplateError::Input(_))
    ));
    assert!(matches!(
        render("{{ messages }}", r#"["hi"]"#),
        Err(TemplateError::Input(_))
    ));
}

#[test]
fn a_template_over_the_bound_is_refused_and_one_at_it_compiles() {
    let at = "x".repeat(MAX_TEMPLATE_BYTES);
    assert!(ChatTemplate::new(&at, SpecialTokens::new()).is_ok());
    let over = "x".repeat(MAX_TEMPLATE_BYTES + 1);
    match ChatTemplate::new(&over, SpecialTokens::new()) {
        Err(TemplateError::TooLarge { limit, actual, .. }) => {
            assert_eq!(
                (limit, actual),
                (MAX_TEMPLATE_BYTES, MAX_TEMPLATE_BYTES + 1)
            );
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn a_rendering_over_the_output_bound_stops_with_an_error() {
    let mib = "y".repeat(1 << 20);
    let messages = format!(r#"[{{"role": "user", "content": "{mib}"}}]"#);
    let per = MAX_OUTPUT_BYTES >> 20;
    // Exactly at the bound renders; one more MiB does not.
    let at = render(
        &format!("{{% for i in range({per}) %}}{{{{ messages[0].content }}}}{{% endfor %}}"),
        &messages,
    )
    .expect("at the bound");
    assert_eq!(at.len(), MAX_OUTPUT_BYTES);
    let over = render(
        &format!(
            "{{% for i in range({}) %}}{{{{ messages[0].content }}}}{{% endfor %}}",
            per + 1
        ),
        &messages,
    );
    assert!(
        matches!(
            over,
            Err(TemplateError::TooLarge {
                what: "rendered prompt",
                ..
            })
        ),
        "{over:?}"
    );
}

#[test]
fn strftime_now_formats_the_render_clock() {
    let t = ChatTemplate::new(
        "{{ strftime_now('%d %b %Y, %H:%M') }}",
        SpecialTokens::new(),
    )
    .expect("compiles");
    let now = chrono::NaiveDate::from_ymd_opt(2026, 3, 7)
        .and_then(|d| d.and_hms_opt(8, 5, 0))
        .expect("date");
    let opts = RenderOptions {
        now: Some(now),
        ..RenderOptions::default()
    };
    let messages = ChatJson::parse(r#"[{"role": "user"}]"#).expect("json");
    assert_eq!(
        t.render(&messages, &opts).expect("renders"),
        "07 Mar 2026, 08:05"
    );
}

#[test]
fn kwargs_override_special_tokens_and_tools_none_is_defined() {
    let t = ChatTemplate::new(
        "{{ bos_token }}|{{ eos_token }}|{{ tools is defined }}|{{ tools is none }}|{{ enable_thinking }}",
        SpecialTokens::new()
            .with("bos_token", "<s>")
            .with("eos_token", "</s>"),
    )
    .expect("compiles");
    let opts = RenderOptions {
        kwargs: vec![
            ("eos_token".into(), ChatJson::from("<eos>")),
            ("enable_thinking".into(), ChatJson::from(false)),
        ],
        ..RenderOptions::default()
    };
    let messages = ChatJson::parse(r#"[{"role": "user"}]"#).expect("json");
    assert_eq!(
        t.render(&messages, &opts).expect("renders"),
        "<s>|<eos>|True|True|False"
    );
}

#[test]
fn a_trailing_newline_is_dropped_as_jinja2_drops_one() {
    assert_eq!(
        render("a\n\n", r#"[{"role": "user"}]"#).expect("renders"),
        "a\n"
    );
}

#[test]
fn loop_controls_work() {
    assert_eq!(
        render(
            "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
            r#"[{"role": "user"}]"#
        )
        .expect("renders"),
        "02"
    );
}
