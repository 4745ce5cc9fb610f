//! Retention: the event log keeps the newest `event_retention` events (a cursor older than
//! what was pruned is `410 cursor_expired`); the audit log keeps `audit_retention` of time and
//! at most `audit_max_entries` entries, so refusals an outsider provokes cannot grow it for
//! good.

use serde::{Deserialize, Serialize};

use crate::Context;
use crate::core::Tx;
use crate::error::ApiResult;

/// Reply of a prune.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Pruned {
    /// Events deleted now.
    pub deleted: u64,
    /// Every event at or below this cursor is gone.
    pub pruned_through: i64,
    /// Audit entries deleted now (older than the audit retention, or beyond its count).
    #[serde(default)]
    pub audit_deleted: u64,
}

/// Applies the retention bounds: keeps the newest `event_retention` events, and the audit
/// entries of the last `audit_retention`, at most `audit_max_entries` of them.
pub async fn prune(st: &Context) -> ApiResult<Pruned> {
    let mut tx = Tx::write(st).await?;
    if !tx.try_claim("prune-events").await? {
        let pruned_through = tx.pruned_through().await?;
        tx.commit().await?;
        return Ok(Pruned {
            deleted: 0,
            pruned_through,
            audit_deleted: 0,
        });
    }
    let max = tx.max_cursor().await?;
    let through = max - st.config.event_retention;
    let already = tx.pruned_through().await?;
    let (deleted, pruned_through) = if through > already {
        (tx.prune_events_through(through).await?, through)
    } else {
        (0, already)
    };
    let retention = i64::try_from(st.config.audit_retention.as_millis()).unwrap_or(i64::MAX);
    let before = tx.now.saturating_sub(retention);
    let audit_deleted = tx.prune_audit(before, st.config.audit_max_entries).await?;
    // Committed even when nothing was pruned: on SQLite a write transaction reads what the
    // earlier members of its commit group wrote, so an answer built from it may be given
    // only after that group's `COMMIT` (a dropped transaction answers at once — a
    // `pruned_through` nobody can read yet). A commit that changed nothing writes nothing.
    tx.commit().await?;
    Ok(Pruned {
        deleted,
        pruned_through,
        audit_deleted,
    })
}
