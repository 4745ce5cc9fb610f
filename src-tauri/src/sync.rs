//! Background sync: `Companion::follow` keeps the mirror current (reconnecting with backoff;
//! a dropped stream is never a cancel). Every applied batch tells the UI to re-read the
//! mirror, re-counts the tray, and runs the notification policy over the threads it touched;
//! when the stream (re)opens after a snapshot, every thread is looked at once, so decisions
//! that arrived while the app was closed are not missed. Notifications are shown once per
//! key (`Mirror::first_notification`), also across restarts. The threads to look at coalesce
//! in a bounded `Touched` set (past its bound: every thread), so sync never waits for the
//! consumer and nothing queues without end.

use std::sync::Arc;
use std::time::Duration;

use tauri::AppHandle;
use tokio::sync::watch;
use waymark_companion::{Error, Look, Touched};

use crate::state::Shared;

/// Starts the sync loop, the link watcher and the notification consumer.
pub fn spawn(app: AppHandle, shared: Arc<Shared>) {
    let touched = Arc::new(Touched::default());
    tauri::async_runtime::spawn(consume(app.clone(), shared.clone(), touched.clone()));
    tauri::async_runtime::spawn(watch_link(app.clone(), shared.clone(), touched.clone()));
    tauri::async_runtime::spawn(async move {
        loop {
            let (_stop_tx, stop_rx) = watch::channel(false);
            let marks = touched.clone();
            let on_batch = move |events: &[waymark_proto::Event]| {
                marks.tasks(events.iter().map(|e| e.task_id.as_str()));
            };
            let run = shared.companion.follow(stop_rx, &on_batch);
            let outcome = tokio::select! {
                r = run => Some(r),
                _ = shared.repaired.notified() => None,
            };
            match outcome {
                // Paired anew: follow the new identity.
                None => shared.set_fatal(None),
                Some(Ok(())) => return,
                Some(Err(Error::NotPaired)) => {
                    shared.repaired.notified().await;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "sync stopped");
                    shared.set_fatal(Some(e.to_string()));
                    crate::events::status_changed(&app);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                        _ = shared.repaired.notified() => {}
                    }
                    shared.set_fatal(None);
                }
            }
            touched.all();
        }
    });
}

/// Tells the UI when the link changes, and asks for a full look when the stream opens.
async fn watch_link(app: AppHandle, shared: Arc<Shared>, touched: Arc<Touched>) {
    let mut rx = shared.companion.health();
    let mut was_connected = false;
    loop {
        let connected = rx.borrow_and_update().connected;
        if connected || was_connected {
            shared.mark_live();
        }
        if connected && !was_connected {
            touched.all();
        }
        was_connected = connected;
        crate::events::status_changed(&app);
        if rx.changed().await.is_err() {
            return;
        }
    }
}

async fn consume(app: AppHandle, shared: Arc<Shared>, touched: Arc<Touched>) {
    loop {
        // Everything marked since the last pass, coalesced.
        let (threads, quiet_finished) = match touched.next().await {
            Look::All => (None, true),
            // More threads changed than are tracked one by one: each may have news.
            Look::Overflowed => (None, false),
            Look::Tasks(ids) => (Some(ids), false),
        };
        crate::events::nudge(&app);
        if let Err(e) = look(&app, &shared, threads, quiet_finished).await {
            tracing::warn!(error = %e, "notification pass failed");
        }
    }
}

/// Runs the notification policy over the touched threads (`None`: every thread) and updates
/// the tray. With `quiet_finished`, finished tasks' notifications are marked seen silently.
async fn look(
    app: &AppHandle,
    shared: &Arc<Shared>,
    threads: Option<Vec<String>>,
    quiet_finished: bool,
) -> Result<(), Error> {
    let mirror = shared.companion.mirror();
    let ids: Vec<String> = match threads {
        Some(ids) => ids,
        None => mirror
            .threads()
            .await?
            .into_iter()
            .map(|t| t.task.id)
            .collect(),
    };
    for id in ids {
        // What closed since it was shown is withdrawn.
        if let Some(thread) = mirror.thread(&id).await? {
            let closed = shared.shown.take_closed(thread.decisions.iter().map(|d| {
                (
                    d.id.as_str(),
                    d.status == waymark_proto::DecisionStatus::Pending,
                )
            }));
            for (decision, notification) in closed {
                crate::notifications::withdraw(decision, notification);
            }
        }
        // The shared content model (with the diff stat of cached diffs), each shown once.
        for n in shared.companion.notifications(&id, true).await? {
            // On a full look after a snapshot or a reconnect, finished tasks from before are
            // marked seen silently: a person pairing a device wants the open decisions, not a
            // backlog of old endings.
            let quiet = quiet_finished && n.decision_id.is_none();
            if !quiet && !shared.muted() {
                crate::notifications::show(app.clone(), shared.clone(), n);
            }
        }
    }
    let pending = mirror.inbox().await?.len();
    crate::tray::update(app, pending, shared.muted());
    Ok(())
}
