//! Settings and status: the link (for the offline banner), muting notifications, and the
//! embedded demo agent.

use std::sync::Arc;

use tauri::{AppHandle, State};
use tauri_specta::Event as _;

use crate::error::AppResult;
use crate::events::{Navigate, StatusChanged};
use crate::state::AppState;
use crate::views::StatusView;

/// Mode, link health, outbox and inbox counts, mute, demo progress.
#[tauri::command]
#[specta::specta]
pub async fn get_status(s: State<'_, AppState>) -> AppResult<StatusView> {
    Ok(s.status().await?)
}

/// Mutes notifications for `minutes` (0 unmutes).
#[tauri::command]
#[specta::specta]
pub async fn mute_notifications(
    app: AppHandle,
    s: State<'_, AppState>,
    minutes: i32,
) -> AppResult<StatusView> {
    s.mute_for(i64::from(minutes));
    crate::events::nudge(&app);
    Ok(s.status().await?)
}

/// Starts another demo agent run against the embedded control plane (it waits for you).
#[tauri::command]
#[specta::specta]
pub async fn start_demo(app: AppHandle, s: State<'_, AppState>) -> AppResult<()> {
    crate::spawn_demo(app.clone(), Arc::clone(&s));
    let _ = StatusChanged {}.emit(&app);
    Ok(())
}

/// Where to go first: a deep link or notification action that came before the UI listened.
#[tauri::command]
#[specta::specta]
pub async fn take_pending_route(
    s: State<'_, crate::events::Pending>,
) -> AppResult<Option<Navigate>> {
    Ok(s.take())
}
