//! One WebSocket connection to the OpenClaw gateway (protocol v4): the three frame kinds, the
//! signed `connect` handshake, and request/response pairing. Events that arrive while a
//! request waits for its answer are kept, in order, for the caller.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::device::{AuthPayload, DeviceKey};

/// The gateway protocol version spoken.
pub(crate) const PROTOCOL: u32 = 4;
/// The role asked for.
pub(crate) const ROLE: &str = "operator";
/// The scopes asked for. The real gateway (2026.9.6) shows an exec approval — its
/// `exec.approval.requested` event and its row of `exec.approval.list` — only to a client with
/// `operator.admin` (or to the client that asked), so an approver needs it.
pub(crate) const SCOPES: [&str; 4] = [
    "operator.read",
    "operator.write",
    "operator.approvals",
    "operator.admin",
];
/// The capabilities advertised. The gateway routes an exec approval only to a client that
/// says it handles them (`exec-approvals`, or `approvals` for every kind) or is one of its own
/// apps; with no such client connected it denies a headless exec at once. Only exec approvals
/// are mirrored, so only they are claimed: plugin approvals stay with whoever handles them.
pub(crate) const CAPS: [&str; 1] = ["exec-approvals"];

/// A gateway frame.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "lowercase")]
pub(crate) enum Frame {
    Req {
        id: String,
        method: String,
        #[serde(default, skip_serializing_if = "Value::is_null")]
        params: Value,
    },
    Res {
        id: String,
        ok: bool,
        #[serde(default, skip_serializing_if = "Value::is_null")]
        payload: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<GatewayError>,
    },
    Event {
        event: String,
        #[serde(default)]
        payload: Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seq: Option<u64>,
    },
}

/// A `res ok:false` error.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub(crate) struct GatewayError {
    #[serde(default)]
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) details: Option<Value>,
    /// The gateway says the same request may succeed later (a gateway still starting).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) retryable: bool,
    /// How long the gateway asks to be left before that.
    #[serde(
        default,
        rename = "retryAfterMs",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) retry_after_ms: Option<u64>,
}

impl GatewayError {
    /// Whether the gateway cannot serve the request now but may later: it says `retryable`,
    /// or `UNAVAILABLE` (a gateway still starting its sidecars refuses every `connect` so,
    /// and closes with 1013 "gateway starting"). Such a refusal is waited out, never taken
    /// for a verdict on who the adapter is.
    pub(crate) fn is_transient(&self) -> bool {
        self.retryable || self.code == "UNAVAILABLE"
    }

    /// The pause the gateway asked for, if any.
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        self.retry_after_ms.map(Duration::from_millis)
    }
}

impl std::fmt::Display for GatewayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

/// The connection is gone (closed, broken, or silent past a deadline).
#[derive(Debug, Clone)]
pub(crate) struct Lost(pub(crate) String);

/// How the handshake failed.
#[derive(Debug)]
pub(crate) enum HandshakeError {
    /// The transport failed; try again later.
    Lost(Lost),
    /// The gateway cannot take the connection yet ([`GatewayError::is_transient`]).
    Unavailable(GatewayError),
    /// The gateway answered `connect` with `ok:false` for good.
    Refused(GatewayError),
}

/// Who the adapter says it is in `connect`.
#[derive(Debug, Clone)]
pub(crate) struct ClientInfo {
    pub(crate) id: String,
    pub(crate) mode: String,
    pub(crate) display_name: String,
    pub(crate) version: String,
    pub(crate) platform: String,
}

/// What the adapter authenticates with.
#[derive(Debug, Clone, Default)]
pub(crate) struct Credentials {
    /// The gateway's shared token.
    pub(crate) gateway_token: Option<String>,
    /// The device token an earlier `hello-ok` issued.
    pub(crate) device_token: Option<String>,
}

/// Events kept while a request waits for its answer, at most. The socket must be read to find
/// the answer, so a gateway that sends more meanwhile cannot be held back: the rest are
/// dropped, [`Conn::overflowed`] is set, and the adapter backfills once it has handled the
/// kept ones — the same recovery as after a `seq` gap.
pub(crate) const MAX_BUFFERED: usize = 1024;

/// An open, authenticated connection.
pub(crate) struct Conn {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
    /// Events received while a request waited for its answer, oldest first; at most
    /// [`MAX_BUFFERED`].
    pub(crate) buffered: VecDeque<Frame>,
    /// Events were dropped because [`Conn::buffered`] was full: backfill.
    pub(crate) overflowed: bool,
    /// The newest event `seq` seen on this connection.
    pub(crate) last_seq: Option<u64>,
}

impl Conn {
    /// Opens the socket (no handshake yet).
    pub(crate) async fn open(url: &str, timeout: Duration) -> Result<Conn, Lost> {
        let (ws, _) = tokio::time::timeout(timeout, tokio_tungstenite::connect_async(url))
            .await
            .map_err(|_| Lost(format!("no WebSocket handshake within {timeout:?}")))?
            .map_err(|e| Lost(e.to_string()))?;
        Ok(Conn {
            ws,
            next_id: 0,
            buffered: VecDeque::new(),
            overflowed: false,
            last_seq: None,
        })
    }

