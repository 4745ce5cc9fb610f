//! The device side of HTTP API v1, as the companion speaks it: pairing, sessions, snapshot,
//! thread detail, blobs, the event stream and signed commands.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::{Stream, StreamExt};
use serde::de::DeserializeOwned;
use waymark_proto::*;

use crate::error::Error;

#[derive(Clone)]
pub(crate) struct Api {
    http: reqwest::Client,
    base: String,
}

/// A transport failure, with its causes (reqwest's own message leaves them out); a pinned
/// server that presented another certificate is [`Error::CertificateMismatch`].
fn unreachable(base: &str, e: reqwest::Error) -> Error {
    if let Some(m) = waymark_tls_pin::find_mismatch(&e) {
        return Error::CertificateMismatch {
            pinned: m.pinned.clone(),
            presented: m.presented.clone(),
        };
    }
    let mut why = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        let text = c.to_string();
        if !why.contains(&text) {
            why = format!("{why}: {text}");
        }
        cause = c.source();
    }
    if waymark_tls_pin::is_unknown_issuer(&e) {
        why.push_str(
            " — no public CA vouches for this server's certificate; pair with a link from `waymark admin pair` that carries its fingerprint (`fp=`)",
        );
    }
    Error::Unreachable(format!("{base}: {why}"))
}

impl Api {
    /// A client for `base`; with `pin` (`sha256:<hex>`), it trusts exactly that certificate,
    /// otherwise the public CAs.
    pub(crate) fn new(base: &str, pin: Option<&str>) -> Result<Self, Error> {
        let mut builder = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        if let Some(pin) = pin {
            let tls = waymark_tls_pin::client_config(pin).map_err(|e| match e {
                waymark_tls_pin::PinError::NotAFingerprint(_) => Error::Invalid(e.to_string()),
                waymark_tls_pin::PinError::Tls(_) => Error::Protocol(e.to_string()),
            })?;
            builder = builder.use_preconfigured_tls(tls);
        }
        let http = builder
            .build()
            .map_err(|e| Error::Protocol(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Api {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    async fn decode<T: DeserializeOwned>(&self, res: reqwest::Response) -> Result<T, Error> {
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| unreachable(&self.base, e))?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                Error::Protocol(format!("unexpected answer from {}: {e}", self.base))
            });
        }
        match serde_json::from_slice::<Problem>(&bytes) {
            Ok(p) if p.code == ErrorCode::CursorExpired => Err(Error::CursorExpired),
            Ok(p) => Err(Error::Refused {
                code: p.code.as_str().to_owned(),
                detail: p.detail,
            }),
            Err(_) => Err(Error::Protocol(format!("{} answered {status}", self.base))),
        }
    }

    pub(crate) async fn pair(&self, req: &PairDevice) -> Result<Device, Error> {
        let res = self
            .http
            .post(format!("{}/v1/devices/pair", self.base))
            .json(req)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        self.decode(res).await
    }

    pub(crate) async fn open_session(
        &self,
        device_id: &str,
        env: &SignedEnvelope,
    ) -> Result<DeviceSession, Error> {
        let res = self
            .http
            .post(format!("{}/v1/devices/{device_id}/session", self.base))
            .json(env)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        if res.status().is_success() {
            return self.decode(res).await;
        }
        let status = res.status();
        let body: serde_json::Value = res.json().await.unwrap_or_default();
        let reason = body
            .get("reason")
            .and_then(|r| r.as_str())
            .unwrap_or("refused")
            .to_owned();
        let detail = body
            .get("detail")
            .and_then(|r| r.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{status}"));
        Err(Error::Refused {
            code: reason,
            detail,
        })
    }

    pub(crate) async fn get<T: DeserializeOwned>(
        &self,
        token: &str,
        path: &str,
    ) -> Result<T, Error> {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        self.decode(res).await
    }

    pub(crate) async fn post<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        token: &str,
        path: &str,
        body: &B,
    ) -> Result<T, Error> {
        self.send_json(reqwest::Method::POST, token, path, body)
            .await
    }

