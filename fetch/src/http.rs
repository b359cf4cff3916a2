//! Checked HTTP range requests.
//!
//! Every response is held to what was asked: a range request must come back `206` with exactly
//! the `Content-Range` asked, the same total length, no `Content-Encoding`, not an HTML page, and
//! a body of exactly the asked length. A `200` to a range request is never data: with the
//! validator captured at the start (strong `ETag`, else `Last-Modified`) sent as `If-Range`, a
//! `200` means either that the file changed ([`FetchError::RemoteChanged`]) or that the server
//! ignores ranges ([`FetchError::RangeIgnored`]). Transient faults (transport errors, dropped
//! bodies, 5xx, 408, 429, a body slower than the low-speed limit) are retried with exponential
//! backoff and jitter.
//!
//! Every wait is bounded: the connection and the response headers by [`HttpConfig::timeout`],
//! each read of a body by the same, and a body that keeps trickling (a byte every few seconds
//! never trips a per-read timeout) by [`LowSpeed`], curl's `--speed-limit`/`--speed-time`.
//!
//! The token (`HF_TOKEN`) goes as `Authorization: Bearer …` only to the hub: the origin (scheme,
//! host and port) of `https://huggingface.co` or of `HF_ENDPOINT`, and only when that origin is
//! https unless [`HttpConfig::token_over_http`] says otherwise. A URL given at any other origin
//! never carries it. Redirects are followed here, not by the HTTP library, so that the token
//! also never goes to a host a hub URL redirects to (a CDN), nor back to the hub after one: a
//! chain that left the hub is latched tokenless, for its later hops and for the later range
//! requests to the URL it ended at.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ureq::http::{HeaderMap, Response};
use ureq::Body;

use crate::error::{
    FetchError, NotModelKind, RedirectFault, RemoteChange, Request, ResponseFault, Result,
};

/// Most redirects followed for one request.
pub const MAX_REDIRECTS: usize = 10;

/// How often and how patiently transient faults are retried.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts per request, the first included.
    pub attempts: u32,
    /// Delay before the first retry; doubled each time, up to `max_delay`.
    pub base_delay: Duration,
    /// Longest delay between attempts.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 8,
            base_delay: Duration::from_millis(300),
            max_delay: Duration::from_secs(20),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry `n` (0-based): `min(base·2ⁿ, max)`, then "equal jitter" (a uniform
    /// draw from its upper half), so parallel workers that failed together do not retry together.
    pub fn delay(&self, n: u32) -> Duration {
        let full = self
            .base_delay
            .saturating_mul(1u32.checked_shl(n.min(30)).unwrap_or(u32::MAX))
            .min(self.max_delay);
        let half = full / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

/// The low-speed limit (curl's `--speed-limit`/`--speed-time`): a response body that brings
/// fewer than `limit` bytes per second, averaged over any `time` of it, is dropped as
/// [`FetchError::TooSlow`], a transient fault (retried). `limit` 0 turns it off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowSpeed {
    /// Bytes per second.
    pub limit: u64,
    /// The period the average is taken over.
    pub time: Duration,
}

impl Default for LowSpeed {
    fn default() -> Self {
        LowSpeed {
            limit: 1024,
            time: Duration::from_secs(30),
        }
    }
}

/// The rate of one body, period by period, held to a [`LowSpeed`].
struct SpeedWatch {
    low: LowSpeed,
    since: Instant,
    bytes: u64,
}

impl SpeedWatch {
    fn new(low: LowSpeed) -> SpeedWatch {
        SpeedWatch {
            low,
            since: Instant::now(),
            bytes: 0,
        }
    }

    /// `n` more bytes arrived. `Err(rate)` when a whole period has passed below the limit.
    fn arrived(&mut self, n: u64) -> std::result::Result<(), u64> {
        if self.low.limit == 0 || self.low.time.is_zero() {
            return Ok(());
        }
        self.bytes += n;
        let elapsed = self.since.elapsed();
        if elapsed >= self.low.time {
            let rate = (self.bytes as f64 / elapsed.as_secs_f64()) as u64;
            if rate < self.low.limit {
                return Err(rate);
            }
            self.since = Instant::now();
            self.bytes = 0;
        }
        Ok(())
    }

    fn too_slow(&self, url: &str, start: u64, end: u64, rate: u64) -> FetchError {
        FetchError::TooSlow {
            url: url.to_string(),
            start,
            end,
            rate,
            limit: self.low.limit,
            secs: self.low.time.as_secs_f64(),
        }
    }
}

/// Settings of the HTTP client.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Sent as `Authorization: Bearer …` to the hub's origin only (module docs), never to
    /// another host, never after a redirect to another origin.
    pub token: Option<String>,
    /// Send the token to a hub whose endpoint is plain `http://` (`TARFA_TOKEN_OVER_HTTP=1`);
    /// otherwise it goes over https only.
    pub token_over_http: bool,
    /// Retries of transient faults.
    pub retry: RetryPolicy,
    /// Connect timeout, and the longest wait for a response or for the next bytes of a body.
    pub timeout: Duration,
    /// The slowest a body may arrive before it is dropped and retried.
    pub low_speed: LowSpeed,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            token: None,
            token_over_http: false,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            low_speed: LowSpeed::default(),
        }
    }
}

