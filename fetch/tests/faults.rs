//! The remote path against a server that misbehaves on purpose: each fault ends in the identical
//! file (transient faults, retried) or a clear error with nothing published — never a wrong file.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::server::{Fault, FaultServer};
use common::write_glm;
use tarfa_fetch::error::{
    NotModelHint, NotModelKind, RedirectFault, RemoteChange, Request, ResponseFault,
};
use tarfa_fetch::{
    FetchError, FetchOptions, Fetcher, HttpConfig, LowSpeed, RetryPolicy, Selection, Silent,
    TransferOptions,
};

struct Setup {
    _root: tempfile::TempDir,
    out: tempfile::TempDir,
    files: HashMap<String, Vec<u8>>,
    reference: Vec<u8>,
    mtp_bytes: u64,
    parts: Vec<PathBuf>,
}

fn setup() -> Setup {
    let root = tempfile::tempdir().expect("tempdir");
    let model = write_glm(root.path());
    let out = tempfile::tempdir().expect("tempdir");
    let local = out.path().join("reference.gguf");
    let f = Fetcher::new(options(None, 1 << 20, 1));
    let plan = f
        .plan(&model.parts[0].display().to_string())
        .expect("local plan");
    f.fetch(&plan, &local, &Silent).expect("local fetch");
    let files = model
        .parts
        .iter()
        .map(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            (
                format!("/m/{}", name.unwrap_or_default()),
                std::fs::read(p).expect("read part"),
            )
        })
        .collect();
    Setup {
        reference: std::fs::read(&local).expect("read reference"),
        _root: root,
        out,
        files,
        mtp_bytes: model.mtp_bytes,
        parts: model.parts,
    }
}

fn options(token: Option<&str>, chunk: u64, attempts: u32) -> FetchOptions {
    FetchOptions {
        selection: Selection {
            mtp: true,
            globs: Vec::new(),
        },
        http: HttpConfig {
            token: token.map(str::to_string),
            retry: RetryPolicy {
                attempts,
                base_delay: Duration::from_millis(1),
                max_delay: Duration::from_millis(10),
            },
            timeout: Duration::from_secs(10),
            ..HttpConfig::default()
        },
        transfer: TransferOptions {
            jobs: 3,
            chunk_size: chunk,
        },
        ..FetchOptions::default()
    }
}

fn url(server: &FaultServer) -> String {
    format!("{}/m/glm-00003-of-00003.gguf", server.base)
}

/// Fetch from `source` into `out`; the error, if any.
fn fetch(
    opts: FetchOptions,
    source: &str,
    out: &Path,
) -> Result<tarfa_fetch::FetchReport, FetchError> {
    let f = Fetcher::new(opts);
    let plan = f.plan(source)?;
    f.fetch(&plan, out, &Silent)
}

#[test]
fn dropped_bodies_and_500s_are_retried_into_the_identical_file() {
    let s = setup();
    for fault in [
        Fault::DropMidBody { every: 3 },
        Fault::Status500 { every: 4 },
    ] {
        let server = FaultServer::start("127.0.0.1", s.files.clone(), fault.clone());
        let out = s.out.path().join("draft.gguf");
        let _ = std::fs::remove_file(&out);
        let r = fetch(options(None, 128 << 10, 8), &url(&server), &out)
            .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
        assert!(r.retries > 0, "{fault:?}: no fault was met");
        assert!(
            std::fs::read(&out).expect("read") == s.reference,
            "{fault:?}: the file differs from the local splice"
        );
    }
}

#[test]
fn a_body_that_stalls_times_out_and_is_retried_into_the_identical_file() {
    let s = setup();
    let server = FaultServer::start(
        "127.0.0.1",
        s.files.clone(),
        Fault::StallMidBody { every: 7 },
    );
    let out = s.out.path().join("draft.gguf");
    let mut opts = options(None, 256 << 10, 8);
    opts.http.timeout = Duration::from_millis(300);
    let r = fetch(opts, &url(&server), &out).expect("fetch");
    assert!(r.retries > 0, "no stall was met");
    assert!(std::fs::read(&out).expect("read") == s.reference);
}

