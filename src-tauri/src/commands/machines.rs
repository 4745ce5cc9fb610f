//! Machines and new runs: the user's machines as their runners report them, and a run started
//! on one of them — a signed `start_run` whose task id this device chooses, queued when offline.

use tauri::{AppHandle, State};
use waymark_companion::StartRun;

use crate::error::AppResult;
use crate::state::AppState;
use crate::views::{MachineView, StartRunView, StartedRunView};

/// The user's machines (live from the server: a machine's state is only worth its freshness).
#[tauri::command]
#[specta::specta]
pub async fn list_machines(s: State<'_, AppState>) -> AppResult<Vec<MachineView>> {
    Ok(s.companion
        .machines()
        .await?
        .machines
        .into_iter()
        .map(Into::into)
        .collect())
}

/// Signs `start_run` for a new task on a machine and delivers it (or queues it: offline, the
/// run starts on the next sync, exactly once).
#[tauri::command]
#[specta::specta]
pub async fn start_run(
    app: AppHandle,
    s: State<'_, AppState>,
    run: StartRunView,
) -> AppResult<StartedRunView> {
    let blank = |o: Option<String>| o.filter(|t| !t.trim().is_empty());
    let run = StartRun {
        machine: run.machine,
        runtime: run.runtime,
        directory: run.directory,
        prompt: run.prompt,
        title: blank(run.title),
        gate: blank(run.gate),
        plan: run.plan,
    };
    let (task_id, entry) = s.companion.start_run(&run).await?;
    crate::events::nudge(&app);
    Ok(StartedRunView {
        task_id,
        command: entry.into(),
    })
}
