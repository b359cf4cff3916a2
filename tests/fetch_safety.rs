//! `tarfa fetch` as a user runs it, where a mistake would cost data or leak a secret: `-o`
//! naming the source, and `HF_TOKEN` with a URL that is not the hub's.

#[path = "../fetch/tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::process::Command;

use common::server::{Fault, FaultServer};
use common::write_glm;

fn tarfa(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tarfa"))
        .args(args)
        .env_remove("HF_TOKEN")
        .output()
        .expect("run tarfa");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn fetch_with_the_source_as_output_exits_2_and_leaves_every_part_untouched() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let before: Vec<Vec<u8>> = model
        .parts
        .iter()
        .map(|p| std::fs::read(p).expect("read"))
        .collect();
    for out in [&model.parts[0], &model.parts[2]] {
        let (code, err) = tarfa(&[
            "fetch".as_ref(),
            model.parts[0].as_os_str(),
            "--mtp".as_ref(),
            "-q".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("never writes over its input"), "{err}");
    }
    for (p, b) in model.parts.iter().zip(&before) {
        assert!(
            std::fs::read(p).expect("read") == *b,
            "{} changed",
            p.display()
        );
    }
    let names: Vec<String> = std::fs::read_dir(root.path())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tarfa-"))
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
}

/// Run `tarfa fetch URL --mtp -o OUT` with `env`; exit code and stderr.
fn fetch_with_env(url: &str, out: &std::path::Path, env: &[(&str, &str)]) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tarfa"));
    cmd.args(["fetch", url, "--mtp", "-q", "--retry-delay-ms", "1", "-o"])
        .arg(out)
        .env_remove("HF_TOKEN")
        .env_remove("HF_ENDPOINT")
        .env_remove("TARFA_TOKEN_OVER_HTTP");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("run tarfa");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn hf_token_is_sent_only_to_the_hub_and_over_plain_http_only_when_asked() {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
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
    let server = FaultServer::start("127.0.0.1", files, Fault::None);
    let url = format!("{}/glm-00001-of-00003.gguf", server.base);
    let work = tempfile::tempdir().expect("tempdir");
    let bearer = |seen: &[common::server::Seen]| {
        seen.iter()
            .filter(|r| r.authorization.as_deref() == Some("Bearer hf_secret"))
            .count()
    };

    // A loopback URL is not the hub: no token, whatever else is set.
    for (i, env) in [
        vec![("HF_TOKEN", "hf_secret")],
        vec![("HF_TOKEN", "hf_secret"), ("TARFA_TOKEN_OVER_HTTP", "1")],
    ]
    .iter()
    .enumerate()
    {
        let (code, err) = fetch_with_env(&url, &work.path().join(format!("a{i}.gguf")), env);
        assert_eq!(code, 0, "{err}");
    }
    let seen = server.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|r| r.authorization.is_none()),
        "HF_TOKEN went to a URL that is not the hub"
    );

    // HF_ENDPOINT names this plain-http server: still no token without the opt-in, and a note.
    let hub = [
        ("HF_TOKEN", "hf_secret"),
        ("HF_ENDPOINT", server.base.as_str()),
    ];
    let (code, err) = fetch_with_env(&url, &work.path().join("b.gguf"), &hub);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("HF_TOKEN is not sent"), "{err}");
    assert_eq!(
        bearer(&server.seen()),
        0,
        "token sent over http without the opt-in"
    );

    // With TARFA_TOKEN_OVER_HTTP=1 the hub gets it.
    let n_before = server.seen().len();
    let opted = [hub[0], hub[1], ("TARFA_TOKEN_OVER_HTTP", "1")];
    let (code, err) = fetch_with_env(&url, &work.path().join("c.gguf"), &opted);
    assert_eq!(code, 0, "{err}");
    let after = server.seen();
    assert_eq!(
        bearer(&after),
        after.len() - n_before,
        "every request to the hub"
    );
}
