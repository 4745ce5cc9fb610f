//! The demo's budget (SPEC §6): what each step spends — token figures of the size an agent of
//! this kind uses — the options its budget decision offers, each saying what it gives up and
//! costs, and how the run answers one: through the admin route when told to
//! (`--budget-choice`), else by waiting for a person or the stated default on expiry. The
//! figures put the 80% threshold right after the fix, before re-verification.

use std::time::{Duration, Instant};

use serde::Serialize;
use waymark_proto::*;

use super::{DecisionSummary, Demo, DemoError, Done, PendingStep, VerificationSummary, short};
use crate::run::{Run, chosen_option};

/// The task's token budget.
pub(super) const MAX_TOKENS: u64 = 40_000;
/// A blended price per token (input and output), in US dollars.
const USD_PER_TOKEN: f64 = 6.0e-6;
/// Reading the alert and the repository, running the failing test.
pub(super) const TOKENS_REPRODUCE: u64 = 9_400;
/// Reading the code, reasoning about the bug, writing and committing the patch: 80.75% with
/// the reproduction.
pub(super) const TOKENS_FIX: u64 = 22_900;
/// One verification try: reading the run's output, plus a share per test.
pub(super) const TOKENS_VERIFY_BASE: u64 = 500;
/// Per test a verification try runs.
pub(super) const TOKENS_PER_TEST: u64 = 300;
/// Preparing the deploy and its approval request.
pub(super) const TOKENS_DELIVER: u64 = 900;
/// How many times verification is tried before the run gives up on it.
pub(super) const VERIFY_TRIES: u32 = 3;
/// `--scenario flaky-tests`: how many calls to the promo service time out (more than the
/// tries verification gets).
pub(super) const PROMO_OUTAGE_CALLS: u32 = 5;

// The figures tell the story: the reproduction stays under 80%, the fix crosses it, and three
// tries of the five cart tests (or one run of the twelve-test suite, then the deploy) stay
// under 100%.
const _: () = assert!(TOKENS_REPRODUCE * 10 < MAX_TOKENS * 8);
const _: () = assert!((TOKENS_REPRODUCE + TOKENS_FIX) * 10 >= MAX_TOKENS * 8);
const _: () = assert!(
    TOKENS_REPRODUCE + TOKENS_FIX + 3 * (TOKENS_VERIFY_BASE + 5 * TOKENS_PER_TEST) < MAX_TOKENS
);
const _: () = assert!(
    TOKENS_REPRODUCE + TOKENS_FIX + TOKENS_VERIFY_BASE + 12 * TOKENS_PER_TEST + TOKENS_DELIVER
        < MAX_TOKENS
);

/// Budget option: run only the tests touching the change.
pub(super) const RELEVANT_TESTS: &str = "relevant_tests";
/// Budget option: run the full suite.
pub(super) const FULL_SUITE: &str = "full_suite";
/// Budget option: stop and deliver the patch with the checks already done.
pub(super) const DELIVER_PATCH: &str = "deliver_patch";

/// How the demo answers a budget decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetChoice {
    /// Run only the tests touching the changed file.
    RelevantTests,
    /// Run the whole suite.
    FullSuite,
    /// Stop and deliver the patch with the checks already done (`partially_delivered`).
    DeliverPatch,
    /// Answer nothing: the stated default applies when the decision expires.
    Default,
}

impl BudgetChoice {
    /// The option id it answers with (`None` for [`BudgetChoice::Default`]).
    pub fn option(self) -> Option<&'static str> {
        match self {
            BudgetChoice::RelevantTests => Some(RELEVANT_TESTS),
            BudgetChoice::FullSuite => Some(FULL_SUITE),
            BudgetChoice::DeliverPatch => Some(DELIVER_PATCH),
            BudgetChoice::Default => None,
        }
    }
}

/// The demo task's budget decisions: who answers them, and how long they wait.
#[derive(Debug, Clone)]
pub struct BudgetPlan {
    /// Answer through the admin route (needs the admin token); `None` waits for a person.
    pub choice: Option<BudgetChoice>,
    /// How long a budget decision waits before its default (`relevant_tests`) applies.
    pub decision_wait: Duration,
}

impl Default for BudgetPlan {
    fn default() -> Self {
        BudgetPlan {
            choice: None,
            decision_wait: Duration::from_secs(15),
        }
    }
}

