//! `tarfa serve` (issue 25) as a client meets it, on the bundled fixture served on loopback:
//! completions whose text equals `tarfa run`'s; the same request alone and among concurrent
//! ones, identical and different, gives the same bytes; streaming as OpenAI sends it; stop
//! strings; errors in OpenAI's shape with their statuses; a full queue is 503 with Retry-After;
//! a client that vanishes frees its slot and the server keeps serving.

mod common;

use std::io::{Read, Write};
use std::path::Path;

use common::serve::{agent, get, start, Server};
use common::{path, tarfa};
use serde_json::{json, Value};

/// POST `body` (JSON text) to `route`: the status, the headers asked for, and the body.
fn post_raw(
    s: &Server,
    route: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> (u16, String, Vec<String>) {
    let mut req = agent()
        .post(format!("{}{route}", s.base))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut r = req.send(body).expect("request");
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(|v| vec![v.to_string()])
        .unwrap_or_default();
    (status, r.body_mut().read_to_string().expect("body"), retry)
}

fn post(s: &Server, route: &str, body: Value) -> (u16, Value) {
    let (status, text, _) = post_raw(s, route, &body.to_string(), &[]);
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

/// A response with the parts that differ per request (its id, its time, how much of its prompt
/// the prompt cache held) taken out.
fn stable(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
        o.remove("created");
        if let Some(u) = o.get_mut("usage").and_then(Value::as_object_mut) {
            u.remove("prompt_tokens_details");
        }
    }
    v
}

fn model(tmp: &Path) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    let m = tmp.join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    m
}

const PROMPTS: [&str; 3] = ["The quick brown fox", "Hello", "abc def ghi"];

