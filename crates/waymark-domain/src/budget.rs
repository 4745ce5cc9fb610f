//! Budget thresholds (SPEC §6): when spend crosses a threshold of a limit (80% and 100% by
//! default), the control plane opens a budget decision whose options each say what they give
//! up, with a stated default on expiry. Each threshold opens once per task.

use serde_json::json;
use waymark_proto::*;
use waymark_store::{DecisionRow, TaskRow};

use crate::core::Tx;
use crate::error::ApiResult;

/// The longest a budget decision waits: the default bound of every decision's expiry.
const MAX_WAIT_SECONDS: u64 = 30 * 24 * 3600;

/// The options offered when the worker gave none.
pub fn default_options() -> Vec<DecisionOption> {
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
pub fn spent(budget: &Budget, usage: &Usage) -> (f64, Vec<String>) {
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

/// The highest threshold (of the budget's, default 80% and 100%) that `spent` (a fraction of
/// the tightest limit) reached; `None` below them all. Thresholds of zero or less never count.
pub fn highest_crossed(budget: &Budget, spent: f64) -> Option<f64> {
    budget
        .thresholds
        .as_deref()
        .unwrap_or(&[0.8, 1.0])
        .iter()
        .copied()
        .filter(|t| *t > 0.0 && spent >= *t)
        .reduce(f64::max)
}

/// A budget decision's options (the worker's, else the defaults) and the one that applies
/// when nobody answers: the budget's own when it is one of them, else `deliver_patch`, else
/// the last.
pub fn choices(budget: &Budget) -> (Vec<DecisionOption>, Option<String>) {
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
    (options, default)
}

/// The budget decision to open now, if spend crossed a threshold not asked about yet (the
/// highest one crossed, so a big jump asks once).
pub async fn crossed(tx: &mut Tx, task: &TaskRow) -> ApiResult<Option<DecisionRow>> {
    let (budget, usage) = (&task.budget, &task.usage);
    let (frac, parts) = spent(budget, usage);
    let Some(threshold) = highest_crossed(budget, frac) else {
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
    let (options, default) = choices(budget);
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
        options,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(v: serde_json::Value) -> Budget {
        serde_json::from_value(v).unwrap()
    }

    fn usage(tokens: u64, cost_usd: f64, wall_seconds: u64) -> Usage {
        Usage {
            tokens,
            cost_usd,
            wall_seconds,
        }
    }

    #[test]
    fn spent_is_the_tightest_limit_and_names_each() {
        let b = budget(json!({"max_tokens": 1000, "max_cost_usd": 2.0, "max_wall_seconds": 100}));
        let (frac, parts) = spent(&b, &usage(500, 1.8, 10));
        assert!((frac - 0.9).abs() < 1e-9, "{frac}");
        assert_eq!(
            parts,
            ["500 of 1000 tokens", "$1.80 of $2.00", "10s of 100s"]
        );
        // No limits, or limits of zero: nothing is spent of anything.
        assert_eq!(spent(&Budget::default(), &usage(9, 9.0, 9)), (0.0, vec![]));
        let zero = budget(json!({"max_tokens": 0, "max_cost_usd": 0.0}));
        assert_eq!(spent(&zero, &usage(9, 9.0, 9)).0, 0.0);
    }

    #[test]
    fn the_highest_threshold_crossed_is_asked_once() {
        let b = Budget::default();
        assert_eq!(highest_crossed(&b, 0.79), None);
        assert_eq!(highest_crossed(&b, 0.8), Some(0.8));
        // A jump past both asks about the higher only.
        assert_eq!(highest_crossed(&b, 1.7), Some(1.0));
        let own = budget(json!({"thresholds": [0.5, 0.0, -1.0, 0.9]}));
        assert_eq!(highest_crossed(&own, 0.0), None);
        assert_eq!(highest_crossed(&own, 0.6), Some(0.5));
        assert_eq!(highest_crossed(&own, 0.95), Some(0.9));
    }

    #[test]
    fn a_budget_decision_defaults_to_what_its_budget_says_else_deliver_patch_else_the_last() {
        let (options, default) = choices(&Budget::default());
        assert_eq!(options, default_options());
        assert_eq!(default.as_deref(), Some("deliver_patch"));
        assert!(
            options.iter().all(|o| !o.gives_up.is_empty()),
            "each says what it gives up"
        );
        let opt = |id: &str| json!({"id": id, "label": id, "gives_up": "x"});
        let own = budget(json!({"options": [opt("a"), opt("b")], "default_option": "a"}));
        assert_eq!(choices(&own).1.as_deref(), Some("a"));
        let unknown = budget(json!({"options": [opt("a"), opt("b")], "default_option": "zz"}));
        assert_eq!(choices(&unknown).1.as_deref(), Some("b"));
    }
}