/// What went over the wire: the numbers `--list` and the tests hold to the plan.
#[derive(Debug, Default)]
pub struct Traffic {
    body_bytes: AtomicU64,
    requests: AtomicU64,
    retries: AtomicU64,
}

impl Traffic {
    /// Response body bytes received, from every response (failed attempts included).
    pub fn body_bytes(&self) -> u64 {
        self.body_bytes.load(Ordering::Relaxed)
    }
    /// Requests sent (each redirect hop counts).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    /// Retries after transient faults.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }
}

/// A blocking HTTP client with the checks of this module.
#[derive(Debug)]
pub struct HttpClient {
    agent: ureq::Agent,
    cfg: HttpConfig,
    /// The one origin the token may go to; `None`: it goes nowhere.
    token_origin: Option<String>,
    traffic: Arc<Traffic>,
}

/// Scheme, host and port of a URL, lower-cased, the default port made explicit: "the same host"
/// for the `Authorization` rule.
pub fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit('@').next()?.to_ascii_lowercase();
    let has_port = host_port
        .rsplit_once(':')
        .is_some_and(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && !host_port.ends_with(']');
    let default_port = match scheme.as_str() {
        "http" => "80",
        "https" => "443",
        _ => return None,
    };
    Some(if has_port {
        format!("{scheme}://{host_port}")
    } else {
        format!("{scheme}://{host_port}:{default_port}")
    })
}

/// The origin the token may be sent to, for the hub at `hub_endpoint`: its origin, if it is
/// https or `over_http` allows plain http. `None` when the endpoint is no usable URL.
pub fn token_origin(hub_endpoint: &str, over_http: bool) -> Option<String> {
    let o = origin(hub_endpoint.trim())?;
    (o.starts_with("https://") || over_http).then_some(o)
}

/// `location` resolved against `base` (absolute, scheme-relative, absolute-path or relative).
fn join(base: &str, location: &str) -> Option<String> {
    if location.starts_with("http://") || location.starts_with("https://") {
        return Some(location.to_string());
    }
    let (scheme, rest) = base.split_once("://")?;
    if let Some(l) = location.strip_prefix("//") {
        return Some(format!("{scheme}://{l}"));
    }
    let auth_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let root = format!("{scheme}://{}", &rest[..auth_end]);
    if location.starts_with('/') {
        return Some(format!("{root}{location}"));
    }
    let path = rest[auth_end..].split(['?', '#']).next().unwrap_or("");
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    Some(format!("{root}{dir}{location}"))
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// `bytes A-B/T` → `(A, B, T)`.
fn parse_content_range(v: &str) -> Option<(u64, u64, u64)> {
    let v = v.trim().strip_prefix("bytes ")?;
    let (range, total) = v.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let (a, b, t) = (
        a.trim().parse().ok()?,
        b.trim().parse().ok()?,
        total.trim().parse().ok()?,
    );
    (a <= b && b < t).then_some((a, b, t))
}

/// The validator a server gave for a file: what `If-Range` sends back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Validator {
    /// A strong entity tag, quotes included.
    ETag(String),
    /// An HTTP date.
    LastModified(String),
    /// Neither: only the length is compared, which cannot show that the file is unchanged, so
    /// a fetch from such a source never resumes from a journal (it starts over).
    None,
}

impl Validator {
    fn from_headers(h: &HeaderMap) -> Validator {
        if let Some(e) = header(h, "etag").filter(|e| !e.starts_with("W/")) {
            return Validator::ETag(e.to_string());
        }
        if let Some(d) = header(h, "last-modified") {
            return Validator::LastModified(d.to_string());
        }
        Validator::None
    }

