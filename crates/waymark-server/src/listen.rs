//! The accept loop: HTTP/1.1 over TCP, or over TLS, with a deadline for the TLS handshake and
//! the request head (slow clients are disconnected), and graceful shutdown — stop accepting,
//! let open requests finish. A plain-HTTP request to a TLS port gets a plain `400` saying to
//! use `https://`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use waymark_proto::{ErrorCode, Problem};

/// What every connection shares.
#[derive(Clone)]
pub(crate) struct Serving {
    pub(crate) router: Router,
    pub(crate) tls: Option<Arc<ServerConfig>>,
    /// Deadline for the TLS handshake, and for each request head (which is also how long an
    /// idle keep-alive connection stays open).
    pub(crate) header_timeout: Duration,
}

/// Serves until `shutdown` resolves, then waits for open connections to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    serving: Serving,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let acceptor = serving.tls.clone().map(TlsAcceptor::from);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_error(e).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let serving = serving.clone();
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            match acceptor {
                None => connection(stream, &serving, watcher).await,
                Some(acceptor) => {
                    let deadline = serving.header_timeout;
                    let tls = tokio::time::timeout(deadline, handshake(stream, acceptor)).await;
                    match tls {
                        Ok(Some(tls)) => connection(tls, &serving, watcher).await,
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

/// Serves HTTP/1.1 on one connection until it closes, or until shutdown asks it to.
async fn connection<I>(io: I, serving: &Serving, watcher: Watcher)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(serving.header_timeout);
    let service = TowerToHyperService::new(serving.router.clone());
    let conn = http.serve_connection(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
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

async fn refuse_plain_http(mut stream: TcpStream) {
    let mut buf = [0u8; 8192];
    let _ = stream.read(&mut buf).await;
    let problem = Problem::new(
        ErrorCode::BadRequest,
        "this server speaks HTTPS only: use an `https://` URL",
    );
    let body = serde_json::to_string(&problem).unwrap_or_default();
    let head = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
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
