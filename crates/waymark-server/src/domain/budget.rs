//! Budget thresholds (SPEC §6): when spend crosses a threshold of a limit (80% and 100% by
//! default), the control plane opens a budget decision whose options each say what they give
//! up, with a stated default on expiry. Each threshold opens once per task.

use serde_json::json;
use waymark_proto::*;
use waymark_store::{DecisionRow, TaskRow};

use crate::domain::core::{Tx, to_value};
use crate::error::ApiResult;

/// The longest a budget decision waits: the default bound of every decision's expiry.
const MAX_WAIT_SECONDS: u64 = 30 * 24 * 3600;

/// The options offered when the worker gave none.
pub(crate) fn default_options() -> Vec<DecisionOption> {
    vec![
        DecisionOption {
            id: "relevant_tests".into(),
            label: "Run only the relevant tests".into(),
            gives_up: "the rest of the suite: a regression elsewhere would go unseen".into(),
            cost: Some("a fraction of the full suite's time and tokens".into()),
        },
        DecisionOption {
            id: "full_suite".into(),
            label: "Continue the full suite".into(),
            gives_up: "the budget: the run goes past its limit".into(),
            cost: Some("the full suite's time and tokens on top".into()),
        },
        DecisionOption {
            id: "deliver_patch".into(),
            label: "Stop and deliver the patch with the checks already done".into(),
            gives_up:
                "verification beyond the checks already run; the task ends partially delivered"
                    .into(),
            cost: Some("nothing more".into()),
        },
    ]
}

/// The fraction of the tightest limit spent, and what was spent of each.
pub(crate) fn spent(budget: &Budget, usage: &Usage) -> (f64, Vec<String>) {
    let mut frac: f64 = 0.0;
    let mut parts = Vec::new();
    if let Some(m) = budget.max_tokens.filter(|m| *m > 0) {
        frac = frac.max(usage.tokens as f64 / m as f64);
        parts.push(format!("{} of {} tokens", usage.tokens, m));
    }
    if let Some(m) = budget.max_cost_usd.filter(|m| *m > 0.0) {
        frac = frac.max(usage.cost_usd / m);
        parts.push(format!("${:.2} of ${:.2}", usage.cost_usd, m));
    }
    if let Some(m) = budget.max_wall_seconds.filter(|m| *m > 0) {
        frac = frac.max(usage.wall_seconds as f64 / m as f64);
        parts.push(format!("{}s of {}s", usage.wall_seconds, m));
    }
    (frac, parts)
}

/// The budget decision to open now, if spend crossed a threshold not asked about yet (the
/// highest one crossed, so a big jump asks once).
pub(crate) async fn crossed(tx: &mut Tx, task: &TaskRow) -> ApiResult<Option<DecisionRow>> {
    let budget: Budget = serde_json::from_value(task.budget.clone()).unwrap_or_default();
    let usage: Usage = serde_json::from_value(task.usage.clone()).unwrap_or_default();
    let (frac, parts) = spent(&budget, &usage);
    let thresholds = budget.thresholds.clone().unwrap_or_else(|| vec![0.8, 1.0]);
    let Some(threshold) = thresholds
        .iter()
        .copied()
        .filter(|t| *t > 0.0 && frac >= *t)
        .reduce(f64::max)
    else {
        return Ok(None);
    };
    let asked = tx.list_decisions(&task.id).await?.into_iter().any(|d| {
        d.kind == DecisionKind::Budget
            && d.intent
                .as_ref()
                .and_then(|i| i.get("threshold"))
                .and_then(|t| t.as_f64())
                .is_some_and(|t| t >= threshold)
    });
    if asked || task.state.is_terminal() {
        return Ok(None);
    }
    let options = if budget.options.is_empty() {
        default_options()
    } else {
        budget.options.clone()
    };
    let default = budget
        .default_option
        .clone()
        .filter(|d| options.iter().any(|o| &o.id == d))
        .or_else(|| {
            options
                .iter()
                .find(|o| o.id == "deliver_patch")
                .map(|o| o.id.clone())
        })
        .or_else(|| options.last().map(|o| o.id.clone()));
    let now = tx.now;
    Ok(Some(DecisionRow {
        id: ids::decision(),
        task_id: task.id.clone(),
        kind: DecisionKind::Budget,
        status: DecisionStatus::Pending,
        step: None,
        question: format!(
            "{:.0}% of the budget is spent ({})",
            threshold * 100.0,
            parts.join(", ")
        ),
        options: to_value(&options),
        default_option: default,
        intent: Some(json!({"threshold": threshold, "usage": usage, "spent_fraction": frac})),
        intent_digest: None,
        effect_id: None,
        plan_revision: task.plan_revision,
        risky: false,
        // At most as long as any decision waits: a longer wait overflowed, or ended past what a
        // date-time can say (found describing the API for `scripts/api-fuzz`).
        expires_at: now
            + 1000 * budget.decision_seconds.unwrap_or(900).min(MAX_WAIT_SECONDS) as i64,
        created_at: now,
        outcome: None,
        durability: None,
        delivery: None,
        editable: None,
        runtime_deadline: None,
        escalation: None,
        escalate_at: None,
    }))
}
