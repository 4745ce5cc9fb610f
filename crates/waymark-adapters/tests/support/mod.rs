//! What every adapter test needs: a real control plane on a temp dir with a worker token, a
//! phone paired to it that answers with signed commands (as the companion does), HTTP to it,
//! and polling with a deadline. Each test binary uses part of it.
#![allow(dead_code, unreachable_pub)]

pub mod fake_model;
pub mod fake_responses;
pub mod openclaw_gateway;
pub mod real_acp;

use std::time::Duration;

use serde_json::Value;
use waymark_proto::{Operation, SteerCommand, TaskDetail};
use waymark_server::{Config, DataDir, Running};
use waymark_worker::Client;

/// The user every test works as.
pub const USER: &str = "alice";

/// Sends the adapters' and the server's logs to the test's output (shown when it fails), at
/// `RUST_LOG` or, by default, the adapters' debug and the rest's warnings.
pub fn logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,waymark_adapters=debug"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Polls `probe` until it yields, for at most 30 s.
pub async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` until it yields, up to `limit` (a real runtime is an external process: its
/// pace is not ours to drive). On timeout, fails with `context()`.
pub async fn within<T, F, Fut>(
    limit: Duration,
    what: &str,
    context: impl Fn() -> String,
    mut probe: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Kills every process whose environment holds `needle` (`NAME=value`): what a real runtime
/// started under a test's private home, its helpers included, once the test is done.
pub fn kill_processes_with_env(needle: &str) {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}

/// Kills every process whose command line names `needle` (a test's private directory): the
/// shell and `tee`s a recording `--agent-cmd` wraps a runtime in, which otherwise keep the
/// adapter's pipe open after the runtime itself is gone.
pub fn kill_processes_naming(needle: &str) {
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.parse::<i32>().is_err() || name == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &name])
                .status();
        }
    }
}

/// One request; the body is JSON when it parses, else the text as a JSON string.
pub async fn http(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.json(b);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A control plane of our own, with a worker token for [`USER`].
pub struct ControlPlane {
    pub dir: tempfile::TempDir,
    pub server: Running,
    pub client: Client,
}

impl ControlPlane {
    /// Starts the server (a fast background tick) and makes `worker`'s token.
    pub async fn start(worker: &str) -> ControlPlane {
        logs();
        let dir = tempfile::tempdir().unwrap();
        let server = waymark_server::start(
            &DataDir::new(dir.path().join("server")),
            "127.0.0.1:0".parse().unwrap(),
            Config {
                tick: Duration::from_millis(100),
                ..Config::default()
            },
        )
        .await
        .unwrap();
        let store = server.state.store.clone();
        waymark_server::admin::add_user(&*store, USER)
            .await
            .unwrap();
        let (token, _) = waymark_server::admin::create_worker_token(&*store, worker, Some(USER))
            .await
            .unwrap();
        ControlPlane {
            client: Client::new(&server.url(), token).unwrap(),
            server,
            dir,
        }
    }

    /// Pairs a phone for [`USER`] that may view, steer and approve.
    pub async fn phone(&self) -> Phone {
        let scopes = ["view", "steer", "approve"].map(String::from);
        let (code, _) = waymark_server::steer::create_pairing(
            &*self.server.state.store,
            USER,
            &scopes,
            600_000,
        )
        .await
        .unwrap();
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let (status, paired) = http(
            reqwest::Method::POST,
            &format!("{}/v1/devices/pair", self.server.url()),
            None,
            Some(&serde_json::json!({
                "code": code.to_lowercase(),
                "name": "alice's phone",
                "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key()),
            })),
        )
        .await;
        assert_eq!(status, 201, "{paired}");
        Phone {
            id: paired["id"].as_str().unwrap().to_owned(),
            key,
            url: self.server.url(),
        }
    }

    /// A read with the admin token.
    pub async fn admin_get(&self, path: &str) -> (u16, Value) {
        http(
            reqwest::Method::GET,
            &format!("{}{path}", self.server.url()),
            Some(&self.server.admin_token),
            None,
        )
        .await
    }

    /// The tasks an adapter made for a runtime's own id.
    pub async fn tasks_of(&self, runtime: &str, key: &str) -> Vec<String> {
        let (status, snap) = self.admin_get("/v1/snapshot").await;
        assert_eq!(status, 200, "{snap}");
        snap["tasks"]
            .as_array()
            .unwrap()
            .iter()
            // A task summary carries the task's fields flattened.
            .map(|t| t.get("task").unwrap_or(t))
            .filter(|t| t["runtime"] == runtime && t["external_key"] == key)
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The task an adapter made for a runtime's own id, once it has.
    pub async fn task_of(&self, runtime: &str, key: &str) -> String {
        eventually(&format!("the {runtime} task of `{key}`"), || async {
            self.tasks_of(runtime, key).await.into_iter().next()
        })
        .await
    }

    pub async fn detail(&self, task: &str) -> TaskDetail {
        self.client.task(task).await.unwrap()
    }
}

/// A paired device with its private key.
pub struct Phone {
    pub id: String,
    pub key: ed25519_dalek::SigningKey,
    url: String,
}

impl Phone {
    /// Signs and submits a command; returns the HTTP status and the command result.
    pub async fn submit(
        &self,
        task: &str,
        revision: i64,
        op: Operation,
        args: Value,
    ) -> (u16, Value) {
        let now = chrono::Utc::now();
        let cmd = SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(task.to_owned()),
            expected_plan_revision: Some(revision),
            operation: op,
            scope: vec![],
            args,
            issued_by: format!("user:{USER}"),
            device_id: self.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(10),
        };
        let envelope =
            serde_json::to_value(waymark_proto::signing::sign(&cmd, &self.key).unwrap()).unwrap();
        http(
            reqwest::Method::POST,
            &format!("{}/v1/commands", self.url),
            None,
            Some(&envelope),
        )
        .await
    }

    /// A command that must apply.
    pub async fn command(&self, task: &str, revision: i64, op: Operation, args: Value) -> Value {
        let (status, body) = self.submit(task, revision, op, args).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "applied", "{body}");
        body
    }
}

/// What a dropped connection must leave of the call its approval guarded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CallAfterDrop {
    /// Closed as not run (`failed`, its receipt saying "not run"): the runtime makes it
    /// certain (the call waited on the approval, and the runtime holding it is gone).
    NotRun,
    /// `unknown`: nothing makes it certain (the approval outlived the connection and may have
    /// been answered elsewhere).
    Unknown,
}

/// What a runtime connection dropped under a pending approval must leave, whatever the
/// runtime: `drop_it` drops it (kills the runtime, or its gateway, and starts it again where
/// that is how the adapter finds out; its output is returned); then, within `limit`, the
/// approval `d` closes `expired` by the runtime with no option (never approved) and no
/// delivery, the effect `is_call` finds leaves `in_progress` as `call` says (never guessed),
/// and a person's late `approve` is refused, saying the decision expired (`decision_closed`)
/// or, when the adapter ended the task with its runtime, that the task is over
/// (`task_terminal`). Returns the closed decision, the effect and what `drop_it` gave; prints
/// how long the close took.
#[allow(clippy::too_many_arguments)]
pub async fn a_dropped_connection_expires_the_approval<T>(
    cp: &ControlPlane,
    phone: &Phone,
    task: &str,
    d: &waymark_proto::Decision,
    limit: Duration,
    drop_it: impl Future<Output = T>,
    is_call: impl Fn(&waymark_proto::Effect) -> bool,
    call: CallAfterDrop,
) -> (waymark_proto::Decision, waymark_proto::Effect, T) {
    use waymark_proto::{DecisionStatus, EffectStatus};
    let dropped = std::time::Instant::now();
    let dropped_with = drop_it.await;
    let closed = within(
        limit,
        "the approval closed by the dropped connection",
        String::new,
        || async {
            cp.detail(task)
                .await
                .decisions
                .into_iter()
                .find(|x| x.id == d.id && x.status != DecisionStatus::Pending)
        },
    )
    .await;
    eprintln!(
        "connection dropped → approval closed in {:?}",
        dropped.elapsed()
    );
    assert_eq!(closed.status, DecisionStatus::Expired, "{closed:?}");
    let outcome = closed
        .outcome
        .clone()
        .expect("a closed decision has an outcome");
    assert_eq!(outcome.option, None, "expired with no option: {outcome:?}");
    assert_eq!(outcome.by, "runtime", "{outcome:?}");
    assert!(
        outcome.text.as_deref().is_some_and(|t| !t.is_empty()),
        "the close says why: {outcome:?}"
    );
    assert!(
        closed.delivery.is_none(),
        "nothing was answered: {closed:?}"
    );
    let effect = within(limit, "the call's effect closed", String::new, || async {
        cp.detail(task).await.effects.into_iter().find(|e| {
            is_call(e) && e.status != EffectStatus::InProgress && e.status != EffectStatus::Intended
        })
    })
    .await;
    eprintln!(
        "connection dropped → effect closed in {:?}",
        dropped.elapsed()
    );
    if call == CallAfterDrop::Unknown {
        assert_eq!(effect.status, EffectStatus::Unknown, "{effect:?}");
    } else {
        assert_eq!(effect.status, EffectStatus::Failed, "{effect:?}");
        let why = effect
            .receipt
            .as_ref()
            .map(|r| r["error"].to_string())
            .unwrap_or_default();
        assert!(
            why.contains("not run"),
            "the effect says it was not run: {effect:?}"
        );
    }
    // A person who answers late is told the decision is closed, not silently ignored.
    let revision = cp.detail(task).await.task.plan_revision;
    let args = serde_json::json!({
        "decision_id": d.id, "intent_digest": d.intent_digest, "option": "approve",
    });
    let (status, body) = phone.submit(task, revision, Operation::Approve, args).await;
    assert_ne!(status, 200, "a late approve is refused: {body}");
    assert_eq!(body["status"], "rejected", "{body}");
    // Where the adapter ended the task with its runtime (an ACP session does not outlive its
    // agent), the refusal names the task's end first; else the decision's.
    let detail = body["detail"].as_str().unwrap_or_default();
    match body["reason"].as_str() {
        Some("decision_closed") => assert!(detail.contains("expired"), "{body}"),
        Some("task_terminal") => assert!(
            cp.detail(task).await.task.state.is_terminal() && detail.contains("the task is"),
            "{body}"
        ),
        _ => panic!("a late approve is refused as `decision_closed` or `task_terminal`: {body}"),
    }
    (closed, effect, dropped_with)
}