    fn if_range(&self) -> Option<&str> {
        match self {
            Validator::ETag(s) | Validator::LastModified(s) => Some(s),
            Validator::None => None,
        }
    }

    /// A one-line form, for the journal.
    pub fn describe(&self) -> String {
        match self {
            Validator::ETag(s) => format!("etag {s}"),
            Validator::LastModified(s) => format!("last-modified {s}"),
            Validator::None => "none".into(),
        }
    }

    /// `Some(change)` when a response's validator shows that the file is not this one.
    fn changed_in(&self, h: &HeaderMap) -> Option<RemoteChange> {
        match self {
            Validator::ETag(old) => match header(h, "etag") {
                Some(new) if new != old => Some(RemoteChange::ETag {
                    was: old.clone(),
                    now: new.to_string(),
                }),
                _ => None,
            },
            Validator::LastModified(old) => match header(h, "last-modified") {
                Some(new) if new != old => Some(RemoteChange::LastModified {
                    was: old.clone(),
                    now: new.to_string(),
                }),
                _ => None,
            },
            Validator::None => None,
        }
    }
}

fn looks_html(h: &HeaderMap) -> bool {
    header(h, "content-type")
        .is_some_and(|t| t.trim_start().to_ascii_lowercase().starts_with("text/html"))
}

impl HttpClient {
    /// A client; the token (if any) goes only to the hub at `hub_endpoint` ([`token_origin`]);
    /// `traffic` counts what it receives.
    pub fn new(cfg: HttpConfig, hub_endpoint: &str, traffic: Arc<Traffic>) -> HttpClient {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .max_redirects(0)
            .http_status_as_error(false)
            .user_agent(concat!("tarfa/", env!("CARGO_PKG_VERSION")))
            .accept_encoding("identity")
            .timeout_connect(Some(cfg.timeout))
            .timeout_recv_response(Some(cfg.timeout))
            .timeout_per_read(Some(cfg.timeout))
            .build()
            .into();
        let token_origin = cfg
            .token
            .as_ref()
            .and_then(|_| token_origin(hub_endpoint, cfg.token_over_http));
        HttpClient {
            agent,
            cfg,
            token_origin,
            traffic,
        }
    }

    /// Where `Authorization` may go on requests that start at `url`: the hub's origin when `url`
    /// is at the hub (and the token may go there at all), else nowhere.
    fn auth_origin(&self, url: &str) -> Option<String> {
        let hub = self.token_origin.as_ref()?;
        (origin(url).as_ref() == Some(hub)).then(|| hub.clone())
    }

    /// The traffic counters.
    pub fn traffic(&self) -> &Arc<Traffic> {
        &self.traffic
    }

