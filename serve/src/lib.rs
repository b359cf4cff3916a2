//! `tarfa serve`: an OpenAI-compatible HTTP server whose answers are exact.
//!
//! The HTTP side is axum on tokio (as mistral.rs and text-generation-inference are): streaming
//! responses, many idle or slow connections and disconnect detection come from the stack, not
//! from a thread per connection; [`net`] accepts the connections, bounding how many are open and
//! how long a request's headers may take. The model lives on one engine thread ([`engine`]), fed by a
//! bounded queue; handlers validate a request, turn it into a [`engine::Job`] and relay the
//! engine's events as a JSON response or as server-sent events.
//!
//! Routes: `POST /v1/chat/completions`, `POST /apply-template`, `POST /v1/completions`,
//! `GET /v1/models`, `GET /health` (503 while the model loads), `GET /metrics` (Prometheus text),
//! `POST /tokenize`, `POST /detokenize`, and a chat page at `GET /` ([`page`]). Errors have OpenAI's
//! shape, `{"error": {"message", "type", "param", "code"}}`, with the status that fits: 400 for a
//! bad or unsupported field (named in `param`; a field this server does not take is never
//! silently ignored), 401 without the API key, 404 for an unknown route or model, 413 for an
//! oversize body, 503 with `Retry-After` when the queue is full or the model is loading.

#![forbid(unsafe_code)]

pub mod api;
pub mod engine;
pub mod net;
pub mod page;
pub mod sample;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};

use tarfa_decode::text::Text;
use tarfa_decode::Decoder;

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address to bind.
    pub addr: SocketAddr,
    /// Sequences generated at once.
    pub parallel: usize,
    /// Requests waiting beyond them; more get 503.
    pub queue: usize,
    /// Positions a sequence may take (default: the model's context).
    pub ctx: Option<usize>,
    /// Every route but `/health` and the chat page needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Serve the chat page at `GET /` (`--no-webui` turns it off: `/` is then an unknown route).
    pub webui: bool,
    /// Largest request body, bytes.
    pub max_body: usize,
    /// Connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Time a request's headers may take to arrive, and then its body.
    pub read_timeout: std::time::Duration,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// The model's name in `/v1/models` and responses.
    pub model_id: String,
    /// Finished sequences kept so a later prompt sharing a prefix computes only the rest.
    pub prompt_cache: usize,
    /// Prompt tokens a step computes at most (`--batch`; [`engine::PROMPT_CHUNK`] by default).
    pub prompt_chunk: usize,
}

/// The server's state while the model loads, once it is up, or when it failed.
pub(crate) const LOADING: u8 = 0;
pub(crate) const READY: u8 = 1;
pub(crate) const STOPPED: u8 = 2;

/// What the handlers share.
#[derive(Debug)]
pub struct Shared {
    pub(crate) opts: ServeOptions,
    pub(crate) state: AtomicU8,
    pub(crate) model: OnceLock<ModelInfo>,
    pub(crate) jobs: std::sync::mpsc::SyncSender<engine::Job>,
    pub(crate) metrics: Arc<engine::Metrics>,
    pub(crate) created: u64,
}

/// What the handlers know of the loaded model.
#[derive(Debug)]
pub struct ModelInfo {
    pub(crate) text: Arc<Text>,
    pub(crate) vocab: usize,
    pub(crate) context: usize,
    pub(crate) digest: String,
    pub(crate) fingerprint: String,
    /// The chat template (`None`: the model has none; an error: it does not compile, said on
    /// every chat request).
    pub(crate) template: Option<Result<tarfa_chat::ChatTemplate, String>>,
    /// Whether the template writes `<think>` blocks: replies are then split into
    /// `reasoning_content` and `content`.
    pub(crate) think: bool,
    /// The tool-call format the template teaches, if tarfa parses it.
    pub(crate) tool_format: Option<tarfa_chat::tools::ToolFormat>,
}

/// A model's chat template, as [`chat_template`] finds it.
#[derive(Debug)]
pub struct FoundTemplate {
    /// The template (`None`: the model has none; an error: it does not compile).
    pub template: Option<Result<tarfa_chat::ChatTemplate, String>>,
    /// Whether its text knows `<think>` blocks.
    pub think: bool,
    /// The tool-call format its text teaches, if one tarfa parses.
    pub tool_format: Option<tarfa_chat::tools::ToolFormat>,
}

