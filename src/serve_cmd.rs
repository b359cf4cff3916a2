//! `tarfa serve`: the model behind an OpenAI-compatible HTTP API (crate `tarfa-serve`).

use crate::cli::ServeArgs;

pub fn run(a: &ServeArgs) -> anyhow::Result<bool> {
    crate::diagnose::require_model_dir(&a.dir, "serve", || {
        crate::diagnose::reads_a_model_dir("serve")
    })?;
    // The flags first: a bad one is exit 2 before anything listens.
    let opts = crate::run_cmd::decoder_options(&a.model)?;
    let model_id = a.alias.clone().unwrap_or_else(|| {
        std::fs::canonicalize(&a.dir)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| a.dir.display().to_string())
    });
    let serve = tarfa_serve::ServeOptions {
        addr: std::net::SocketAddr::new(a.host, a.port),
        parallel: a.parallel,
        queue: a.queue,
        ctx: a.ctx_size,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        webui: !a.no_webui,
        max_body: a.max_body,
        max_connections: a.max_connections,
        read_timeout: std::time::Duration::from_secs(a.read_timeout),
        max_tokens_limit: a.max_tokens_limit,
        model_id,
        prompt_cache: a.prompt_cache,
        prompt_chunk: a.model.batch.unwrap_or(tarfa_serve::engine::PROMPT_CHUNK),
    };
    let dir = a.dir.clone();
    let parallel = a.parallel;
    tarfa_serve::serve(
        serve,
        move || {
            tarfa_decode::Decoder::open(&dir, &opts)
                .map_err(|e| tarfa_serve::anyhow_like::Error::msg(e.to_string()))
        },
        move |addr| {
            eprintln!(
                "tarfa serve: listening on http://{addr} ({parallel} slot{}); loading the model (GET /health answers 503 until it is up)",
                if parallel == 1 { "" } else { "s" }
            );
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(true)
}
