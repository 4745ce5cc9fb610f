//! The accept loop: HTTP/1.1 over TCP, or over TLS, with a deadline for the TLS handshake and
//! the request head (slow clients are disconnected), a cap on open connections, and graceful
//! shutdown — stop accepting, let open requests finish. A plain-HTTP request to a TLS port gets
//! a plain `400` saying to use `https://`.
//!
//! At the cap (`serve --max-connections`) a new connection is refused at once while the open
//! ones are served on: over plain HTTP with `503 unavailable`, `Retry-After: 1` and a problem
//! document (a few refusals are written at a time, beyond that the connection is just closed);
//! over TLS it is closed without a handshake — answering would take the handshake the cap is
//! there to save — so the client sees a connection error, which clients retry with backoff.
//! A connection's slot is freed when it ends.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use waymark_proto::{ErrorCode, Problem};

use crate::lanes::{self, PeopleLane};
use crate::metrics::Metrics;

/// Refusals (`503`) written at the same time at most; a connection beyond them is closed.
const REFUSING_AT_ONCE: usize = 32;

/// How long writing one refusal may take in all.
const REFUSAL_DEADLINE: Duration = Duration::from_secs(3);

/// What every connection shares.
#[derive(Clone)]
pub(crate) struct Serving {
    pub(crate) router: Router,
    pub(crate) tls: Option<Arc<ServerConfig>>,
    /// Deadline for the TLS handshake, and for each request head (which is also how long an
    /// idle keep-alive connection stays open).
    pub(crate) header_timeout: Duration,
    /// Open connections at most (a TLS connection counts from before its handshake).
    pub(crate) max_connections: usize,
    pub(crate) metrics: Arc<Metrics>,
    /// Where connections that ask for an event stream are served (`lanes`); `None`: here.
    pub(crate) people: Option<Arc<PeopleLane>>,
}

/// Serves until `shutdown` resolves, then waits for open connections to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    serving: Serving,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let acceptor = serving.tls.clone().map(TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(serving.max_connections));
    let refusing = Arc::new(Semaphore::new(REFUSING_AT_ONCE));
    let mut at_cap = false;
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            if !at_cap {
                tracing::warn!(
                    max = serving.max_connections,
                    "at the connection cap: refusing new connections until one closes (`serve --max-connections`)"
                );
                at_cap = true;
            }
            serving.metrics.connection_refused();
            refuse(stream, &serving, &refusing);
            continue;
        };
        if at_cap {
            tracing::info!("below the connection cap again; accepting connections");
            at_cap = false;
        }
        let _ = stream.set_nodelay(true);
        let serving = serving.clone();
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let open = Open::new(slot, &serving.metrics);
            match acceptor {
                None => connection(stream, peer, &serving, watcher, open).await,
                Some(acceptor) => {
                    let deadline = serving.header_timeout;
                    let tls = tokio::time::timeout(deadline, handshake(stream, acceptor)).await;
                    match tls {
                        Ok(Some(tls)) => connection(tls, peer, &serving, watcher, open).await,
                        Ok(None) => {}
                        Err(_) => tracing::debug!("TLS handshake timed out; connection closed"),
                    }
                }
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// An open connection: holds its slot and counts in the gauge until it ends.
struct Open {
    _slot: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl Open {
    fn new(slot: OwnedSemaphorePermit, metrics: &Arc<Metrics>) -> Self {
        metrics.connection_opened();
        Open {
            _slot: slot,
            metrics: metrics.clone(),
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.metrics.connection_closed();
    }
}

/// A connection beyond the cap: a `503` over plain HTTP (while few are being written),
/// otherwise closed at once.
fn refuse(stream: TcpStream, serving: &Serving, refusing: &Arc<Semaphore>) {
    if serving.tls.is_some() {
        return;
    }
    let Ok(permit) = refusing.clone().try_acquire_owned() else {
        return;
    };
    let problem = Problem::new(
        ErrorCode::Unavailable,
        format!(
            "the server has {} open connections, its limit; retry shortly (or raise `serve --max-connections`)",
            serving.max_connections
        ),
    )
    .with("limit", serving.max_connections)
    .with("retry_after_ms", 1000);
    tokio::spawn(async move {
        let _permit = permit;
        let answer = answer_and_close(
            stream,
            "503 Service Unavailable",
            &[("retry-after", "1")],
            &problem,
        );
        let _ = tokio::time::timeout(REFUSAL_DEADLINE, answer).await;
    });
}

/// Serves HTTP/1.1 on one connection until it closes, or until shutdown asks it to; it holds
/// its slot (`open`) until then. Each request carries the peer's address (`ConnectInfo`),
/// which the routes open to unknown callers are rate-limited by. A connection that asks for
/// the event stream moves to the people's lane (`lanes`).
async fn connection<I>(io: I, peer: SocketAddr, serving: &Serving, watcher: Watcher, open: Open)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(serving.header_timeout);
    let to_people = Arc::new(AtomicBool::new(false));
    let asks = to_people.clone();
    let router = serving.router.clone().map_request(
        move |mut r: axum::http::Request<hyper::body::Incoming>| {
            if lanes::is_event_stream(r.method(), r.uri().path()) {
                asks.store(true, Ordering::Release);
            }
            r.extensions_mut().insert(ConnectInfo(peer));
            r
        },
    );
    let service = TowerToHyperService::new(router);
    let conn = http.serve_connection(TokioIo::new(io), service);
    let served = async move {
        let _open = open;
        if let Err(e) = watcher.watch(conn).await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
    };
    let moved = &serving.metrics.people_lane_connections;
    lanes::serve(served, to_people, serving.people.clone(), moved).await;
}

/// The TLS handshake, or `None` (with a plain `400` when the client spoke plain HTTP).
async fn handshake(
    stream: TcpStream,
    acceptor: TlsAcceptor,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let mut first = [0u8; 1];
    match stream.peek(&mut first).await {
        Ok(1..) => {}
        _ => return None,
    }
    // A TLS record starts with 0x16 (handshake); a plain HTTP request with a method name.
    if first[0].is_ascii_uppercase() {
        refuse_plain_http(stream).await;
        return None;
    }
    match acceptor.accept(stream).await {
        Ok(tls) => Some(tls),
        Err(e) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
    }
}

async fn refuse_plain_http(stream: TcpStream) {
    let problem = Problem::new(
        ErrorCode::BadRequest,
        "this server speaks HTTPS only: use an `https://` URL",
    );
    answer_and_close(stream, "400 Bad Request", &[], &problem).await;
}

/// Reads the request's first bytes, answers with `problem` and closes the connection.
async fn answer_and_close(
    mut stream: TcpStream,
    status: &str,
    headers: &[(&str, &str)],
    problem: &Problem,
) {
    let mut buf = [0u8; 8192];
    // What has arrived of the request; a silent client is answered all the same.
    let _ = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await;
    let body = serde_json::to_string(problem).unwrap_or_default();
    let mut head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).await.is_err()
        || stream.write_all(body.as_bytes()).await.is_err()
    {
        return;
    }
    let _ = stream.shutdown().await;
    // Read what the client still sends, so closing does not reset the connection before it
    // has read the answer.
    let drain = async { while let Ok(1..) = stream.read(&mut buf).await {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Errors on one accepted connection are that connection's; others (too many open files)
/// pause accepting for a moment rather than spin.
async fn accept_error(e: std::io::Error) {
    use std::io::ErrorKind::*;
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed; pausing for a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
