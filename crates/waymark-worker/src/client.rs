//! The HTTP client of API v1: one place that sends, retries what is safe to retry, and turns
//! `application/problem+json` into typed errors. [`crate::Run`] builds on it.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use url::Url;
use waymark_proto::{CreateTask, Decision, ErrorCode, Health, Problem, Task, TaskDetail};

use crate::error::{Error, Result};
use crate::run::{AttemptOptions, Run};

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
}

impl Client {
    /// A client of the control plane at `base_url` (e.g. `http://127.0.0.1:7700`), acting with
    /// a worker token from `waymark admin worker-token`.
    pub fn new(base_url: &str, worker_token: impl Into<String>) -> Result<Self> {
        let base = Url::parse(base_url).map_err(|e| Error::Unreachable {
            url: base_url.to_owned(),
            reason: format!("not a URL ({e}); give one like `http://127.0.0.1:7700`"),
        })?;
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Transport(e.to_string()))?;
        Ok(Client {
            http,
            base,
            token: worker_token.into(),
        })
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

    /// Starts an attempt on a task (a new one, or one to resume): acquires the lease, loads the
    /// task's last checkpoint so [`Run::checkpoint`] continues the chain, and starts the
    /// heartbeat.
    pub async fn start_attempt(&self, task_id: &str, options: AttemptOptions) -> Result<Run> {
        Run::start(self.clone(), task_id, options).await
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
        if e.is_connect() {
            Error::Unreachable {
                url: self.base.to_string(),
                reason: root_cause(&e),
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
