//! The commands the UI calls, grouped by domain. Each delegates to `waymark-companion` (or,
//! for embedded-only facts, to the embedded control plane) and converts to the UI's views;
//! none holds a rule of its own.

pub mod inbox;
pub mod machines;
pub mod pairing;
pub mod rules;
pub mod settings;
pub mod steer;
pub mod threads;

use waymark_companion::{Error, OutboxEntry};

use crate::error::AppResult;
use crate::state::Shared;
use crate::views::OutboxView;

/// A signed command's outcome for the UI: offline is not a failure — the command stays queued
/// and the outbox shows it — so an unreachable server answers with the queued entry.
pub(crate) async fn queued_ok(
    shared: &Shared,
    task_id: &str,
    r: Result<OutboxEntry, Error>,
) -> AppResult<OutboxView> {
    match r {
        Ok(e) => Ok(e.into()),
        Err(Error::Unreachable(why)) => {
            let newest = shared
                .companion
                .mirror()
                .outbox(Some(task_id))
                .await?
                .into_iter()
                .find(|e| e.status == waymark_companion::OutboxStatus::Queued);
            match newest {
                Some(e) => Ok(e.into()),
                None => Err(Error::Unreachable(why).into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}
