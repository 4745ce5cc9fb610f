//! The reference write gateway: a tiny "deploy to staging" service that does what SPEC §4 asks
//! of every provider Waymark agents write to. It dedups on the idempotency key (a repeat
//! returns the first result, never deploys twice), refuses a write whose fence is older than
//! one it has seen for the task, and keeps its log durably so a crash loses nothing.
//!
//! Its request and reply bodies are this service's own API, not Waymark's: a real provider
//! would have its own, and [`DeployClient`] is the adapter an agent author writes for it.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::effect::{EffectCtx, ProviderError, ProviderStatus, Reconciler};

/// `POST /deploy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployRequest {
    /// The caller's idempotency key: a repeat returns the first result.
    pub idempotency_key: String,
    /// The Waymark task deploying.
    pub task_id: String,
    /// The attempt's fence; older than one already seen for the task → refused.
    pub fence: i64,
    /// Where to, e.g. `staging`.
    pub target: String,
    /// What, e.g. a git commit.
    pub commit: String,
}

/// A deploy that happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployRecord {
    /// `dep-N`, in the order deploys happened.
    pub deploy_id: String,
    /// The key it was made under.
    pub idempotency_key: String,
    /// The task.
    pub task_id: String,
    /// The fence it carried.
    pub fence: i64,
    /// Where to.
    pub target: String,
    /// What.
    pub commit: String,
    /// When.
    pub deployed_at: DateTime<Utc>,
}

/// A write refused because its fence was stale.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Refusal {
    /// The key it carried.
    pub idempotency_key: String,
    /// The task.
    pub task_id: String,
    /// The stale fence.
    pub fence: i64,
    /// The highest fence seen for the task then.
    pub highest_fence: i64,
    /// When.
    pub at: DateTime<Utc>,
}

/// Everything the service has done: what `GET /deploys` answers, and what the state file
/// holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeployLog {
    /// Deploys, oldest first.
    pub deploys: Vec<DeployRecord>,
    /// Stale writes refused.
    pub refusals: Vec<Refusal>,
    /// The highest fence seen per task.
    pub highest_fence: BTreeMap<String, i64>,
}

impl DeployLog {
    /// Reads the state file (an empty log when it does not exist yet).
    pub fn load(path: &Path) -> std::io::Result<Self> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(DeployLog::default()),
            Err(e) => Err(e),
        }
    }

    /// Writes it durably: a temporary file, fsync, rename over the old one, fsync the dir.
    fn save(&self, path: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    }

    /// The deploy made under `key`.
    pub fn by_key(&self, key: &str) -> Option<&DeployRecord> {
        self.deploys.iter().find(|d| d.idempotency_key == key)
    }
}

#[derive(Debug, Clone)]
struct Service {
    path: Arc<PathBuf>,
    log: Arc<Mutex<DeployLog>>,
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, Json(body)).into_response()
}

fn storage_error(e: std::io::Error) -> Response {
    reply(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"error": "storage", "reason": format!("the deploy log could not be written: {e}; nothing was deployed")}),
    )
}

async fn deploy(State(svc): State<Service>, Json(req): Json<DeployRequest>) -> Response {
    let mut log = svc.log.lock().await;
    let highest = log.highest_fence.get(&req.task_id).copied().unwrap_or(0);
    if req.fence < highest {
        let mut next = log.clone();
        next.refusals.push(Refusal {
            idempotency_key: req.idempotency_key.clone(),
            task_id: req.task_id.clone(),
            fence: req.fence,
            highest_fence: highest,
            at: Utc::now(),
        });
        if let Err(e) = next.save(&svc.path) {
            return storage_error(e);
        }
        *log = next;
        return reply(
            StatusCode::CONFLICT,
            json!({
                "error": "stale_fence",
                "reason": format!(
                    "fence {} is older than fence {highest} already seen for task `{}`: a newer worker holds the task; this write is refused",
                    req.fence, req.task_id
                ),
                "highest_fence": highest,
            }),
        );
    }
    if let Some(first) = log.by_key(&req.idempotency_key) {
        if first.target != req.target || first.commit != req.commit || first.task_id != req.task_id
        {
            return reply(
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({
                    "error": "idempotency_mismatch",
                    "reason": format!("key `{}` was used for a different deploy ({}); use a new key", req.idempotency_key, first.deploy_id),
                }),
            );
        }
        let mut body = serde_json::to_value(first).unwrap_or_default();
        body["repeat"] = json!(true);
        return reply(StatusCode::OK, body);
    }
    let mut next = log.clone();
    let record = DeployRecord {
        deploy_id: format!("dep-{}", next.deploys.len() + 1),
        idempotency_key: req.idempotency_key,
        task_id: req.task_id.clone(),
        fence: req.fence,
        target: req.target,
        commit: req.commit,
        deployed_at: Utc::now(),
    };
    next.highest_fence.insert(req.task_id, req.fence);
    next.deploys.push(record.clone());
    // Durable before the reply: an acknowledged deploy survives a crash of this service.
    if let Err(e) = next.save(&svc.path) {
        return storage_error(e);
    }
    *log = next;
    let mut body = serde_json::to_value(&record).unwrap_or_default();
    body["repeat"] = json!(false);
    reply(StatusCode::CREATED, body)
}

async fn one(State(svc): State<Service>, UrlPath(key): UrlPath<String>) -> Response {
    match svc.log.lock().await.by_key(&key) {
        Some(d) => reply(StatusCode::OK, serde_json::to_value(d).unwrap_or_default()),
        None => reply(
            StatusCode::NOT_FOUND,
            json!({"error": "not_found", "reason": format!("no deploy was made under key `{key}`")}),
        ),
    }
}

