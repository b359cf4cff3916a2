//! `tarfa fetch` as a process: killed mid-run with SIGKILL, a rerun keeps every chunk the
//! journal vouches for and fetches only the rest; `--list` fetches no tensor data.

#[path = "../fetch/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{Fault, FaultServer};
use common::write_glm;

fn tarfa() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tarfa"))
}

fn serve(dir: &Path) -> (FaultServer, common::GlmModel) {
    let model = write_glm(dir);
    let files: HashMap<String, Vec<u8>> = model
        .parts
        .iter()
        .map(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned());
            (
                format!("/{}", n.unwrap_or_default()),
                std::fs::read(p).expect("read part"),
            )
        })
        .collect();
    (FaultServer::start("127.0.0.1", files, Fault::None), model)
}

fn journal_lines(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .map(|s| s.lines().filter(|l| l.starts_with("done ")).count())
        .unwrap_or(0)
}

#[test]
fn a_fetch_killed_with_sigkill_resumes_without_refetching_what_it_had() {
    let src = tempfile::tempdir().expect("tempdir");
    let (server, model) = serve(src.path());
    let url = format!("{}/glm-00001-of-00003.gguf", server.base);
    let work = tempfile::tempdir().expect("tempdir");
    let out = work.path().join("draft.gguf");
    let journal = work.path().join("draft.gguf.tarfa-journal");
    let args = |cmd: &mut Command| {
        cmd.args(["fetch", &url, "--mtp", "--chunk-size", "64K", "--jobs", "2"])
            .args(["--retry-delay-ms", "1", "--quiet", "--json", "-o"])
            .arg(&out);
    };

    server.set_delay(Duration::from_millis(15));
    let mut cmd = tarfa();
    args(&mut cmd);
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tarfa");
    let deadline = Instant::now() + Duration::from_secs(60);
    while journal_lines(&journal) < 20 {
        assert!(Instant::now() < deadline, "no progress within 60 s");
        assert!(
            child.try_wait().expect("poll").is_none(),
            "tarfa ended before it was killed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().expect("SIGKILL tarfa");
    child.wait().expect("reap");
    assert!(!out.exists(), "a killed fetch published its output");
    let had = journal_lines(&journal);

    server.set_delay(Duration::ZERO);
    let before = server.sent_body();
    let mut cmd = tarfa();
    args(&mut cmd);
    let rerun = cmd.output().expect("rerun tarfa");
    assert!(
        rerun.status.success(),
        "{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let second = server.sent_body() - before;
    let report: serde_json::Value = serde_json::from_slice(&rerun.stdout).expect("--json summary");
    let resumed = report["bytes_resumed"].as_u64().expect("bytes_resumed");
    eprintln!(
        "killed after {had} journalled chunks; rerun kept {resumed} bytes and moved {second} of {} MTP bytes",
        model.mtp_bytes
    );
    assert!(resumed > 0, "nothing kept of {had} journalled chunks");
    // The rerun moved the three headers' windows and the chunks it lacked, nothing more.
    assert!(
        second <= model.mtp_bytes - resumed + 3 * 16 * 1024,
        "rerun moved {second} bytes; {resumed} of {} were already there",
        model.mtp_bytes
    );

    // Identical to the local splice.
    let local = work.path().join("local.gguf");
    let st = tarfa()
        .args(["fetch", "--mtp", "--quiet", "-o"])
        .arg(&local)
        .arg(&model.parts[2])
        .status()
        .expect("local splice");
    assert!(st.success());
    assert!(std::fs::read(&local).expect("local") == std::fs::read(&out).expect("draft"));
    assert!(!journal.exists());
}

#[test]
fn list_names_the_mtp_tensors_and_fetches_no_tensor_bytes() {
    let src = tempfile::tempdir().expect("tempdir");
    let (server, model) = serve(src.path());
    let url = format!("{}/glm-00002-of-00003.gguf", server.base);
    let o = tarfa()
        .args(["fetch", &url, "--mtp", "--list"])
        .output()
        .expect("run tarfa");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    for t in &model.mtp_tensors {
        assert!(text.contains(t.as_str()), "{t} not listed:\n{text}");
    }
    assert!(text.contains(&format!(
        "{} tensors, {} bytes to fetch",
        model.mtp_tensors.len(),
        model.mtp_bytes
    )));
    assert!(
        server.sent_body() <= 3 * 16 * 1024,
        "{}",
        server.sent_body()
    );
}

#[test]
fn a_server_that_ignores_ranges_is_an_error_that_says_so() {
    let src = tempfile::tempdir().expect("tempdir");
    let (server, _) = serve(src.path());
    server.set_fault(Fault::Full200);
    let out = src.path().join("draft.gguf");
    let o = tarfa()
        .args(["fetch", "--mtp", "--quiet", "--retry-delay-ms", "1", "-o"])
        .arg(&out)
        .arg(format!("{}/glm-00001-of-00003.gguf", server.base))
        .output()
        .expect("run tarfa");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("ignores range requests"), "{err}");
    assert!(!out.exists());
}
