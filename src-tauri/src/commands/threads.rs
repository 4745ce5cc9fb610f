//! Threads: the list (what needs attention first), one thread in full, artifact text for the
//! diff and text viewers, pinning for offline review. All answer from the mirror.

use tauri::State;

use crate::error::{AppError, AppResult};
use crate::state::AppState;
use crate::views::{ArtifactText, ThreadDetailView, ThreadRowView};

/// Largest artifact text sent to the UI (the diff viewer stays fast; the rest is cut).
const TEXT_LIMIT: usize = 4 << 20;

/// Threads, what needs attention first.
#[tauri::command]
#[specta::specta]
pub async fn list_threads(s: State<'_, AppState>) -> AppResult<Vec<ThreadRowView>> {
    let me = s.companion.identity().await?.map(|i| i.user);
    let now = chrono::Utc::now();
    Ok(s.companion
        .mirror()
        .threads()
        .await?
        .into_iter()
        .map(|r| ThreadRowView::for_user(r, me.as_deref(), now))
        .collect())
}

/// One thread in full.
#[tauri::command]
#[specta::specta]
pub async fn get_thread(s: State<'_, AppState>, task_id: String) -> AppResult<ThreadDetailView> {
    s.companion
        .mirror()
        .thread(&task_id)
        .await?
        .map(|d| ThreadDetailView::at(d, chrono::Utc::now()))
        .ok_or_else(|| {
            AppError::new(
                "not_found",
                format!("no thread `{task_id}` in the mirror yet — it appears after the next sync"),
            )
        })
}

/// An artifact's content as text (cached for offline review, else fetched).
#[tauri::command]
#[specta::specta]
pub async fn artifact_text(s: State<'_, AppState>, sha256: String) -> AppResult<ArtifactText> {
    let bytes = s.companion.blob(&sha256).await?;
    let size = bytes.len() as i64;
    let truncated = bytes.len() > TEXT_LIMIT;
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(TEXT_LIMIT)]).into_owned();
    Ok(ArtifactText {
        text,
        size,
        truncated,
    })
}

/// Pins a thread for offline review (its artifacts are prefetched).
#[tauri::command]
#[specta::specta]
pub async fn pin_thread(s: State<'_, AppState>, task_id: String, pinned: bool) -> AppResult<bool> {
    Ok(s.companion.mirror().pin(&task_id, pinned).await?)
}
