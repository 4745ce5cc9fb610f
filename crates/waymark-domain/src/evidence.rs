//! What a run produces and spends: artifacts, test receipts, session messages, usage.

use serde::{Deserialize, Serialize};
use waymark_proto::digest::sha256_hex;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::{
    Made, Tx, audited, check_text, created, emit, emit_task, invalid, task_for, task_wire, to_value,
};
use crate::decisions::open_decision;
use crate::error::{ApiError, ApiResult};
use crate::fences::{fenced_attempt, optional_fence};

/// Query of an artifact upload (the body is the raw content).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct ArtifactQuery {
    /// File name.
    #[param(
        min_length = 1,
        max_length = 255,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub name: String,
    /// Plan step.
    pub step: Option<String>,
    /// The writing attempt (with `fence`, or neither).
    #[param(pattern = r"^att_[0-9a-f]{32}$")]
    pub attempt_id: Option<String>,
    /// Its fence.
    #[param(minimum = 1)]
    pub fence: Option<i64>,
}

/// Reply to appending messages.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MessagesAppended {
    /// The stored messages.
    pub messages: Vec<Message>,
}

/// Stores an artifact's content (content-addressed) and records it on the task.
pub async fn upload_artifact(
    st: &Context,
    caller: &Caller,
    task_id: String,
    q: ArtifactQuery,
    media_type: String,
    bytes: &[u8],
) -> ApiResult<Made<Artifact>> {
    check_text("name", &q.name, 255, true)?;
    let sha = sha256_hex(bytes);
    audited(st, caller, "artifact.upload", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        optional_fence(&mut tx, &task, &q.attempt_id, q.fence).await?;
        tx.put_blob(&sha, bytes).await?;
        let row = ArtifactRow {
            id: ids::artifact(),
            task_id: task.id.clone(),
            sha256: sha.clone(),
            name: q.name.clone(),
            media_type: media_type.clone(),
            size: bytes.len() as i64,
            step: q.step.clone(),
            created_at: tx.now,
        };
        tx.insert_artifact(&row).await?;
        let wire = convert::artifact(&row);
        let cursor = emit(&mut tx, &task, EventKind::ArtifactAdded, &wire).await?;
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

/// Parses a JUnit report into a test receipt.
pub async fn submit_test_receipt(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: SubmitTestReceipt,
) -> ApiResult<Made<TestReceipt>> {
    check_text("command", &req.command, 4000, true)?;
    if req.junit_xml.len() > st.config.max_blob_bytes {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            "`junit_xml` is larger than the artifact limit",
        ));
    }
    let parsed = crate::junit::parse(&req.junit_xml)
        .map_err(|e| invalid(format!("`junit_xml` is not JUnit XML: {e}")))?;
    audited(st, caller, "test_receipt.submit", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        fenced_attempt(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let now = tx.now;
        let sha = sha256_hex(req.junit_xml.as_bytes());
        tx.put_blob(&sha, req.junit_xml.as_bytes()).await?;
        let receipt_id = ids::receipt();
        let artifact = ArtifactRow {
            id: ids::artifact(),
            task_id: task.id.clone(),
            sha256: sha.clone(),
            name: format!("junit-{receipt_id}.xml"),
            media_type: "application/xml".into(),
            size: req.junit_xml.len() as i64,
            step: req.step.clone(),
            created_at: now,
        };
        tx.insert_artifact(&artifact).await?;
        emit(
            &mut tx,
            &task,
            EventKind::ArtifactAdded,
            convert::artifact(&artifact),
        )
        .await?;
        let passed = req.exit_code == 0 && parsed.totals.failures == 0 && parsed.totals.errors == 0;
        let row = ReceiptRow {
            id: receipt_id,
            task_id: task.id.clone(),
            step: req.step.clone(),
            command: req.command.clone(),
            exit_code: req.exit_code.into(),
            commit: req.commit.clone(),
            totals: to_value(&parsed.totals),
            failures: to_value(&parsed.failures),
            duration_seconds: parsed.duration_seconds,
            passed,
            junit_sha256: sha,
            created_at: now,
        };
        tx.insert_receipt(&row).await?;
        let wire = convert::receipt(&row)?;
        let cursor = emit(&mut tx, &task, EventKind::TestReceiptAdded, &wire).await?;
        tx.commit().await?;
        Ok(created(cursor, wire))
    })
    .await
}

/// Appends session messages, redacted.
pub async fn append_messages(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: AppendMessages,
) -> ApiResult<Made<MessagesAppended>> {
    if req.messages.is_empty() || req.messages.len() > 1000 {
        return Err(invalid("send between 1 and 1000 messages"));
    }
    for m in &req.messages {
        check_text("messages[].role", &m.role, 32, true)?;
        check_text("messages[].text", &m.text, 1 << 20, false)?;
    }
    audited(st, caller, "messages.append", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let now = tx.now;
        let mut out = Vec::with_capacity(req.messages.len());
        for m in &req.messages {
            let mut row = MessageRow {
                session_id: task.session_id.clone(),
                task_id: task.id.clone(),
                seq: 0,
                role: m.role.clone(),
                text: st.config.redaction.text(&m.text).0,
                created_at: now,
            };
            row.seq = tx.insert_message(&row).await?;
            out.push(convert::message(&row));
        }
        let value = MessagesAppended { messages: out };
        let cursor = emit(&mut tx, &task, EventKind::MessagesAppended, &value).await?;
        tx.commit().await?;
        Ok(created(cursor, value))
    })
    .await
}

/// Adds usage to the task; crossing a budget threshold opens its decision.
pub async fn report_usage(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: ReportUsage,
) -> ApiResult<Written<UsageReported>> {
    if !req.cost_usd.is_finite() || req.cost_usd < 0.0 {
        return Err(invalid("`cost_usd` must be a non-negative number"));
    }
    audited(st, caller, "usage.report", async {
        let mut tx = Tx::write(st).await?;
        let mut task = task_for(&mut tx, caller, &task_id).await?;
        optional_fence(&mut tx, &task, &req.attempt_id, req.fence).await?;
        let usage = &mut task.usage;
        usage.tokens = usage.tokens.saturating_add(req.tokens);
        usage.cost_usd += req.cost_usd;
        usage.wall_seconds = usage.wall_seconds.saturating_add(req.wall_seconds);
        task.updated_at = tx.now;
        tx.update_task(&task).await?;
        let mut cursor = emit_task(&mut tx, &task, EventKind::TaskUpdated).await?;
        let budget_decision = match crate::budget::crossed(&mut tx, &task).await? {
            Some(row) => {
                let w = open_decision(&mut tx, task.clone(), row).await?;
                cursor = cursor.max(w.cursor);
                Some(w.value)
            }
            None => None,
        };
        let task = tx.task(&task.id).await?.unwrap_or(task);
        let wire = task_wire(&mut tx, &task).await?;
        tx.commit().await?;
        Ok(Written {
            cursor,
            value: UsageReported {
                task: wire,
                budget_decision,
            },
        })
    })
    .await
}
