//! The HTTP client of API v1: one place that sends, retries what is safe to retry, and turns
//! `application/problem+json` into typed errors. `Run` builds on it.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;
use waymark_proto::{CreateTask, Decision, ErrorCode, Health, Problem, Task, TaskDetail};

use crate::error::{Error, Result};
use waymark_tls_pin::SERVER_FP_ENV;

/// Timeout of an ordinary request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a request may be sent again after a failure whose effect is not known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Repeating it changes nothing (reads, heartbeats, effect declarations and updates).
    Always,
    /// Only when it certainly did not arrive: the connection failed or the server said 503.
    IfUndelivered,
}

/// A request body.
#[derive(Debug, Clone)]
pub(crate) enum Payload {
    None,
    Json(Vec<u8>),
    Raw { bytes: Vec<u8>, media_type: String },
}

impl Payload {
    pub(crate) fn json(value: &impl Serialize) -> Result<Self> {
        serde_json::to_vec(value)
            .map(Payload::Json)
            .map_err(|e| Error::Transport(format!("the request does not serialise: {e}")))
    }
}

/// A client of one control plane with one worker token. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: Url,
    token: String,
    pin: Option<String>,
}

/// Builds a [`Client`]: where, with which token, and whom to trust.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    base_url: String,
    token: String,
    pin: Option<String>,
}

impl ClientBuilder {
    /// Trusts exactly the server certificate with this fingerprint (`sha256:<hex>`, the `TLS:`
    /// line of `waymark serve`, the `fp=` of a pairing link) instead of the public CAs: a
    /// self-signed certificate is accepted, any other certificate is refused before a byte is
    /// sent ([`Error::CertificateMismatch`]). The handshake signatures are still verified.
    pub fn pin(mut self, fingerprint: impl Into<String>) -> Self {
        self.pin = Some(fingerprint.into());
        self
    }

    /// [`ClientBuilder::pin`] with the fingerprint in [`SERVER_FP_ENV`] (`WAYMARK_SERVER_FP`),
    /// when it is set and not empty; otherwise nothing changes.
    pub fn pin_from_env(self) -> Self {
        self.pin_from(std::env::var(SERVER_FP_ENV).ok())
    }

    fn pin_from(self, value: Option<String>) -> Self {
        match value {
            Some(fp) if !fp.trim().is_empty() => self.pin(fp),
            _ => self,
        }
    }

    /// The client; a pin must be a fingerprint, and pins only an `https://` server.
    pub fn build(self) -> Result<Client> {
        let base = Url::parse(&self.base_url).map_err(|e| Error::Unreachable {
            url: self.base_url.clone(),
            reason: format!("not a URL ({e}); give one like `http://127.0.0.1:7700`"),
        })?;
        let mut http = reqwest::Client::builder().connect_timeout(Duration::from_secs(5));
        let pin = match &self.pin {
            None => None,
            Some(pin) => {
                let pin = waymark_tls_pin::parse_pin(pin).map_err(|e| {
                    Error::Config(format!("`{SERVER_FP_ENV}` / `--server-fp`: {e}"))
                })?;
                if base.scheme() != "https" {
                    return Err(Error::Config(format!(
                        "a certificate pin ({SERVER_FP_ENV}) needs an `https://` server, not `{base}`: give the server's `https://` URL or drop the pin"
                    )));
                }
                let tls = waymark_tls_pin::client_config(&pin)
                    .map_err(|e| Error::Config(e.to_string()))?;
                http = http.use_preconfigured_tls(tls);
                Some(pin)
            }
        };
        let http = http.build().map_err(|e| Error::Transport(e.to_string()))?;
        Ok(Client {
            http,
            base,
            token: self.token,
            pin,
        })
    }
}

impl Client {
    /// A client of the control plane at `base_url` (e.g. `http://127.0.0.1:7700`), acting with
    /// a worker token from `waymark admin worker-token`, trusting the public CAs for
    /// `https://`. [`Client::builder`] pins a certificate instead.
    pub fn new(base_url: &str, worker_token: impl Into<String>) -> Result<Self> {
        Self::builder(base_url, worker_token).build()
    }