    /// Run `f` until it succeeds, fails for good, or the attempts are spent.
    pub fn with_retries<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let attempts = self.cfg.retry.attempts.max(1);
        let mut n = 0;
        loop {
            match f() {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && n + 1 < attempts => {
                    self.traffic.retries.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(self.cfg.retry.delay(n));
                    n += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One GET of `url` with `headers`, redirects followed by hand. `Authorization` is sent only
    /// while every URL of the chain so far is at `auth_origin` (from [`Self::auth_origin`] of the
    /// URL given): once a redirect leaves it, no later hop carries the token, even one that comes
    /// back. Returns the response, the URL that answered and where the token may still go on
    /// requests that start at that URL (`None` once the chain left the hub).
    fn send(
        &self,
        url: &str,
        auth_origin: Option<&str>,
        headers: &[(&str, String)],
    ) -> Result<(Response<Body>, String, Option<String>)> {
        let mut at = url.to_string();
        let mut auth = auth_origin.filter(|o| origin(url).as_deref() == Some(*o));
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self.agent.get(&at);
            for (k, v) in headers {
                req = req.header(*k, v.as_str());
            }
            if let (Some(token), Some(_)) = (&self.cfg.token, auth) {
                req = req.header("authorization", format!("Bearer {token}"));
            }
            self.traffic.requests.fetch_add(1, Ordering::Relaxed);
            let resp = req.call().map_err(|e| transport(&at, e))?;
            let status = resp.status().as_u16();
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let loc =
                    header(resp.headers(), "location").ok_or_else(|| FetchError::Redirect {
                        url: at.clone(),
                        fault: RedirectFault::NoLocation { status },
                    })?;
                at = join(&at, loc).ok_or_else(|| FetchError::Redirect {
                    url: at.clone(),
                    fault: RedirectFault::BadLocation {
                        location: loc.to_string(),
                    },
                })?;
                // Latched: a chain that left the hub never carries the token again.
                auth = auth.filter(|o| origin(&at).as_deref() == Some(*o));
                continue;
            }
            return Ok((resp, at, auth.map(str::to_string)));
        }
        Err(FetchError::Redirect {
            url: url.to_string(),
            fault: RedirectFault::TooMany { max: MAX_REDIRECTS },
        })
    }

    /// GET a small whole file (config.json, an index): `200`, at most `limit` bytes, not an LFS
    /// pointer or an HTML page. `None` for a 404.
    pub fn get_small(&self, url: &str, limit: u64) -> Result<Option<Vec<u8>>> {
        let auth = self.auth_origin(url);
        self.with_retries(|| {
            let (mut resp, at, _) = self.send(url, auth.as_deref(), &[])?;
            let status = resp.status().as_u16();
            if status == 404 {
                return Ok(None);
            }
            if status != 200 {
                return Err(FetchError::Status {
                    url: at,
                    status,
                    request: Request::Get,
                });
            }
            if looks_html(resp.headers()) {
                return Err(not_a_model(&at, NotModelKind::HtmlPage));
            }
            let mut body = Vec::new();
            let mut r = resp.body_mut().as_reader().take(limit + 1);
            let mut watch = SpeedWatch::new(self.cfg.low_speed);
            let mut chunk = vec![0u8; 64 << 10];
            loop {
                match r.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(n) => {
                        body.extend_from_slice(&chunk[..n]);
                        self.traffic
                            .body_bytes
                            .fetch_add(n as u64, Ordering::Relaxed);
                        watch
                            .arrived(n as u64)
                            .map_err(|rate| watch.too_slow(&at, 0, limit, rate))?;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(transport(&at, e)),
                }
            }
            if body.len() as u64 > limit {
                return Err(FetchError::BadResponse {
                    url: at,
                    start: 0,
                    end: limit,
                    fault: ResponseFault::TooLarge { limit },
                });
            }
            if body.starts_with(crate::LFS_PREFIX) {
                return Err(not_a_model(&at, NotModelKind::LfsPointer));
            }
            Ok(Some(body))
        })
    }
}

fn not_a_model(url: &str, what: NotModelKind) -> FetchError {
    FetchError::NotAModel {
        url: url.to_string(),
        what,
        hint: None,
    }
}

fn transport(url: &str, e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> FetchError {
    FetchError::Transport {
        url: url.to_string(),
        source: e.into(),
    }
}

/// Where a remote file's data comes from after redirects, and where the token may go on requests
/// that start there: `None` when the chain that found it left the hub (it came from a CDN, or
/// came back to the hub by way of another host).
#[derive(Clone, Debug)]
struct Target {
    url: String,
    auth_origin: Option<String>,
}

/// A remote file read by range: its length and validator fixed by the first response, a cache
/// of its first bytes (the header), and the URL its data comes from after redirects.
#[derive(Debug)]
pub struct RemoteFile {
    client: Arc<HttpClient>,
    url: String,
    auth_origin: Option<String>,
    target: Mutex<Target>,
    len: u64,
    validator: Validator,
    head: Mutex<Vec<u8>>,
    sealed: AtomicBool,
}

/// The largest prefix kept in memory for header reads.
const HEAD_CACHE_LIMIT: u64 = 256 << 20;

impl RemoteFile {
    /// Probe `url` with a GET of its first `probe` bytes: learns the length and the validator,
    /// follows redirects once, and keeps the bytes for the header reader.
    pub fn open(client: Arc<HttpClient>, url: &str, probe: u64) -> Result<RemoteFile> {
        let auth_origin = client.auth_origin(url);
        let probe = probe.max(1);
        let (len, validator, head, target) = client.with_retries(|| {
            let range = format!("bytes=0-{}", probe - 1);
            let (mut resp, at, auth_at) =
                client.send(url, auth_origin.as_deref(), &[("range", range)])?;
            let status = resp.status().as_u16();
            let h = resp.headers().clone();
            if status == 200 {
                let len = header(&h, "content-length").map(str::to_string);
                if looks_html(&h) {
                    return Err(not_a_model(&at, NotModelKind::HtmlPage));
                }
                return Err(FetchError::RangeIgnored {
                    url: at,
                    start: 0,
                    end: probe - 1,
                    len,
                });
            }
            if status != 206 {
                return Err(FetchError::Status {
                    url: at,
                    status,
                    request: Request::Range {
                        start: 0,
                        end: probe - 1,
                    },
                });
            }
            let bad = |fault: ResponseFault| FetchError::BadResponse {
                url: at.clone(),
                start: 0,
                end: probe - 1,
                fault,
            };
            let cr =
                header(&h, "content-range").ok_or_else(|| bad(ResponseFault::NoContentRange))?;
            let (a, b, total) = parse_content_range(cr).ok_or_else(|| {
                bad(ResponseFault::BadContentRange {
                    value: cr.to_string(),
                })
            })?;
            // A file shorter than the probe comes back whole: the one answer that may differ.
            if a != 0 || b != probe.min(total) - 1 {
                return Err(bad(ResponseFault::OtherRange {
                    value: cr.to_string(),
                }));
            }
            check_framing(&h, b + 1, &bad)?;
            let mut body = vec![0u8; (b + 1) as usize];
            read_body(&client, &mut resp, &mut body, &at, 0, b)?;
            let target = Target {
                url: at,
                auth_origin: auth_at,
            };
            Ok((total, Validator::from_headers(&h), body, target))
        })?;
        Ok(RemoteFile {
            client,
            url: url.to_string(),
            auth_origin,
            target: Mutex::new(target),
            len,
            validator,
            head: Mutex::new(head),
            sealed: AtomicBool::new(false),
        })
    }

    /// The URL given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stop growing the header cache: the header is read; data reads go to the network.
    pub fn seal_head(&self) {
        self.sealed.store(true, Ordering::Relaxed);
    }

    /// The validator captured by the probe.
    pub fn validator(&self) -> &Validator {
        &self.validator
    }

    /// Fill `buf` from `offset` with one checked range request (retried when transient).
    pub fn read_range(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64 - 1;
        let mut reresolved = false;
        self.client.with_retries(|| {
            let target = self
                .target
                .lock()
                .map_or_else(|p| p.into_inner().clone(), |t| t.clone());
            match self.try_range(&target, offset, end, buf) {
                // A signed CDN URL expires (about an hour on the hub): resolve the URL given once more.
                Err(FetchError::Status { status, .. })
                    if matches!(status, 401 | 403 | 404 | 410)
                        && target.url != self.url
                        && !reresolved =>
                {
                    reresolved = true;
                    let given = Target {
                        url: self.url.clone(),
                        auth_origin: self.auth_origin.clone(),
                    };
                    if let Ok(mut t) = self.target.lock() {
                        *t = given.clone();
                    }
                    self.try_range(&given, offset, end, buf)
                }
                r => r,
            }
        })
    }

    fn try_range(&self, target: &Target, start: u64, end: u64, buf: &mut [u8]) -> Result<()> {
        let mut headers = vec![("range", format!("bytes={start}-{end}"))];
        if let Some(v) = self.validator.if_range() {
            headers.push(("if-range", v.to_string()));
        }
        let (mut resp, at, auth_at) =
            self.client
                .send(&target.url, target.auth_origin.as_deref(), &headers)?;
        if at != target.url {
            if let Ok(mut t) = self.target.lock() {
                *t = Target {
                    url: at.clone(),
                    auth_origin: auth_at,
                };
            }
        }
        let status = resp.status().as_u16();
        let h = resp.headers().clone();
        if let Some(change) = self.validator.changed_in(&h) {
            return Err(FetchError::RemoteChanged { url: at, change });
        }
        if status == 200 {
            // With If-Range, a 200 is the server's way of saying the validator no longer holds.
            if self.validator != Validator::None && self.validator.if_range().is_some() {
                if let Some(l) = header(&h, "content-length").and_then(|l| l.parse::<u64>().ok()) {
                    if l != self.len {
                        return Err(FetchError::RemoteChanged {
                            url: at,
                            change: RemoteChange::Length {
                                was: self.len,
                                now: l,
                            },
                        });
                    }
                }
            }
            return Err(FetchError::RangeIgnored {
                url: at,
                start,
                end,
                len: header(&h, "content-length").map(str::to_string),
            });
        }
        if status != 206 {
            return Err(FetchError::Status {
                url: at,
                status,
                request: Request::Range { start, end },
            });
        }
        let bad = |fault: ResponseFault| FetchError::BadResponse {
            url: at.clone(),
            start,
            end,
            fault,
        };
        let cr = header(&h, "content-range").ok_or_else(|| bad(ResponseFault::NoContentRange))?;
        let (a, b, total) = parse_content_range(cr).ok_or_else(|| {
            bad(ResponseFault::BadContentRange {
                value: cr.to_string(),
            })
        })?;
        if total != self.len {
            return Err(FetchError::RemoteChanged {
                url: at,
                change: RemoteChange::RangeTotal {
                    was: self.len,
                    now: total,
                },
            });
        }
        if (a, b) != (start, end) {
            return Err(bad(ResponseFault::OtherRange {
                value: cr.to_string(),
            }));
        }
        check_framing(&h, end - start + 1, &bad)?;
        read_body(&self.client, &mut resp, buf, &at, start, end)
    }
}

/// `Content-Length` (when present) must equal the range's length; no content coding; not HTML.
fn check_framing(
    h: &HeaderMap,
    want: u64,
    bad: &dyn Fn(ResponseFault) -> FetchError,
) -> Result<()> {
    if let Some(l) = header(h, "content-length") {
        if l.trim().parse::<u64>().ok() != Some(want) {
            return Err(bad(ResponseFault::ContentLength {
                value: l.to_string(),
                want,
            }));
        }
    }
    if let Some(enc) = header(h, "content-encoding").filter(|e| !e.eq_ignore_ascii_case("identity"))
    {
        return Err(bad(ResponseFault::ContentEncoding {
            value: enc.to_string(),
        }));
    }
    if looks_html(h) {
        return Err(bad(ResponseFault::Html));
    }
    Ok(())
}

/// Read exactly `buf.len()` body bytes, then make sure the body ends there.
fn read_body(
    client: &HttpClient,
    resp: &mut Response<Body>,
    buf: &mut [u8],
    url: &str,
    start: u64,
    end: u64,
) -> Result<()> {
    let mut r = resp.body_mut().as_reader();
    let mut got = 0usize;
    let mut watch = SpeedWatch::new(client.cfg.low_speed);
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                client
                    .traffic
                    .body_bytes
                    .fetch_add(n as u64, Ordering::Relaxed);
                watch
                    .arrived(n as u64)
                    .map_err(|rate| watch.too_slow(url, start, end, rate))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(if got > 0 {
                    FetchError::ShortBody {
                        url: url.to_string(),
                        start,
                        end,
                        got: got as u64,
                        want: buf.len() as u64,
                    }
                } else {
                    transport(url, e)
                })
            }
        }
    }
    if got < buf.len() {
        return Err(FetchError::ShortBody {
            url: url.to_string(),
            start,
            end,
            got: got as u64,
            want: buf.len() as u64,
        });
    }
    let mut extra = [0u8; 1];
    match r.read(&mut extra) {
        Ok(0) => Ok(()),
        Ok(_) => Err(FetchError::BadResponse {
            url: url.to_string(),
            start,
            end,
            fault: ResponseFault::BodyTooLong,
        }),
        Err(e) => Err(transport(url, e)),
    }
}

