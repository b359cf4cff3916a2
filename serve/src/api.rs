//! The HTTP routes, their requests' validation and OpenAI's response and error shapes.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::engine::{hold_back, Event, Finish, Job, TokenLogprob};
use crate::{ModelInfo, Shared, READY};
use tarfa_chat::{ChatJson, RenderOptions};

/// An error in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
    param: Option<String>,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            kind,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    /// 400 naming the field.
    fn bad(param: &str, message: impl Into<String>) -> ApiError {
        let mut e = ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        e.param = Some(param.to_string());
        e
    }

    fn unavailable(message: impl Into<String>, retry_after: u64) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        );
        e.retry_after = Some(retry_after);
        e
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert("retry-after", HeaderValue::from(s));
        }
        // A retry of a refused request is useless, except when the server is busy or loading.
        if self.status.is_client_error() {
            r.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        r
    }
}

/// The routes.
pub fn router(shared: Arc<Shared>) -> Router {
    let limit = shared.opts.max_body;
    let mut routes = Router::new();
    if shared.opts.webui {
        routes = routes.route("/", get(crate::page::index));
    }
    routes
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/apply-template", post(apply_template))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            read_body,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            auth,
        ))
        .layer(DefaultBodyLimit::max(limit))
        .with_state(shared)
}

async fn not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not a method of {}", req.method(), req.uri().path()),
    )
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found_error",
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

/// With `--api-key`, every route but `/health` and the chat page (`GET /`, unless `--no-webui`)
/// needs `Authorization: Bearer KEY`. The page is open as llama-server's web UI is: it holds no
/// data, and each route it calls asks for the key.
async fn auth(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.opts.api_key {
        let path = req.uri().path();
        let page = s.opts.webui
            && path == "/"
            && (req.method() == Method::GET || req.method() == Method::HEAD);
        if path != "/health" && path != "/v1/health" && !page {
            let given = req
                .headers()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            if !given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    "invalid or missing API key (Authorization: Bearer KEY)",
                )
                .into_response();
            }
        }
    }
    next.run(req).await
}

/// The request's body, read whole within `--read-timeout` (and at most `--max-body` bytes) before
/// a handler sees it: a client that sends its body slowly, or never, is answered 408 and its
/// connection closed, not kept for as long as it likes (the headers' own timeout is hyper's).
async fn read_body(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let within = s.opts.read_timeout;
    match tokio::time::timeout(within, axum::body::to_bytes(body, s.opts.max_body)).await {
        Ok(Ok(bytes)) => {
            next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await
        }
        Ok(Err(e)) => {
            let over = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<http_body_util::LengthLimitError>())
                .is_some()
                || e.to_string().contains("length limit");
            if over {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "the request body is larger than this server takes (--max-body)",
                )
                .into_response()
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("reading the request body: {e}"),
                )
                .into_response()
            }
        }
        Err(_) => {
            let mut r = ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s (--read-timeout)",
                    within.as_secs()
                ),
            )
            .into_response();
            r.headers_mut()
                .insert("connection", HeaderValue::from_static("close"));
            r
        }
    }
}

/// Whether `a` is `b`, in a time that depends on their lengths only (not on where they differ).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The loaded model, or 503 while it loads (or after the engine stopped).
fn ready(s: &Shared) -> Result<&ModelInfo, ApiError> {
    match (s.state.load(Ordering::SeqCst), s.model.get()) {
        (READY, Some(m)) => Ok(m),
        (crate::STOPPED, _) => {
            let mut e = ApiError::unavailable("the engine has stopped; restart the server", 0);
            e.retry_after = None;
            Err(e)
        }
        _ => Err(ApiError::unavailable("Loading model", 5)),
    }
}

async fn health(State(s): State<Arc<Shared>>) -> Response {
    match ready(&s) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn models(State(s): State<Arc<Shared>>) -> Result<Json<Value>, ApiError> {
    let m = ready(&s)?;
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": s.opts.model_id,
            "object": "model",
            "created": s.created,
            "owned_by": "tarfa",
            "manifest_digest": m.digest,
            "system_fingerprint": m.fingerprint,
            "max_model_len": m.context,
        }],
    })))
}