impl BudgetPlan {
    /// The task's budget for a suite of `suite` tests, `relevant` of them in the file of the
    /// alert's test: the options say what each gives up and costs, in this suite's numbers.
    pub(super) fn budget(&self, suite: usize, relevant: usize) -> Budget {
        let cost = |tests: usize| TOKENS_VERIFY_BASE + TOKENS_PER_TEST * tests as u64;
        Budget {
            max_wall_seconds: Some(3600),
            max_tokens: Some(MAX_TOKENS),
            max_cost_usd: None,
            thresholds: None,
            options: vec![
                DecisionOption {
                    id: RELEVANT_TESTS.into(),
                    label: format!(
                        "Run only the tests touching the change (about {relevant} of {suite})"
                    ),
                    gives_up: format!(
                        "the other {} tests: a regression outside the changed module would go unseen",
                        suite.saturating_sub(relevant)
                    ),
                    cost: Some(format!("~{} tokens", thousands(cost(relevant)))),
                },
                DecisionOption {
                    id: FULL_SUITE.into(),
                    label: format!("Run the full suite ({suite} tests)"),
                    gives_up: "budget headroom: most of what is left goes to tests that do not touch the change".into(),
                    cost: Some(format!("~{} tokens", thousands(cost(suite)))),
                },
                DecisionOption {
                    id: DELIVER_PATCH.into(),
                    label: "Stop and deliver the patch with the checks already done".into(),
                    gives_up: "any test of the patch, and the deploy: the task ends partially delivered".into(),
                    cost: Some("nothing more".into()),
                },
            ],
            default_option: Some(RELEVANT_TESTS.into()),
            decision_seconds: Some(self.decision_wait.as_secs().max(1)),
        }
    }
}

/// `32300` → `32,300`.
pub(super) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let bytes = digits.as_bytes();
    let head = match bytes.len() % 3 {
        0 => 3.min(bytes.len()),
        r => r,
    };
    let mut groups = vec![&digits[..head]];
    groups.extend(
        bytes[head..]
            .chunks(3)
            .map(|c| std::str::from_utf8(c).unwrap_or_default()),
    );
    groups.join(",")
}

/// What the run knows about its budget and verification, for checkpoints and the summary.
#[derive(Debug, Clone, Default)]
pub(super) struct Ledger {
    /// The task's limits.
    pub(super) budget: Budget,
    /// Spend, as the control plane totals it.
    pub(super) usage: Usage,
    /// When spend was last reported (wall time is reported as it passes).
    pub(super) last_report: Option<Instant>,
    /// The suite's test node ids.
    pub(super) suite: Vec<String>,
    /// The newest budget option chosen.
    pub(super) choice: Option<String>,
    /// Budget decisions, as they closed.
    pub(super) decisions: Vec<DecisionSummary>,
    /// Where the alert's failure was reproduced: (commit, receipt).
    pub(super) reproduced: Option<(String, String)>,
    /// How the patch was verified.
    pub(super) verification: Option<VerificationSummary>,
    /// What a partial delivery lists as verified.
    pub(super) verified: Vec<String>,
    /// And as not verified or not done.
    pub(super) not_verified: Vec<String>,
}

impl Ledger {
    /// The budget decision that chose last, for people.
    pub(super) fn last_budget_decision(&self) -> String {
        self.decisions
            .last()
            .map_or_else(|| "-".to_owned(), |d| d.id.clone())
    }

    /// How the patch was verified, in a few words.
    pub(super) fn verified_line(&self) -> String {
        match &self.verification {
            Some(v) if v.selection.is_empty() => {
                format!("The full suite passes ({} tests)", v.tests)
            }
            Some(v) => format!(
                "The {} tests touching the change pass ({}; {} others not run)",
                v.tests,
                v.selection.join(", "),
                v.suite.saturating_sub(v.tests)
            ),
            None => "Tests pass".to_owned(),
        }
    }
}

impl Demo {
    pub(super) fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The budget left, for checkpoints.
    pub(super) fn remaining(&self) -> Option<Budget> {
        let l = self.ledger();
        let b = &l.budget;
        if b.max_tokens.is_none() && b.max_wall_seconds.is_none() && b.max_cost_usd.is_none() {
            return None;
        }
        Some(Budget {
            max_tokens: b.max_tokens.map(|m| m.saturating_sub(l.usage.tokens)),
            max_wall_seconds: b
                .max_wall_seconds
                .map(|m| m.saturating_sub(l.usage.wall_seconds)),
            max_cost_usd: b.max_cost_usd.map(|m| (m - l.usage.cost_usd).max(0.0)),
            ..Budget::default()
        })
    }