#[test]
fn completions_are_runs_text_and_the_same_bytes_alone_or_among_others() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "4", "--queue", "64"]);
    let req = |p: &str| json!({"prompt": p, "max_tokens": 24});
    let mut alone = Vec::new();
    for p in PROMPTS {
        let (status, v) = post(&s, "/v1/completions", req(p));
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
        assert_eq!(v["usage"]["completion_tokens"], 24, "{v}");
        // The text tarfa run prints for the same prompt.
        let (code, out, err) = tarfa(&["run", path(&m), "-p", p, "-n", "24"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(v["choices"][0]["text"], out.trim_end_matches('\n'), "{p}");
        alone.push(stable(v));
    }
    // 8 and then 32 at once — each prompt again and again, with logprobs — over 4 slots, on this
    // server (the prompt cache hit: each prompt ran alone first) and on one without a cache: the
    // same bytes as alone, tokens, text and logprobs.
    let nocache = start(
        &m,
        &["--parallel", "4", "--queue", "64", "--prompt-cache", "0"],
    );
    let with_lp = |p: &str| json!({"prompt": p, "max_tokens": 24, "logprobs": 2});
    let mut alone_lp = Vec::new();
    for p in PROMPTS {
        let (status, v) = post(&s, "/v1/completions", with_lp(p));
        assert_eq!(status, 200, "{v}");
        assert_eq!(
            v["choices"][0]["text"],
            alone[alone_lp.len()]["choices"][0]["text"]
        );
        alone_lp.push(stable(v));
    }
    for (server, n) in [(&s, 8), (&nocache, 8), (&s, 32), (&nocache, 32)] {
        let base = server.base.clone();
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let base = base.clone();
                let body = with_lp(PROMPTS[i % 3]).to_string();
                std::thread::spawn(move || {
                    let mut r = agent()
                        .post(format!("{base}/v1/completions"))
                        .header("content-type", "application/json")
                        .send(&body)
                        .expect("request");
                    assert_eq!(r.status().as_u16(), 200);
                    let v: Value =
                        serde_json::from_str(&r.body_mut().read_to_string().expect("body"))
                            .expect("json");
                    (i % 3, stable(v))
                })
            })
            .collect();
        for h in handles {
            let (k, v) = h.join().expect("thread");
            assert_eq!(v, alone_lp[k], "prompt {k} among {n} others");
        }
    }
    let hits = get(&s, "/metrics")
        .expect("metrics")
        .1
        .lines()
        .find_map(|l| l.strip_prefix("tarfa_prompt_cache_hits_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("metric");
    // The longer prompts hit the cache in each of the 40 concurrent requests (a prompt's last
    // token is always computed, so a one-token prompt has nothing to reuse).
    assert!(hits >= 20, "{hits} prompt cache hits");
    // Streamed: the deltas are the text; a finish chunk, the usage chunk, then [DONE].
    let (status, text, _) = post_raw(
        &s,
        "/v1/completions",
        &json!({"prompt": PROMPTS[0], "max_tokens": 24, "stream": true,
                "stream_options": {"include_usage": true}})
        .to_string(),
        &[],
    );
    assert_eq!(status, 200);
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}")))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk"))
        .collect();
    let joined: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(
        joined,
        alone[0]["choices"][0]["text"].as_str().expect("text")
    );
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(
        stable(json!({"usage": chunks[n - 1]["usage"]})),
        json!({"usage": alone[0]["usage"]})
    );
    assert!(chunks[..n - 2]
        .iter()
        .all(|c| c["choices"][0]["finish_reason"].is_null()));

    // A stop string: the text ends before it, finish_reason stop.
    let full = alone[0]["choices"][0]["text"].as_str().expect("text");
    let stop = &full[5..7];
    let at = full.find(stop).expect("in it");
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": PROMPTS[0], "max_tokens": 24, "stop": [stop]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], &full[..at]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // The models list names the model's manifest digest; the fingerprint is in every answer.
    let (status, body) = get(&s, "/v1/models").expect("models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&body).expect("json");
    let fp = models["data"][0]["system_fingerprint"]
        .as_str()
        .expect("fp");
    assert_eq!(alone[0]["system_fingerprint"], fp);
    assert_eq!(
        models["data"][0]["manifest_digest"].as_str().map(str::len),
        Some(64)
    );
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--max-body", "4096", "--api-key", "k3y"]);
    let auth = [("authorization", "Bearer k3y")];
    let cases: Vec<(String, u16, Option<&str>)> = vec![
        ("{bad".into(), 400, None),
        ("[1,2]".into(), 400, None),
        (json!({"max_tokens": 3}).to_string(), 400, Some("prompt")),
        (
            json!({"prompt": "x", "foo": 1}).to_string(),
            400,
            Some("foo"),
        ),
        (
            json!({"prompt": "x", "temperature": 101}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            json!({"prompt": "x", "top_p": 0}).to_string(),
            400,
            Some("top_p"),
        ),
        (
            json!({"prompt": "x", "top_k": 1000}).to_string(),
            400,
            Some("top_k"),
        ),
        (
            json!({"prompt": "x", "presence_penalty": 0.5}).to_string(),
            400,
            Some("presence_penalty"),
        ),
        (
            json!({"prompt": "x", "logprobs": 21}).to_string(),
            400,
            Some("logprobs"),
        ),
        (
            json!({"prompt": "x", "max_tokens": -1}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"prompt": "x", "max_tokens": "9"}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"prompt": [1, 99999]}).to_string(),
            400,
            Some("prompt"),
        ),
        (json!({"prompt": "x", "n": 17}).to_string(), 400, Some("n")),
        (
            json!({"prompt": "x", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            json!({"prompt": "x", "stop": ""}).to_string(),
            400,
            Some("stop"),
        ),
        (
            json!({"prompt": "x", "stop": "s".repeat(300)}).to_string(),
            400,
            Some("stop"),
        ),
        (json!({"prompt": "x", "n": 0}).to_string(), 400, Some("n")),
        (
            json!({"prompt": "x", "stop": 7}).to_string(),
            400,
            Some("stop"),
        ),
        (
            json!({"prompt": "x", "stream_options": {"include_usage": true}}).to_string(),
            400,
            Some("stream_options"),
        ),
        (
            json!({"prompt": "x", "model": "other"}).to_string(),
            404,
            None,
        ),
        (json!({"prompt": "x".repeat(5000)}).to_string(), 413, None),
    ];
    for (body, want, param) in cases {
        let (status, text, _) = post_raw(&s, "/v1/completions", &body, &auth);
        assert_eq!(status, want, "{body:.80}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["error"]["code"], want, "{text}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{text}");
        }
    }
    // Without the key: 401 everywhere but /health.
    let (status, text, _) = post_raw(
        &s,
        "/v1/completions",
        &json!({"prompt": "x"}).to_string(),
        &[],
    );
    assert_eq!(status, 401, "{text}");
    assert_eq!(get(&s, "/health").expect("health").0, 200);
    assert_eq!(get(&s, "/v1/models").expect("models").0, 401);
    let (status, _, _) = post_raw(&s, "/nope", "{}", &auth);
    assert_eq!(status, 404);
    // A wrong method: OpenAI's error shape too.
    let mut r = agent()
        .get(format!("{}/v1/completions", s.base))
        .header("authorization", "Bearer k3y")
        .call()
        .expect("request");
    assert_eq!(r.status().as_u16(), 405);
    let v: Value =
        serde_json::from_str(&r.body_mut().read_to_string().expect("body")).expect("json");
    assert_eq!(v["error"]["code"], 405, "{v}");
    // And it still answers.
    let (status, text, _) = post_raw(
        &s,
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 3}).to_string(),
        &auth,
    );
    assert_eq!(status, 200, "{text}");
}