    /// Waits for `connect.challenge`, then sends the signed `connect`; returns `hello-ok`.
    pub(crate) async fn handshake(
        &mut self,
        key: &DeviceKey,
        client: &ClientInfo,
        creds: &Credentials,
        timeout: Duration,
    ) -> Result<Value, HandshakeError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let (nonce, challenge_ts) = loop {
            let frame = tokio::time::timeout_at(deadline, self.recv())
                .await
                .map_err(|_| {
                    HandshakeError::Lost(Lost(format!(
                        "the gateway sent no `connect.challenge` within {timeout:?}"
                    )))
                })?
                .map_err(HandshakeError::Lost)?;
            if let Frame::Event { event, payload, .. } = frame
                && event == "connect.challenge"
            {
                // The signature's time is the challenge's `ts` (as OpenClaw's own client signs),
                // so it is the gateway's clock that the skew check compares, not ours.
                let ts = payload.get("ts").and_then(Value::as_i64);
                match payload.get("nonce").and_then(Value::as_str) {
                    Some(n) if !n.is_empty() => break (n.to_owned(), ts),
                    _ => {
                        return Err(HandshakeError::Lost(Lost(
                            "`connect.challenge` carried no nonce".into(),
                        )));
                    }
                }
            }
        };
        let signed_at_ms = challenge_ts.unwrap_or_else(now_ms);
        let params = connect_params(key, client, creds, &nonce, signed_at_ms);
        match self
            .call("connect", params, deadline - tokio::time::Instant::now())
            .await
        {
            Err(lost) => Err(HandshakeError::Lost(lost)),
            Ok(Err(e)) if e.is_transient() => Err(HandshakeError::Unavailable(e)),
            Ok(Err(refused)) => Err(HandshakeError::Refused(refused)),
            Ok(Ok(hello)) => Ok(hello),
        }
    }

    /// Sends a request and waits up to `timeout` for its answer; events meanwhile go to
    /// [`Conn::buffered`].
    pub(crate) async fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Result<Value, GatewayError>, Lost> {
        self.next_id += 1;
        let id = format!("wm-{}", self.next_id);
        self.send(&Frame::Req {
            id: id.clone(),
            method: method.to_owned(),
            params,
        })
        .await?;
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let frame = tokio::time::timeout_at(deadline, self.recv())
                .await
                .map_err(|_| Lost(format!("no answer to `{method}` within {timeout:?}")))??;
            match frame {
                Frame::Res {
                    id: rid,
                    ok,
                    payload,
                    error,
                } if rid == id => {
                    return Ok(if ok {
                        Ok(payload)
                    } else {
                        Err(error.unwrap_or_else(|| GatewayError {
                            code: "UNKNOWN".into(),
                            message: format!("`{method}` failed without saying why"),
                            ..GatewayError::default()
                        }))
                    });
                }
                Frame::Res { id: rid, .. } => {
                    tracing::debug!(id = %rid, "an answer to a request no longer waited for")
                }
                ev @ Frame::Event { .. } if self.buffered.len() < MAX_BUFFERED => {
                    self.buffered.push_back(ev)
                }
                Frame::Event { event, .. } => {
                    if !self.overflowed {
                        tracing::warn!(
                            max = MAX_BUFFERED,
                            %event,
                            %method,
                            "more gateway events arrived while waiting for an answer than are kept; dropping the rest and backfilling after"
                        );
                    }
                    self.overflowed = true;
                }
                Frame::Req { method, .. } => {
                    tracing::debug!(%method, "the gateway sent a request; operators answer none")
                }
            }
        }
    }

    /// The next frame from the socket (not from [`Conn::buffered`]). Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Result<Frame, Lost> {
        loop {
            let msg = match self.ws.next().await {
                None => return Err(Lost("the gateway closed the connection".into())),
                Some(Err(e)) => return Err(Lost(e.to_string())),
                Some(Ok(m)) => m,
            };
            let text = match msg {
                Message::Text(t) => t.to_string(),
                Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                Message::Close(c) => {
                    return Err(Lost(match c {
                        Some(c) if !c.reason.is_empty() => {
                            format!("the gateway closed the connection: {}", c.reason)
                        }
                        _ => "the gateway closed the connection".into(),
                    }));
                }
                _ => continue,
            };
            match serde_json::from_str::<Frame>(&text) {
                Ok(f) => return Ok(f),
                Err(e) => {
                    tracing::warn!(error = %e, "a gateway frame this adapter cannot read; skipped")
                }
            }
        }
    }

    async fn send(&mut self, frame: &Frame) -> Result<(), Lost> {
        let text = serde_json::to_string(frame).map_err(|e| Lost(e.to_string()))?;
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| Lost(e.to_string()))
    }

    /// Closes politely (best effort).
    pub(crate) async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(2), self.ws.close(None)).await;
    }
}