async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let m = &s.metrics;
    let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::SeqCst);
    let ttft_n = g(&m.ttft_count);
    let busy = g(&m.busy_us) as f64 / 1e6;
    let generated = g(&m.generated_tokens);
    let text = format!(
        "# HELP tarfa_requests_total Requests admitted to the queue.\n# TYPE tarfa_requests_total counter\ntarfa_requests_total {}\n\
# HELP tarfa_requests_rejected_total Requests refused with 503: the queue was full.\n# TYPE tarfa_requests_rejected_total counter\ntarfa_requests_rejected_total {}\n\
# HELP tarfa_requests_disconnected_total Requests whose client went away before the end.\n# TYPE tarfa_requests_disconnected_total counter\ntarfa_requests_disconnected_total {}\n\
# HELP tarfa_requests_finished_total Requests generated to their end.\n# TYPE tarfa_requests_finished_total counter\ntarfa_requests_finished_total {}\n\
# HELP tarfa_queue_depth Requests waiting for a slot.\n# TYPE tarfa_queue_depth gauge\ntarfa_queue_depth {}\n\
# HELP tarfa_slots_active Sequences generating.\n# TYPE tarfa_slots_active gauge\ntarfa_slots_active {}\n\
# HELP tarfa_prompt_tokens_total Prompt tokens computed.\n# TYPE tarfa_prompt_tokens_total counter\ntarfa_prompt_tokens_total {}\n\
# HELP tarfa_generated_tokens_total Tokens generated.\n# TYPE tarfa_generated_tokens_total counter\ntarfa_generated_tokens_total {}\n\
# HELP tarfa_time_to_first_token_seconds Time from a request's arrival to its first token.\n# TYPE tarfa_time_to_first_token_seconds summary\ntarfa_time_to_first_token_seconds_sum {}\ntarfa_time_to_first_token_seconds_count {}\n\
# HELP tarfa_busy_seconds_total Time the engine spent computing.\n# TYPE tarfa_busy_seconds_total counter\ntarfa_busy_seconds_total {}\n\
# HELP tarfa_tokens_per_second Generated tokens per second of engine time.\n# TYPE tarfa_tokens_per_second gauge\ntarfa_tokens_per_second {}\n\
# HELP tarfa_expert_bytes_read_total Expert bytes read from disk.\n# TYPE tarfa_expert_bytes_read_total counter\ntarfa_expert_bytes_read_total {}\n\
# HELP tarfa_expert_bytes_per_token Expert bytes read per generated token.\n# TYPE tarfa_expert_bytes_per_token gauge\ntarfa_expert_bytes_per_token {}\n\
# HELP tarfa_expert_reads_total Expert reads.\n# TYPE tarfa_expert_reads_total counter\ntarfa_expert_reads_total {}\n\
# HELP tarfa_expert_cache_hits_total Experts found in the RAM cache.\n# TYPE tarfa_expert_cache_hits_total counter\ntarfa_expert_cache_hits_total {}\n\
# HELP tarfa_prompt_cache_hits_total Requests that reused a cached prompt prefix.\n# TYPE tarfa_prompt_cache_hits_total counter\ntarfa_prompt_cache_hits_total {}\n\
# HELP tarfa_prompt_cache_tokens_total Prompt tokens taken from the prompt cache.\n# TYPE tarfa_prompt_cache_tokens_total counter\ntarfa_prompt_cache_tokens_total {}\n\
# HELP tarfa_connections Connections open.\n# TYPE tarfa_connections gauge\ntarfa_connections {}\n\
# HELP tarfa_connections_refused_total Connections refused with 503: --max-connections were open.\n# TYPE tarfa_connections_refused_total counter\ntarfa_connections_refused_total {}\n",
        g(&m.requests),
        g(&m.rejected),
        g(&m.disconnected),
        g(&m.finished),
        m.queued.load(Ordering::SeqCst),
        m.active.load(Ordering::SeqCst),
        g(&m.prompt_tokens),
        generated,
        g(&m.ttft_us) as f64 / 1e6,
        ttft_n,
        busy,
        if busy > 0.0 { generated as f64 / busy } else { 0.0 },
        g(&m.expert_bytes),
        g(&m.expert_bytes).checked_div(generated).unwrap_or(0),
        g(&m.expert_reads),
        g(&m.cache_hits),
        g(&m.prompt_cache_hits),
        g(&m.prompt_cache_tokens),
        m.connections.load(Ordering::SeqCst),
        g(&m.connections_refused),
    );
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// The request's JSON object, or OpenAI-shaped 400 / 413.
fn object(body: Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    object_of(&bytes_of(body)?)
}

/// The request's bytes, or 413 / 400.
fn bytes_of(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "the request body is larger than this server takes (--max-body)",
            )
        } else {
            ApiError::new(e.status(), "invalid_request_error", e.body_text())
        }
    })
}

/// The JSON object of `bytes`, or 400.
fn object_of(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the request body is not JSON: {e}"),
        )),
    }
}

/// A request's fields, read once each: whatever is left is a field this server does not take.
struct Fields(Map<String, Value>);

impl Fields {
    fn take(&mut self, k: &str) -> Option<Value> {
        self.0.remove(k).filter(|v| !v.is_null())
    }

    fn bool(&mut self, k: &str) -> Result<Option<bool>, ApiError> {
        match self.take(k) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(v) => Err(ApiError::bad(k, format!("{k} must be a boolean, not {v}"))),
        }
    }

    fn uint(&mut self, k: &str, max: usize) -> Result<Option<usize>, ApiError> {
        match self.take(k) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n as usize <= max && n <= max as u64 => Ok(Some(n as usize)),
                Some(n) => Err(ApiError::bad(k, format!("{k} is {n}; at most {max}"))),
                None => Err(ApiError::bad(
                    k,
                    format!("{k} must be a non-negative integer, not {v}"),
                )),
            },
        }
    }

    fn number(&mut self, k: &str) -> Result<Option<f64>, ApiError> {
        match self.take(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| ApiError::bad(k, format!("{k} must be a number, not {v}"))),
        }
    }

    /// A field that is taken only at the value that means "off" (greedy decoding's).
    fn only(&mut self, k: &str, off: f64, why: &str) -> Result<(), ApiError> {
        if let Some(x) = self.number(k)? {
            if x != off {
                return Err(ApiError::bad(k, format!("{k} {x}: {why}")));
            }
        }
        Ok(())
    }

    /// Every field left: each is one this server does not take.
    fn done(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(k) => Err(ApiError::bad(
                k,
                format!("{k}: a field this server does not take (it is never silently ignored)"),
            )),
        }
    }
}

/// What completions and chat requests share: limits, stops, streaming.
struct Common {
    max_tokens: Option<usize>,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    ignore_eos: bool,
    sampling: Option<crate::sample::Sampling>,
    n: usize,
}

/// The most choices (`n`) a request may ask for.
const MAX_CHOICES: usize = 16;

/// A number in `lo..=hi` (`lo` excluded when `open`), or 400 naming the field.
fn in_range(
    f: &mut Fields,
    k: &str,
    lo: f64,
    hi: f64,
    open: bool,
) -> Result<Option<f64>, ApiError> {
    match f.number(k)? {
        Some(x) if (if open { x > lo } else { x >= lo }) && x <= hi => Ok(Some(x)),
        Some(x) => Err(ApiError::bad(
            k,
            format!(
                "{k} {x} is not in {}{lo}, {hi}]",
                if open { "(" } else { "[" }
            ),
        )),
        None => Ok(None),
    }
}