/// The model's chat template as transformers' AutoTokenizer finds it: `chat_template.jinja`, else
/// `tokenizer_config.json`'s `chat_template`; for a GGUF-sourced model `tokenizer.chat_template`
/// with the BOS and EOS strings of its token list. Whether its text knows `<think>` blocks, and
/// the tool-call format it teaches.
pub fn chat_template(dec: &Decoder) -> FoundTemplate {
    let aux = |name: &str| -> Result<Option<Vec<u8>>, String> {
        dec.aux_file(name)
            .map(|f| f.map(|f| f.bytes))
            .map_err(|e| e.to_string())
    };
    let m = dec.manifest();
    let found = (|| -> Result<Option<(String, tarfa_chat::ChatTemplate)>, String> {
        if m.architecture.source_format == "gguf" {
            let c = &m.architecture.config;
            let Some(src) = c
                .get("tokenizer.chat_template")
                .and_then(|v| v.get("value"))
                .and_then(|v| v.as_str())
            else {
                return Ok(None);
            };
            let strings = dec
                .gguf_token_strings()
                .transpose()
                .map_err(|e| e.to_string())?;
            let token = |key: &str| -> Option<String> {
                let id = c.get(key)?.get("value")?.as_u64()?;
                strings.as_ref()?.get(usize::try_from(id).ok()?).cloned()
            };
            let mut sp = tarfa_chat::SpecialTokens::new();
            for (name, key) in [
                ("bos_token", "tokenizer.ggml.bos_token_id"),
                ("eos_token", "tokenizer.ggml.eos_token_id"),
                ("pad_token", "tokenizer.ggml.padding_token_id"),
                ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ] {
                if let Some(t) = token(key) {
                    sp = sp.with(name, &t);
                }
            }
            let t = tarfa_chat::ChatTemplate::new(src, sp).map_err(|e| e.to_string())?;
            return Ok(Some((src.to_string(), t)));
        }
        let config: serde_json::Value = match aux("tokenizer_config.json")? {
            Some(b) => {
                serde_json::from_slice(&b).map_err(|e| format!("tokenizer_config.json: {e}"))?
            }
            None => serde_json::Value::Object(Default::default()),
        };
        let jinja = match aux("chat_template.jinja")? {
            Some(b) => Some(
                String::from_utf8(b).map_err(|_| "chat_template.jinja is not UTF-8".to_string())?,
            ),
            None => None,
        };
        let source = jinja
            .clone()
            .or_else(|| config.get("chat_template").map(|t| t.to_string()));
        match tarfa_chat::ChatTemplate::from_tokenizer_config(&config, jinja.as_deref()) {
            Ok(Some(t)) => Ok(Some((source.unwrap_or_default(), t))),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })();
    let (template, think, tool_format) = match found {
        Ok(None) => (None, false, None),
        Ok(Some((src, t))) => (
            Some(Ok(t)),
            src.contains("<think>"),
            tarfa_chat::tools::ToolFormat::of_template(&src),
        ),
        Err(e) => (Some(Err(e)), false, None),
    };
    FoundTemplate {
        template,
        think,
        tool_format,
    }
}

/// The numerics version: bumped when a change of kernels could change a bit of any output
/// (spec/EXACTNESS.md); with the manifest digest it is `system_fingerprint`, so the same
/// fingerprint and request give the same bytes.
pub const NUMERICS_VERSION: &str = "1";

/// Serve the model `open` loads: bind first (so `/health` answers 503 while it loads), load it
/// on the engine thread, then answer until Ctrl-C / SIGTERM. An error loading the model ends the
/// server with that error.
pub fn serve(
    opts: ServeOptions,
    open: impl FnOnce() -> anyhow_like::Result<Decoder> + Send + 'static,
    on_ready: impl FnOnce(&SocketAddr) + Send + 'static,
) -> anyhow_like::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(2)
        .thread_name("tarfa-http")
        .build()
        .map_err(|e| anyhow_like::Error::msg(format!("starting the HTTP runtime: {e}")))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(opts.addr)
            .await
            .map_err(|e| anyhow_like::Error::msg(format!("binding {}: {e}", opts.addr)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| anyhow_like::Error::msg(e.to_string()))?;
        // Admission is counted (engine::Metrics::admitted against parallel + queue): the channel
        // never holds more.
        let (tx, rx) = std::sync::mpsc::sync_channel(opts.parallel.max(1) + opts.queue);
        let metrics = Arc::new(engine::Metrics::default());
        let metrics_for_net = Arc::clone(&metrics);
        let shared = Arc::new(Shared {
            opts: opts.clone(),
            state: AtomicU8::new(LOADING),
            model: OnceLock::new(),
            jobs: tx,
            metrics: Arc::clone(&metrics),
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        });
        let (fail_tx, mut fail_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let engine_shared = Arc::clone(&shared);
        let parallel = opts.parallel.max(1);
        let ctx = opts.ctx;
        let prompt_cache = opts.prompt_cache;
        let prompt_chunk = opts.prompt_chunk.max(1);
        std::thread::Builder::new()
            .name("tarfa-engine".into())
            .spawn(move || {
                let loaded = (|| -> Result<(Decoder, ModelInfo, engine::EngineConfig), String> {
                    let dec = open().map_err(|e| e.to_string())?;
                    let text = Text::of(&dec).map_err(|e| e.to_string())?;
                    let model_ctx = dec.context_length().unwrap_or(usize::MAX);
                    let context = match ctx {
                        Some(c) if c > model_ctx => {
                            return Err(format!(
                                "--ctx {c}: the model's context is {model_ctx} positions"
                            ))
                        }
                        Some(c) => c,
                        None => model_ctx,
                    };
                    let eos = dec.eos_ids().map_err(|e| e.to_string())?;
                    let m = serde_json::to_value(dec.manifest()).map_err(|e| e.to_string())?;
                    let digest = tarfa_format::manifest::content_digest(&m);
                    let found = chat_template(&dec);
                    if let Some(Err(e)) = &found.template {
                        eprintln!("warning: the model's chat template does not load ({e}); /v1/chat/completions will refuse every request");
                    }
                    let info = ModelInfo {
                        template: found.template,
                        think: found.think,
                        tool_format: found.tool_format,
                        text: Arc::new(text),
                        vocab: dec.vocab_size(),
                        context,
                        fingerprint: format!("tarfa-n{NUMERICS_VERSION}-{}", &digest[..16]),
                        digest,
                    };
                    Ok((
                        dec,
                        info,
                        engine::EngineConfig {
                            prompt_cache,
                            parallel,
                            context,
                            eos,
                            prompt_chunk,
                        },
                    ))
                })();
                match loaded {
                    Ok((dec, info, cfg)) => {
                        let text = Arc::clone(&info.text);
                        let _ = engine_shared.model.set(info);
                        engine_shared.state.store(READY, Ordering::SeqCst);
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            engine::run(dec, text, cfg, rx, metrics)
                        }));
                        // Whatever ended it, the server says so rather than "busy".
                        engine_shared.state.store(STOPPED, Ordering::SeqCst);
                    }
                    Err(e) => {
                        let _ = fail_tx.send(e);
                    }
                }
            })
            .map_err(|e| anyhow_like::Error::msg(format!("starting the engine: {e}")))?;
        on_ready(&bound);
        let app = api::router(Arc::clone(&shared));
        let shutdown = async move {
            tokio::select! {
                e = fail_rx.recv() => e,
                _ = shutdown_signal() => {
                    eprintln!(
                        "tarfa serve: shutting down: no new connections; open answers get up to 5 s (Ctrl-C again to quit now)"
                    );
                    tokio::spawn(async {
                        shutdown_signal().await;
                        eprintln!("tarfa serve: quitting now");
                        std::process::exit(130);
                    });
                    None
                }
            }
        };
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<Option<String>>();
        let limits = net::Limits {
            max_connections: opts.max_connections,
            read_timeout: opts.read_timeout,
            drain: std::time::Duration::from_secs(5),
        };
        net::serve(listener, app, limits, metrics_for_net, async move {
            let why = shutdown.await;
            let _ = stop_tx.send(why);
        })
        .await;
        match stop_rx.await {
            Ok(Some(e)) => Err(anyhow_like::Error::msg(format!("loading the model: {e}"))),
            _ => Ok(()),
        }
    })
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// A small error type for the server's entry point (the binary wraps it in anyhow).
pub mod anyhow_like {
    /// An error with its message.
    #[derive(Debug)]
    pub struct Error(String);

    impl Error {
        /// An error saying `m`.
        pub fn msg(m: impl Into<String>) -> Error {
            Error(m.into())
        }
    }

    impl std::fmt::Display for Error {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(&self.0)
        }
    }

    impl std::error::Error for Error {}

    /// A result of [`Error`].
    pub type Result<T> = std::result::Result<T, Error>;
}