/// Review finding 9: a body that trickles in (a byte every 50 ms: no read ever times out) is
/// dropped by the low-speed limit and retried, so the fetch ends, with the identical file; a
/// server that only trickles ends in a clear error instead of never.
#[test]
fn a_body_slower_than_the_low_speed_limit_is_dropped_and_retried() {
    let s = setup();
    let run = |fault: Fault, attempts: u32| {
        let files = s.files.clone();
        let out = s.out.path().join(format!("trickle-{attempts}.gguf"));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let server = FaultServer::start("127.0.0.1", files, fault);
            let mut opts = options(None, 128 << 10, attempts);
            opts.http.low_speed = LowSpeed {
                limit: 10_000,
                time: Duration::from_millis(500),
            };
            let r = fetch(opts, &url(&server), &out);
            let _ = tx.send((r, out));
        });
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("still fetching after 60 s: the trickle was never cut"))
    };
    let (r, out) = run(Fault::Trickle { every: 3 }, 8);
    let r = r.expect("fetch");
    assert!(r.retries > 0, "no trickle was met");
    assert!(std::fs::read(&out).expect("read") == s.reference);
    match run(Fault::Trickle { every: 1 }, 2).0 {
        Err(FetchError::TooSlow { limit, .. }) => assert_eq!(limit, 10_000),
        other => panic!("{other:?}"),
    }
}

/// Run against `fault` and return the error; the output must not exist afterwards.
fn must_fail(s: &Setup, fault: Fault) -> FetchError {
    let server = FaultServer::start("127.0.0.1", s.files.clone(), fault.clone());
    let out = s.out.path().join("failed.gguf");
    let e = match fetch(options(None, 128 << 10, 3), &url(&server), &out) {
        Ok(_) => panic!("{fault:?}: a fetch that should fail succeeded"),
        Err(e) => e,
    };
    assert!(!out.exists(), "{fault:?}: a file was published: {e}");
    e
}

#[test]
fn a_200_to_a_range_request_is_refused_not_used() {
    let s = setup();
    let e = must_fail(&s, Fault::Full200);
    assert!(
        matches!(&e, FetchError::RangeIgnored { start, len: Some(_), .. } if *start > 0),
        "{e}"
    );
    assert!(e.to_string().contains("ignores range requests"), "{e}");
}

