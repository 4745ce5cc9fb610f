//! What a caller may read: the snapshot of their tasks, one task in full (with its chain
//! verified), and the audit log.

use serde::{Deserialize, Serialize};
use waymark_proto::*;

use crate::Context;
use crate::caller::Caller;
use crate::checkpoints::verify_chain;
use crate::convert;
use crate::core::{Tx, task_for, task_wire};
use crate::deliveries;
use crate::error::{ApiError, ApiResult};

pub async fn snapshot(st: &Context, caller: &Caller) -> ApiResult<Snapshot> {
    let mut tx = Tx::read(st).await?;
    let cursor = tx.max_cursor().await?;
    let mut tasks = Vec::new();
    for row in tx.list_tasks(caller.owner_filter()).await? {
        if !caller.may_access_task(&row) {
            continue;
        }
        let pending_decisions = tx.pending_decision_count(&row.id).await?;
        let last_sequence = tx.last_checkpoint(&row.id).await?.map_or(0, |c| c.sequence);
        let task = task_wire(&mut tx, &row).await?;
        tasks.push(TaskSummary {
            task,
            pending_decisions,
            last_sequence,
        });
    }
    Ok(Snapshot { cursor, tasks })
}

pub async fn task_detail(st: &Context, caller: &Caller, task_id: String) -> ApiResult<TaskDetail> {
    let mut tx = Tx::read(st).await?;
    let cursor = tx.max_cursor().await?;
    let row = task_for(&mut tx, caller, &task_id).await?;
    let task = task_wire(&mut tx, &row).await?;
    let session = tx
        .session(&row.session_id)
        .await?
        .map(|s| convert::session(&s))
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "task without session"))?;
    let cps = tx.list_checkpoints(&row.id).await?;
    let chain = verify_chain(&cps);
    if !chain.intact {
        tracing::warn!(task = %row.id, reason = ?chain.reason, "checkpoint chain is broken");
    }
    let mut decisions: Vec<Decision> = tx
        .list_decisions(&row.id)
        .await?
        .iter()
        .map(convert::decision)
        .collect::<Result<_, _>>()?;
    deliveries::attach(&mut tx, &mut decisions).await?;
    let detail = TaskDetail {
        cursor,
        task,
        session,
        attempts: tx
            .list_attempts(&row.id)
            .await?
            .iter()
            .map(convert::attempt)
            .collect(),
        checkpoints: cps.iter().map(convert::checkpoint).collect(),
        chain,
        effects: tx
            .list_effects(&row.id)
            .await?
            .iter()
            .map(convert::effect)
            .collect(),
        decisions,
        artifacts: tx
            .list_artifacts(&row.id)
            .await?
            .iter()
            .map(convert::artifact)
            .collect(),
        test_receipts: tx
            .list_receipts(&row.id)
            .await?
            .iter()
            .map(convert::receipt)
            .collect::<Result<_, _>>()?,
        messages: tx
            .list_messages(&row.session_id)
            .await?
            .iter()
            .map(convert::message)
            .collect(),
    };
    Ok(detail)
}

/// An audit entry.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditEntry {
    pub at: chrono::DateTime<chrono::Utc>,
    pub actor: String,
    pub action: String,
    pub task_id: Option<String>,
    pub code: String,
    pub detail: String,
}

/// The audit log, newest first: `task` narrows it to one task; at most `limit` (1–1000).
pub async fn audit(st: &Context, task: Option<&str>, limit: i64) -> ApiResult<Vec<AuditEntry>> {
    let rows = Tx::read(st).await?.list_audit(task, limit).await?;
    Ok(rows
        .into_iter()
        .map(|a| AuditEntry {
            at: convert::dt(a.at),
            actor: a.actor,
            action: a.action,
            task_id: a.task_id,
            code: a.code,
            detail: a.detail,
        })
        .collect())
}