/// The sampling fields: `None` (greedy) at temperature 0 or without one; else the settings,
/// the seed drawn from the clock when none is given (and said in the response).
fn sampling(f: &mut Fields, vocab: usize) -> Result<Option<crate::sample::Sampling>, ApiError> {
    let temperature = in_range(f, "temperature", 0.0, 100.0, false)?.unwrap_or(0.0);
    let top_p = in_range(f, "top_p", 0.0, 1.0, true)?.unwrap_or(1.0);
    let min_p = in_range(f, "min_p", 0.0, 1.0, false)?.unwrap_or(0.0);
    let top_k = match f.take("top_k") {
        None => 0,
        Some(v) => match v.as_i64() {
            // -1 (vLLM's and SGLang's "off") and 0 both mean all.
            Some(-1 | 0) => 0,
            Some(k) if k > 0 && (k as u64) <= vocab as u64 => k as usize,
            _ => {
                return Err(ApiError::bad(
                    "top_k",
                    format!(
                        "top_k {v}: an integer from 1 to the vocabulary's {vocab} (0 or -1: all)"
                    ),
                ))
            }
        },
    };
    let seed = match f.take("seed") {
        None => None,
        Some(v) => Some(
            v.as_i64()
                .map(|x| x as u64)
                .or_else(|| v.as_u64())
                .ok_or_else(|| {
                    ApiError::bad("seed", format!("seed must be an integer, not {v}"))
                })?,
        ),
    };
    if temperature == 0.0 {
        // Greedy: the highest logit whatever the filters and the seed.
        return Ok(None);
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    Ok(Some(crate::sample::Sampling {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
    }))
}

/// The settings a sampled response carries (`None` when greedy).
fn sampling_json(s: &Option<crate::sample::Sampling>) -> Value {
    match s {
        None => Value::Null,
        Some(s) => json!({
            "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
            "min_p": s.min_p, "seed": s.seed,
        }),
    }
}

fn common(f: &mut Fields, s: &Shared, m: &ModelInfo) -> Result<Common, ApiError> {
    if let Some(model) = f.take("model") {
        match model.as_str() {
            Some(id) if id == s.opts.model_id => {}
            Some(id) => {
                return Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found_error",
                    format!(
                        "the model `{id}` does not exist; this server serves `{}`",
                        s.opts.model_id
                    ),
                ))
            }
            None => return Err(ApiError::bad("model", "model must be a string")),
        }
    }
    let max_tokens = match (
        f.uint("max_completion_tokens", s.opts.max_tokens_limit)?,
        f.uint("max_tokens", s.opts.max_tokens_limit)?,
    ) {
        (Some(0), _) => return Err(ApiError::bad("max_completion_tokens", "must be at least 1")),
        (None, Some(0)) => return Err(ApiError::bad("max_tokens", "must be at least 1")),
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let one_stop = |x: Value| match x {
        Value::String(x) if !x.is_empty() && x.len() <= 256 => Ok(x),
        x => Err(ApiError::bad(
            "stop",
            format!("each stop must be a string of 1 to 256 bytes, not {x}"),
        )),
    };
    let stop = match f.take("stop") {
        None => Vec::new(),
        Some(x @ Value::String(_)) => vec![one_stop(x)?],
        Some(Value::Array(a)) => {
            if a.len() > 16 {
                return Err(ApiError::bad("stop", "stop takes at most 16 strings"));
            }
            a.into_iter().map(one_stop).collect::<Result<_, _>>()?
        }
        Some(v) => {
            return Err(ApiError::bad(
                "stop",
                format!("stop must be a string or a list of strings, not {v}"),
            ))
        }
    };
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(Value::Object(mut o)) => {
            let u = match o.remove("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(v) => {
                    return Err(ApiError::bad(
                        "stream_options.include_usage",
                        format!("include_usage must be a boolean, not {v}"),
                    ))
                }
            };
            if let Some(k) = o.keys().next() {
                return Err(ApiError::bad(
                    &format!("stream_options.{k}"),
                    format!("stream_options.{k}: a field this server does not take"),
                ));
            }
            if !stream {
                return Err(ApiError::bad(
                    "stream_options",
                    "stream_options is taken only with stream: true",
                ));
            }
            u
        }
        Some(v) => {
            return Err(ApiError::bad(
                "stream_options",
                format!("stream_options must be an object, not {v}"),
            ))
        }
    };
    let sampling = sampling(f, m.vocab)?;
    f.only("presence_penalty", 0.0, "penalties are not taken")?;
    f.only("frequency_penalty", 0.0, "penalties are not taken")?;
    // Choices: each its own sequence, its draws keyed by its index.
    let n = match f.uint("n", MAX_CHOICES)? {
        Some(0) => return Err(ApiError::bad("n", "n must be at least 1")),
        Some(n) if n > s.opts.parallel.max(1) + s.opts.queue => {
            return Err(ApiError::bad(
                "n",
                format!(
                    "n {n}: more choices than this server's slots and queue ({}) can ever hold",
                    s.opts.parallel.max(1) + s.opts.queue
                ),
            ))
        }
        Some(n) => n,
        None => 1,
    };
    // OpenAI's end-user id: for the operator's logs; nothing here reads it.
    if let Some(u) = f.take("user") {
        if !u.is_string() {
            return Err(ApiError::bad("user", "user must be a string"));
        }
    }
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    Ok(Common {
        max_tokens,
        stop,
        stream,
        include_usage,
        ignore_eos,
        sampling,
        n,
    })
}

/// A prompt as ids: a string (tokenized as transformers' `tokenizer(text)`), or ids.
fn prompt_ids(v: Value, m: &ModelInfo) -> Result<Vec<u32>, ApiError> {
    let ids = match v {
        Value::String(t) => m
            .text
            .encode(&t, true)
            .map_err(|e| ApiError::bad("prompt", format!("tokenizing the prompt: {e}")))?,
        Value::Array(a) if a.iter().all(|x| x.is_u64()) && !a.is_empty() => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&t| (t as usize) < m.vocab)
                    .map(|t| t as u32)
                    .ok_or_else(|| {
                        ApiError::bad(
                            "prompt",
                            format!("token {x} is outside the vocabulary of {}", m.vocab),
                        )
                    })
            })
            .collect::<Result<_, _>>()?,
        Value::Array(_) => {
            return Err(ApiError::bad(
                "prompt",
                "one prompt per request: a string or a non-empty list of token ids",
            ))
        }
        v => {
            return Err(ApiError::bad(
                "prompt",
                format!("prompt must be a string or a list of token ids, not {v}"),
            ))
        }
    };
    if ids.is_empty() {
        return Err(ApiError::bad("prompt", "the prompt has no tokens"));
    }
    if ids.len() >= m.context {
        return Err(ApiError::bad(
            "prompt",
            format!(
                "the prompt's {} tokens leave no room in the context of {} positions",
                ids.len(),
                m.context
            ),
        ));
    }
    Ok(ids)
}

