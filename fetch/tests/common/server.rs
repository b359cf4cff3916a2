//! A small HTTP/1.1 file server on 127.0.0.1 for the tests, with faults injected on demand:
//! dropped bodies, 500s, a 200 to a range request, a wrong `Content-Range`, an HTML page, an ETag
//! that changes mid-run, a redirect to another host. It can also send no validator (no ETag, no
//! Last-Modified) and have a file replaced between runs. It records what each request carried
//! and counts the body bytes it sent. Every connection is closed after one response.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// What the server does wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Nothing.
    None,
    /// Every `every`-th range request past byte 0: full headers, half the body, then close.
    DropMidBody { every: u64 },
    /// Every `every`-th range request past byte 0: HTTP 500.
    Status500 { every: u64 },
    /// Every range request past byte 0: HTTP 200 with the whole file.
    Full200,
    /// Every range request past byte 0: a 206 for the range shifted by one byte.
    WrongContentRange,
    /// Every response: a 200 HTML page.
    HtmlPage,
    /// After this many requests the ETag changes (and If-Range then gets the whole file).
    EtagChangesAfter { requests: u64 },
    /// Every request: 302 to the same path under this base URL.
    RedirectTo { base: String },
    /// Every `every`-th range request past byte 0: half the body, then silence for a second.
    StallMidBody { every: u64 },
    /// After this many requests, every range request past byte 0: 404 (a fault no retry cures).
    FailAfter { requests: u64 },
    /// Every `every`-th range request past byte 0: the headers, then the body one byte every
    /// 50 ms (never silent long enough for a read timeout).
    Trickle { every: u64 },
    /// Every range request past byte 0: a 206 without `Content-Range`.
    NoContentRange,
    /// Every range request past byte 0: a 206 with `Content-Encoding: gzip`.
    Gzip,
    /// Every range request past byte 0: a 206 without `Content-Length` whose body runs one byte
    /// past the range.
    LongBody,
    /// Every request: a 302 without `Location`.
    RedirectWithoutLocation,
    /// A request whose path starts with `prefix`: 302 to `location` followed by the rest of the
    /// path; any other path is served as with `None`.
    RedirectUnder { prefix: String, location: String },
}

/// One request as received.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    pub path: String,
    pub range: Option<String>,
    pub if_range: Option<String>,
    pub authorization: Option<String>,
}

#[derive(Debug)]
struct State {
    files: HashMap<String, Vec<u8>>,
    fault: Fault,
    seen: Vec<Seen>,
    sent_body: u64,
    delay: Duration,
    /// Send an ETag (the default); false: neither ETag nor Last-Modified.
    validators: bool,
}