    /// Reports what `step` spent. When that crosses a budget threshold, checkpoints the wait
    /// (nothing in progress; `waiting` is the step that waits), gets the choice and returns it.
    pub(super) async fn spend(
        &self,
        run: &Run,
        done: &Done,
        step: &'static str,
        tokens: u64,
        waiting: &str,
    ) -> Result<Option<String>, DemoError> {
        let wall = {
            let mut l = self.ledger();
            let now = Instant::now();
            let since = l.last_report.map_or(0, |t| now.duration_since(t).as_secs());
            l.last_report = Some(now);
            since
        };
        let cost = tokens as f64 * USD_PER_TOKEN;
        let reported = run.usage(tokens, cost, wall).await?;
        let (budget, usage) = (reported.task.budget, reported.task.usage);
        let of = match budget.max_tokens {
            Some(max) if max > 0 => format!(
                " — {} of {} tokens ({:.0}%)",
                thousands(usage.tokens),
                thousands(max),
                usage.tokens as f64 * 100.0 / max as f64
            ),
            _ => String::new(),
        };
        self.say(
            "usage",
            format!("{step}: +{} tokens, ${cost:.2}{of}", thousands(tokens)),
        );
        {
            let mut l = self.ledger();
            l.budget = budget;
            l.usage = usage;
        }
        let Some(d) = reported.budget_decision else {
            return Ok(None);
        };
        let options: String = d
            .options
            .iter()
            .map(|o| {
                format!(
                    "\n            · {} — {}; gives up {}{}",
                    o.id,
                    o.label,
                    o.gives_up,
                    o.cost
                        .as_deref()
                        .map(|c| format!("; costs {c}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        self.say("budget", format!("{} asks: {}{options}", d.id, d.question));
        let cp = self
            .checkpoint(
                run,
                done,
                "human_wait",
                Some(PendingStep {
                    step: waiting.to_owned(),
                    intent_digest: None,
                    idempotency_key: None,
                    approval_id: Some(d.id.clone()),
                }),
                vec![],
                format!("waiting for the budget choice {}", d.id),
            )
            .await?;
        self.say(
            "checkpoint",
            format!(
                "#{} {} (waiting for the budget choice)",
                cp.sequence,
                short(&cp.digest)
            ),
        );
        run.say(format!(
            "{} Before I go on: {}",
            d.question,
            d.options
                .iter()
                .map(|o| format!("`{}` ({})", o.id, o.label))
                .collect::<Vec<_>>()
                .join(", ")
        ))
        .await?;
        let closed = self.choose(run, &d).await?;
        let option = chosen_option(&closed).map(str::to_owned);
        let by = closed.outcome.as_ref().map(|o| o.by.clone());
        self.say(
            "budget",
            match (closed.status, option.as_deref()) {
                (DecisionStatus::Expired, Some(o)) => format!(
                    "{} expired: nobody answered, so the default `{o}` applies",
                    closed.id
                ),
                (_, Some(o)) => format!(
                    "{} answered `{o}` by {}",
                    closed.id,
                    by.as_deref().unwrap_or("nobody")
                ),
                (s, None) => format!("{} is {s}; going on as planned", closed.id),
            },
        );
        if let Some(o) = &option {
            run.say(format!(
                "Budget decision {}: going with `{o}` ({}).",
                closed.id,
                if closed.status == DecisionStatus::Expired {
                    "nobody answered; the stated default"
                } else {
                    "as answered"
                }
            ))
            .await?;
        }
        let mut l = self.ledger();
        if option.is_some() {
            l.choice = option.clone();
        }
        l.decisions.push(DecisionSummary {
            id: closed.id.clone(),
            question: closed.question.clone(),
            status: closed.status,
            option: option.clone(),
            by,
            intent_digest: None,
        });
        Ok(option)
    }

    /// Answers a budget decision as the plan says, or tells a person how; then waits for the
    /// choice (or the default).
    async fn choose(&self, run: &Run, d: &Decision) -> Result<Decision, DemoError> {
        let default = d.default_option.as_deref().unwrap_or("none");
        let left = (d.expires_at - chrono::Utc::now()).num_seconds().max(0);
        match (self.plan.choice, &self.cfg.admin_token) {
            (Some(BudgetChoice::Default), _) => self.say(
                "budget",
                format!(
                    "nobody answers (--budget-choice default): `{default}` applies when it expires in {left} s"
                ),
            ),
            (Some(choice), Some(admin)) => {
                let option = choice.option().unwrap_or(default);
                self.resolve_as_admin(admin, &d.id, option).await?;
                self.say(
                    "budget",
                    format!("answered `{option}` through the admin route (--budget-choice)"),
                );
            }
            (Some(_), None) => {
                return Err(DemoError::Resume(
                    "`--budget-choice` answers the budget decision through the admin route and needs the admin token: add `--admin-token`, or leave it out and answer it yourself".into(),
                ));
            }
            (None, admin) => {
                let bearer = admin
                    .as_deref()
                    .unwrap_or("<admin token from the data dir's admin.token>");
                self.say(
                    "budget",
                    format!(
                        "waiting for a person; `{default}` applies in {left} s. Choose with:\n            curl -sX POST {}/v1/admin/decisions/{}/resolve -H 'authorization: Bearer {bearer}' -H 'content-type: application/json' -d '{{\"option\":\"{FULL_SUITE}\"}}'\n            (options: {})",
                        self.cfg.server.trim_end_matches('/'),
                        d.id,
                        d.options
                            .iter()
                            .map(|o| o.id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
        }
        Ok(run.budget_choice(d).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(32_300), "32,300");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn every_option_says_what_it_gives_up_and_the_default_is_one_of_them() {
        let b = BudgetPlan::default().budget(12, 5);
        assert!(b.options.iter().all(|o| !o.gives_up.is_empty()));
        assert!(b.options[0].gives_up.starts_with("the other 7 tests"));
        assert_eq!(b.options[0].cost.as_deref(), Some("~2,000 tokens"));
        let default = b.default_option.unwrap();
        assert!(b.options.iter().any(|o| o.id == default));
    }
}