fn id(prefix: &str) -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{prefix}-{t:x}{:04x}",
        N.fetch_add(1, Ordering::SeqCst) & 0xffff
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Queue `job`; 503 with Retry-After when the queue is full.
fn enqueue(s: &Shared, job: Job) -> Result<(), ApiError> {
    // Admitted while the jobs in the server (in slots or queued) are fewer than the slots and
    // the queue together: a free slot is never refused.
    let limit = s.opts.parallel.max(1) + s.opts.queue;
    let admitted = s
        .metrics
        .admitted
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < limit).then_some(n + 1)
        });
    if admitted.is_err() {
        s.metrics.rejected.fetch_add(1, Ordering::SeqCst);
        return Err(ApiError::unavailable(
            "the server is busy: every slot is generating and the queue is full; retry later",
            1,
        ));
    }
    s.metrics.queued.fetch_add(1, Ordering::SeqCst);
    match s.jobs.try_send(job) {
        Ok(()) => {
            s.metrics.requests.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        Err(e) => {
            s.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            s.metrics.admitted.fetch_sub(1, Ordering::SeqCst);
            match e {
                std::sync::mpsc::TrySendError::Disconnected(_) => Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "the engine has stopped (see the server's log); restart the server",
                )),
                std::sync::mpsc::TrySendError::Full(_) => {
                    s.metrics.rejected.fetch_add(1, Ordering::SeqCst);
                    Err(ApiError::unavailable(
                        "the server is busy: every slot is generating and the queue is full; retry later",
                        1,
                    ))
                }
            }
        }
    }
}

async fn completions(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let m = ready(&s)?;
    let mut f = Fields(object(body)?);
    let prompt = f
        .take("prompt")
        .ok_or_else(|| ApiError::bad("prompt", "prompt is required"))?;
    let c = common(&mut f, &s, m)?;
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::bad("echo", "echo is not taken"));
    }
    // OpenAI's completions: the number of alternatives, 0 to 20 (0: the token's own alone).
    let logprobs = f.uint("logprobs", 20)?;
    if f.take("suffix").is_some() {
        return Err(ApiError::bad("suffix", "suffix is not taken"));
    }
    f.done()?;
    let ids = prompt_ids(prompt, m)?;
    // OpenAI's legacy default: 16 tokens.
    let max_tokens = c.max_tokens.unwrap_or(16);
    let (meta, rxs) = submit(&s, m, "cmpl", ids, max_tokens, &c, logprobs)?;
    if c.stream {
        Ok(stream_completion(meta, rxs, c.include_usage).into_response())
    } else {
        whole_completion(meta, rxs, logprobs.is_some()).await
    }
}

/// Queue a request's jobs, one per choice (503 when the queue cannot take them all; the ones
/// queued are then dropped with their channels): what its response is headed with, and the
/// channels its choices' events come on.
fn submit(
    s: &Shared,
    m: &ModelInfo,
    prefix: &str,
    prompt: Vec<u32>,
    max_tokens: usize,
    c: &Common,
    logprobs: Option<usize>,
) -> Result<(Meta, Vec<crate::engine::UnboundedReceiver<Event>>), ApiError> {
    let mut rxs = Vec::with_capacity(c.n);
    for choice in 0..c.n {
        let (tx, rx) = crate::engine::channel();
        enqueue(
            s,
            Job {
                prompt: prompt.clone(),
                max_tokens,
                stop: c.stop.clone(),
                ignore_eos: c.ignore_eos,
                sampling: c.sampling.clone(),
                logprobs,
                choice: choice as u64,
                tx,
                arrived: Instant::now(),
            },
        )?;
        rxs.push(rx);
    }
    let meta = Meta {
        id: id(prefix),
        created: now(),
        model: s.opts.model_id.clone(),
        fingerprint: m.fingerprint.clone(),
        sampling: sampling_json(&c.sampling),
        text: Arc::clone(&m.text),
    };
    Ok((meta, rxs))
}

#[derive(Clone)]
struct Meta {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
    /// The sampling settings (null when greedy), on every response that is sampled.
    sampling: Value,
    text: Arc<tarfa_decode::text::Text>,
}

impl Meta {
    /// A response object's head: id, object, time, model, fingerprint (and sampling).
    fn head(&self, object: &str) -> Map<String, Value> {
        let mut o = Map::new();
        o.insert("id".into(), json!(self.id));
        o.insert("object".into(), json!(object));
        o.insert("created".into(), json!(self.created));
        o.insert("model".into(), json!(self.model));
        o.insert("system_fingerprint".into(), json!(self.fingerprint));
        if !self.sampling.is_null() {
            o.insert("sampling".into(), self.sampling.clone());
        }
        o
    }

    /// A token's text as the logprobs show it.
    fn piece(&self, t: u32) -> String {
        self.text.piece(t).unwrap_or_default()
    }

    /// OpenAI's completions `logprobs` object of `entries` (tokens in order).
    fn completion_logprobs(&self, entries: &[TokenLogprob]) -> Value {
        let mut offset = 0usize;
        let mut tokens = Vec::new();
        let mut lps = Vec::new();
        let mut tops = Vec::new();
        let mut offsets = Vec::new();
        for lp in entries {
            let piece = self.piece(lp.token);
            offsets.push(offset);
            offset += piece.len();
            tokens.push(json!(piece));
            lps.push(json!(lp.logprob));
            let mut top = Map::new();
            for (id, l) in &lp.top {
                top.insert(self.piece(*id), json!(l));
            }
            tops.push(Value::Object(top));
        }
        json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
    }