#[test]
fn a_wrong_content_range_is_refused() {
    let s = setup();
    let e = must_fail(&s, Fault::WrongContentRange);
    assert!(
        matches!(
            &e,
            FetchError::BadResponse {
                fault: ResponseFault::OtherRange { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("is not the range asked"), "{e}");
}

#[test]
fn an_html_page_is_named_as_such() {
    let s = setup();
    let e = must_fail(&s, Fault::HtmlPage);
    assert!(
        matches!(
            e,
            FetchError::NotAModel {
                what: NotModelKind::HtmlPage,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("HTML"), "{e}");
}

#[test]
fn an_etag_that_changes_mid_run_stops_the_fetch_and_nothing_is_spliced() {
    let s = setup();
    // The three headers take a handful of requests; the change lands among the data chunks.
    let e = must_fail(&s, Fault::EtagChangesAfter { requests: 12 });
    assert!(
        matches!(
            &e,
            FetchError::RemoteChanged {
                change: RemoteChange::ETag { was, now },
                ..
            } if was == "\"v1\"" && now == "\"v2\""
        ),
        "{e}"
    );
    assert!(e.to_string().contains("changed"), "{e}");
}

#[test]
fn an_lfs_pointer_is_named_as_such() {
    let s = setup();
    let pointer =
        b"version https://git-lfs.github.com/spec/v1\noid sha256:0123\nsize 99\n".to_vec();
    let files = HashMap::from([("/m/x.gguf".to_string(), pointer)]);
    let server = FaultServer::start("127.0.0.1", files, Fault::None);
    let out = s.out.path().join("x.gguf");
    let e = fetch(
        options(None, 1 << 20, 2),
        &format!("{}/m/x.gguf", server.base),
        &out,
    )
    .expect_err("must fail");
    assert!(
        matches!(
            e,
            FetchError::NotAModel {
                what: NotModelKind::LfsPointer,
                hint: Some(NotModelHint::ClonedWithoutLfs),
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("Git LFS pointer"), "{e}");
    assert!(!out.exists());
}

/// `options` with `token`, the hub at `hub` and plain http allowed for the token or not.
fn hub_options(token: &str, hub: &str, over_http: bool) -> FetchOptions {
    let mut opts = options(Some(token), 256 << 10, 3);
    opts.hf_endpoint = hub.to_string();
    opts.http.token_over_http = over_http;
    opts
}

#[test]
fn the_token_goes_to_the_hub_and_never_to_the_host_it_redirects_to() {
    let s = setup();
    let cdn = FaultServer::start("127.0.0.2", s.files.clone(), Fault::None);
    let hub = FaultServer::start(
        "127.0.0.1",
        HashMap::new(),
        Fault::RedirectTo {
            base: cdn.base.clone(),
        },
    );
    let out = s.out.path().join("draft.gguf");
    fetch(hub_options("hf_secret", &hub.base, true), &url(&hub), &out).expect("fetch");
    assert!(std::fs::read(&out).expect("read") == s.reference);
    let at_hub = hub.seen();
    let at_cdn = cdn.seen();
    assert!(!at_hub.is_empty() && !at_cdn.is_empty());
    assert!(at_hub
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer hf_secret")));
    assert!(
        at_cdn.iter().all(|r| r.authorization.is_none()),
        "the token leaked to the redirect target"
    );
    // Data came from the CDN directly once it was known: the hub saw the probes only.
    assert!(
        at_hub.len() <= 3 + 2,
        "{} requests at the hub",
        at_hub.len()
    );
}

#[test]
fn the_token_never_goes_to_a_url_that_is_not_the_hub() {
    let s = setup();
    // The hub is https://huggingface.co (the default): a loopback URL is another host.
    let server = FaultServer::start("127.0.0.1", s.files.clone(), Fault::None);
    let out = s.out.path().join("draft.gguf");
    let mut opts = options(Some("hf_secret"), 256 << 10, 3);
    opts.http.token_over_http = true;
    fetch(opts, &url(&server), &out).expect("fetch");
    assert!(std::fs::read(&out).expect("read") == s.reference);
    let seen = server.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|r| r.authorization.is_none()),
        "the token went to a host that is not the hub"
    );

    // Nor to the hub when a URL at another host redirects there: never after a redirect.
    let hub = FaultServer::start("127.0.0.1", s.files.clone(), Fault::None);
    let other = FaultServer::start(
        "127.0.0.2",
        HashMap::new(),
        Fault::RedirectTo {
            base: hub.base.clone(),
        },
    );
    let out = s.out.path().join("via-redirect.gguf");
    fetch(
        hub_options("hf_secret", &hub.base, true),
        &url(&other),
        &out,
    )
    .expect("fetch");
    assert!(other.seen().iter().all(|r| r.authorization.is_none()));
    assert!(
        hub.seen().iter().all(|r| r.authorization.is_none()),
        "the token followed a redirect from another host"
    );
}

#[test]
fn the_token_never_goes_back_to_the_hub_once_a_redirect_left_it() {
    let s = setup();
    // hub/out/m/F → other/back/m/F → hub/m/F: the chain comes back to the hub's origin.
    let hub = FaultServer::start("127.0.0.1", s.files.clone(), Fault::None);
    let other = FaultServer::start(
        "127.0.0.2",
        HashMap::new(),
        Fault::RedirectUnder {
            prefix: "/back".into(),
            location: hub.base.clone(),
        },
    );
    hub.set_fault(Fault::RedirectUnder {
        prefix: "/out".into(),
        location: format!("{}/back", other.base),
    });
    let out = s.out.path().join("draft.gguf");
    let source = format!("{}/out/m/glm-00003-of-00003.gguf", hub.base);
    fetch(hub_options("hf_secret", &hub.base, true), &source, &out).expect("fetch");
    assert!(std::fs::read(&out).expect("read") == s.reference);
    let at_hub = hub.seen();
    let (given, came_back): (Vec<_>, Vec<_>) =
        at_hub.iter().partition(|r| r.path.starts_with("/out/"));
    assert!(!given.is_empty() && !came_back.is_empty(), "{at_hub:?}");
    assert!(given
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer hf_secret")));
    assert!(other.seen().iter().all(|r| r.authorization.is_none()));
    assert!(
        came_back.iter().all(|r| r.authorization.is_none()),
        "the token went back to the hub after a redirect to another host"
    );
}

#[test]
fn the_token_never_goes_over_plain_http_without_the_opt_in() {
    let s = setup();
    let files: HashMap<String, Vec<u8>> = s
        .files
        .iter()
        .map(|(k, v)| (k.replace("/m/", "/o/r/resolve/main/"), v.clone()))
        .collect();
    let hub = FaultServer::start("127.0.0.1", files, Fault::None);
    let out = s.out.path().join("draft.gguf");
    // HF_ENDPOINT is this plain-http hub; both the hf:// form and its URL.
    for source in [
        "hf://o/r/glm-00001-of-00003.gguf".to_string(),
        format!("{}/o/r/resolve/main/glm-00002-of-00003.gguf", hub.base),
    ] {
        let _ = std::fs::remove_file(&out);
        fetch(hub_options("hf_secret", &hub.base, false), &source, &out).expect("fetch");
        assert!(std::fs::read(&out).expect("read") == s.reference);
    }
    let seen = hub.seen();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|r| r.authorization.is_none()),
        "the token went over plain http without the opt-in"
    );
}

#[test]
fn hf_urls_resolve_under_hf_endpoint_with_the_token() {
    let s = setup();
    let files: HashMap<String, Vec<u8>> = s
        .files
        .iter()
        .map(|(k, v)| (k.replace("/m/", "/o/r/resolve/v1/"), v.clone()))
        .collect();
    let server = FaultServer::start("127.0.0.1", files, Fault::None);
    let out = s.out.path().join("draft.gguf");
    let mut opts = hub_options("tok", &server.base, true);
    opts.transfer.chunk_size = 1 << 20;
    fetch(opts, "hf://o/r@v1/glm-00001-of-00003.gguf", &out).expect("fetch");
    assert!(std::fs::read(&out).expect("read") == s.reference);
    assert!(server
        .seen()
        .iter()
        .all(|r| r.path.starts_with("/o/r/resolve/v1/")
            && r.authorization.as_deref() == Some("Bearer tok")));
}

#[test]
fn an_interrupted_fetch_resumes_from_its_journal_without_refetching() {
    let s = setup();
    let chunk = 64u64 << 10;
    let server = FaultServer::start(
        "127.0.0.1",
        s.files.clone(),
        Fault::FailAfter { requests: 40 },
    );
    let out = s.out.path().join("draft.gguf");
    let mut opts = options(None, chunk, 2);
    opts.transfer.jobs = 1;
    let e = fetch(opts.clone(), &url(&server), &out).expect_err("must fail");
    assert!(
        matches!(
            e,
            FetchError::Status {
                status: 404,
                request: Request::Range { .. },
                ..
            }
        ),
        "{e}"
    );
    assert!(!out.exists());
    let journal = s.out.path().join("draft.gguf.tarfa-journal");
    let done = std::fs::read_to_string(&journal)
        .expect("journal kept")
        .lines()
        .filter(|l| l.starts_with("done "))
        .count() as u64;
    assert!(done >= 20, "only {done} chunks journalled");

    // Damage one journalled chunk: it must be fetched again, not trusted.
    let partial = s.out.path().join("draft.gguf.tarfa-partial");
    let mut bytes = std::fs::read(&partial).expect("partial");
    let first_data = s.reference.len() - s.mtp_bytes as usize;
    bytes[first_data + 10] ^= 0xff;
    std::fs::write(&partial, bytes).expect("damage");

    server.set_fault(Fault::None);
    let before = server.sent_body();
    let r = fetch(opts, &url(&server), &out).expect("resume");
    let second = server.sent_body() - before;
    assert!(std::fs::read(&out).expect("read") == s.reference);
    assert_eq!(
        r.transfer.chunks_resumed as u64,
        done - 1,
        "the damaged chunk is refetched"
    );
    assert_eq!(
        r.transfer.bytes_fetched,
        s.mtp_bytes - r.transfer.bytes_resumed
    );
    // The rerun moved the headers and the missing chunks only.
    assert!(
        second <= s.mtp_bytes - r.transfer.bytes_resumed + 3 * 64 * 1024,
        "resumed run fetched {second} bytes; {} were already there",
        r.transfer.bytes_resumed
    );
    assert!(!journal.exists() && !partial.exists());
}

/// The notes a fetch gives.
#[derive(Default)]
struct Notes(std::sync::Mutex<Vec<String>>);

impl tarfa_fetch::Progress for Notes {
    fn note(&self, msg: &str) {
        if let Ok(mut v) = self.0.lock() {
            v.push(msg.to_string());
        }
    }
}

#[test]
fn without_a_validator_a_rerun_starts_over_and_never_splices_a_replaced_remote() {
    let s = setup();
    let server = FaultServer::start(
        "127.0.0.1",
        s.files.clone(),
        Fault::FailAfter { requests: 40 },
    );
    server.set_validators(false);
    let out = s.out.path().join("draft.gguf");
    let mut opts = options(None, 64 << 10, 2);
    opts.transfer.jobs = 1;
    let e = fetch(opts.clone(), &url(&server), &out).expect_err("must fail");
    assert!(matches!(e, FetchError::Status { status: 404, .. }), "{e}");
    let journal = s.out.path().join("draft.gguf.tarfa-journal");
    let journalled = std::fs::read_to_string(&journal)
        .expect("journal kept")
        .lines()
        .filter(|l| l.starts_with("done "))
        .count();
    assert!(journalled >= 20, "only {journalled} chunks journalled");

    // The remote is replaced: same names, lengths and headers, other tensor bytes.
    let replaced = tempfile::tempdir().expect("tempdir");
    for (path, bytes) in &s.files {
        let mut b = bytes.clone();
        let h = tarfa_gguf::parse_header(&b, b.len() as u64).expect("header");
        for x in &mut b[h.data_start as usize..] {
            *x ^= 0x5A;
        }
        let name = path.trim_start_matches("/m/");
        std::fs::write(replaced.path().join(name), &b).expect("write");
        server.set_file(path, b);
    }
    let expected_path = s.out.path().join("expected.gguf");
    let first = replaced.path().join("glm-00001-of-00003.gguf");
    fetch(
        options(None, 1 << 20, 1),
        &first.display().to_string(),
        &expected_path,
    )
    .expect("local fetch of the replaced model");
    let expected = std::fs::read(&expected_path).expect("read");
    assert!(expected.len() == s.reference.len() && expected != s.reference);

    server.set_fault(Fault::None);
    let f = Fetcher::new(opts);
    let plan = f.plan(&url(&server)).expect("plan");
    let notes = Notes::default();
    let r = f.fetch(&plan, &out, &notes).expect("rerun");
    assert!(
        std::fs::read(&out).expect("read") == expected,
        "the rerun's file is not the replaced remote's (old chunks kept)"
    );
    assert_eq!(r.transfer.chunks_resumed, 0);
    let notes = notes.0.into_inner().expect("notes");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("no ETag or Last-Modified") && n.contains("fetching again")),
        "{notes:?}"
    );
}

#[test]
fn a_local_source_gives_the_same_file_as_any_of_its_parts() {
    let s = setup();
    let f = Fetcher::new(options(None, 1 << 20, 1));
    for p in &s.parts {
        let out = s.out.path().join("again.gguf");
        let plan = f.plan(&p.display().to_string()).expect("plan");
        f.fetch(&plan, &out, &Silent).expect("fetch");
        assert!(std::fs::read(&out).expect("read") == s.reference);
    }
}

#[test]
fn each_bad_framing_of_a_range_response_is_its_own_fault() {
    let s = setup();
    let fault_of = |fault: Fault| match must_fail(&s, fault.clone()) {
        FetchError::BadResponse { fault, .. } => fault,
        e => panic!("{fault:?}: expected BadResponse, got {e}"),
    };
    assert_eq!(
        fault_of(Fault::NoContentRange),
        ResponseFault::NoContentRange
    );
    assert_eq!(
        fault_of(Fault::Gzip),
        ResponseFault::ContentEncoding {
            value: "gzip".into()
        }
    );
    assert_eq!(fault_of(Fault::LongBody), ResponseFault::BodyTooLong);
}

#[test]
fn each_unfollowable_redirect_is_its_own_fault() {
    let s = setup();
    let e = must_fail(&s, Fault::RedirectWithoutLocation);
    assert!(
        matches!(
            e,
            FetchError::Redirect {
                fault: RedirectFault::NoLocation { status: 302 },
                ..
            }
        ),
        "{e}"
    );
    // A server that redirects every request to itself.
    let server = FaultServer::start("127.0.0.1", s.files.clone(), Fault::None);
    server.set_fault(Fault::RedirectTo {
        base: server.base.clone(),
    });
    let out = s.out.path().join("loop.gguf");
    let e = fetch(options(None, 128 << 10, 1), &url(&server), &out).expect_err("a loop");
    assert!(
        matches!(
            e,
            FetchError::Redirect {
                fault: RedirectFault::TooMany {
                    max: tarfa_fetch::http::MAX_REDIRECTS
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(!out.exists());
}