    /// A [`ClientBuilder`] for the control plane at `base_url` with a worker token.
    pub fn builder(base_url: &str, worker_token: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.to_owned(),
            token: worker_token.into(),
            pin: None,
        }
    }

    /// The pinned certificate fingerprint (`sha256:<hex>`), if any.
    pub fn pin(&self) -> Option<&str> {
        self.pin.as_deref()
    }

    /// The control plane's base URL.
    pub fn base_url(&self) -> &Url {
        &self.base
    }

    /// `GET /healthz`: whether the server answers.
    pub async fn health(&self) -> Result<Health> {
        self.call(
            Method::GET,
            "/healthz",
            &[],
            Payload::None,
            Resend::Always,
            None,
        )
        .await
    }

    /// `POST /v1/tasks`.
    pub async fn create_task(&self, req: &CreateTask) -> Result<Task> {
        self.call(
            Method::POST,
            "/v1/tasks",
            &[],
            Payload::json(req)?,
            Resend::IfUndelivered,
            None,
        )
        .await
    }

    /// `GET /v1/tasks/{task}`: the whole thread.
    pub async fn task(&self, task_id: &str) -> Result<TaskDetail> {
        self.call(
            Method::GET,
            &format!("/v1/tasks/{task_id}"),
            &[],
            Payload::None,
            Resend::Always,
            None,
        )
        .await
    }

    /// `GET /v1/tasks/{task}/decisions/{decision}?wait=…`: the decision, once it is no longer
    /// pending or `wait` has passed.
    pub async fn decision(
        &self,
        task_id: &str,
        decision_id: &str,
        wait: Duration,
    ) -> Result<Decision> {
        self.call(
            Method::GET,
            &format!("/v1/tasks/{task_id}/decisions/{decision_id}"),
            &[("wait", format!("{}s", wait.as_secs()))],
            Payload::None,
            Resend::Always,
            Some(wait + REQUEST_TIMEOUT),
        )
        .await
    }

    /// Sends a request, retrying with backoff what [`Resend`] allows, and decodes the reply.
    pub(crate) async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        payload: Payload,
        resend: Resend,
        timeout: Option<Duration>,
    ) -> Result<T> {
        let once = || self.once::<T>(method.clone(), path, query, &payload, timeout);
        once.retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(2))
                .with_max_times(4)
                .with_jitter(),
        )
        .sleep(tokio::time::sleep)
        .when(|e: &Error| match resend {
            Resend::Always => e.is_transient(),
            Resend::IfUndelivered => {
                matches!(e, Error::Unreachable { .. }) || e.code() == Some(ErrorCode::Unavailable)
            }
        })
        .notify(|e: &Error, after: Duration| {
            tracing::debug!(error = %e, ?after, %path, "retrying");
        })
        .await
    }

    async fn once<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        payload: &Payload,
        timeout: Option<Duration>,
    ) -> Result<T> {
        let res = self.send(method, path, query, payload, timeout).await?;
        decode(res).await
    }

    /// Sends once, without decoding; connection failures become [`Error::Unreachable`].
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        payload: &Payload,
        timeout: Option<Duration>,
    ) -> Result<reqwest::Response> {
        let url = self.base.join(path).map_err(|e| Error::Unreachable {
            url: self.base.to_string(),
            reason: format!("cannot form a URL for `{path}`: {e}"),
        })?;
        let mut req = self
            .http
            .request(method, url)
            .bearer_auth(&self.token)
            .query(query);
        if let Some(t) = timeout.or(Some(REQUEST_TIMEOUT)) {
            req = req.timeout(t);
        }
        req = match payload {
            Payload::None => req,
            Payload::Json(b) => req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.clone()),
            Payload::Raw { bytes, media_type } => req
                .header(reqwest::header::CONTENT_TYPE, media_type.as_str())
                .body(bytes.clone()),
        };
        req.send().await.map_err(|e| self.transport(e))
    }

    fn transport(&self, e: reqwest::Error) -> Error {
        if let Some(m) = waymark_tls_pin::find_mismatch(&e) {
            return Error::CertificateMismatch {
                pinned: m.pinned.clone(),
                presented: m.presented.clone(),
            };
        }
        if e.is_connect() {
            let mut reason = root_cause(&e);
            if waymark_tls_pin::is_unknown_issuer(&e) {
                reason.push_str(&format!(
                    " — no public CA vouches for this server's certificate; pin it with `{SERVER_FP_ENV}=sha256:…` (the `TLS:` line `waymark serve` prints)"
                ));
            }
            Error::Unreachable {
                url: self.base.to_string(),
                reason,
            }
        } else {
            Error::Transport(root_cause(&e))
        }
    }
}

/// Decodes a reply: the body on success, a typed error otherwise.
pub(crate) async fn decode<T: DeserializeOwned>(res: reqwest::Response) -> Result<T> {
    let status = res.status();
    let bytes = res
        .bytes()
        .await
        .map_err(|e| Error::Transport(root_cause(&e)))?;
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| {
            Error::Transport(format!(
                "the reply ({status}) is not what API v1 answers: {e}"
            ))
        });
    }
    Err(problem_of(status, &bytes))
}

/// The typed error of a non-success reply.
pub(crate) fn problem_of(status: StatusCode, bytes: &[u8]) -> Error {
    match serde_json::from_slice::<Problem>(bytes) {
        Ok(p) => Error::from_problem(p),
        Err(_) => {
            let code = match status.as_u16() {
                503 => ErrorCode::Unavailable,
                404 => ErrorCode::NotFound,
                401 => ErrorCode::Unauthorized,
                403 => ErrorCode::Forbidden,
                _ => ErrorCode::Internal,
            };
            let text = String::from_utf8_lossy(bytes);
            let text: String = text.chars().take(200).collect();
            Error::from_problem(Problem::new(code, format!("HTTP {status}: {text}")))
        }
    }
}

/// The innermost cause of an error, which is the part people can act on.
pub(crate) fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: &(dyn std::error::Error + 'static) = e;
    let mut text = e.to_string();
    while let Some(next) = cur.source() {
        text = next.to_string();
        cur = next;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_pins_only_when_it_names_a_fingerprint() {
        let fp = format!("sha256:{}", "ab".repeat(32));
        let b = || Client::builder("https://127.0.0.1:1", "wmk_w_x");
        assert_eq!(b().pin_from(None).pin, None);
        assert_eq!(b().pin_from(Some("  ".into())).pin, None);
        assert_eq!(b().pin_from(Some(fp.clone())).pin, Some(fp.clone()));
        // A malformed one is not dropped silently: building says what is wrong.
        let e = b().pin_from(Some("sha256:zz".into())).build().unwrap_err();
        assert!(e.to_string().contains(SERVER_FP_ENV), "{e}");
        // Without the variable set, nothing is pinned.
        if std::env::var_os(SERVER_FP_ENV).is_none() {
            assert_eq!(b().pin_from_env().build().unwrap().pin(), None);
        }
    }
}
