//! Connections: the accept loop in place of `axum::serve`, for the two bounds it lacks.
//!
//! - At most `--max-connections` connections are open at once. One more is answered `503`
//!   with `Retry-After` and closed at once, never left waiting: a client learns the server is
//!   busy, and the server never runs out of file descriptors (each connection holds one).
//! - A request's headers must arrive within `--read-timeout` seconds (hyper's
//!   `header_read_timeout`, from the first byte of a request or the end of the one before), and
//!   then its body within as long again (`api::read_body`, 408): a client that opens
//!   connections and sends nothing, or a request a byte at a time (slowloris), loses them and
//!   gives its place back. A response the client reads slowly is not timed: a streamed answer's
//!   pace is the model's.
//!
//! HTTP/1.1 with keep-alive, as axum serves it (tarfa-serve builds axum with `http1` only).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::engine::Metrics;

/// What a connection over the bound is told before it is closed: OpenAI's error shape, 503.
fn busy() -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "message": "too many connections are open (--max-connections); retry shortly",
        "type": "unavailable_error",
        "param": null,
        "code": 503,
    }})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Connection bounds.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Time a request's headers may take to arrive.
    pub read_timeout: Duration,
    /// Time open connections are given to finish after a shutdown begins.
    pub drain: Duration,
}

/// Serve `app` on `listener` until `shutdown` resolves, then give open connections `drain` to
/// finish their answers.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors or memory, or a connection reset before it was taken:
                    // wait a moment rather than spin.
                    eprintln!("warning: accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.connections_refused.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut stream = stream;
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), stream.write_all(&busy())).await;
                let _ = stream.shutdown().await;
            });
            continue;
        };
        let _ = stream.set_nodelay(true);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.read_timeout)
            .keep_alive(true);
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        let open = Arc::clone(&metrics);
        open.connections.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            // An error here is the client's (a reset, a malformed or too slow request): hyper has
            // answered what could be answered; the connection ends either way.
            let _ = conn.await;
            open.connections.fetch_sub(1, Ordering::SeqCst);
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.drain, graceful.shutdown()).await;
}