    /// OpenAI's chat `logprobs` object of `entries`.
    fn chat_logprobs(&self, entries: &[TokenLogprob]) -> Value {
        let one = |t: u32, l: f32| {
            let bytes = self.text.token_bytes(t).unwrap_or_default();
            json!({"token": String::from_utf8_lossy(&bytes), "logprob": l, "bytes": bytes})
        };
        let content: Vec<Value> = entries
            .iter()
            .map(|lp| {
                let mut e = one(lp.token, lp.logprob);
                e["top_logprobs"] = Value::Array(lp.top.iter().map(|(i, l)| one(*i, *l)).collect());
                e
            })
            .collect();
        json!({"content": content})
    }
}

fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// One choice's whole answer: its text, its tokens' logprobs, why it ended and its counts.
struct Answer {
    text: String,
    logprobs: Vec<TokenLogprob>,
    finish: Finish,
    prompt: usize,
    completion: usize,
    cached: usize,
}

/// The answer on `rx`, to its end; 500 when the engine failed it.
async fn answer(mut rx: crate::engine::UnboundedReceiver<Event>) -> Result<Answer, ApiError> {
    let mut text = String::new();
    let mut logprobs = Vec::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Delta { text: t, logprob } => {
                text.push_str(&t);
                logprobs.extend(logprob);
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                return Ok(Answer {
                    text,
                    logprobs,
                    finish,
                    prompt: prompt_tokens,
                    completion: completion_tokens,
                    cached: cached_tokens,
                })
            }
            Event::Error(e) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    e,
                ))
            }
        }
    }
    Err(ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        "the engine stopped",
    ))
}

/// Every choice's answer, in choice order, and their usage (the prompt counted once).
async fn answers(
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
) -> Result<(Vec<Answer>, Value), ApiError> {
    let mut all = Vec::with_capacity(rxs.len());
    for rx in rxs {
        all.push(answer(rx).await?);
    }
    let prompt = all.first().map_or(0, |a| a.prompt);
    let cached = all.first().map_or(0, |a| a.cached);
    let completion = all.iter().map(|a| a.completion).sum();
    Ok((all, usage(prompt, completion, cached)))
}

async fn whole_completion(
    meta: Meta,
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let (all, usage) = answers(rxs).await?;
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, a)| {
            json!({
                "index": i,
                "text": a.text,
                "logprobs": if logprobs { meta.completion_logprobs(&a.logprobs) } else { Value::Null },
                "finish_reason": a.finish.reason(),
            })
        })
        .collect();
    let mut o = meta.head("text_completion");
    o.insert("choices".into(), Value::Array(choices));
    o.insert("usage".into(), usage);
    Ok(Json(Value::Object(o)).into_response())
}

/// The events of every choice, each with its index, as they come.
fn merged(
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
) -> impl tokio_stream::Stream<Item = (usize, Event)> {
    futures_util::stream::select_all(
        rxs.into_iter()
            .enumerate()
            .map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |e| (i, e))),
    )
}

/// What a stream has counted of its choices' ends: how many ended, and their usage.
#[derive(Default)]
struct Ends {
    done: usize,
    prompt: usize,
    completion: usize,
    cached: usize,
}

impl Ends {
    /// Count a choice's end; after the last of `n`, the usage chunk (when asked for) and
    /// `[DONE]`.
    fn end(
        &mut self,
        n: usize,
        (prompt, completion, cached): (usize, usize, usize),
        meta: &Meta,
        object: &str,
        include_usage: bool,
    ) -> Vec<Value> {
        self.done += 1;
        self.prompt = prompt;
        self.cached = cached;
        self.completion += completion;
        if self.done < n {
            return Vec::new();
        }
        let mut v = Vec::new();
        if include_usage {
            let mut o = meta.head(object);
            o.insert("choices".into(), json!([]));
            o.insert(
                "usage".into(),
                usage(self.prompt, self.completion, self.cached),
            );
            v.push(Value::Object(o));
        }
        v.push(Value::String("[DONE]".into()));
        v
    }
}

/// A stream's values as server-sent events (`[DONE]` as itself), kept alive by comments.
fn sse(
    values: impl tokio_stream::Stream<Item = Value> + Send + 'static,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let events = values.map(|v| {
        Ok(match v {
            Value::String(done) => SseEvent::default().data(done),
            v => SseEvent::default().data(v.to_string()),
        })
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

fn stream_completion(
    meta: Meta,
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
    include_usage: bool,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let n = rxs.len();
    let chunk = move |meta: &Meta, i: usize, text: &str, lp: Value, finish: Option<Finish>| {
        let mut o = meta.head("text_completion");
        o.insert(
            "choices".into(),
            json!([{
                "index": i,
                "text": text,
                "logprobs": lp,
                "finish_reason": finish.map(Finish::reason),
            }]),
        );
        Value::Object(o)
    };
    let mut ends = Ends::default();
    let values = merged(rxs).flat_map(move |(i, ev)| {
        let out: Vec<Value> = match ev {
            Event::Delta {
                text,
                logprob: None,
            } if text.is_empty() => Vec::new(),
            Event::Delta { text, logprob } => {
                let lp = logprob.map_or(Value::Null, |l| meta.completion_logprobs(&[l]));
                vec![chunk(&meta, i, &text, lp, None)]
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                let mut v = vec![chunk(&meta, i, "", Value::Null, Some(finish))];
                v.extend(ends.end(
                    n,
                    (prompt_tokens, completion_tokens, cached_tokens),
                    &meta,
                    "text_completion",
                    include_usage,
                ));
                v
            }
            Event::Error(e) => {
                vec![ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e).body()]
            }
        };
        tokio_stream::iter(out)
    });
    sse(values)
}

