//! Event retention: the log keeps the newest `event_retention` events; a cursor older than
//! what was pruned is `410 cursor_expired`.

use serde::{Deserialize, Serialize};

use crate::domain::core::Tx;
use crate::error::ApiResult;
use crate::state::AppState;

/// Reply of a prune.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub(crate) struct Pruned {
    /// Events deleted now.
    pub deleted: u64,
    /// Every event at or below this cursor is gone.
    pub pruned_through: i64,
}

/// Applies the retention bound: keeps the newest `event_retention` events.
pub(crate) async fn prune(st: &AppState) -> ApiResult<Pruned> {
    let mut tx = Tx::write(st).await?;
    if !tx.try_claim("prune-events").await? {
        return Ok(Pruned {
            deleted: 0,
            pruned_through: tx.pruned_through().await?,
        });
    }
    let max = tx.max_cursor().await?;
    let through = max - st.config.event_retention;
    let already = tx.pruned_through().await?;
    if through <= already {
        return Ok(Pruned {
            deleted: 0,
            pruned_through: already,
        });
    }
    let deleted = tx.prune_events_through(through).await?;
    tx.commit().await?;
    Ok(Pruned {
        deleted,
        pruned_through: through,
    })
}
