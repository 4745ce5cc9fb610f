//! Bounded retries and partial delivery (SPEC §6). A step that fails for its own reasons (a
//! flaky test, a tool that times out) is tried again up to a bound — transport failures are
//! not counted here, the client already retries those. Past the bound the agent gets an
//! [`Exhausted`] it turns into a human decision ([`Exhausted::decision`]) or a partial
//! delivery ([`PartialDelivery`], finished with [`Run::deliver_partially`]) that lists
//! what was and was not verified — never a silent "done".

use std::future::Future;

use waymark_proto::{DecisionKind, DecisionOption, RequestDecision};

use crate::error::Error;
use crate::run::Run;

/// The option of an [`Exhausted::decision`] that tries the step again, as many times more.
pub const RETRY_AGAIN: &str = "retry";
/// The option of an [`Exhausted::decision`] that stops and delivers what was verified.
pub const DELIVER_PARTIAL: &str = "deliver_partial";

/// How a bounded step ended.
#[derive(Debug)]
pub enum Retried<T, E> {
    /// It succeeded on attempt `attempts` (1 = the first); `failures` are the tries before.
    Succeeded {
        /// What it produced.
        value: T,
        /// How many tries it took.
        attempts: u32,
        /// What the failed tries said, oldest first.
        failures: Vec<E>,
    },
    /// Every try up to the bound failed.
    Exhausted(Exhausted<E>),
}

/// A step that failed as many times as it was allowed to.
#[derive(Debug)]
pub struct Exhausted<E> {
    /// The plan step.
    pub step: String,
    /// The bound: how many tries were made.
    pub bound: u32,
    /// What each try said, oldest first (never empty).
    pub failures: Vec<E>,
}

impl<E> Exhausted<E> {
    /// The last try's failure.
    pub fn last(&self) -> &E {
        self.failures
            .last()
            .expect("an exhausted step failed at least once")
    }

    /// A recovery decision asking a person what happens past the bound: try
    /// [`RETRY_AGAIN`] or [`DELIVER_PARTIAL`] (the default on expiry). `question` says what
    /// failed; open it with [`Run::decision`].
    pub fn decision(&self, question: impl Into<String>) -> RequestDecision {
        RequestDecision {
            attempt_id: None,
            fence: None,
            kind: DecisionKind::Recovery,
            step: Some(self.step.clone()),
            question: question.into(),
            options: vec![
                DecisionOption {
                    id: RETRY_AGAIN.into(),
                    label: format!("Try `{}` {} more times", self.step, self.bound),
                    gives_up: "time and budget on a step that has failed every try so far".into(),
                    cost: None,
                },
                DecisionOption {
                    id: DELIVER_PARTIAL.into(),
                    label: "Stop and deliver what was verified".into(),
                    gives_up: format!(
                        "the verification `{}` would have given; the task ends partially delivered",
                        self.step
                    ),
                    cost: Some("nothing more".into()),
                },
            ],
            default_option: Some(DELIVER_PARTIAL.into()),
            expires_in_seconds: None,
            form: None,
        }
    }
}

/// What a partially delivered task hands over: the part delivered, what was verified, and
/// what was not (checks not run or failing, steps not done).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartialDelivery {
    /// What is delivered, e.g. "the patch a1b2c3 (fix.diff 4d5e6f)".
    pub delivered: String,
    /// What was checked and held, one item each.
    pub verified: Vec<String>,
    /// What was not checked, failed, or not done, one item each.
    pub not_verified: Vec<String>,
}

impl PartialDelivery {
    /// The summary the attempt finishes with: what was delivered, then both lists.
    pub fn summary(&self) -> String {
        let list = |items: &[String]| {
            if items.is_empty() {
                "\n- nothing".to_owned()
            } else {
                items.iter().map(|i| format!("\n- {i}")).collect()
            }
        };
        format!(
            "Partially delivered: {}.\nVerified:{}\nNot verified:{}",
            self.delivered.trim_end_matches('.'),
            list(&self.verified),
            list(&self.not_verified)
        )
    }
}

impl Run {
    /// Runs `attempt` (given the try number, from 1) until it returns `Ok(Ok(_))` or `bound`
    /// tries have returned `Ok(Err(_))`. An outer `Err` — the control plane refused, the run was
    /// cancelled, a tool could not start — stops at once and is returned: only the step's own
    /// failures are retried. Between tries the run honours a pause and stops when cancelled.
    pub async fn retry_step<T, E, X, F, Fut>(
        &self,
        step: &str,
        bound: u32,
        mut attempt: F,
    ) -> Result<Retried<T, E>, X>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<Result<T, E>, X>>,
        X: From<Error>,
    {
        let bound = bound.max(1);
        let mut failures = Vec::new();
        for n in 1..=bound {
            if n > 1 {
                self.wait_if_paused().await?;
            }
            self.shared.check_live()?;
            match attempt(n).await? {
                Ok(value) => {
                    return Ok(Retried::Succeeded {
                        value,
                        attempts: n,
                        failures,
                    });
                }
                Err(e) => {
                    tracing::info!(step, attempt = n, bound, "the step failed");
                    failures.push(e);
                }
            }
        }
        Ok(Retried::Exhausted(Exhausted {
            step: step.to_owned(),
            bound,
            failures,
        }))
    }

    /// Ends the attempt `partially_delivered`, with [`PartialDelivery::summary`].
    pub async fn deliver_partially(
        &self,
        delivery: &PartialDelivery,
    ) -> crate::error::Result<waymark_proto::Attempt> {
        self.finish(
            waymark_proto::FinishOutcome::PartiallyDelivered,
            Some(delivery.summary()),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_lists_what_was_and_was_not_verified() {
        let p = PartialDelivery {
            delivered: "the patch abc.".into(),
            verified: vec!["tests/test_cart.py: 5 of 5 passed".into()],
            not_verified: vec![],
        };
        assert_eq!(
            p.summary(),
            "Partially delivered: the patch abc.\nVerified:\n- tests/test_cart.py: 5 of 5 passed\nNot verified:\n- nothing"
        );
    }

    #[test]
    fn past_the_bound_a_person_is_asked_with_a_default_that_delivers_partially() {
        let e = Exhausted {
            step: "verify".into(),
            bound: 3,
            failures: vec!["a", "b", "c"],
        };
        assert_eq!(*e.last(), "c");
        let d = e.decision("verify failed 3 times");
        assert_eq!(d.kind, DecisionKind::Recovery);
        assert_eq!(d.default_option.as_deref(), Some(DELIVER_PARTIAL));
        assert!(d.options.iter().all(|o| !o.gives_up.is_empty()));
        assert_eq!(d.options[0].label, "Try `verify` 3 more times");
    }
}