#[test]
fn a_full_queue_is_503_with_retry_after_and_a_vanished_client_frees_its_slot() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "1", "--queue", "0"]);
    // 40 requests of 200 tokens at once on one slot and no queue: some are refused.
    let base = s.base.clone();
    let handles: Vec<_> = (0..40)
        .map(|_| {
            let base = base.clone();
            std::thread::spawn(move || {
                let mut r = agent()
                    .post(format!("{base}/v1/completions"))
                    .header("content-type", "application/json")
                    .send(&json!({"prompt": "Hello", "max_tokens": 200}).to_string())
                    .expect("request");
                let retry = r.headers().get("retry-after").is_some();
                let body = r.body_mut().read_to_string().expect("body");
                (r.status().as_u16(), retry, body)
            })
        })
        .collect();
    let mut ok = 0;
    let mut busy = 0;
    for h in handles {
        match h.join().expect("thread") {
            (200, _, _) => ok += 1,
            (503, true, body) => {
                assert!(body.contains("\"code\":503"), "{body}");
                busy += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(ok >= 1 && busy >= 1, "{ok} answered, {busy} refused");

    // A streaming client that reads one chunk and goes away: its slot is freed, counted, and
    // the next request is answered.
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).expect("connect");
    let body = json!({"prompt": "Hello", "max_tokens": 240, "stream": true}).to_string();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut first = [0u8; 256];
    let n = c.read(&mut first).expect("read");
    assert!(
        String::from_utf8_lossy(&first[..n]).contains("200"),
        "{:?}",
        &first[..n]
    );
    drop(c);
    let disconnected = || metric(&s, "tarfa_requests_disconnected_total");
    let mut freed = false;
    for _ in 0..200 {
        if disconnected() >= 1 {
            freed = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(freed, "the vanished client's slot was not freed");
    still_serves(&s);
}

/// Sampling is a function of the request alone: the same seed gives the same bytes alone and
/// among other requests, another seed (almost surely) other text, and the response says it was
/// sampled and with what; logprobs are the fp32 log-softmax of `tarfa run`'s logits, the same
/// bits every time.
#[test]
fn sampling_and_logprobs_are_the_requests_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "3"]);
    let sampled = |seed: u64| {
        json!({"prompt": "Hello", "max_tokens": 24, "temperature": 1.5, "top_k": 50,
               "top_p": 0.95, "min_p": 0.01, "seed": seed})
    };
    let (status, a) = post(&s, "/v1/completions", sampled(5));
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["sampling"]["seed"], 5, "{a}");
    assert_eq!(a["sampling"]["temperature"], 1.5, "{a}");
    let base = s.base.clone();
    let handles: Vec<_> = (0..6u64)
        .map(|i| {
            let base = base.clone();
            let body = if i % 2 == 0 {
                sampled(5)
            } else {
                sampled(100 + i)
            }
            .to_string();
            std::thread::spawn(move || {
                let mut r = agent()
                    .post(format!("{base}/v1/completions"))
                    .header("content-type", "application/json")
                    .send(&body)
                    .expect("request");
                let v: Value = serde_json::from_str(&r.body_mut().read_to_string().expect("body"))
                    .expect("json");
                (i, stable(v))
            })
        })
        .collect();
    let mut others = Vec::new();
    for h in handles {
        let (i, v) = h.join().expect("thread");
        if i % 2 == 0 {
            assert_eq!(v, stable(a.clone()), "seed 5 among others");
        } else {
            others.push(v["choices"][0]["text"].clone());
        }
    }
    assert!(
        others.iter().any(|t| *t != a["choices"][0]["text"]),
        "three other seeds all gave seed 5's text"
    );
    let (_, greedy) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 4}),
    );
    assert!(greedy.get("sampling").is_none(), "{greedy}");

    // Logprobs of a greedy run: the chosen token is the likeliest, and its logprob is the
    // log-softmax of the logits tarfa run writes, the same bits every request.
    let req = json!({"prompt": [5, 17, 99], "max_tokens": 4, "logprobs": 3});
    let (status, v) = post(&s, "/v1/completions", req.clone());
    assert_eq!(status, 200, "{v}");
    assert_eq!(post(&s, "/v1/completions", req).1["choices"], v["choices"]);
    let npy = tmp.path().join("l.npy");
    let (code, _, err) = tarfa(&[
        "run",
        path(&m),
        "--tokens",
        "5,17,99",
        "-n",
        "4",
        "--logits-out",
        path(&npy),
    ]);
    assert_eq!(code, 0, "{err}");
    let logits = tarfa_decode::npy::read(&npy).expect("npy");
    assert_eq!(logits.rows, 4);
    let lp = &v["choices"][0]["logprobs"];
    for (step, row) in logits.data.chunks(logits.cols).enumerate() {
        let best = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|&l| (l - best).exp()).sum();
        let want = -z.ln();
        let got = lp["token_logprobs"][step].as_f64().expect("logprob");
        assert!((got - want).abs() < 1e-5, "step {step}: {got} vs {want}");
        let tops = lp["top_logprobs"][step].as_object().expect("top");
        assert_eq!(tops.len(), 3, "{tops:?}");
        assert!(
            tops.values().all(|x| x.as_f64().expect("lp") <= got + 1e-9),
            "{tops:?}"
        );
    }
}

