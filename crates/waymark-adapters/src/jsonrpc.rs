//! JSON-RPC 2.0 over newline-delimited JSON, both ways: the Codex app-server and ACP agents
//! both send requests to us (approvals) while we send requests to them (turns, prompts).
//! Codex leaves out the `"jsonrpc"` member, ACP requires it: [`Dialect`] says which.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use serde_json::{Map, Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{Mutex, mpsc, oneshot};

/// Whether messages carry `"jsonrpc": "2.0"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Standard JSON-RPC 2.0 (ACP).
    Standard,
    /// The member left out (Codex app-server).
    NoVersion,
}

/// What went wrong with a call.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RpcError {
    /// The peer answered with an error object.
    #[error("{method}: the peer answered error {code}: {message}")]
    Remote {
        /// The method called.
        method: String,
        /// JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
        /// Its `data`, if any.
        data: Option<Value>,
    },
    /// The connection closed before the answer came.
    #[error("{0}: the connection closed before the peer answered")]
    Closed(String),
    /// Writing to the peer failed.
    #[error("writing to the peer failed: {0}")]
    Io(String),
}

/// A request id as the peer sent it (number or string), echoed back verbatim.
pub type RequestId = Value;

/// A message the peer started.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A request: answer it with [`Peer::respond`] or [`Peer::respond_error`].
    Request {
        /// Its id.
        id: RequestId,
        /// The method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// A notification.
    Notification {
        /// The method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
}

type Pending = Arc<Mutex<HashMap<String, (String, oneshot::Sender<Result<Value, RpcError>>)>>>;

/// One side of a JSON-RPC connection. Cloning shares it.
#[derive(Clone)]
pub struct Peer {
    dialect: Dialect,
    writer: Arc<Mutex<Box<dyn AsyncWrite + Send + Unpin>>>,
    pending: Pending,
    next_id: Arc<AtomicI64>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("dialect", &self.dialect)
            .finish()
    }
}

impl Peer {
    /// Starts reading `reader`; answers to our requests are routed to their callers, and what
    /// the peer starts arrives on the returned channel, which closes when the connection does
    /// (every call still waiting then fails with [`RpcError::Closed`]).
    pub fn start<R, W>(reader: R, writer: W, dialect: Dialect) -> (Peer, mpsc::Receiver<Incoming>)
    where
        R: AsyncRead + Send + Unpin + 'static,
        W: AsyncWrite + Send + Unpin + 'static,
    {
        let peer = Peer {
            dialect,
            writer: Arc::new(Mutex::new(Box::new(writer))),
            pending: Arc::default(),
            next_id: Arc::new(AtomicI64::new(1)),
        };
        let (tx, rx) = mpsc::channel(256);
        let reading = peer.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(reader).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Value>(&line) {
                    Ok(msg) => {
                        if let Some(incoming) = reading.route(msg).await
                            && tx.send(incoming).await.is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "the peer sent a line that is not JSON; skipped");
                        // A parse error has no id to answer; JSON-RPC says answer with id null.
                        let _ = reading
                            .write(json!({"id": null, "error": {"code": -32700, "message": "parse error"}}))
                            .await;
                    }
                }
            }
            let mut pending = reading.pending.lock().await;
            for (_, (method, waiter)) in pending.drain() {
                let _ = waiter.send(Err(RpcError::Closed(method)));
            }
        });
        (peer, rx)
    }

    /// Hands an answer to its caller, or returns what the peer started.
    async fn route(&self, msg: Value) -> Option<Incoming> {
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = msg.get("id").cloned().filter(|v| !v.is_null());
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match (method, id) {
            (Some(method), Some(id)) => Some(Incoming::Request { id, method, params }),
            (Some(method), None) => Some(Incoming::Notification { method, params }),
            (None, Some(id)) => {
                let waiter = self.pending.lock().await.remove(&key(&id));
                match waiter {
                    Some((method, waiter)) => {
                        let answer = match msg.get("error") {
                            Some(e) => Err(RpcError::Remote {
                                method,
                                code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
                                message: e
                                    .get("message")
                                    .and_then(Value::as_str)
                                    .unwrap_or("")
                                    .to_owned(),
                                data: e.get("data").cloned(),
                            }),
                            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
                        };
                        let _ = waiter.send(answer);
                    }
                    None => tracing::warn!(id = %id, "an answer to no request of ours; ignored"),
                }
                None
            }
            (None, None) => {
                tracing::warn!(%msg, "a message with neither method nor id; ignored");
                None
            }
        }
    }

    async fn write(&self, mut msg: Value) -> Result<(), RpcError> {
        if self.dialect == Dialect::Standard
            && let Some(o) = msg.as_object_mut()
        {
            let mut with = Map::with_capacity(o.len() + 1);
            with.insert("jsonrpc".into(), Value::from("2.0"));
            with.append(o);
            msg = Value::Object(with);
        }
        let mut line = serde_json::to_vec(&msg).map_err(|e| RpcError::Io(e.to_string()))?;
        line.push(b'\n');
        let mut w = self.writer.lock().await;
        w.write_all(&line)
            .await
            .map_err(|e| RpcError::Io(e.to_string()))?;
        w.flush().await.map_err(|e| RpcError::Io(e.to_string()))
    }

    /// Calls `method` and waits for the answer.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending
            .lock()
            .await
            .insert(key(&Value::from(id)), (method.to_owned(), tx));
        if let Err(e) = self
            .write(json!({"id": id, "method": method, "params": params}))
            .await
        {
            self.pending.lock().await.remove(&key(&Value::from(id)));
            return Err(e);
        }
        rx.await
            .unwrap_or_else(|_| Err(RpcError::Closed(method.to_owned())))
    }

    /// Sends a notification.
    pub async fn notify(&self, method: &str, params: Value) -> Result<(), RpcError> {
        self.write(json!({"method": method, "params": params}))
            .await
    }

    /// Answers a request the peer sent.
    pub async fn respond(&self, id: &RequestId, result: Value) -> Result<(), RpcError> {
        self.write(json!({"id": id, "result": result})).await
    }

    /// Answers a request the peer sent with an error.
    pub async fn respond_error(
        &self,
        id: &RequestId,
        code: i64,
        message: &str,
    ) -> Result<(), RpcError> {
        self.write(json!({"id": id, "error": {"code": code, "message": message}}))
            .await
    }
}

