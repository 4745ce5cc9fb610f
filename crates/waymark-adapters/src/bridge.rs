//! The worker-SDK side every adapter shares: one runtime session becomes one task (found
//! again by the runtime's own id, so a restarted adapter resumes it), run as one attempt whose
//! lease the adapter's heartbeat keeps.

use std::time::Duration;

use tokio::task::JoinSet;
use waymark_proto::{
    ApprovalDurability, AskedRuntimeDeadline, CreateTask, Decision, DecisionOption, DeliveryState,
};
use waymark_worker::{ApprovalOptions, AttemptOptions, Client, Run};

/// Drops the finished tasks of a set of fire-and-forget background tasks. A `JoinSet` keeps a
/// finished task until it is joined, so a long-lived adapter that only spawns would hold one
/// entry per approval, timer and tool call it ever started; its loop reaps on every turn, and
/// the set holds only what still runs. Returns how many were reaped.
pub(crate) fn reap(set: &mut JoinSet<()>) -> usize {
    let mut n = 0;
    while let Some(done) = set.try_join_next() {
        if let Err(e) = done
            && e.is_panic()
        {
            tracing::error!(error = %e, "a background task panicked");
        }
        n += 1;
    }
    n
}

/// A runtime session as the adapter first sees it.
#[derive(Debug, Clone)]
pub struct SessionSpec {
    /// `codex`, `openclaw`, `hermes`, `acp`.
    pub runtime: String,
    /// The runtime's own id (thread id, session key, ACP session id).
    pub key: String,
    /// Short title for the inbox.
    pub title: String,
    /// What the run is for, when known.
    pub goal: String,
}

/// Finds or creates the session's task and starts (or takes over) its attempt. A previous
/// adapter process's lease is waited out for up to `wait_for_lease`.
pub async fn attach(
    client: &Client,
    spec: &SessionSpec,
    worker: &str,
    wait_for_lease: Duration,
) -> waymark_worker::Result<Run> {
    let task = client
        .create_task(&CreateTask {
            title: spec.title.clone(),
            goal: spec.goal.clone(),
            runtime: Some(spec.runtime.clone()),
            budget: Default::default(),
            plan: Vec::new(),
            materials: Default::default(),
            external_key: Some(spec.key.clone()),
        })
        .await?;
    start(client, &task.id, worker, wait_for_lease).await
}

/// Starts (or takes over) an attempt on a task that exists already — one a runner's
/// `start_run` made, bound to a session by the runner rather than found by the runtime's id.
pub async fn start(
    client: &Client,
    task_id: &str,
    worker: &str,
    wait_for_lease: Duration,
) -> waymark_worker::Result<Run> {
    client
        .start_attempt(
            task_id,
            AttemptOptions::new(worker)
                .lease(Duration::from_secs(30))
                .wait_for_lease(wait_for_lease),
        )
        .await
}

/// One choice a runtime offers on an approval, and whether it grants.
#[derive(Debug, Clone)]
pub struct Choice {
    /// Our option id: `approve`, `deny`, or `approve_…` / `deny_…`.
    pub id: String,
    /// The runtime's label.
    pub label: String,
    /// What choosing it gives up, for people.
    pub gives_up: String,
}

impl Choice {
    /// A choice with no stated cost.
    pub fn new(id: &str, label: &str) -> Choice {
        Choice {
            id: id.into(),
            label: label.into(),
            gives_up: String::new(),
        }
    }
}

/// Opens an approval held by the runtime: `intent` is what the runtime asked, in full; the
/// answer counts once [`acknowledge`] (or [`lost`]) reports what the runtime did with it.
pub async fn open_approval(
    run: &Run,
    intent: serde_json::Value,
    summary: &str,
    durability: ApprovalDurability,
    choices: &[Choice],
    expires_in: Option<Duration>,
    runtime_deadline: Option<AskedRuntimeDeadline>,
) -> waymark_worker::Result<Decision> {
    run.open_approval(
        intent,
        summary,
        approval_options(durability, choices, expires_in, runtime_deadline),
    )
    .await
}

/// What [`open_approval`] asks with, for an adapter that adds to it (e.g. the effect the
/// approval is for).
pub fn approval_options(
    durability: ApprovalDurability,
    choices: &[Choice],
    expires_in: Option<Duration>,
    runtime_deadline: Option<AskedRuntimeDeadline>,
) -> ApprovalOptions {
    ApprovalOptions {
        durability: Some(durability),
        choices: choices
            .iter()
            .map(|c| DecisionOption {
                id: c.id.clone(),
                label: c.label.clone(),
                gives_up: c.gives_up.clone(),
                cost: None,
            })
            .collect(),
        expires_in,
        runtime_deadline,
        ..ApprovalOptions::default()
    }
}

/// The runtime took the answer (e.g. Codex's `serverRequest/resolved`).
pub async fn acknowledge(run: &Run, decision_id: &str, detail: &str) -> waymark_worker::Result<()> {
    run.report_delivery(
        decision_id,
        DeliveryState::Acknowledged,
        Some(detail.into()),
    )
    .await
    .map(drop)
}

/// The runtime went away after the answer but before it took it.
pub async fn lost(run: &Run, decision_id: &str, detail: &str) -> waymark_worker::Result<()> {
    run.report_delivery(decision_id, DeliveryState::Lost, Some(detail.into()))
        .await
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reaping_keeps_only_the_tasks_still_running() {
        let mut set = JoinSet::new();
        let (release, wait) = tokio::sync::oneshot::channel::<()>();
        set.spawn(async move {
            let _ = wait.await;
        });
        for _ in 0..1000 {
            set.spawn(async {});
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(set.len(), 1001, "finished tasks stay until joined");
        assert_eq!(reap(&mut set), 1000);
        assert_eq!(set.len(), 1, "the running one is kept");
        release.send(()).unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(reap(&mut set), 1);
        assert!(set.is_empty());
    }
}
