//! The remote path against a real server: nginx on loopback serving a generated GLM-style GGUF
//! split in three parts, with two MTP blocks in the last part.

mod common;

use std::path::Path;
use std::process::Command;

use common::{start_nginx, write_glm, BLOCKS, NEXTN};
use tarfa_fetch::{FetchOptions, Fetcher, Selection, Silent, TransferOptions};
use tarfa_gguf::{FileSource, GgufModel};

fn mtp_options(chunk: u64) -> FetchOptions {
    FetchOptions {
        selection: Selection {
            mtp: true,
            globs: Vec::new(),
        },
        transfer: TransferOptions {
            jobs: 4,
            chunk_size: chunk,
        },
        ..FetchOptions::default()
    }
}

/// Splice locally: the reference the remote path must equal.
fn local_splice(part: &Path, out: &Path) -> tarfa_fetch::FetchReport {
    let f = Fetcher::new(mtp_options(1 << 20));
    let plan = f.plan(&part.display().to_string()).expect("local plan");
    f.fetch(&plan, out, &Silent).expect("local fetch")
}

#[test]
fn draft_over_nginx_equals_the_local_splice_and_transfers_only_headers_and_mtp_bytes() {
    let test = "draft_over_nginx_equals_the_local_splice_and_transfers_only_headers_and_mtp_bytes";
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let Some(nginx) = start_nginx(root.path(), test) else {
        return;
    };
    let out = tempfile::tempdir().expect("tempdir");
    let local = out.path().join("local.gguf");
    local_splice(&model.parts[1], &local);

    // Any part names the set: give the middle one.
    let url = format!("http://127.0.0.1:{}/glm-00002-of-00003.gguf", nginx.port);
    let f = Fetcher::new(mtp_options(256 << 10));
    let plan = f.plan(&url).expect("remote plan");
    let header_traffic = f.traffic().body_bytes();
    let remote = out.path().join("remote.gguf");
    let report = f.fetch(&plan, &remote, &Silent).expect("remote fetch");

    let a = std::fs::read(&local).expect("read local");
    let b = std::fs::read(&remote).expect("read remote");
    assert!(
        a == b,
        "the draft fetched over HTTP differs from the local splice"
    );

    // Only the MTP blocks were taken, all of them.
    let names: Vec<&str> = plan.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, model.mtp_tensors);
    assert_eq!(report.tensor_bytes, model.mtp_bytes);

    let budget = report.source_header_bytes + report.tensor_bytes;
    eprintln!(
        "{test}: transferred {} bytes (header windows {header_traffic}, true headers {}, MTP tensors {}), {} requests; budget {} + 1%",
        report.bytes_transferred,
        report.source_header_bytes,
        report.tensor_bytes,
        report.requests,
        budget
    );
    assert!(
        report.bytes_transferred * 100 <= budget * 101,
        "transferred {} bytes, more than headers + MTP bytes ({budget}) + 1%",
        report.bytes_transferred
    );
    assert_eq!(report.retries, 0);

    // The draft: the first part's key/values less split.*, block_count and nextn kept.
    let src = GgufModel::open(&model.parts[0]).expect("open source");
    let draft = tarfa_gguf::GgufFile::open(&remote).expect("open draft");
    let want: Vec<_> = src
        .metadata()
        .iter()
        .filter(|(k, _)| !k.starts_with("split."))
        .cloned()
        .collect();
    assert_eq!(draft.header().metadata, want);
    assert_eq!(
        draft
            .header()
            .get("glm4moe.block_count")
            .and_then(|v| v.as_u64()),
        Some(BLOCKS)
    );
    assert_eq!(
        draft
            .header()
            .get("glm4moe.nextn_predict_layers")
            .and_then(|v| v.as_u64()),
        Some(NEXTN)
    );
    for t in &draft.header().tensors {
        let s = src.tensor(&t.name).expect("tensor in source");
        assert_eq!((t.dtype, &t.ne), (s.info.dtype, &s.info.ne), "{}", t.name);
        assert!(
            draft.tensor_bytes(t).expect("draft bytes") == src.tensor_bytes(s).expect("src bytes"),
            "{}: bytes differ",
            t.name
        );
        assert_eq!(t.data_offset % draft.header().alignment, 0);
    }
    // No partial file or journal is left behind.
    let left: Vec<_> = std::fs::read_dir(out.path())
        .expect("ls")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tarfa-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(FileSource::open(&remote));
}

#[test]
fn the_draft_loads_in_gguf_py_with_every_tensor_equal_to_the_source() {
    if !tarfa_testtools::python_gguf() {
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let draft = root.path().join("draft.gguf");
    local_splice(&model.parts[2], &draft);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/check_draft.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(&draft)
        .args(&model.parts)
        .output()
        .expect("run python3");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gguf-py check failed: {text}");
    assert!(
        text.contains(&format!("ok: {} tensors", model.mtp_tensors.len())),
        "{text}"
    );
}