    pub(crate) async fn put<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        token: &str,
        path: &str,
        body: &B,
    ) -> Result<T, Error> {
        self.send_json(reqwest::Method::PUT, token, path, body)
            .await
    }

    async fn send_json<B: serde::Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: &B,
    ) -> Result<T, Error> {
        let res = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        self.decode(res).await
    }

    /// A `DELETE` answered `204 No Content` (or a problem).
    pub(crate) async fn delete(&self, token: &str, path: &str) -> Result<(), Error> {
        let res = self
            .http
            .delete(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        if res.status().is_success() {
            return Ok(());
        }
        self.decode::<serde_json::Value>(res).await.map(drop)
    }

    pub(crate) async fn blob(&self, token: &str, sha256: &str) -> Result<Vec<u8>, Error> {
        let res = self
            .http
            .get(format!("{}/v1/blobs/{sha256}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        if !res.status().is_success() {
            return self
                .decode::<serde_json::Value>(res)
                .await
                .map(|_| Vec::new());
        }
        Ok(res
            .bytes()
            .await
            .map_err(|e| unreachable(&self.base, e))?
            .to_vec())
    }

    /// Submits a signed command. Every answer (applied, duplicate, conflict, rejected) is a
    /// `CommandResult`; only transport failures are errors.
    pub(crate) async fn submit(&self, env: &SignedEnvelope) -> Result<CommandResult, Error> {
        let res = self
            .http
            .post(format!("{}/v1/commands", self.base))
            .json(env)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| unreachable(&self.base, e))?;
        serde_json::from_slice(&bytes).map_err(|_| {
            match serde_json::from_slice::<Problem>(&bytes) {
                Ok(p) => Error::Refused {
                    code: p.code.as_str().to_owned(),
                    detail: p.detail,
                },
                Err(_) => Error::Protocol(format!("{} answered {status} to a command", self.base)),
            }
        })
    }

    /// The event stream from `after`. 410 → `CursorExpired`.
    pub(crate) async fn events(
        &self,
        token: &str,
        after: i64,
    ) -> Result<impl Stream<Item = Result<Event, Error>> + use<>, Error> {
        let res = self
            .http
            .get(format!("{}/v1/events?after={after}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| unreachable(&self.base, e))?;
        if !res.status().is_success() {
            return Err(self
                .decode::<serde_json::Value>(res)
                .await
                .err()
                .unwrap_or(Error::Protocol("event stream refused".into())));
        }
        Ok(decode_events(res.bytes_stream(), self.base.clone()))
    }
}

/// Decodes a `text/event-stream` body from `base` into events: `cursor_expired` becomes
/// `Error::CursorExpired`, an event that is not an `Event` a protocol error, a broken body — or
/// an event past [`waymark_proto::sse::MAX_EVENT_BYTES`] — an unreachable server. Public so the fuzz target drives the exact parsing the sync engine uses.
pub fn decode_events<S, B, E>(body: S, base: String) -> impl Stream<Item = Result<Event, Error>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    decode_events_within(body, base, waymark_proto::sse::MAX_EVENT_BYTES)
}

/// [`decode_events`] with events bounded at `max_event` bytes.
fn decode_events_within<S, B, E>(
    body: S,
    base: String,
    max_event: usize,
) -> impl Stream<Item = Result<Event, Error>>
where
    S: Stream<Item = Result<B, E>>,
    B: AsRef<[u8]>,
    E: std::fmt::Display,
{
    // The body ends at the first event past the bound: the bytes after it cannot be trusted
    // to start an event, so the stream breaks there like a broken connection.
    let bound = Some(waymark_proto::sse::EventBound::new(max_event));
    let body = body.scan(bound, |bound, chunk| {
        let item = match (bound.as_mut(), chunk) {
            (None, _) => None,
            (Some(b), Ok(bytes)) => match b.check(bytes.as_ref()) {
                Ok(()) => Some(Ok(bytes)),
                Err(e) => {
                    *bound = None;
                    Some(Err(e.to_string()))
                }
            },
            (Some(_), Err(e)) => Some(Err(e.to_string())),
        };
        std::future::ready(item)
    });
    body.eventsource().map(move |item| match item {
        Ok(ev) if ev.event == "cursor_expired" => Err(Error::CursorExpired),
        Ok(ev) => serde_json::from_str::<Event>(&ev.data)
            .map_err(|e| Error::Protocol(format!("bad event from {base}: {e}"))),
        Err(e) => Err(Error::Unreachable(format!(
            "{base}: the event stream broke: {e}"
        ))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn an_event_that_never_ends_breaks_the_stream_instead_of_growing_memory() {
        let mut chunks: Vec<Result<Vec<u8>, std::io::Error>> =
            vec![Ok(b"event: cursor_expired\ndata: {}\n\n".to_vec())];
        // One event of endless data lines: no blank line ever ends it.
        chunks.extend((0..1_000).map(|_| Ok(b"data: 0123456789abcdef\n".to_vec())));
        let events: Vec<_> =
            decode_events_within(futures::stream::iter(chunks), "http://s".into(), 4_096)
                .collect()
                .await;
        assert!(matches!(events[0], Err(Error::CursorExpired)), "{events:?}");
        assert_eq!(events.len(), 2, "{events:?}");
        match &events[1] {
            Err(Error::Unreachable(m)) => assert!(m.contains("more than 4096 bytes"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