/// `connect.params`: protocol 4, operator role and scopes, the token, and the device signed
/// over the gateway's nonce.
pub(crate) fn connect_params(
    key: &DeviceKey,
    client: &ClientInfo,
    creds: &Credentials,
    nonce: &str,
    signed_at_ms: i64,
) -> Value {
    let scopes: Vec<String> = SCOPES.iter().map(|s| (*s).to_owned()).collect();
    let device_id = key.device_id();
    // The token the signature binds: the one the gateway checks first.
    let signed_token = creds
        .gateway_token
        .as_deref()
        .or(creds.device_token.as_deref())
        .unwrap_or("");
    let signature = key.sign(&AuthPayload {
        device_id: &device_id,
        client_id: &client.id,
        client_mode: &client.mode,
        role: ROLE,
        scopes: &scopes,
        signed_at_ms,
        token: signed_token,
        nonce,
        platform: &client.platform,
        device_family: "",
    });
    let mut auth = serde_json::Map::new();
    if let Some(t) = &creds.gateway_token {
        auth.insert("token".into(), json!(t));
    }
    if let Some(t) = &creds.device_token {
        auth.insert("deviceToken".into(), json!(t));
    }
    json!({
        "minProtocol": PROTOCOL,
        "maxProtocol": PROTOCOL,
        "client": {
            "id": client.id,
            "displayName": client.display_name,
            "version": client.version,
            "platform": client.platform,
            "mode": client.mode,
        },
        "role": ROLE,
        "scopes": scopes,
        "caps": CAPS,
        "auth": auth,
        "device": {
            "id": device_id,
            "publicKey": key.public_key(),
            "signature": signature,
            "signedAt": signed_at_ms,
            "nonce": nonce,
        },
    })
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openclaw::recorded;

    /// What the real gateway needs of an approver (`fixtures/openclaw/real/`: the recorded
    /// connect the gateway accepted): the `exec-approvals` capability, `operator.admin`, and a
    /// signature over the challenge's `ts`.
    #[test]
    fn connect_claims_exec_approvals_with_admin_scope_signed_at_the_challenge_ts() {
        let dir = tempfile::tempdir().unwrap();
        let key = DeviceKey::load_or_create(&dir.path().join("k.json")).unwrap();
        let client = ClientInfo {
            id: "gateway-client".into(),
            mode: "backend".into(),
            display_name: "waymark-adapter".into(),
            version: "0".into(),
            platform: "linux".into(),
        };
        let creds = Credentials {
            gateway_token: Some("T".into()),
            device_token: None,
        };
        let p = connect_params(&key, &client, &creds, "n-1", 1_796_159_803_980);
        assert_eq!(p["caps"], json!(["exec-approvals"]));
        assert_eq!(
            p["scopes"],
            json!([
                "operator.read",
                "operator.write",
                "operator.approvals",
                "operator.admin"
            ])
        );
        assert_eq!(p["device"]["signedAt"], 1_796_159_803_980_i64);
        assert!(
            recorded("challenge")["payload"]["ts"].as_i64().is_some(),
            "the real challenge carries `ts`"
        );
    }

    /// A real gateway started again listens before its sidecars are up and refuses every
    /// `connect` meanwhile (recorded from 2026.9.6): that refusal is transient, with the pause
    /// it asks for; a pairing refusal is not.
    #[test]
    fn a_gateway_still_starting_refuses_for_now_not_for_good() {
        let res: Frame = serde_json::from_value(recorded("starting: connect refused")).unwrap();
        let Frame::Res { ok, error, .. } = res else {
            panic!()
        };
        assert!(!ok);
        let error = error.unwrap();
        assert!(error.is_transient(), "{error:?}");
        assert_eq!(error.retry_after(), Some(Duration::from_millis(500)));
        let unpaired: GatewayError =
            serde_json::from_value(json!({"code": "NOT_PAIRED", "message": "pairing required"}))
                .unwrap();
        assert!(!unpaired.is_transient());
        assert_eq!(unpaired.retry_after(), None);
    }

    #[test]
    fn frames_read_and_write_in_the_gateway_shapes() {
        let ev: Frame = serde_json::from_str(
            r#"{"type":"event","event":"connect.challenge","payload":{"nonce":"n-123","ts":1737264000000}}"#,
        )
        .unwrap();
        assert!(
            matches!(ev, Frame::Event { ref event, seq: None, .. } if event == "connect.challenge")
        );
        let res: Frame = serde_json::from_str(
            r#"{"type":"res","id":"c1","ok":false,"error":{"code":"NOT_PAIRED","message":"pairing required"}}"#,
        )
        .unwrap();
        let Frame::Res { ok, error, .. } = res else {
            panic!()
        };
        assert!(!ok);
        assert_eq!(error.unwrap().message, "pairing required");
        let req = Frame::Req {
            id: "r9".into(),
            method: "exec.approval.resolve".into(),
            params: json!({"id": "ap_1", "decision": "allow-once"}),
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            json!({"type":"req","id":"r9","method":"exec.approval.resolve","params":{"id":"ap_1","decision":"allow-once"}})
        );
    }
}