/// The prompt cache reuses a finished request's sequence for a later prompt sharing its prefix,
/// and changes no bit: each answer equals a server's without a cache, the usage says how many
/// prompt tokens came from the cache, and /metrics counts the hits.
#[test]
fn a_cached_prefix_changes_no_bit() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let cached = start(&m, &["--prompt-cache", "4"]);
    let plain = start(&m, &["--prompt-cache", "0"]);
    let reqs = [
        json!({"prompt": [5, 17, 99, 3, 42, 7], "max_tokens": 8}),
        // The same again: all but the last prompt token from the cache.
        json!({"prompt": [5, 17, 99, 3, 42, 7], "max_tokens": 8}),
        // A longer prompt sharing the first six tokens.
        json!({"prompt": [5, 17, 99, 3, 42, 7, 11, 12], "max_tokens": 8}),
        // A prompt that runs into the first request's answer.
        json!({"prompt": [5, 17, 99], "max_tokens": 8, "temperature": 1.3, "seed": 4}),
        json!({"prompt": [9, 9], "max_tokens": 8}),
    ];
    let mut hits = 0;
    for (i, r) in reqs.iter().enumerate() {
        let (sa, a) = post(&cached, "/v1/completions", r.clone());
        let (sb, b) = post(&plain, "/v1/completions", r.clone());
        assert_eq!((sa, sb), (200, 200), "{a} {b}");
        assert_eq!(a["choices"], b["choices"], "request {i}");
        let used = a["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .expect("cached_tokens");
        assert_eq!(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        match i {
            0 | 4 => assert_eq!(used, 0, "request {i}"),
            1 => assert_eq!(used, 5, "request {i}"),
            2 => assert_eq!(used, 6, "request {i}"),
            _ => assert_eq!(used, 2, "request {i}"),
        }
        hits += u64::from(used > 0);
    }
    let metrics = get(&cached, "/metrics").expect("metrics").1;
    assert!(
        metrics.contains(&format!("tarfa_prompt_cache_hits_total {hits}")),
        "{metrics}"
    );
}

/// `n` choices: each its own sequence, its draws keyed by its index — choice 0 is the request
/// with `n` 1, the others differ (sampled), streamed or not the same texts, usage summed.
#[test]
fn n_choices_are_each_their_own() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "2"]);
    let req = |n: u64, stream: bool| {
        json!({"prompt": "Hello", "max_tokens": 16, "temperature": 1.4, "seed": 11, "n": n,
               "stream": stream})
    };
    let (_, one) = post(&s, "/v1/completions", req(1, false));
    let (status, three) = post(&s, "/v1/completions", req(3, false));
    assert_eq!(status, 200, "{three}");
    let texts: Vec<&str> = (0..3)
        .map(|i| {
            assert_eq!(three["choices"][i]["index"], i);
            three["choices"][i]["text"].as_str().expect("text")
        })
        .collect();
    assert_eq!(texts[0], one["choices"][0]["text"].as_str().expect("text"));
    assert!(texts[1] != texts[0] || texts[2] != texts[0], "{texts:?}");
    assert_eq!(three["usage"]["completion_tokens"], 48, "{three}");
    assert_eq!(
        three["usage"]["prompt_tokens"],
        one["usage"]["prompt_tokens"]
    );
    // Streamed: each index's deltas are its text; one [DONE] at the end.
    let (status, text, _) = post_raw(&s, "/v1/completions", &req(3, true).to_string(), &[]);
    assert_eq!(status, 200);
    let mut joined = vec![String::new(); 3];
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    assert_eq!(events.iter().filter(|e| e.contains("[DONE]")).count(), 1);
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e.trim_start_matches("data: ")).expect("chunk");
        let i = v["choices"][0]["index"].as_u64().expect("index") as usize;
        joined[i].push_str(v["choices"][0]["text"].as_str().expect("text"));
    }
    assert_eq!(joined, texts);
}