async fn all(State(svc): State<Service>) -> Response {
    let log = svc.log.lock().await;
    reply(
        StatusCode::OK,
        serde_json::to_value(&*log).unwrap_or_default(),
    )
}

/// The service's routes over the state file at `state_path` (loaded now).
pub fn router(state_path: &Path) -> std::io::Result<Router> {
    let log = DeployLog::load(state_path)?;
    let svc = Service {
        path: Arc::new(state_path.to_owned()),
        log: Arc::new(Mutex::new(log)),
    };
    Ok(Router::new()
        .route("/deploy", post(deploy))
        .route("/deploys", get(all))
        .route("/deploys/{key}", get(one))
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(svc))
}

/// Serves the deploy service on `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, state_path: PathBuf) -> std::io::Result<()> {
    let app = router(&state_path)?;
    axum::serve(listener, app).await
}

/// Why a deploy service query failed.
#[derive(Debug, thiserror::Error)]
#[error("deploy service at {url}: {reason}")]
pub struct DeployServiceError {
    /// Where.
    pub url: String,
    /// What went wrong.
    pub reason: String,
}

/// The agent's client of the deploy service: the provider call and its [`Reconciler`].
#[derive(Debug, Clone)]
pub struct DeployClient {
    http: reqwest::Client,
    base: url::Url,
}

impl DeployClient {
    /// A client of the service at `base_url`.
    pub fn new(base_url: &str) -> Result<Self, DeployServiceError> {
        let err = |reason: String| DeployServiceError {
            url: base_url.to_owned(),
            reason,
        };
        let base = url::Url::parse(base_url).map_err(|e| err(e.to_string()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| err(e.to_string()))?;
        Ok(DeployClient { http, base })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base.as_str().trim_end_matches('/'), path)
    }

    fn error(&self, reason: impl Into<String>) -> DeployServiceError {
        DeployServiceError {
            url: self.base.to_string(),
            reason: reason.into(),
        }
    }

    /// Deploys `commit` to `target` under the effect's key and fence. The receipt is the
    /// service's [`DeployRecord`].
    pub async fn deploy(
        &self,
        ctx: &EffectCtx,
        target: &str,
        commit: &str,
    ) -> Result<Value, ProviderError> {
        let req = DeployRequest {
            idempotency_key: ctx.idempotency_key.clone(),
            task_id: ctx.task_id.clone(),
            fence: ctx.fence,
            target: target.to_owned(),
            commit: commit.to_owned(),
        };
        let res = self
            .http
            .post(self.url("/deploy"))
            .json(&req)
            .send()
            .await
            .map_err(|e| ProviderError::Unknown {
                reason: format!(
                    "the deploy request failed in transit ({}); whether it deployed is not known",
                    crate::client::root_cause(&e)
                ),
            })?;
        let status = res.status();
        let body: Value = res.json().await.map_err(|e| ProviderError::Unknown {
            reason: format!("the deploy reply ({status}) could not be read: {e}"),
        })?;
        if status.is_success() {
            let record: DeployRecord =
                serde_json::from_value(body.clone()).map_err(|e| ProviderError::Unknown {
                    reason: format!("the deploy reply is not a deploy record: {e}"),
                })?;
            return Ok(serde_json::to_value(record).unwrap_or(body));
        }
        let reason = body["reason"]
            .as_str()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("HTTP {status}"));
        if status.is_client_error() {
            Err(ProviderError::Failed {
                compensable: false,
                reason: format!("the deploy service refused: {reason}"),
            })
        } else {
            Err(ProviderError::Unknown { reason })
        }
    }

    /// The deploy made under `key`, if any. Only the service's own "no such key" answer
    /// counts as none; anything else it cannot vouch for is an error.
    pub async fn get(&self, key: &str) -> Result<Option<DeployRecord>, DeployServiceError> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|_| self.error("the deploy service URL cannot take a path"))?
            .pop_if_empty()
            .extend(["deploys", key]);
        let res = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.error(crate::client::root_cause(&e)))?;
        match res.status() {
            StatusCode::NOT_FOUND => {
                let body: Value = res.json().await.unwrap_or_default();
                if body["error"] == "not_found" {
                    Ok(None)
                } else {
                    Err(self.error(format!(
                        "`GET /deploys/{key}` answered 404 without saying the key is unknown"
                    )))
                }
            }
            s if s.is_success() => res
                .json()
                .await
                .map(Some)
                .map_err(|e| self.error(e.to_string())),
            s => Err(self.error(format!("HTTP {s}"))),
        }
    }

    /// Everything the service did.
    pub async fn log(&self) -> Result<DeployLog, DeployServiceError> {
        let res = self
            .http
            .get(self.url("/deploys"))
            .send()
            .await
            .map_err(|e| self.error(crate::client::root_cause(&e)))?;
        if !res.status().is_success() {
            return Err(self.error(format!("HTTP {}", res.status())));
        }
        res.json().await.map_err(|e| self.error(e.to_string()))
    }
}

impl Reconciler for DeployClient {
    async fn query(&self, ctx: &EffectCtx) -> ProviderStatus {
        match self.get(&ctx.idempotency_key).await {
            Ok(Some(record)) => {
                ProviderStatus::Confirmed(serde_json::to_value(record).unwrap_or_default())
            }
            Ok(None) => ProviderStatus::NotStarted,
            Err(e) => ProviderStatus::Unknown {
                reason: e.to_string(),
            },
        }
    }
}
