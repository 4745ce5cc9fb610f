//! Standing rules: the user's rules, live from the server, and a rule made or revoked by a
//! signed command sent at once (never queued: offline, nothing changes and the UI says so).

use tauri::State;
use waymark_proto::{CommandResult, CommandStatus};

use crate::error::{AppError, AppResult};
use crate::state::AppState;
use crate::views::{NewRuleView, RuleAddedView, RulesView};

/// The server's words for a rule command, or its refusal as an error the screen shows.
fn applied(r: CommandResult) -> AppResult<String> {
    match r.status {
        CommandStatus::Applied | CommandStatus::Duplicate => Ok(r.detail),
        _ => Err(AppError::new("refused", r.detail)),
    }
}

/// This user's rules, newest first (live, revoked and expired), and the runtimes' own rules
/// on their machines.
#[tauri::command]
#[specta::specta]
pub async fn list_rules(s: State<'_, AppState>) -> AppResult<RulesView> {
    Ok(s.companion.rules().await?.into())
}

/// Signs `add_rule` and sends it.
#[tauri::command]
#[specta::specta]
pub async fn add_rule(s: State<'_, AppState>, rule: NewRuleView) -> AppResult<RuleAddedView> {
    let (rule_id, res) = s
        .companion
        .add_rule(&rule.into_new_rule(chrono::Utc::now()))
        .await?;
    Ok(RuleAddedView {
        rule_id,
        detail: applied(res)?,
    })
}

/// Signs `revoke_rule` and sends it: the rule answers nothing from the next approval on.
#[tauri::command]
#[specta::specta]
pub async fn revoke_rule(s: State<'_, AppState>, rule_id: String) -> AppResult<String> {
    applied(s.companion.revoke_rule(&rule_id).await?)
}