/// Under abuse the server answers clearly and keeps serving: 300 requests at once against a
/// queue of 4 (each a 200 or a 503 in OpenAI's shape, none lost), a client that sends a long
/// prompt and vanishes before its first token (nothing of it stays in a slot or the queue), and
/// one that holds a stream open without reading while another request is answered.
#[test]
fn abuse_gets_clear_answers_and_the_server_keeps_serving() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "2", "--queue", "4"]);
    let base = s.base.clone();
    // A thousand requests at once: each answered, or refused with 503 while the queue is full.
    let handles: Vec<_> = (0..1000)
        .map(|i| {
            let base = base.clone();
            std::thread::spawn(move || {
                let body = json!({"prompt": [1 + i % 100, 7], "max_tokens": 2}).to_string();
                match agent()
                    .post(format!("{base}/v1/completions"))
                    .header("content-type", "application/json")
                    .send(&body)
                {
                    Ok(mut r) => {
                        let status = r.status().as_u16();
                        let v: Value =
                            serde_json::from_str(&r.body_mut().read_to_string().expect("body"))
                                .expect("json");
                        (status, v)
                    }
                    Err(e) => panic!("request {i}: {e}"),
                }
            })
        })
        .collect();
    let (mut ok, mut busy) = (0, 0);
    for h in handles {
        match h.join().expect("thread") {
            (200, v) => {
                assert_eq!(v["usage"]["completion_tokens"], 2, "{v}");
                ok += 1;
            }
            (503, v) => {
                assert_eq!(v["error"]["type"], "unavailable_error", "{v}");
                busy += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(ok + busy, 1000);
    assert!(ok >= 6, "{ok} answered");

    // A long prompt, and the client gone before its first token: dropped (hyper cancels the
    // handler of a connection its client closed) or freed by the engine — either way nothing
    // stays in a slot or the queue.
    let addr = s.base.trim_start_matches("http://").to_string();
    let gauge = |name: &str| metric(&s, name);
    {
        let long: Vec<u32> = (0..250).map(|i| 1 + i % 120).collect();
        let body = json!({"prompt": long, "max_tokens": 200, "stream": true}).to_string();
        let mut c = std::net::TcpStream::connect(&addr).expect("connect");
        write!(
            c,
            "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .expect("send");
    }
    let mut idle = false;
    for _ in 0..200 {
        if gauge("tarfa_slots_active") == 0 && gauge("tarfa_queue_depth") == 0 {
            idle = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(
        idle,
        "the vanished client's request still holds a slot or the queue"
    );

    // A stream held open and never read: another request is answered meanwhile.
    let mut held = std::net::TcpStream::connect(&addr).expect("connect");
    let body = json!({"prompt": "Hello", "max_tokens": 200, "stream": true}).to_string();
    write!(
        held,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let (status, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "Hi", "max_tokens": 3}),
    );
    assert_eq!(status, 200, "{v}");
    drop(held);
    assert_eq!(get(&s, "/health").expect("health").0, 200);
}

/// The stream a user reads with `curl -N` is OpenAI's, byte for byte the committed transcript
/// (fixtures/golden/serve/completion-stream.txt; its per-request id and time, and the
/// fingerprint of this conversion, written as ID, TIME and FINGERPRINT): data lines, a finish chunk, the usage chunk, `data: [DONE]`. TARFA_BLESS=1 rewrites it.
#[test]
fn a_streamed_completion_is_the_golden_transcript() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--alias", "fixture"]);
    let body = json!({"prompt": "The quick brown fox", "max_tokens": 6, "stream": true,
                      "stream_options": {"include_usage": true}})
    .to_string();
    let out = std::process::Command::new("curl")
        .args(["-sN", "-H", "content-type: application/json", "-d", &body])
        .arg(format!("{}/v1/completions", s.base))
        .output()
        .expect("curl (scripts/test.sh installs it)");
    assert!(out.status.success(), "curl failed");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut normal = String::new();
    for line in text.split_inclusive('\n') {
        let mut l = line.to_string();
        if let Some(json) = l.strip_prefix("data: {") {
            let mut v: Value =
                serde_json::from_str(&format!("{{{}", json.trim_end())).expect("json");
            v["id"] = json!("ID");
            v["created"] = json!("TIME");
            // The manifest digest in it records the conversion's source file times.
            v["system_fingerprint"] = json!("FINGERPRINT");
            l = format!("data: {v}\n");
        }
        normal.push_str(&l);
    }
    let golden =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/golden/serve/completion-stream.txt");
    if std::env::var_os("TARFA_BLESS").is_some() {
        std::fs::write(&golden, &normal).expect("bless");
    }
    let want = std::fs::read_to_string(&golden).expect("golden transcript");
    assert_eq!(normal, want);
}

/// A free slot is never refused: with --parallel 2 and no queue, two requests at a time are
/// both answered, round after round (the queue's bound counts the slots too).
#[test]
fn a_free_slot_is_never_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--parallel", "2", "--queue", "0"]);
    for round in 0..10 {
        let base = s.base.clone();
        let pair: Vec<_> = (0..2)
            .map(|_| {
                let base = base.clone();
                std::thread::spawn(move || {
                    agent()
                        .post(format!("{base}/v1/completions"))
                        .header("content-type", "application/json")
                        .send(&json!({"prompt": "Hello", "max_tokens": 8}).to_string())
                        .expect("request")
                        .status()
                        .as_u16()
                })
            })
            .collect();
        let statuses: Vec<u16> = pair
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect();
        assert_eq!(statuses, [200, 200], "round {round}");
    }
}

/// Each token's own text: /tokenize's pieces joined are the content (and /detokenize gives it
/// back), and the chat logprobs' `bytes` joined are the answer `tarfa run` prints, byte for
/// byte — a token's bytes are its own, not the decode of it alone. (The fixture's Metaspace
/// decoder keeps a first token's space; a SentencePiece one that drops it from a text would
/// make the joined bytes one leading space longer: `decode/tests/detokenizer.rs` checks bytes
/// and pieces on those.)
#[test]
fn token_pieces_and_logprob_bytes_join_to_the_text() {
    let tmp = tempfile::tempdir().expect("tmp");
    let m = common::serve::chat_model(tmp.path());
    let s = start(&m, &[]);
    let content = "Hello world, how are you? 1 + 1 = 2";
    let (status, v) = post(
        &s,
        "/tokenize",
        json!({"content": content, "with_pieces": true}),
    );
    assert_eq!(status, 200, "{v}");
    let tokens = v["tokens"].as_array().expect("tokens");
    assert!(tokens.len() > 5, "{v}");
    let joined: String = tokens
        .iter()
        .map(|t| t["piece"].as_str().expect("a piece"))
        .collect();
    assert_eq!(joined, content);
    let ids: Vec<Value> = tokens.iter().map(|t| t["id"].clone()).collect();
    let (status, d) = post(&s, "/detokenize", json!({ "tokens": ids }));
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["content"], content);

    let (_, out) = common::serve::hi_and_its_run(&s, &m, None, "12");
    let (status, c) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 12,
               "logprobs": true, "top_logprobs": 2}),
    );
    assert_eq!(status, 200, "{c}");
    let entries = c["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("logprobs");
    assert_eq!(entries.len(), 12, "{c}");
    let bytes: Vec<u8> = entries
        .iter()
        .flat_map(|e| e["bytes"].as_array().expect("bytes").clone())
        .map(|b| b.as_u64().expect("a byte") as u8)
        .collect();
    assert_eq!(String::from_utf8_lossy(&bytes), out);
}

