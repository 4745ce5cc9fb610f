//! Steering: pause, resume, cancel, replan with instructions, take over — each a signed
//! command based on the plan revision the person sees; the outbox; a manual sync.

use serde_json::json;
use tauri::{AppHandle, State};

use crate::error::AppResult;
use crate::state::AppState;
use crate::views::{OutboxView, SteerOp, SyncView};

/// Sends a steer command (queued when offline), signed with `seen_revision`: the plan revision
/// on the screen the person acted from, never one read afterwards.
#[tauri::command]
#[specta::specta]
pub async fn steer(
    app: AppHandle,
    s: State<'_, AppState>,
    task_id: String,
    op: SteerOp,
    instructions: Option<String>,
    suspend: Vec<String>,
    seen_revision: i64,
) -> AppResult<OutboxView> {
    let args = match &instructions {
        Some(i) => json!({ "instructions": i }),
        None => json!({}),
    };
    let r = s
        .companion
        .command(
            &task_id,
            op.operation(!suspend.is_empty()),
            args,
            suspend,
            seen_revision,
        )
        .await;
    crate::events::nudge(&app);
    super::queued_ok(&s, &task_id, r).await
}

/// Commands signed on this device, newest first.
#[tauri::command]
#[specta::specta]
pub async fn list_outbox(s: State<'_, AppState>) -> AppResult<Vec<OutboxView>> {
    Ok(s.companion
        .mirror()
        .outbox(None)
        .await?
        .into_iter()
        .map(Into::into)
        .collect())
}

/// Delivers the outbox and catches up now.
#[tauri::command]
#[specta::specta]
pub async fn sync_now(app: AppHandle, s: State<'_, AppState>) -> AppResult<SyncView> {
    let r = s.companion.sync_once().await;
    crate::events::nudge(&app);
    Ok(r?.into())
}
