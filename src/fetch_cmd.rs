//! `tarfa fetch`: argument handling, the progress bar and the summary around
//! [`tarfa_fetch::Fetcher`].

use std::time::Duration;

use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tarfa_fetch::{
    FetchError, FetchOptions, Fetcher, HttpConfig, LowSpeed, Plan, Progress, RetryPolicy,
    Selection, TransferOptions, DEFAULT_HF_ENDPOINT,
};

use crate::cli::FetchArgs;

/// `8M`, `64K`, `1G` or plain bytes, for the option `flag`.
fn parse_size(flag: &str, s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let (num, mul) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("{flag} {s:?}: expected bytes, or a number with K, M or G"))?;
    match n.checked_mul(mul) {
        Some(v) => Ok(v),
        None => bail!("{flag} {s:?} is out of range"),
    }
}

struct Bar(ProgressBar);

impl Progress for Bar {
    fn start(&self, total: u64, resumed: u64) {
        self.0.set_length(total);
        self.0.set_position(resumed);
        self.0.reset_eta();
        if resumed > 0 {
            self.0.println(format!(
                "resuming: {resumed} of {total} bytes already fetched and checked"
            ));
        }
    }
    fn advance(&self, n: u64) {
        self.0.inc(n);
    }
    fn note(&self, msg: &str) {
        self.0.println(format!("note: {msg}"));
    }
}

fn list(plan: &Plan, json: bool) {
    if json {
        let tensors: Vec<_> = plan
            .tensors
            .iter()
            .map(|t| {
                serde_json::json!({
                    "name": t.name, "dtype": t.dtype, "shape": t.shape,
                    "bytes": t.src.end - t.src.start,
                    "source": plan.sources[t.source].source.name(),
                    "offset": t.src.start,
                })
            })
            .collect();
        let v = serde_json::json!({
            "schema": "tarfa.fetch-list/1",
            "tensors": tensors,
            "tensor_bytes": plan.tensor_bytes(),
            "output_bytes": plan.total_len,
            "notes": plan.notes,
        });
        println!("{v:#}");
        return;
    }
    for t in &plan.tensors {
        println!(
            "{:<48} {:<6} {:<22} {:>12}  part {}",
            t.name,
            t.dtype,
            format!("{:?}", t.shape),
            t.src.end - t.src.start,
            t.source + 1
        );
    }
    for n in &plan.notes {
        println!("note: {n}");
    }
    println!(
        "{} tensors, {} bytes to fetch; output {} bytes",
        plan.tensors.len(),
        plan.tensor_bytes(),
        plan.total_len
    );
}

fn hint(e: &FetchError) -> Option<&'static str> {
    match e {
        FetchError::RemoteChanged { .. } => Some("the remote file was replaced; run again to start over from its new version"),
        FetchError::RangeIgnored { .. } => Some("this server (or a proxy before it) does not honour Range; tarfa fetch needs one that does"),
        FetchError::Transport { .. } | FetchError::ShortBody { .. } => Some("the fetch can be resumed: run the same command again"),
        _ => None,
    }
}

/// Run `tarfa fetch`. `Ok(false)` (exit 1) when the input is at fault; the error is printed here.
pub fn run(a: &FetchArgs) -> anyhow::Result<bool> {
    let token = std::env::var("HF_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    let hf_endpoint = std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_HF_ENDPOINT.into());
    let token_over_http = std::env::var("TARFA_TOKEN_OVER_HTTP").is_ok_and(|v| v == "1");
    if token.is_some() && tarfa_fetch::http::token_origin(&hf_endpoint, token_over_http).is_none() {
        eprintln!(
            "note: HF_TOKEN is not sent: HF_ENDPOINT {hf_endpoint} is not https (set TARFA_TOKEN_OVER_HTTP=1 to send it over plain http)"
        );
    }
    let opts = FetchOptions {
        selection: Selection {
            mtp: a.mtp,
            globs: a.tensors.clone(),
        },
        http: HttpConfig {
            token,
            token_over_http,
            retry: RetryPolicy {
                attempts: a.retries.max(1),
                base_delay: Duration::from_millis(a.retry_delay_ms),
                ..RetryPolicy::default()
            },
            timeout: Duration::from_secs(a.timeout.max(1)),
            low_speed: LowSpeed {
                limit: parse_size("--speed-limit", &a.speed_limit)?,
                time: Duration::from_secs(a.speed_time.max(1)),
            },
        },
        transfer: TransferOptions {
            jobs: a.jobs.max(1),
            chunk_size: match parse_size("--chunk-size", &a.chunk_size)? {
                0 => bail!("--chunk-size {:?} is out of range", a.chunk_size),
                n => n,
            },
        },
        hf_endpoint,
    };
    if !a.mtp && a.tensors.is_empty() {
        bail!("nothing to fetch: give --mtp and/or --tensors GLOB");
    }
    let out = match (&a.output, a.list) {
        (_, true) => None,
        (Some(o), false) => Some(o.clone()),
        (None, false) => bail!("give -o OUTPUT (or --list to see what would be fetched)"),
    };
    let fetcher = Fetcher::new(opts);
    let result = (|| {
        let plan = fetcher.plan(&a.source)?;
        let Some(out) = &out else {
            list(&plan, a.json);
            return Ok(None);
        };
        let bar = ProgressBar::with_draw_target(
            Some(plan.tensor_bytes()),
            if a.quiet {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        if !a.quiet {
            for n in &plan.notes {
                bar.println(format!("note: {n}"));
            }
        }
        let report = fetcher.fetch(&plan, out, &Bar(bar.clone()));
        bar.finish_and_clear();
        report.map(|r| Some((r, out.clone())))
    })();
    match result {
        Ok(None) => Ok(true),
        Ok(Some((r, out))) => {
            if a.json {
                let v = serde_json::json!({
                    "schema": "tarfa.fetch/1",
                    "output": out.display().to_string(),
                    "tensors": r.tensors,
                    "tensor_bytes": r.tensor_bytes,
                    "output_bytes": r.output_len,
                    "source_header_bytes": r.source_header_bytes,
                    "bytes_transferred": r.bytes_transferred,
                    "requests": r.requests,
                    "retries": r.retries,
                    "bytes_resumed": r.transfer.bytes_resumed,
                    "bytes_fetched": r.transfer.bytes_fetched,
                });
                println!("{v:#}");
            } else {
                println!(
                    "wrote {}: {} tensors, {} bytes; transferred {} bytes ({} requests, {} retries), {} bytes kept from an earlier run",
                    out.display(),
                    r.tensors,
                    r.output_len,
                    r.bytes_transferred,
                    r.requests,
                    r.retries,
                    r.transfer.bytes_resumed
                );
            }
            Ok(true)
        }
        Err(e) => {
            let invalid = e.is_invalid_input();
            let h = hint(&e);
            if invalid {
                eprintln!("error: {e}");
                if let Some(h) = h {
                    eprintln!("hint: {h}");
                }
                return Ok(false);
            }
            match h {
                Some(h) => Err(anyhow::anyhow!("{e}\nhint: {h}")),
                None => Err(e.into()),
            }
        }
    }
}