/// Text held back for a stop string that never completes goes out when the answer ends at an
/// end-of-sequence token, streamed or not: the answer is `tarfa run`'s text whole. (The
/// mixtral fixture's reference answer ends with its eos 2.)
#[test]
fn text_held_back_for_a_stop_string_goes_out_at_the_end_of_sequence() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/mixtral");
    let m = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let reference: Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/reference/mixtral/reference.json"),
        )
        .expect("reference"),
    )
    .expect("json");
    let prompt = reference["prompts"][0]["text"].as_str().expect("prompt");
    let (code, out, err) = tarfa(&["run", path(&m), "-p", prompt, "-n", "32", "--json"]);
    assert_eq!(code, 0, "{err}");
    let run: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(run["finish_reason"], "stop", "{run}");
    let text = run["text"].as_str().expect("text");
    // A stop string that begins with the answer's last character and never appears.
    let last = text.chars().last().expect("an answer");
    let stop = format!("{last}\u{1}never");
    let s = start(&m, &[]);
    let req = json!({"prompt": prompt, "max_tokens": 32, "stop": [stop]});
    let (status, v) = post(&s, "/v1/completions", req.clone());
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], text, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let mut streamed = req;
    streamed["stream"] = json!(true);
    let (status, body, _) = post_raw(&s, "/v1/completions", &streamed.to_string(), &[]);
    assert_eq!(status, 200, "{body}");
    let joined: String = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(joined, text, "{body}");
}

