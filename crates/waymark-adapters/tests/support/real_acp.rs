//! What the real-ACP-agent tests share (`real_opencode.rs`, `real_copilot.rs`): finding the
//! runtime `scripts/setup-debian` installed (or failing, never skipping, with how to install
//! it), running the generic ACP adapter on it as `waymark adapters acp` does, and the inbox
//! side of one turn: the session's task, its pending approval, a phone's answer.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use waymark_adapters::acp::{self, AcpArgs, AcpError};
use waymark_proto::{Decision, DecisionStatus, Effect, Operation, TaskDetail};

use super::{ControlPlane, Phone};

/// Where `scripts/setup-debian` installs the real runtimes.
pub fn runtimes_dir() -> PathBuf {
    std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real runtimes")
}

/// The native binary `relative` under `runtimes_dir()/name`, when its stamp file says `want`
/// is installed; else a failure that says how to install it.
#[track_caller]
pub fn installed_binary(name: &str, want: &str, relative: &str) -> PathBuf {
    let dir = runtimes_dir().join(name);
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    let binary = dir.join(relative);
    if stamp.trim() == want && binary.is_file() {
        return binary;
    }
    panic!(
        "the real {want} is not installed in `{}` (installed: `{}`; `{}` {}) — run \
         `scripts/setup-debian`, which installs it there (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
        binary.display(),
        if binary.is_file() {
            "exists"
        } else {
            "is missing"
        },
    )
}

/// `'…'` for `sh -c`.
pub fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// One `waymark adapters acp` run; aborted (so the agent is killed) when dropped.
pub struct Adapter {
    handle: Option<JoinHandle<Result<(), AcpError>>>,
    shutdown: CancellationToken,
}

impl Adapter {
    /// Runs the adapter as the CLI does: `acp::run` with the worker token's client.
    pub fn start(cp: &ControlPlane, args: AcpArgs) -> Adapter {
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(acp::run(args, cp.client.clone(), shutdown.clone()));
        Adapter {
            handle: Some(handle),
            shutdown,
        }
    }

    /// Waits (at most `limit`) for the adapter to end by itself, i.e. the turn ended.
    pub async fn ended(mut self, limit: Duration) -> Result<(), AcpError> {
        let handle = self.handle.take().unwrap();
        tokio::time::timeout(limit, handle)
            .await
            .expect("the adapter ends when the agent's turn ends")
            .unwrap()
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

/// Polls `probe` every 20 ms until it yields, failing after `limit`.
pub async fn within<T, F, Fut>(limit: Duration, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            started.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `runtime` task not among `seen` (each adapter run opens a new ACP session, so a new
/// task), with its external key (the agent's `sessionId`).
pub async fn new_task(
    cp: &ControlPlane,
    runtime: &str,
    seen: &mut Vec<String>,
    limit: Duration,
) -> (String, String) {
    let (id, key) = within(limit, &format!("a new {runtime} task"), || async {
        let (status, snap) = cp.admin_get("/v1/snapshot").await;
        assert_eq!(status, 200, "{snap}");
        snap["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.get("task").unwrap_or(t))
            .filter(|t| t["runtime"] == runtime)
            .filter(|t| !seen.iter().any(|s| t["id"] == s.as_str()))
            .find_map(|t| {
                Some((
                    t["id"].as_str()?.to_owned(),
                    t["external_key"].as_str()?.to_owned(),
                ))
            })
    })
    .await;
    seen.push(id.clone());
    (id, key)
}

/// The task's approval once one is pending.
pub async fn pending_approval(cp: &ControlPlane, task: &str, limit: Duration) -> Decision {
    within(limit, "a pending approval in the inbox", || async {
        cp.detail(task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == DecisionStatus::Pending)
    })
    .await
}

/// A phone answers `d` with `option` (as a person taps it: signed, at the current revision,
/// with the digest the card showed).
pub async fn answer(
    phone: &Phone,
    cp: &ControlPlane,
    task: &str,
    d: &Decision,
    op: Operation,
    option: &str,
) {
    let revision = cp.detail(task).await.task.plan_revision;
    let args = json!({"decision_id": d.id, "intent_digest": d.intent_digest, "option": option});
    phone.command(task, revision, op, args).await;
}

/// The effect keyed `key`, once settled.
pub async fn settled_effect(cp: &ControlPlane, task: &str, key: &str, limit: Duration) -> Effect {
    within(limit, &format!("the effect `{key}` settled"), || async {
        cp.detail(task)
            .await
            .effects
            .into_iter()
            .find(|e| e.idempotency_key == key && e.status.is_terminal())
    })
    .await
}

/// The messages of the task as `(role, text)`.
pub fn messages(t: &TaskDetail) -> Vec<(String, String)> {
    t.messages
        .iter()
        .map(|m| (m.role.clone(), m.text.clone()))
        .collect()
}

/// One ACP turn whose agent is killed while its permission request waits in the inbox: the
/// adapter runs with `args` (a prompt that makes the agent's model ask to run a command that
/// makes `file`); once the approval is pending, `check` looks at it (with the session id), then
/// `kill` kills the agent (every process whose environment holds a variable private to it,
/// and any wrapper that would keep its pipe open). The approval must expire by the runtime with no option, the call it guarded be
/// closed as not run, a late approve be refused (`super::a_dropped_connection_expires_the_approval`),
/// the file never appear and the adapter end saying the agent exited. Returns the closed
/// approval and the call's effect.
pub async fn killed_under_a_pending_approval(
    cp: &ControlPlane,
    phone: &Phone,
    args: AcpArgs,
    kill: impl FnOnce(),
    file: &Path,
    limit: Duration,
    check: impl FnOnce(&Decision, &str),
) -> (Decision, Effect) {
    let runtime = args.runtime.clone();
    let started = Instant::now();
    let adapter = Adapter::start(cp, args);
    let (task, session) = new_task(cp, &runtime, &mut Vec::new(), limit).await;
    let d = pending_approval(cp, &task, limit).await;
    eprintln!(
        "{runtime}: approval in the inbox at {:?}",
        started.elapsed()
    );
    check(&d, &session);
    let (closed, effect, ()) = super::a_dropped_connection_expires_the_approval(
        cp,
        phone,
        &task,
        &d,
        limit,
        async { kill() },
        // The call the approval guards: linked to it, or named by its request.
        |e| {
            e.intent["approval"] == d.id.as_str()
                || d.intent.as_ref().is_some_and(|i| {
                    i["toolCall"]["toolCallId"].is_string()
                        && i["toolCall"]["toolCallId"] == e.intent["toolCallId"]
                })
        },
        super::CallAfterDrop::NotRun,
    )
    .await;
    let text = closed
        .outcome
        .as_ref()
        .and_then(|o| o.text.clone())
        .unwrap_or_default();
    assert!(
        text.contains("the agent process exited"),
        "the approval says the agent went away: {text}"
    );
    assert!(!file.exists(), "the command never ran");
    match adapter.ended(limit).await {
        Err(AcpError::AgentExited(why)) => assert!(why.contains("exited"), "{why}"),
        other => panic!("the adapter ends saying the agent exited: {other:?}"),
    }
    assert!(!file.exists(), "the command never ran");
    eprintln!(
        "{runtime}: killed-agent turn done at {:?}",
        started.elapsed()
    );
    (closed, effect)
}