async fn tokenize(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let m = ready(&s)?;
    let mut f = Fields(object(body)?);
    let content = match f.take("content") {
        Some(Value::String(c)) => c,
        Some(v) => {
            return Err(ApiError::bad(
                "content",
                format!("content must be a string, not {v}"),
            ))
        }
        None => return Err(ApiError::bad("content", "content is required")),
    };
    let special = f.bool("add_special")?.unwrap_or(false);
    let pieces = f.bool("with_pieces")?.unwrap_or(false);
    f.done()?;
    let ids = m
        .text
        .encode(&content, special)
        .map_err(|e| ApiError::bad("content", format!("tokenizing: {e}")))?;
    let tokens: Vec<Value> = if pieces {
        ids.iter()
            .map(|&t| {
                // As llama-server gives it: the text, or the bytes where they are not UTF-8
                // (a part of a character).
                let bytes = m.text.token_bytes(t).unwrap_or_default();
                let piece = match String::from_utf8(bytes) {
                    Ok(p) => json!(p),
                    Err(e) => json!(e.into_bytes()),
                };
                json!({"id": t, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&t| json!(t)).collect()
    };
    Ok(Json(json!({"tokens": tokens})))
}

async fn detokenize(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let m = ready(&s)?;
    let mut f = Fields(object(body)?);
    let tokens = f
        .take("tokens")
        .ok_or_else(|| ApiError::bad("tokens", "tokens is required"))?;
    f.done()?;
    let ids: Vec<u32> = tokens
        .as_array()
        .ok_or_else(|| ApiError::bad("tokens", "tokens must be a list of token ids"))?
        .iter()
        .map(|x| {
            x.as_u64()
                .filter(|&t| (t as usize) < m.vocab)
                .map(|t| t as u32)
                .ok_or_else(|| {
                    ApiError::bad(
                        "tokens",
                        format!("{x} is not a token id of the vocabulary of {}", m.vocab),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    let content = m
        .text
        .decode(&ids)
        .ok_or_else(|| ApiError::bad("tokens", "these ids do not decode to text"))?;
    Ok(Json(json!({"content": content})))
}

/// A chat request rendered: the prompt text, and whether it leaves the reply inside an open
/// `<think>` block (the generation prompt opened it).
struct Rendered {
    text: String,
    opened: bool,
    /// Where the reply's tool calls are parsed: the template's format and the request's tools.
    tools: Option<Tools>,
    /// A hash of the prompt's ids, which the tool calls' ids include.
    context: u64,
}

/// A chat request's tools, and the format its template's calls come in.
type Tools = (tarfa_chat::tools::ToolFormat, Vec<Value>);

/// The chat fields of a request (`messages`, `tools`, `documents`, `chat_template_kwargs`,
/// `add_generation_prompt`) taken from `f` and rendered with the model's template, the values in
/// the order the client wrote them (`ordered`: the body as the template's JSON reads it).
fn render(f: &mut Fields, ordered: &ChatJson, m: &ModelInfo) -> Result<Rendered, ApiError> {
    let field = |k: &str| -> Option<ChatJson> {
        ordered
            .object_entries()?
            .into_iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v)
    };
    match f.take("messages") {
        Some(Value::Array(a)) if !a.is_empty() => {}
        Some(Value::Array(_)) => return Err(ApiError::bad("messages", "messages is empty")),
        Some(v) => {
            return Err(ApiError::bad(
                "messages",
                format!("messages must be a list of message objects, not {v}"),
            ))
        }
        None => return Err(ApiError::bad("messages", "messages is required")),
    }
    // An assistant turn the client sends back with its tool calls has `content: null`.
    let messages = field("messages")
        .unwrap_or_else(|| ChatJson::from(&Value::Null))
        .with_assistant_content();
    let list = |f: &mut Fields, k: &str| -> Result<Option<ChatJson>, ApiError> {
        match f.take(k) {
            None => Ok(None),
            Some(Value::Array(_)) => Ok(field(k)),
            Some(v) => Err(ApiError::bad(k, format!("{k} must be a list, not {v}"))),
        }
    };
    let tool_values = f.0.get("tools").and_then(Value::as_array).cloned();
    let tools = list(f, "tools")?;
    let documents = list(f, "documents")?;
    let mut choice_none = false;
    if let Some(c) = f.take("tool_choice") {
        match c.as_str() {
            Some("auto") => {}
            Some("none") => choice_none = true,
            _ => {
                return Err(ApiError::bad(
                    "tool_choice",
                    format!("tool_choice {c}: only \"none\" and \"auto\" are taken (the model is not forced to call a tool: its reply is what it chose)"),
                ))
            }
        }
    }
    // Calls are parsed out of the reply where the request gave tools, did not say "none", and
    // the template's format is one tarfa reads.
    let parsed_tools = match (m.tool_format, tool_values) {
        (Some(format), Some(list)) if !list.is_empty() && !choice_none => Some((format, list)),
        _ => None,
    };
    let _ = f.bool("parallel_tool_calls")?;
    let kwargs = match f.take("chat_template_kwargs") {
        None => Vec::new(),
        Some(Value::Object(_)) => field("chat_template_kwargs")
            .and_then(|k| k.object_entries())
            .unwrap_or_default(),
        Some(v) => {
            return Err(ApiError::bad(
                "chat_template_kwargs",
                format!("chat_template_kwargs must be an object, not {v}"),
            ))
        }
    };
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let template = match &m.template {
        Some(Ok(t)) => t,
        Some(Err(e)) => {
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                format!("the model's chat template does not load: {e}"),
            ))
        }
        None => {
            return Err(ApiError::bad(
                "messages",
                "the model has no chat template (tokenizer_config.json's chat_template, chat_template.jinja or a GGUF's tokenizer.chat_template); use /v1/completions with a prompt",
            ))
        }
    };
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt,
                tools,
                documents,
                kwargs,
                now: None,
            },
        )
        .map_err(|e| {
            ApiError::bad(
                "messages",
                format!("the chat template refused the request: {e}"),
            )
        })?;
    let opened = m.think && text.trim_end().ends_with("<think>");
    Ok(Rendered {
        text,
        opened,
        tools: parsed_tools,
        context: 0,
    })
}

/// The body as the chat template's JSON (objects in the client's key order).
fn ordered(bytes: &[u8]) -> Result<ChatJson, ApiError> {
    let text = std::str::from_utf8(bytes).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "the request body is not UTF-8",
        )
    })?;
    ChatJson::parse(text).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the request body is not JSON: {e}"),
        )
    })
}

async fn apply_template(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let m = ready(&s)?;
    let bytes = bytes_of(body)?;
    let mut f = Fields(object_of(&bytes)?);
    let r = render(&mut f, &ordered(&bytes)?, m)?;
    f.done()?;
    Ok(Json(json!({"prompt": r.text})))
}