/// A running server; stopped on drop.
#[derive(Debug)]
pub struct FaultServer {
    pub base: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl FaultServer {
    /// Serve `files` (URL path → bytes) on `ip` (a 127.0.0.0/8 address) at an ephemeral port.
    pub fn start(ip: &str, files: HashMap<String, Vec<u8>>, fault: Fault) -> FaultServer {
        assert!(ip.starts_with("127."), "test servers stay on loopback");
        let listener = TcpListener::bind((ip, 0)).expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let state = Arc::new(Mutex::new(State {
            files,
            fault,
            seen: Vec::new(),
            sent_body: 0,
            delay: Duration::ZERO,
            validators: true,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (state.clone(), stop.clone());
        let handle = std::thread::spawn(move || {
            let mut workers = Vec::new();
            while !sp.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let st = st.clone();
                        workers.push(std::thread::spawn(move || {
                            let _ = handle(conn, &st);
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
                workers.retain(|w: &JoinHandle<()>| !w.is_finished());
            }
            for w in workers {
                let _ = w.join();
            }
        });
        FaultServer {
            base,
            state,
            stop,
            handle: Some(handle),
        }
    }

    /// The requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state
            .lock()
            .map(|s| s.seen.clone())
            .unwrap_or_default()
    }

    /// Body bytes sent so far.
    pub fn sent_body(&self) -> u64 {
        self.state.lock().map(|s| s.sent_body).unwrap_or(0)
    }

    /// Wait this long before each range response past byte 0 (to kill a client mid-run).
    pub fn set_delay(&self, d: Duration) {
        if let Ok(mut s) = self.state.lock() {
            s.delay = d;
        }
    }

    /// Send an ETag (true, the default) or no validator at all (false).
    pub fn set_validators(&self, on: bool) {
        if let Ok(mut s) = self.state.lock() {
            s.validators = on;
        }
    }

    /// Replace the file served at `path`.
    pub fn set_file(&self, path: &str, bytes: Vec<u8>) {
        if let Ok(mut s) = self.state.lock() {
            s.files.insert(path.to_string(), bytes);
        }
    }

    /// Change the fault.
    pub fn set_fault(&self, f: Fault) {
        if let Ok(mut s) = self.state.lock() {
            s.fault = f;
        }
    }
}

fn handle(conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    conn.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut r = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let path = line
        .split(' ')
        .nth(1)
        .unwrap_or("/")
        .split('?')
        .next()
        .unwrap_or("/")
        .to_string();
    let mut headers = HashMap::new();
    for _ in 0..100 {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let seen = Seen {
        path: path.clone(),
        range: headers.get("range").cloned(),
        if_range: headers.get("if-range").cloned(),
        authorization: headers.get("authorization").cloned(),
    };
    let (fault, n, body, delay, validators) = {
        let mut s = state
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        s.seen.push(seen.clone());
        let n = s.seen.len() as u64;
        (
            s.fault.clone(),
            n,
            s.files.get(&path).cloned(),
            s.delay,
            s.validators,
        )
    };
    let mut out = conn;
    let count = |k: usize| {
        if let Ok(mut s) = state.lock() {
            s.sent_body += k as u64;
        }
    };
    let send =
        |out: &mut TcpStream, status: &str, hdrs: &[String], body: &[u8]| -> std::io::Result<()> {
            let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
            for h in hdrs {
                head.push_str(h);
                head.push_str("\r\n");
            }
            head.push_str("\r\n");
            out.write_all(head.as_bytes())?;
            out.write_all(body)?;
            count(body.len());
            out.flush()
        };
    if let Fault::RedirectTo { base } = &fault {
        return send(
            &mut out,
            "302 Found",
            &[
                format!("Location: {base}{path}"),
                "Content-Length: 0".into(),
            ],
            b"",
        );
    }
    if let Fault::RedirectUnder { prefix, location } = &fault {
        if let Some(rest) = path.strip_prefix(prefix.as_str()) {
            return send(
                &mut out,
                "302 Found",
                &[
                    format!("Location: {location}{rest}"),
                    "Content-Length: 0".into(),
                ],
                b"",
            );
        }
    }
    if fault == Fault::RedirectWithoutLocation {
        return send(&mut out, "302 Found", &["Content-Length: 0".into()], b"");
    }
    if fault == Fault::HtmlPage {
        let page = b"<!DOCTYPE html><html><body>Sign in</body></html>";
        return send(
            &mut out,
            "200 OK",
            &[
                "Content-Type: text/html; charset=utf-8".into(),
                format!("Content-Length: {}", page.len()),
            ],
            page,
        );
    }
    let Some(file) = body else {
        return send(
            &mut out,
            "404 Not Found",
            &["Content-Length: 0".into()],
            b"",
        );
    };
    let etag = match fault {
        Fault::EtagChangesAfter { requests } if n > requests => "\"v2\"",
        _ => "\"v1\"",
    };
    let etag_line = |rest: Vec<String>| -> Vec<String> {
        let mut h: Vec<String> = validators
            .then(|| format!("ETag: {etag}"))
            .into_iter()
            .collect();
        h.extend(rest);
        h
    };
    let len = file.len() as u64;
    let whole = |out: &mut TcpStream| {
        send(
            out,
            "200 OK",
            &etag_line(vec![format!("Content-Length: {len}")]),
            &file,
        )
    };
    let range = seen.range.as_deref().and_then(|r| {
        let (a, b) = r.strip_prefix("bytes=")?.split_once('-')?;
        let a: u64 = a.parse().ok()?;
        let b: u64 = b.parse::<u64>().ok()?.min(len.saturating_sub(1));
        (a <= b && a < len).then_some((a, b))
    });
    let Some((a, b)) = range else {
        return whole(&mut out);
    };
    if seen.if_range.as_deref().is_some_and(|v| v != etag) {
        return whole(&mut out);
    }
    if a > 0 {
        std::thread::sleep(delay);
        match fault {
            Fault::Full200 => return whole(&mut out),
            Fault::FailAfter { requests } if n > requests => {
                return send(
                    &mut out,
                    "404 Not Found",
                    &["Content-Length: 0".into()],
                    b"",
                )
            }
            Fault::Status500 { every } if n % every == 0 => {
                return send(
                    &mut out,
                    "500 Internal Server Error",
                    &["Content-Length: 0".into()],
                    b"",
                )
            }
            Fault::NoContentRange | Fault::Gzip | Fault::LongBody => {
                let part = &file[a as usize..=(b + 1).min(len - 1) as usize];
                let part = if fault == Fault::LongBody {
                    part
                } else {
                    &part[..(b - a + 1) as usize]
                };
                let mut h = Vec::new();
                if fault != Fault::NoContentRange {
                    h.push(format!("Content-Range: bytes {a}-{b}/{len}"));
                }
                if fault != Fault::LongBody {
                    h.push(format!("Content-Length: {}", part.len()));
                }
                if fault == Fault::Gzip {
                    h.push("Content-Encoding: gzip".into());
                }
                return send(&mut out, "206 Partial Content", &etag_line(h), part);
            }
            Fault::WrongContentRange => {
                let (a2, b2) = (a + 1, (b + 1).min(len - 1));
                let part = &file[a2 as usize..=b2 as usize];
                return send(
                    &mut out,
                    "206 Partial Content",
                    &etag_line(vec![
                        format!("Content-Range: bytes {a2}-{b2}/{len}"),
                        format!("Content-Length: {}", part.len()),
                    ]),
                    part,
                );
            }
            Fault::Trickle { every } if n % every == 0 => {
                let part = &file[a as usize..=b as usize];
                let mut head = "HTTP/1.1 206 Partial Content\r\nConnection: close\r\n".to_string();
                for h in etag_line(vec![
                    format!("Content-Range: bytes {a}-{b}/{len}"),
                    format!("Content-Length: {}", part.len()),
                ]) {
                    head.push_str(&h);
                    head.push_str("\r\n");
                }
                head.push_str("\r\n");
                out.write_all(head.as_bytes())?;
                // Until the client gives up (the write fails) or, at this pace, hours later.
                for byte in part.chunks(1) {
                    out.write_all(byte)?;
                    out.flush()?;
                    count(1);
                    std::thread::sleep(Duration::from_millis(50));
                }
                return Ok(());
            }
            Fault::DropMidBody { every } | Fault::StallMidBody { every } if n % every == 0 => {
                let part = &file[a as usize..=b as usize];
                let mut head = "HTTP/1.1 206 Partial Content\r\nConnection: close\r\n".to_string();
                for h in etag_line(vec![
                    format!("Content-Range: bytes {a}-{b}/{len}"),
                    format!("Content-Length: {}", part.len()),
                ]) {
                    head.push_str(&h);
                    head.push_str("\r\n");
                }
                head.push_str("\r\n");
                out.write_all(head.as_bytes())?;
                let half = part.len() / 2;
                out.write_all(&part[..half])?;
                count(half);
                out.flush()?;
                if matches!(fault, Fault::StallMidBody { .. }) {
                    std::thread::sleep(Duration::from_secs(1));
                }
                return out.shutdown(std::net::Shutdown::Both);
            }
            _ => {}
        }
    }
    let part = &file[a as usize..=b as usize];
    send(
        &mut out,
        "206 Partial Content",
        &etag_line(vec![
            format!("Content-Range: bytes {a}-{b}/{len}"),
            format!("Content-Length: {}", part.len()),
        ]),
        part,
    )
}
