//! A `tarfa serve` on a free loopback port for the server's tests, and the requests they make.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use super::path;

/// A server on a free port, killed when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `tarfa serve MODEL --port 0 EXTRA…` and wait for `/health` to say it is up.
pub fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(["serve", path(model), "--port", "0"])
        .args(extra)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut err = BufReader::new(child.stderr.take().expect("stderr"));
    // The address is on the line that says it listens; a warning may come before it.
    let mut before = String::new();
    let base = loop {
        let mut line = String::new();
        let read = err.read_line(&mut line).expect("stderr line");
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().expect("address").to_string();
        }
        before.push_str(&line);
        assert!(read > 0, "the server ended without an address: {before:?}");
    };
    // The rest of stderr drained, so the server never blocks on it.
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = err.read_to_string(&mut sink);
    });
    let s = Server { child, base };
    // Up when /health says so.
    for _ in 0..600 {
        if let Ok((200, _)) = get(&s, "/health") {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the server did not come up");
}

/// A client that hands back every status as a response.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// GET `route`: the status and the body.
pub fn get(s: &Server, route: &str) -> Result<(u16, String), ureq::Error> {
    let mut r = agent().get(format!("{}{route}", s.base)).call()?;
    let status = r.status().as_u16();
    Ok((status, r.body_mut().read_to_string()?))
}

/// A copy of the `qwen3_moe` fixture whose tokenizer_config.json holds Qwen3's chat template
/// (fixtures/templates), converted into `tmp/chat`.
pub fn chat_model(tmp: &Path) -> std::path::PathBuf {
    chat_model_with(tmp, "Qwen-Qwen3-0.6B.jinja")
}

/// [`chat_model`] with another template of fixtures/templates, `template` its file's name.
pub fn chat_model_with(tmp: &Path, template: &str) -> std::path::PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = tmp.join("chat-src");
    std::fs::create_dir_all(&src).expect("mkdir");
    for e in std::fs::read_dir(root.join("fixtures/hf/qwen3_moe")).expect("fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), src.join(e.file_name())).expect("copy");
    }
    let template =
        std::fs::read_to_string(root.join("fixtures/templates").join(template)).expect("template");
    let config = serde_json::json!({"chat_template": template, "eos_token": "<|im_end|>"});
    std::fs::write(src.join("tokenizer_config.json"), config.to_string()).expect("write");
    let out = tmp.join("chat");
    let (code, _, err) = super::tarfa(&["convert", path(&src), "-o", path(&out), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    out
}

/// Run `python3 tests/serve/SCRIPT ARGS…` (a client of a server these tests started) and fail
/// with everything it printed unless it exits 0.
pub fn python_client<S: AsRef<std::ffi::OsStr>>(script: &str, args: &[S]) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/serve")
        .join(script);
    let out = Command::new("python3")
        .arg(&file)
        .args(args)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "tests/serve/{script}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The prompt `s`'s chat template renders for one user message "Hi" (`/apply-template`, with
/// `key` when the server wants one), and the text `tarfa run MODEL -p PROMPT -n N` prints for it:
/// what a chat answer of `n` tokens must be.
pub fn hi_and_its_run(s: &Server, model: &Path, key: Option<&str>, n: &str) -> (String, String) {
    let mut req = agent()
        .post(format!("{}/apply-template", s.base))
        .header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let text = req
        .send(r#"{"messages": [{"role": "user", "content": "Hi"}]}"#)
        .expect("apply-template")
        .body_mut()
        .read_to_string()
        .expect("body");
    let rendered: serde_json::Value = serde_json::from_str(&text).expect("json");
    let prompt = rendered["prompt"].as_str().expect("prompt").to_string();
    let (code, out, err) = super::tarfa(&["run", path(model), "-p", &prompt, "-n", n]);
    assert_eq!(code, 0, "{err}");
    (prompt, out.trim_end_matches('\n').to_string())
}