impl tarfa_gguf::ByteSource for RemoteFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "read past the end of the remote file",
                )
            })?;
        let mut head = self
            .head
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?;
        let cached = head.len() as u64;
        if end <= cached {
            buf.copy_from_slice(&head[offset as usize..end as usize]);
            return Ok(());
        }
        // While the header is read, a window grows from 0: serve what is cached and extend the
        // cache with the rest, so no byte of the header is fetched twice.
        if !self.sealed.load(Ordering::Relaxed) && offset <= cached && end <= HEAD_CACHE_LIMIT {
            let from_cache = (cached - offset) as usize;
            buf[..from_cache].copy_from_slice(&head[offset as usize..]);
            let rest = &mut buf[from_cache..];
            self.read_range(cached, rest).map_err(FetchError::into_io)?;
            head.extend_from_slice(rest);
            return Ok(());
        }
        drop(head);
        self.read_range(offset, buf).map_err(FetchError::into_io)
    }

    fn name(&self) -> String {
        self.url.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_origin_is_the_hubs_and_plain_http_needs_the_opt_in() {
        let hub = Some("https://huggingface.co:443".to_string());
        assert_eq!(token_origin("https://huggingface.co", false), hub);
        assert_eq!(token_origin("https://HuggingFace.co:443/", false), hub);
        assert_eq!(token_origin("http://mirror.local:8080", false), None);
        assert_eq!(
            token_origin("http://mirror.local:8080", true).as_deref(),
            Some("http://mirror.local:8080")
        );
        assert_eq!(token_origin("ftp://x", true), None);
    }
}
