//! The inbox: pending decisions with their evidence, and answering them with signed commands
//! bound to the decision's intent digest and plan revision.

use tauri::{AppHandle, State};
use waymark_proto::Operation;

use crate::error::AppResult;
use crate::state::AppState;
use crate::views::{DecideOp, InboxItemView, OutboxView, SeenView};

/// Pending decisions, soonest expiry first.
#[tauri::command]
#[specta::specta]
pub async fn list_inbox(s: State<'_, AppState>) -> AppResult<Vec<InboxItemView>> {
    let me = s.companion.identity().await?.map(|i| i.user);
    Ok(s.companion
        .mirror()
        .inbox()
        .await?
        .into_iter()
        .map(|i| InboxItemView::for_user(i, me.as_deref()))
        .collect())
}

/// Tells the server a person opened these decisions' cards on this device (proof of
/// delivery); steps already recorded are not sent again. Failures are the caller's to ignore.
#[tauri::command]
#[specta::specta]
pub async fn mark_opened(s: State<'_, AppState>, decision_ids: Vec<String>) -> AppResult<u32> {
    let n = s
        .companion
        .report_receipts(&decision_ids, waymark_proto::DeliveryStep::Opened)
        .await?;
    Ok(n as u32)
}

/// Approves an approval with its editable part (`DecisionView::editable`) changed to
/// `edited_part` (JSON text): signed with the edited intent's digest beside the digest the card
/// showed (`seen`), so only what the person read and changed runs.
#[tauri::command]
#[specta::specta]
pub async fn approve_edited(
    app: AppHandle,
    s: State<'_, AppState>,
    decision_id: String,
    edited_part: String,
    seen: SeenView,
) -> AppResult<OutboxView> {
    let part: serde_json::Value = serde_json::from_str(&edited_part)
        .map_err(|e| waymark_companion::Error::Invalid(format!("the edit is not JSON: {e}")))?;
    let task = s
        .companion
        .mirror()
        .decision(&decision_id)
        .await?
        .map(|d| d.task_id)
        .unwrap_or_default();
    let r = s
        .companion
        .approve_edited(&decision_id, part, None, &seen.into())
        .await;
    crate::events::nudge(&app);
    super::queued_ok(&s, &task, r).await
}

/// Answers a decision: approve / deny an approval, choose an option, or answer a question —
/// signed with what its card showed (`seen`: the plan revision and, for an approval, the
/// intent digest), never with what the mirror holds by the time the command is made.
#[tauri::command]
#[specta::specta]
pub async fn decide(
    app: AppHandle,
    s: State<'_, AppState>,
    decision_id: String,
    op: DecideOp,
    option: Option<String>,
    text: Option<String>,
    seen: SeenView,
) -> AppResult<OutboxView> {
    let operation = match op {
        DecideOp::Approve => Operation::Approve,
        DecideOp::Deny => Operation::Deny,
        DecideOp::Choose => Operation::ChooseOption,
        DecideOp::Answer => Operation::AnswerQuestion,
        DecideOp::Wait => Operation::Defer,
    };
    let task = s
        .companion
        .mirror()
        .decision(&decision_id)
        .await?
        .map(|d| d.task_id)
        .unwrap_or_default();
    let r = s
        .companion
        .answer(
            &decision_id,
            operation,
            option.as_deref(),
            text.as_deref(),
            &seen.into(),
        )
        .await;
    crate::events::nudge(&app);
    super::queued_ok(&s, &task, r).await
}