/// `(reasoning, content)` of a reply so far, where the template writes `<think>` blocks (else all
/// content): the reply is reasoning when the prompt opened a block (`opened`: its generation
/// prompt ends in `<think>`) or when it begins with `<think>` (after whitespace), up to the first
/// `</think>`, and content after it (its leading whitespace dropped); otherwise it is all content,
/// a later tag included. The rule only ever extends what it gave for a shorter prefix (a tag
/// still arriving is held back by the stream), so what a stream has sent is never taken back, and
/// a whole response splits exactly as its stream did.
fn split(m: &ModelInfo, opened: bool, text: &str) -> (Option<String>, String) {
    split_think(m.think, opened, text)
}

/// [`split`] for a template that writes `<think>` blocks (`think`) or not.
fn split_think(think: bool, opened: bool, text: &str) -> (Option<String>, String) {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    if !think {
        return (None, text.to_string());
    }
    let trimmed = text.trim_start();
    let inside = if opened {
        text
    } else if let Some(rest) = trimmed.strip_prefix(OPEN) {
        rest
    } else if trimmed.is_empty() || OPEN.starts_with(trimmed) {
        // Nothing yet but whitespace, or a tag on its way: undecided.
        return (None, String::new());
    } else {
        return (None, text.to_string());
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    match inside.find(CLOSE) {
        Some(end) => (
            nonempty(inside[..end].trim()),
            inside[end + CLOSE.len()..].trim_start().to_string(),
        ),
        None => (nonempty(inside.trim()), String::new()),
    }
}

async fn chat(
    State(s): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let m = ready(&s)?;
    let bytes = bytes_of(body)?;
    let mut f = Fields(object_of(&bytes)?);
    let mut rendered = render(&mut f, &ordered(&bytes)?, m)?;
    let c = common(&mut f, &s, m)?;
    // OpenAI's chat: logprobs true, with top_logprobs 0 to 20 alternatives.
    let top_logprobs = f.uint("top_logprobs", 20)?;
    let logprobs = match (f.bool("logprobs")?, top_logprobs) {
        (Some(true), n) => Some(n.unwrap_or(0)),
        (_, Some(_)) => {
            return Err(ApiError::bad(
                "top_logprobs",
                "top_logprobs is taken only with logprobs: true",
            ))
        }
        _ => None,
    };
    f.done()?;
    // As transformers' apply_chat_template(tokenize=True): the rendered text's own special
    // tokens, nothing added.
    let ids = m
        .text
        .encode(&rendered.text, false)
        .map_err(|e| ApiError::bad("messages", format!("tokenizing the prompt: {e}")))?;
    if ids.is_empty() || ids.len() >= m.context {
        return Err(ApiError::bad(
            "messages",
            format!(
                "the rendered prompt's {} tokens leave no room in the context of {} positions",
                ids.len(),
                m.context
            ),
        ));
    }
    // The rest of the context by default, within --max-tokens-limit.
    let max_tokens = c
        .max_tokens
        .unwrap_or((m.context - ids.len()).min(s.opts.max_tokens_limit));
    rendered.context = ids.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    let (meta, rxs) = submit(&s, m, "chatcmpl", ids, max_tokens, &c, logprobs)?;
    if c.stream {
        Ok(stream_chat(
            meta,
            rxs,
            c.include_usage,
            s.clone(),
            rendered.opened,
            rendered.tools,
            rendered.context,
        )
        .into_response())
    } else {
        whole_chat(meta, rxs, m, &rendered, logprobs.is_some()).await
    }
}

/// A reply's reasoning and content, and its tool calls where they are parsed and parse (the
/// content then the text before them).
fn reply_parts(
    m: &ModelInfo,
    opened: bool,
    tools: Option<&Tools>,
    text: &str,
) -> (
    Option<String>,
    String,
    Option<Vec<tarfa_chat::tools::ToolCall>>,
) {
    let (reasoning, content) = split(m, opened, text);
    match tools.and_then(|(f, list)| tarfa_chat::tools::parse(*f, &content, list)) {
        Some((content, calls)) => (reasoning, content, Some(calls)),
        None => (reasoning, content, None),
    }
}

/// A whole reply's message, and whether it called tools.
fn chat_message(m: &ModelInfo, r: &Rendered, choice: usize, text: &str) -> (Value, bool) {
    let (reasoning, content, calls) = reply_parts(m, r.opened, r.tools.as_ref(), text);
    let mut msg = json!({"role": "assistant", "content": content});
    if let Some(r) = reasoning {
        msg["reasoning_content"] = json!(r);
    }
    let called = calls.is_some();
    if let Some(calls) = calls {
        if msg["content"] == "" {
            msg["content"] = Value::Null;
        }
        msg["tool_calls"] = calls
            .iter()
            .enumerate()
            .map(|(k, c)| c.json(r.context, choice, k))
            .collect();
    }
    (msg, called)
}

async fn whole_chat(
    meta: Meta,
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
    m: &ModelInfo,
    rendered: &Rendered,
    logprobs: bool,
) -> Result<Response, ApiError> {
    let (all, usage) = answers(rxs).await?;
    let choices: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (message, called) = chat_message(m, rendered, i, &a.text);
            let finish = if called { Finish::ToolCalls } else { a.finish };
            json!({
                "index": i,
                "message": message,
                "logprobs": if logprobs { meta.chat_logprobs(&a.logprobs) } else { Value::Null },
                "finish_reason": finish.reason(),
            })
        })
        .collect();
    let mut o = meta.head("chat.completion");
    o.insert("choices".into(), Value::Array(choices));
    o.insert("usage".into(), usage);
    Ok(Json(Value::Object(o)).into_response())
}

/// What a chat stream has sent of one choice's reply: the text, and of it the reasoning and
/// content.
#[derive(Default, Clone)]
struct ChatSent {
    text: String,
    reasoning: String,
    content: String,
}

