//! `tarfa serve` against the real `openai` Python client (issue 25): chat and completions,
//! streaming and not, usage, stop strings, seeds, errors (tests/serve/openai_client.py), on the
//! fixture with Qwen3's chat template; the chat reply is the text `tarfa run` prints for the
//! prompt the template renders.

mod common;

use std::path::Path;

use common::serve::{chat_model, python_client, start};
use common::{path, tarfa};

#[test]
fn the_openai_client_gets_what_tarfa_run_gives() {
    if !tarfa_testtools::python_openai() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let m = chat_model(tmp.path());
    let s = start(&m, &["--api-key", "k3y", "--alias", "fixture"]);
    // The prompt the template renders, run by `tarfa run`: the chat reply's text.
    let text = ureq::post(format!("{}/apply-template", s.base))
        .header("authorization", "Bearer k3y")
        .header("content-type", "application/json")
        .send(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#)
        .expect("apply-template")
        .body_mut()
        .read_to_string()
        .expect("body");
    let rendered: serde_json::Value = serde_json::from_str(&text).expect("json");
    let prompt = rendered["prompt"].as_str().expect("prompt");
    assert_eq!(
        prompt,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let (code, out, err) = tarfa(&["run", path(&m), "-p", prompt, "-n", "12"]);
    assert_eq!(code, 0, "{err}");
    let expected = tmp.path().join("expected.txt");
    std::fs::write(&expected, out.trim_end_matches('\n')).expect("write");
    python_client(
        "openai_client.py",
        &[s.base.as_str(), "fixture", path(&expected)],
    );
}

/// Tool calls as the `openai` client reads them, whole and streamed, on the scripted model
/// (fixtures/hf/make_scripted.py), whose greedy reply is a reasoning block, a line of content
/// and a get_weather call in Qwen3's format (tests/serve/openai_tools.py).
#[test]
fn the_openai_client_reads_tool_calls() {
    if !tarfa_testtools::python_openai() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/scripted");
    let m = tmp.path().join("scripted");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let s = start(&m, &["--alias", "scripted"]);
    python_client("openai_tools.py", &[s.base.as_str(), "scripted"]);
}
