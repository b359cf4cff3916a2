//! `tarfa chat` (issue 25), its input piped: each answer is what `tarfa run` gives for the
//! prompt the chat template renders for the conversation so far; a later turn reuses the
//! earlier turn's sequence for their shared prefix (said by /stats) without changing a bit; /reset
//! starts over; a model without a template is refused, saying so.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::serve::chat_model;
use common::{path, tarfa};

fn chat(model: &std::path::Path, input: &str, extra: &[&str]) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(["chat", path(model), "-n", "12"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn chat_answers_are_runs_of_the_rendered_conversation() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = chat_model(tmp.path());
    let (code, out, err) = chat(&m, "Hi\nWhat now?\n/stats\n/reset\nHi\n", &[]);
    assert_eq!(code, 0, "{err}");
    let answers: Vec<&str> = out.lines().collect();
    assert_eq!(answers.len(), 3, "{out}");
    // Turn one: the rendered prompt's run.
    let first = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    let (code, run1, e) = tarfa(&["run", path(&m), "-p", first, "-n", "12"]);
    assert_eq!(code, 0, "{e}");
    assert_eq!(answers[0], run1.trim_end_matches('\n'));
    // Turn two: the conversation with the first answer, rendered by the same template.
    let second = format!(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>user\nWhat now?<|im_end|>\n<|im_start|>assistant\n",
        answers[0]
    );
    let (code, run2, e) = tarfa(&["run", path(&m), "-p", &second, "-n", "12"]);
    assert_eq!(code, 0, "{e}");
    assert_eq!(answers[1], run2.trim_end_matches('\n'));
    // It took the first turn's prefix from the cache.
    let stats = err
        .lines()
        .find(|l| l.starts_with("last answer:"))
        .expect("/stats line");
    assert!(!stats.contains(", 0 of them from the cache"), "{stats}");
    // After /reset the conversation starts over: the first answer again.
    assert_eq!(answers[2], answers[0]);
    assert!(err.contains("[a new conversation]"), "{err}");

    // Seeded sampling: the same seed, the same answers.
    let (_, a, _) = chat(&m, "Hi\n", &["--temp", "1.3", "--seed", "9"]);
    let (_, b, e) = chat(&m, "Hi\n", &["--temp", "1.3", "--seed", "9"]);
    assert_eq!(a, b, "{e}");
    assert!(e.contains("seed 9"), "{e}");
}

#[test]
fn a_model_without_a_chat_template_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let m = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = chat(&m, "Hi\n", &[]);
    assert_ne!(code, 0);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("has no chat template"), "{err}");
}