/// The server answers a request: what each abuse test ends with.
fn still_serves(s: &Server) {
    let (status, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": "Hello", "max_tokens": 3}),
    );
    assert_eq!(status, 200, "{v}");
}

/// A metric of /metrics.
fn metric(s: &Server, name: &str) -> u64 {
    get(s, "/metrics")
        .expect("metrics")
        .1
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no metric {name}")) as u64
}

/// A long prompt runs in chunks: a client that leaves mid-prompt frees its slot within a chunk,
/// not at the prompt's end, and the next request is answered. (The fixture with a 64k context,
/// a 12,000-token prompt: seconds whole, a few chunks before the leaving is seen.)
#[test]
fn a_client_that_leaves_mid_prompt_frees_its_slot_within_a_chunk() {
    let tmp = tempfile::tempdir().expect("tmp");
    let src = tmp.path().join("src");
    std::fs::create_dir_all(&src).expect("mkdir");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/hf/qwen3_moe");
    for e in std::fs::read_dir(&fixture).expect("fixture") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), src.join(e.file_name())).expect("copy");
    }
    let mut config: Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).expect("config"))
            .expect("json");
    config["max_position_embeddings"] = json!(65536);
    std::fs::write(src.join("config.json"), config.to_string()).expect("write");
    let m = tmp.path().join("m");
    let (code, _, err) = tarfa(&["convert", path(&src), "-o", path(&m), "--quiet"]);
    assert_eq!(code, 0, "{err}");
    let s = start(&m, &["--parallel", "1"]);
    const LONG: u64 = 12_000;
    let prompt: Vec<u64> = (0..LONG).map(|i| 5 + i % 100).collect();
    let body = json!({"prompt": prompt, "max_tokens": 4, "stream": true}).to_string();
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut c = std::net::TcpStream::connect(&addr).expect("connect");
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut first = [0u8; 256];
    let n = c.read(&mut first).expect("read");
    assert!(String::from_utf8_lossy(&first[..n]).contains("200"));
    // Computing has begun: drop the connection mid-prompt.
    let t0 = std::time::Instant::now();
    while metric(&s, "tarfa_prompt_tokens_total") == 0 {
        assert!(t0.elapsed().as_secs() < 60, "the prompt never began");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(c);
    while metric(&s, "tarfa_requests_disconnected_total") == 0 {
        assert!(t0.elapsed().as_secs() < 120, "the leaving was never seen");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let computed = metric(&s, "tarfa_prompt_tokens_total");
    assert!(
        computed < LONG / 2,
        "{computed} of the prompt's {LONG} tokens computed before the leaving was seen"
    );
    still_serves(&s);
}

/// Connections are bounded: eight clients that open a connection and send part of a request
/// hold all of `--max-connections 8`; one more is answered 503 (OpenAI's error, Retry-After) at
/// once rather than left waiting; the slow eight lose their connections when their headers have
/// not come within `--read-timeout 3`, a body that never ends is answered 408, and requests are
/// answered again. (3 s, not 1: on a loaded 2-core CI machine the ninth connection was once
/// accepted more than a second after the eighth, so a slow one had already timed out and freed
/// its place, and the ninth was served instead of refused.)
#[test]
fn slow_clients_lose_their_connections_and_one_over_the_bound_gets_503() {
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().expect("tmp");
    let m = model(tmp.path());
    let s = start(&m, &["--max-connections", "8", "--read-timeout", "3"]);
    let addr = s.base.trim_start_matches("http://").to_string();
    // Wait until the model is up, so that a refusal below is the bound's, not the loading's.
    assert_eq!(get(&s, "/health").expect("health").0, 200);
    // The eight slow connections must each take a slot: a connection of the checks above may
    // still hold one for a moment after its client closed it (the server's task ends when it
    // reads the close), and then the eighth would be refused and the ninth take the freed slot.
    // So wait until the server holds no connection but the one asking, and try the eight again
    // should one of them still have been refused.
    let mut t0 = Instant::now();
    let mut slow: Vec<TcpStream> = Vec::new();
    for attempt in 0..5 {
        // Until a /metrics request is answered (not refused: the slots of connections just
        // closed may not be free yet) saying it is the only one open.
        let wait = Instant::now();
        let open = || -> Option<u64> {
            let (code, body) = get(&s, "/metrics").ok()?;
            (code == 200).then_some(())?;
            body.lines()
                .find_map(|l| l.strip_prefix("tarfa_connections ")?.parse::<u64>().ok())
        };
        while open() != Some(1) {
            assert!(
                wait.elapsed() < Duration::from_secs(10),
                "connections stay open"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        t0 = Instant::now();
        slow = (0..8)
            .map(|_| {
                let mut c = TcpStream::connect(&addr).expect("connect");
                c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
                    .expect("send");
                c
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        // A refused one has its 503 waiting.
        let refused = slow.iter().any(|c| {
            c.set_nonblocking(true).expect("nonblocking");
            let got = c.peek(&mut [0u8; 1]).is_ok_and(|n| n > 0);
            c.set_nonblocking(false).expect("blocking");
            got
        });
        if !refused {
            break;
        }
        assert!(
            attempt < 4,
            "a slow connection was refused in every attempt"
        );
        slow.clear();
    }
    let mut extra = TcpStream::connect(&addr).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut answer = String::new();
    extra
        .read_to_string(&mut answer)
        .expect("a 503, then the close");
    assert!(
        answer.starts_with("HTTP/1.1 503") && answer.contains("retry-after: 1"),
        "{answer}"
    );
    let body: Value =
        serde_json::from_str(answer.split("\r\n\r\n").nth(1).expect("body")).expect("json");
    assert_eq!(body["error"]["type"], "unavailable_error", "{body}");
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "the 503 was not at once: {:?}, the read timeout being 3 s",
        t0.elapsed()
    );
    // The slow ones are closed after the header timeout (hyper answers 408 or just closes).
    for mut c in slow {
        c.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            rest.is_empty() || rest.starts_with("HTTP/1.1 408"),
            "{rest}"
        );
    }
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(2900) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    // Headers whole, the body begun and never ended: 408 after the timeout, the connection
    // closed.
    let mut c = TcpStream::connect(&addr).expect("connect");
    c.write_all(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"prompt\"",
    )
    .expect("send");
    c.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let t1 = Instant::now();
    let mut answer = String::new();
    c.read_to_string(&mut answer)
        .expect("a 408, then the close");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("--read-timeout"), "{answer}");
    assert!(t1.elapsed() < Duration::from_secs(10), "{:?}", t1.elapsed());
    still_serves(&s);
    assert!(metric(&s, "tarfa_connections_refused_total") >= 1);
}
