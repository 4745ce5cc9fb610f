//! Work the control plane does on its own clock: moving tasks whose lease ran out to
//! recovery, delivering due follow-ups, applying the default of expired decisions, and pruning
//! the event and audit logs; and starting push delivery, which runs beside it.

use crate::state::AppState;

pub(crate) fn spawn(st: AppState) {
    tokio::spawn(async move {
        let mut stopping = st.stopping.subscribe();
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + st.config.tick, st.config.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopping.wait_for(|s| *s) => break,
            }
            pass(&st).await;
        }
    });
}

/// One pass of the background work, on the clock's current time. Passes never overlap (the
/// timer's and one a test asks for after moving the clock).
pub(crate) async fn pass(st: &AppState) {
    let _one_at_a_time = st.background.lock().await;
    st.rules.forget_idle_limits();
    st.address_limiter.retain_recent();
    if let Err(e) = crate::domain::recovery::sweep_leases(st).await {
        tracing::warn!(error = %e.problem, "sweeping expired leases failed");
    }
    if let Err(e) = crate::domain::followups::tick(st).await {
        tracing::warn!(error = %e.problem, "running follow-ups failed");
    }
    if let Err(e) = crate::domain::escalation::escalate_due(st).await {
        tracing::warn!(error = %e.problem, "moving escalations failed");
    }
    // Pushes reach endpoints devices chose, which may be slow or silent: they run beside
    // the pass, never inside it, so no device holds up anyone's sweeps or decision defaults.
    crate::domain::push::spawn_round(st);
    if let Err(e) = crate::domain::decisions::expire_due(st).await {
        tracing::warn!(error = %e.problem, "applying decision defaults failed");
    }
    if let Err(e) = crate::domain::retention::prune(st).await {
        tracing::warn!(error = %e.problem, "pruning the event log failed");
    }
}
