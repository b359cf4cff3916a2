//! Every case under fixtures/templates/golden/ (rendered by transformers itself, see
//! fixtures/templates/make_goldens.py) renders byte for byte the same here; a case transformers
//! refused is refused here too.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use tarfa_chat::{ChatJson, ChatTemplate, RenderOptions, SpecialTokens, TemplateError};

#[derive(Deserialize)]
struct Golden {
    template: String,
    transformers_version: String,
    now: String,
    special_tokens: ChatJson,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: ChatJson,
    tools: Option<ChatJson>,
    documents: Option<ChatJson>,
    kwargs: Option<ChatJson>,
    add_generation_prompt: bool,
    expected: Option<String>,
    error: Option<String>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/templates")
}

fn first_difference(a: &str, b: &str) -> String {
    let at = a
        .bytes()
        .zip(b.bytes())
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let around = |s: &str| {
        let bytes = s.as_bytes();
        String::from_utf8_lossy(&bytes[at.saturating_sub(60)..(at + 60).min(bytes.len())])
            .into_owned()
    };
    format!(
        "first difference at byte {at}\n  tarfa:        {:?}\n  transformers: {:?}",
        around(a),
        around(b)
    )
}

#[test]
fn every_golden_case_renders_byte_for_byte_as_transformers_renders_it() {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(fixtures().join("golden"))
        .expect("golden dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    assert!(paths.len() >= 6, "expected at least six golden files");
    let (mut passed, mut failures) = (0usize, Vec::new());
    for path in &paths {
        let golden: Golden =
            serde_json::from_str(&std::fs::read_to_string(path).expect("read golden"))
                .expect("golden json");
        assert!(
            golden.transformers_version.starts_with('5'),
            "goldens come from transformers 5.x"
        );
        let source = std::fs::read_to_string(fixtures().join(&golden.template)).expect("template");
        let mut specials = SpecialTokens::new();
        for (name, token) in golden
            .special_tokens
            .object_entries()
            .expect("special_tokens object")
        {
            let text = token.as_str().expect("special tokens are strings");
            specials = specials.with(&name, text);
        }
        let template = ChatTemplate::new(&source, specials).expect("template compiles");
        let now =
            chrono::NaiveDateTime::parse_from_str(&golden.now, "%Y-%m-%dT%H:%M:%S").expect("now");
        for case in golden.cases {
            let opts = RenderOptions {
                add_generation_prompt: case.add_generation_prompt,
                tools: case.tools,
                documents: case.documents,
                kwargs: case
                    .kwargs
                    .map(|k| k.object_entries().expect("kwargs object"))
                    .unwrap_or_default(),
                now: Some(now),
            };
            let got = template.render(&case.messages, &opts);
            let label = format!("{} / {}", golden.template, case.name);
            match (got, case.expected, case.error) {
                (Ok(got), Some(want), _) if got == want => passed += 1,
                (Ok(got), Some(want), _) => {
                    failures.push(format!("{label}: {}", first_difference(&got, &want)))
                }
                (Err(e), Some(_), _) => {
                    failures.push(format!("{label}: refused, transformers renders it: {e}"))
                }
                (Err(TemplateError::Raised { message, .. }), None, Some(err)) => {
                    if err == format!("TemplateError: {message}") {
                        passed += 1;
                    } else {
                        failures.push(format!("{label}: raised {message:?}, transformers {err:?}"));
                    }
                }
                (Err(_), None, Some(err)) if !err.starts_with("TemplateError: ") => {
                    // transformers failed outside raise_exception (a TypeError in a filter): refusing is
                    // what must match; the wording is minijinja's.
                    passed += 1;
                }
                (Err(e), None, Some(err)) => {
                    failures.push(format!("{label}: refused with {e}, transformers {err:?}"))
                }
                (Ok(got), None, Some(err)) => failures.push(format!(
                    "{label}: rendered {} bytes, transformers refused: {err}",
                    got.len()
                )),
                (_, None, None) => {
                    failures.push(format!("{label}: golden has neither expected nor error"))
                }
            }
        }
    }
    eprintln!("{passed} golden cases byte-equal");
    assert!(
        failures.is_empty(),
        "{} failures ({passed} passed):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