fn stream_chat(
    meta: Meta,
    rxs: Vec<crate::engine::UnboundedReceiver<Event>>,
    include_usage: bool,
    s: Arc<Shared>,
    opened: bool,
    tools: Option<Tools>,
    context: u64,
) -> Sse<impl tokio_stream::Stream<Item = Result<SseEvent, Infallible>>> {
    let n = rxs.len();
    let chunk = |meta: &Meta, i: usize, delta: Value, finish: Option<Finish>| {
        let mut o = meta.head("chat.completion.chunk");
        o.insert(
            "choices".into(),
            json!([{
                "index": i,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish.map(Finish::reason),
            }]),
        );
        Value::Object(o)
    };
    let first: Vec<Value> = (0..n)
        .map(|i| chunk(&meta, i, json!({"role": "assistant", "content": ""}), None))
        .collect();
    let mut sent = vec![ChatSent::default(); n];
    let mut ends = Ends::default();
    let events = merged(rxs).flat_map(move |(i, ev)| {
        let Some(m) = s.model.get() else {
            return tokio_stream::iter(Vec::new());
        };
        // The deltas of reasoning and content that extend what was sent, of `view`, and at the
        // `end` the reply's tool calls where they parse (while tools may be called, content is
        // sent only up to where a call may begin).
        let deltas = |view: &str,
                      sent: &mut ChatSent,
                      end: bool|
         -> (Vec<Value>, Option<Vec<tarfa_chat::tools::ToolCall>>) {
            let (r, c, calls) = if end {
                reply_parts(m, opened, tools.as_ref(), view)
            } else {
                let (r, mut c) = split(m, opened, view);
                if tools.is_some() {
                    c.truncate(tarfa_chat::tools::streamable(&c));
                }
                (r, c, None)
            };
            let r = r.unwrap_or_default();
            let mut out = Vec::new();
            if r.len() > sent.reasoning.len() && r.starts_with(sent.reasoning.as_str()) {
                out.push(chunk(
                    &meta,
                    i,
                    json!({"reasoning_content": &r[sent.reasoning.len()..]}),
                    None,
                ));
                sent.reasoning = r;
            }
            if c.len() > sent.content.len() && c.starts_with(sent.content.as_str()) {
                out.push(chunk(
                    &meta,
                    i,
                    json!({"content": &c[sent.content.len()..]}),
                    None,
                ));
                sent.content = c;
            }
            (out, calls)
        };
        let out: Vec<Value> = match ev {
            Event::Delta { text, logprob } => {
                sent[i].text.push_str(&text);
                let lp = logprob.map(|l| meta.chat_logprobs(&[l]));
                // A tag that may be arriving is held back until it is whole.
                let all = sent[i].text.clone();
                let hold = if m.think {
                    hold_back(&all, &["<think>".to_string(), "</think>".to_string()])
                } else {
                    0
                };
                let (mut out, _) = deltas(&all[..all.len() - hold], &mut sent[i], false);
                // A token's logprobs ride on the chunk of its step (an empty delta if its text
                // is held back).
                if let Some(lp) = lp {
                    if out.is_empty() {
                        out.push(chunk(&meta, i, json!({}), None));
                    }
                    out[0]["choices"][0]["logprobs"] = lp;
                }
                out
            }
            Event::Done {
                finish,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
            } => {
                let all = sent[i].text.clone();
                let (mut v, calls) = deltas(&all, &mut sent[i], true);
                let finish = match calls {
                    Some(calls) => {
                        let list: Vec<Value> = calls
                            .iter()
                            .enumerate()
                            .map(|(k, c)| {
                                let mut e = c.json(context, i, k);
                                e["index"] = json!(k);
                                e
                            })
                            .collect();
                        v.push(chunk(&meta, i, json!({ "tool_calls": list }), None));
                        Finish::ToolCalls
                    }
                    None => finish,
                };
                v.push(chunk(&meta, i, json!({}), Some(finish)));
                v.extend(ends.end(
                    n,
                    (prompt_tokens, completion_tokens, cached_tokens),
                    &meta,
                    "chat.completion.chunk",
                    include_usage,
                ));
                v
            }
            Event::Error(e) => {
                vec![ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", e).body()]
            }
        };
        tokio_stream::iter(out)
    });
    sse(tokio_stream::iter(first).chain(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream sends the split of each prefix (less a tag on its way) where it extends what was
    /// sent; the whole reply's split must then be exactly what was sent — never taken back.
    #[test]
    fn the_reasoning_split_only_extends_so_a_stream_is_its_whole_answer() {
        let tags = ["<think>".to_string(), "</think>".to_string()];
        for (opened, reply) in [
            (false, "  <think>\nplan a\n</think>\n\nThe answer."),
            (false, "Sure.</think>Answer"),
            (false, "plain answer <think>not reasoning</think>"),
            (true, "still thinking</think>\n\nDone"),
            (true, "never closed"),
            (false, " <think> open only"),
            (false, "   "),
        ] {
            let (mut r_sent, mut c_sent) = (String::new(), String::new());
            let mut text = String::new();
            for ch in reply.chars() {
                text.push(ch);
                let hold = hold_back(&text, &tags);
                let (r, c) = split_think(true, opened, &text[..text.len() - hold]);
                let r = r.unwrap_or_default();
                assert!(
                    r.starts_with(r_sent.as_str()),
                    "{reply:?}: {r:?} after {r_sent:?}"
                );
                assert!(
                    c.starts_with(c_sent.as_str()),
                    "{reply:?}: {c:?} after {c_sent:?}"
                );
                (r_sent, c_sent) = (r, c);
            }
            let (r, c) = split_think(true, opened, reply);
            assert_eq!((r.unwrap_or_default(), c), (r_sent, c_sent), "{reply:?}");
        }
        assert_eq!(
            split_think(true, false, "<think>a</think>b"),
            (Some("a".into()), "b".into())
        );
        assert_eq!(
            split_think(true, false, "Sure.</think>Answer"),
            (None, "Sure.</think>Answer".into())
        );
        assert_eq!(
            split_think(false, true, "<think>a"),
            (None, "<think>a".into())
        );
    }

    #[test]
    fn a_secret_is_compared_whole() {
        assert!(same_secret(b"k3y", b"k3y"));
        assert!(!same_secret(b"k3y", b"k3z"));
        assert!(!same_secret(b"k3", b"k3y"));
        assert!(!same_secret(b"", b"k"));
    }
}
