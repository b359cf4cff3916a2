//! `tarfa chat`: a conversation in the terminal, on the server's engine and the model's chat
//! template — the same code that answers `/v1/chat/completions`, in process.
//!
//! Each turn renders the whole conversation with the template, as transformers'
//! `apply_chat_template` does, and the engine's prompt cache reuses the sequence of the turn
//! before for the prefix they share, so a turn computes only what is new (and the same bits as
//! computing it all). Ctrl-C while an answer streams drops its channel: the engine frees the
//! sequence before its next step, and the partial answer stays in the conversation.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context};
use tarfa_chat::{split_reasoning, ChatJson, RenderOptions};
use tarfa_decode::text::Text;
use tarfa_serve::engine::{self, Event, Finish, Job, Metrics};
use tarfa_serve::sample::Sampling;

use crate::cli::ChatArgs;

/// Set by Ctrl-C while an answer streams.
static STOP: AtomicBool = AtomicBool::new(false);

/// The last answer's figures, for /stats.
#[derive(Default)]
struct Stats {
    prompt: usize,
    cached: usize,
    generated: usize,
    seconds: f64,
    expert_bytes: u64,
    expert_reads: u64,
    cache_hits: u64,
}

pub fn run(a: &ChatArgs) -> anyhow::Result<bool> {
    crate::diagnose::require_model_dir(&a.dir, "chat", || {
        crate::diagnose::reads_a_model_dir("chat")
    })?;
    let opts = crate::run_cmd::decoder_options(&a.model)?;
    let kwargs = match &a.chat_template_kwargs {
        None => Vec::new(),
        Some(j) => ChatJson::parse(j)
            .ok()
            .and_then(|v| v.object_entries())
            .ok_or_else(|| anyhow::anyhow!("--chat-template-kwargs: not a JSON object: {j}"))?,
    };
    let sampling = (a.temperature > 0.0).then(|| Sampling {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        seed: a.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        }),
    });
    let tty = std::io::stdin().is_terminal();
    eprintln!("loading {} …", a.dir.display());
    let dec = tarfa_decode::Decoder::open(&a.dir, &opts)?;
    let text = Arc::new(Text::of(&dec).map_err(|e| anyhow::anyhow!("{}: {e}", a.dir.display()))?);
    let template = match tarfa_serve::chat_template(&dec).template {
        Some(Ok(t)) => t,
        Some(Err(e)) => bail!("{}: the chat template does not load: {e}", a.dir.display()),
        None => bail!(
            "{}: the model has no chat template (tokenizer_config.json's chat_template, chat_template.jinja or a GGUF's tokenizer.chat_template); use tarfa run with a prompt",
            a.dir.display()
        ),
    };
    let model_ctx = dec.context_length().unwrap_or(usize::MAX);
    let context = match a.ctx_size {
        Some(c) if c > model_ctx => {
            bail!("-c/--ctx-size {c}: the model's context is {model_ctx} positions")
        }
        Some(c) => c,
        None => model_ctx,
    };
    let cfg = engine::EngineConfig {
        prompt_cache: 2,
        parallel: 1,
        context,
        eos: dec.eos_ids()?,
        prompt_chunk: a.model.batch.unwrap_or(engine::PROMPT_CHUNK),
    };
    let metrics = Arc::new(Metrics::default());
    let (jobs, rx) = std::sync::mpsc::sync_channel::<Job>(1);
    {
        let text = Arc::clone(&text);
        let metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("tarfa-engine".into())
            .spawn(move || engine::run(dec, text, cfg, rx, metrics))
            .context("starting the engine")?;
    }
    ctrlc::set_handler(|| STOP.store(true, Ordering::SeqCst))
        .context("installing the Ctrl-C handler")?;
    if let Some(s) = &sampling {
        eprintln!(
            "sampling: temperature {}, top-k {}, top-p {}, min-p {}, seed {} (the same seed and conversation give the same answers)",
            s.temperature, s.top_k, s.top_p, s.min_p, s.seed
        );
    }
    if tty {
        eprintln!("/reset starts over, /stats prints the last answer's figures, /quit or Ctrl-D ends; Ctrl-C stops an answer");
    }
    let mut lines: Box<dyn FnMut() -> anyhow::Result<Option<String>>> = if tty {
        let mut ed = rustyline::DefaultEditor::new().context("the line editor")?;
        Box::new(move || loop {
            match ed.readline("> ") {
                Ok(l) => {
                    let _ = ed.add_history_entry(l.as_str());
                    return Ok(Some(l));
                }
                Err(rustyline::error::ReadlineError::Interrupted) => continue,
                Err(rustyline::error::ReadlineError::Eof) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
        })
    } else {
        let mut stdin = std::io::stdin().lock();
        Box::new(move || {
            let mut l = String::new();
            match stdin.read_line(&mut l)? {
                0 => Ok(None),
                _ => Ok(Some(l.trim_end_matches(['\n', '\r']).to_string())),
            }
        })
    };
    let start = || -> Vec<serde_json::Value> {
        a.system
            .iter()
            .map(|s| serde_json::json!({"role": "system", "content": s}))
            .collect()
    };
    let mut messages = start();
    let mut last = Stats::default();
    let mut out = std::io::stdout().lock();
    while let Some(line) = lines()? {
        let line = line.trim();
        match line {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                messages = start();
                eprintln!("[a new conversation]");
                continue;
            }
            "/stats" => {
                eprintln!(
                    "last answer: {} tokens in {:.3} s ({:.2} tokens/s); prompt {} tokens, {} of them from the cache; experts: {} read ({} bytes, {} per token), {} cache hits",
                    last.generated,
                    last.seconds,
                    if last.seconds > 0.0 { last.generated as f64 / last.seconds } else { 0.0 },
                    last.prompt,
                    last.cached,
                    last.expert_reads,
                    last.expert_bytes,
                    last.expert_bytes.checked_div(last.generated as u64).unwrap_or(0),
                    last.cache_hits,
                );
                continue;
            }
            "/help" => {
                eprintln!("/reset starts over, /stats prints the last answer's figures, /quit ends; Ctrl-C stops an answer");
                continue;
            }
            _ => {}
        }
        messages.push(serde_json::json!({"role": "user", "content": line}));
        let conversation = ChatJson::from(&serde_json::Value::Array(messages.clone()));
        let prompt_text = match template.render(
            &conversation,
            &RenderOptions {
                add_generation_prompt: true,
                kwargs: kwargs.clone(),
                ..RenderOptions::default()
            },
        ) {
            Ok(t) => t,
            Err(e) => {
                messages.pop();
                eprintln!("error: the chat template refused the conversation: {e}");
                continue;
            }
        };
        let prompt = text
            .encode(&prompt_text, false)
            .map_err(|e| anyhow::anyhow!("tokenizing the conversation: {e}"))?;
        if prompt.len() >= context {
            messages.pop();
            eprintln!(
                "error: the conversation takes {} tokens, the whole context of {context}: /reset to start over",
                prompt.len()
            );
            continue;
        }
        let room = context - prompt.len();
        let (tx, mut events) = engine::channel();
        STOP.store(false, Ordering::SeqCst);
        let before = (
            metrics.expert_bytes.load(Ordering::SeqCst),
            metrics.expert_reads.load(Ordering::SeqCst),
            metrics.cache_hits.load(Ordering::SeqCst),
        );
        metrics.queued.fetch_add(1, Ordering::SeqCst);
        jobs.send(Job {
            prompt: prompt.clone(),
            max_tokens: a.max_tokens.unwrap_or(room).min(room),
            stop: Vec::new(),
            ignore_eos: false,
            sampling: sampling.clone(),
            logprobs: None,
            choice: 0,
            tx,
            arrived: Instant::now(),
        })
        .map_err(|_| anyhow::anyhow!("the engine stopped"))?;
        let t0 = Instant::now();
        let mut reply = String::new();
        let mut done = None;
        while let Some(ev) = events.blocking_recv() {
            match ev {
                Event::Delta { text: t, .. } => {
                    write!(out, "{t}")?;
                    out.flush()?;
                    reply.push_str(&t);
                }
                Event::Done {
                    finish,
                    prompt_tokens,
                    completion_tokens,
                    cached_tokens,
                } => {
                    done = Some((finish, prompt_tokens, completion_tokens, cached_tokens));
                    break;
                }
                Event::Error(e) => bail!("{e}"),
            }
            if STOP.load(Ordering::SeqCst) {
                break;
            }
        }
        // Dropping the channel frees the sequence before its next step.
        drop(events);
        writeln!(out)?;
        match done {
            Some((finish, p, g, c)) => {
                last = Stats {
                    prompt: p,
                    cached: c,
                    generated: g,
                    seconds: t0.elapsed().as_secs_f64(),
                    expert_bytes: metrics.expert_bytes.load(Ordering::SeqCst) - before.0,
                    expert_reads: metrics.expert_reads.load(Ordering::SeqCst) - before.1,
                    cache_hits: metrics.cache_hits.load(Ordering::SeqCst) - before.2,
                };
                if finish == Finish::Length {
                    eprintln!("[the answer reached its length limit]");
                }
            }
            None => eprintln!("[stopped]"),
        }
        let (reasoning, content) = if prompt_text.trim_end().ends_with("<think>") {
            split_reasoning(&format!("<think>{reply}"))
        } else {
            split_reasoning(&reply)
        };
        let mut msg = serde_json::json!({"role": "assistant", "content": content});
        if let Some(r) = reasoning {
            msg["reasoning_content"] = serde_json::json!(r);
        }
        messages.push(msg);
    }
    Ok(true)
}
