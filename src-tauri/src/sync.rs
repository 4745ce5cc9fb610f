//! Background sync: `Companion::follow` keeps the mirror current (reconnecting with backoff;
//! a dropped stream is never a cancel). Every applied batch tells the UI to re-read the
//! mirror, re-counts the tray, and runs the notification policy over the threads it touched;
//! when the stream (re)opens after a snapshot, every thread is looked at once, so decisions
//! that arrived while the app was closed are not missed. Notifications are shown once per
//! key (`Mirror::first_notification`), also across restarts.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tauri::AppHandle;
use tauri_specta::Event as _;
use tokio::sync::{mpsc, watch};
use waymark_companion::Error;

use crate::events::{MirrorChanged, StatusChanged};
use crate::state::Shared;

/// What the consumer should look at.
enum Touch {
    /// These tasks changed.
    Tasks(Vec<String>),
    /// The mirror was re-snapshotted or the link changed: look at everything.
    All,
}

/// Starts the sync loop, the link watcher and the notification consumer.
pub fn spawn(app: AppHandle, shared: Arc<Shared>) {
    let (tx, rx) = mpsc::unbounded_channel::<Touch>();
    tauri::async_runtime::spawn(consume(app.clone(), shared.clone(), rx));
    tauri::async_runtime::spawn(watch_link(app.clone(), shared.clone(), tx.clone()));
    tauri::async_runtime::spawn(async move {
        loop {
            let (_stop_tx, stop_rx) = watch::channel(false);
            let sender = tx.clone();
            let on_batch = move |events: &[waymark_proto::Event]| {
                let _ = sender.send(Touch::Tasks(
                    events.iter().map(|e| e.task_id.clone()).collect(),
                ));
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
                    let _ = StatusChanged {}.emit(&app);
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                        _ = shared.repaired.notified() => {}
                    }
                    shared.set_fatal(None);
                }
            }
            let _ = tx.send(Touch::All);
        }
    });
}

/// Tells the UI when the link changes, and asks for a full look when the stream opens.
async fn watch_link(app: AppHandle, shared: Arc<Shared>, tx: mpsc::UnboundedSender<Touch>) {
    let mut rx = shared.companion.health();
    let mut was_connected = false;
    loop {
        let connected = rx.borrow_and_update().connected;
        if connected || was_connected {
            shared.mark_live();
        }
        if connected && !was_connected {
            let _ = tx.send(Touch::All);
        }
        was_connected = connected;
        let _ = StatusChanged {}.emit(&app);
        if rx.changed().await.is_err() {
            return;
        }
    }
}

async fn consume(app: AppHandle, shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Touch>) {
    while let Some(first) = rx.recv().await {
        // Coalesce what arrived meanwhile.
        let mut all = false;
        let mut tasks = BTreeSet::new();
        let mut take = |t: Touch| match t {
            Touch::All => all = true,
            Touch::Tasks(ids) => tasks.extend(ids),
        };
        take(first);
        while let Ok(more) = rx.try_recv() {
            take(more);
        }
        let _ = MirrorChanged {}.emit(&app);
        let _ = StatusChanged {}.emit(&app);
        if let Err(e) = look(&app, &shared, all, tasks).await {
            tracing::warn!(error = %e, "notification pass failed");
        }
    }
}

/// Runs the notification policy over the touched threads and updates the tray.
async fn look(
    app: &AppHandle,
    shared: &Arc<Shared>,
    all: bool,
    tasks: BTreeSet<String>,
) -> Result<(), Error> {
    let mirror = shared.companion.mirror();
    let ids: Vec<String> = if all {
        mirror
            .threads()
            .await?
            .into_iter()
            .map(|t| t.task.id)
            .collect()
    } else {
        tasks.into_iter().collect()
    };
    for id in ids {
        // The shared content model (with the diff stat of cached diffs), each shown once.
        for n in shared.companion.notifications(&id, true).await? {
            // On a full look, finished tasks from before are marked seen silently: a person
            // pairing a device wants the open decisions, not a backlog of old endings.
            let quiet = all && n.decision_id.is_none();
            if !quiet && !shared.muted() {
                crate::notifications::show(app.clone(), shared.clone(), n);
            }
        }
    }
    let pending = mirror.inbox().await?.len();
    crate::tray::update(app, pending, shared.muted());
    Ok(())
}

/// Tells the UI to re-read the mirror and the status (after a command changed the outbox).
pub fn nudge(app: &AppHandle) {
    let _ = MirrorChanged {}.emit(app);
    let _ = StatusChanged {}.emit(app);
}