/// Ids compare by their JSON text, so `7` and `"7"` stay distinct.
fn key(id: &Value) -> String {
    id.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_cross_both_ways_and_a_closed_connection_fails_the_waiting_call() {
        let (a_io, b_io) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a_io);
        let (br, bw) = tokio::io::split(b_io);
        let (a, _a_in) = Peer::start(ar, aw, Dialect::Standard);
        let (b, mut b_in) = Peer::start(br, bw, Dialect::Standard);

        let call = tokio::spawn({
            let a = a.clone();
            async move { a.request("session/prompt", json!({"text": "hi"})).await }
        });
        let Some(Incoming::Request { id, method, params }) = b_in.recv().await else {
            panic!("b should see a request")
        };
        assert_eq!(method, "session/prompt");
        assert_eq!(params["text"], "hi");
        b.respond(&id, json!({"stopReason": "end_turn"}))
            .await
            .unwrap();
        assert_eq!(call.await.unwrap().unwrap()["stopReason"], "end_turn");

        let call = tokio::spawn({
            let a = a.clone();
            async move { a.request("x", Value::Null).await }
        });
        let Some(Incoming::Request { id, .. }) = b_in.recv().await else {
            panic!()
        };
        b.respond_error(&id, -32601, "no such method")
            .await
            .unwrap();
        match call.await.unwrap() {
            Err(RpcError::Remote { code, .. }) => assert_eq!(code, -32601),
            other => panic!("{other:?}"),
        }

        // A peer that reads the request and goes away.
        let (c_io, d_io) = tokio::io::duplex(4096);
        let (cr, cw) = tokio::io::split(c_io);
        let (c, _c_in) = Peer::start(cr, cw, Dialect::Standard);
        let waiting = tokio::spawn({
            let c = c.clone();
            async move { c.request("turn/start", Value::Null).await }
        });
        let mut d_lines = BufReader::new(d_io).lines();
        assert!(
            d_lines
                .next_line()
                .await
                .unwrap()
                .unwrap()
                .contains("turn/start")
        );
        drop(d_lines);
        match waiting.await.unwrap() {
            Err(RpcError::Closed(m)) => assert_eq!(m, "turn/start"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn codex_dialect_leaves_out_the_version_member() {
        let (a_io, b_io) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a_io);
        let (a, _rx) = Peer::start(ar, aw, Dialect::NoVersion);
        a.notify("initialized", json!({})).await.unwrap();
        let mut lines = BufReader::new(b_io).lines();
        let line = lines.next_line().await.unwrap().unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        assert!(v.get("jsonrpc").is_none(), "{line}");
        assert_eq!(v["method"], "initialized");
    }
}
