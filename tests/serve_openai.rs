//! `tarfa serve` against the real `openai` Python client (issue 25): chat and completions,
//! streaming and not, usage, stop strings, seeds, errors (tests/serve/openai_client.py), on the
//! fixture with Qwen3's chat template; the chat reply is the text `tarfa run` prints for the
//! prompt the template renders.

mod common;

use std::path::Path;

use common::serve::{chat_model, hi_and_its_run, python_client, start};
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
    let (prompt, text) = hi_and_its_run(&s, &m, Some("k3y"), "12");
    assert_eq!(
        prompt,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
    let expected = tmp.path().join("expected.txt");
    std::fs::write(&expected, text).expect("write");
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
