//! Re-verification as the budget choice says — only the test files touching the change, the
//! full suite, or none — tried up to a bound; and how the run stops short of the deploy: a
//! partial delivery (or, asked for, a report) listing what was and was not verified.

use waymark_proto::*;

use super::budget::{
    DELIVER_PATCH, FULL_SUITE, RELEVANT_TESTS, TOKENS_PER_TEST, TOKENS_VERIFY_BASE, VERIFY_TRIES,
};
use super::repo::Repo;
use super::{
    DEPLOY, DecisionSummary, Demo, DemoError, DemoSummary, Done, FAILING_TEST, FIX, REPORT,
    SERVICE, VERIFY, VerificationSummary, short,
};
use crate::retry::{PartialDelivery, Retried};
use crate::run::Run;

/// Where the run goes after verification.
pub(super) enum Next {
    /// On to the deploy.
    Continue(Done),
    /// It finished short of it.
    Finished(Box<DemoSummary>),
}

/// Why the run stops before deploying; the decision id that said so.
pub(super) enum Stop {
    /// The budget choice was to deliver the patch as it is.
    Budget(String),
    /// Verification failed every try, on tests other than the alert's.
    Exhausted(u32),
    /// The deploy approval was denied.
    Denied(String),
    /// The deploy approval was denied to only write the report (finishes `completed`).
    ReportOnly(String),
}

/// `tests.test_cart` + `test_x` → `tests/test_cart.py::test_x`.
fn node(f: &TestFailure) -> String {
    format!("{}.py::{}", f.classname.replace('.', "/"), f.name)
}

fn failures(r: &TestReceipt) -> Vec<String> {
    r.failures
        .iter()
        .map(|f| {
            format!(
                "{}: {}",
                node(f),
                f.message.lines().next().unwrap_or_default()
            )
        })
        .collect()
}

impl Demo {
    /// Runs the tests the budget choice allows, up to [`VERIFY_TRIES`] times.
    pub(super) async fn verify(
        &self,
        run: &Run,
        repo: &Repo,
        mut done: Done,
    ) -> Result<Next, DemoError> {
        let commit = done.commit.clone().ok_or_else(|| {
            DemoError::Resume("the checkpoints record no commit to verify".into())
        })?;
        let choice = self.ledger().choice.clone();
        if choice.as_deref() == Some(DELIVER_PATCH) {
            self.say(
                VERIFY,
                "skipped: the budget choice is to deliver the patch with the checks already done",
            );
            let by = self.ledger().last_budget_decision();
            let s = self
                .stop(run, repo, done, &commit, Stop::Budget(by), None)
                .await?;
            return Ok(Next::Finished(Box::new(s)));
        }
        run.wait_if_paused().await?;
        let suite = self.ledger().suite.len();
        let selection = if choice.as_deref() == Some(RELEVANT_TESTS) {
            let changed = repo.changed_files().await?;
            let files = repo.tests_touching(&changed);
            if files.is_empty() {
                self.say(
                    VERIFY,
                    format!(
                        "no test file imports {}; running the full suite instead",
                        changed.join(", ")
                    ),
                );
            } else {
                self.say(
                    VERIFY,
                    format!(
                        "budget choice `{RELEVANT_TESTS}`: only the tests touching {} — {}",
                        changed.join(", "),
                        files.join(", ")
                    ),
                );
            }
            files
        } else {
            self.say(
                VERIFY,
                format!(
                    "the full suite, {suite} tests{}",
                    if choice.as_deref() == Some(FULL_SUITE) {
                        format!(" (budget choice `{FULL_SUITE}`)")
                    } else {
                        String::new()
                    }
                ),
            );
            Vec::new()
        };
        let head = repo.head().await?;
        let junit = self.cfg.workdir.join("junit-verify.xml");
        let (head_r, selection_r, junit_r) = (&head, &selection, &junit);
        let outcome = run
            .retry_step(VERIFY, VERIFY_TRIES, move |n| async move {
                let t = repo.test(junit_r, selection_r).await?;
                let receipt = run
                    .test_receipt(
                        Some(VERIFY),
                        &t.command,
                        t.exit_code,
                        Some(head_r),
                        t.junit_xml,
                    )
                    .await?;
                if !receipt.passed {
                    self.say(
                        VERIFY,
                        format!(
                            "try {n} of {VERIFY_TRIES}: {} of {} passed — {} (receipt {})",
                            receipt.totals.passed,
                            receipt.totals.tests,
                            failures(&receipt).join("; "),
                            receipt.id
                        ),
                    );
                }
                Ok::<_, DemoError>(if receipt.passed {
                    Ok(receipt)
                } else {
                    Err(receipt)
                })
            })
            .await?;
        let (receipt, tries) = match outcome {
            Retried::Succeeded {
                value, attempts, ..
            } => (value, attempts),
            Retried::Exhausted(e) => {
                let tries = e.bound;
                let last = e.failures.into_iter().next_back().ok_or_else(|| {
                    DemoError::Resume("verification ended without a receipt".into())
                })?;
                (last, tries)
            }
        };
        let scope = if selection.is_empty() {
            FULL_SUITE
        } else {
            RELEVANT_TESTS
        };
        self.ledger().verification = Some(VerificationSummary {
            scope: scope.into(),
            selection: selection.clone(),
            command: receipt.command.clone(),
            tests: receipt.totals.tests,
            passed: receipt.totals.passed,
            suite: suite as u64,
            tries,
            passed_all: receipt.passed,
            failing: failures(&receipt),
            receipt: receipt.id.clone(),
        });
        let tokens =
            u64::from(tries) * (TOKENS_VERIFY_BASE + TOKENS_PER_TEST * receipt.totals.tests);
        let line = format!(
            "{} of {} passed at {} (receipt {}, junit {})",
            receipt.totals.passed,
            receipt.totals.tests,
            short(&head),
            receipt.id,
            short(&receipt.junit_sha256)
        );
        if receipt.passed {
            self.say(
                VERIFY,
                if tries > 1 {
                    format!("{line}, on try {tries} of {VERIFY_TRIES}")
                } else {
                    line.clone()
                },
            );
            done.add(CompletedStep {
                step: VERIFY.into(),
                artifact_digests: vec![receipt.junit_sha256.clone()],
                verified: true,
            });
            run.say(format!("Verified: {line}.")).await?;
            let verified = self.ledger().verified_line();
            let cp = self
                .checkpoint(run, &done, "step_completed", None, vec![], verified)
                .await?;
            self.say(
                "checkpoint",
                format!("#{} {}", cp.sequence, short(&cp.digest)),
            );
            if self
                .spend(run, &done, VERIFY, tokens, DEPLOY)
                .await?
                .as_deref()
                == Some(DELIVER_PATCH)
            {
                let by = self.ledger().last_budget_decision();
                let s = self
                    .stop(run, repo, done, &commit, Stop::Budget(by), None)
                    .await?;
                return Ok(Next::Finished(Box::new(s)));
            }
            return Ok(Next::Continue(done));
        }

        // Past the bound. Whatever a budget decision says now, the run stops here.
        self.spend(run, &done, VERIFY, tokens, VERIFY).await?;
        let alert_fails = receipt.failures.iter().any(|f| node(f) == FAILING_TEST);
        if alert_fails {
            run.say(format!(
                "The suite still fails after the patch: {line}. Stopping; nothing was deployed."
            ))
            .await?;
            let summary =
                format!("the patch did not make the suite pass ({line}); nothing deployed");
            run.finish(FinishOutcome::Failed, Some(summary.clone()))
                .await?;
            let s = self
                .summary(run, repo, &done, FinishOutcome::Failed, summary, None, None)
                .await?;
            return Ok(Next::Finished(Box::new(s)));
        }
        self.say(
            VERIFY,
            format!(
                "gave up after {tries} tries: the alert's test passes, but {} failed every try",
                receipt
                    .failures
                    .iter()
                    .map(node)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        run.say(format!(
            "Verification failed {tries} times in a row on tests other than the alert's ({}). I won't retry past the bound or deploy unverified; delivering the patch with what was and was not verified.",
            failures(&receipt).join("; ")
        ))
        .await?;
        let s = self
            .stop(run, repo, done, &commit, Stop::Exhausted(tries), None)
            .await?;
        Ok(Next::Finished(Box::new(s)))
    }

    /// What was and was not verified of the patch at `commit`.
    fn lists(&self, done: &Done, commit: &str) -> (Vec<String>, Vec<String>) {
        let l = self.ledger();
        let mut verified = Vec::new();
        let mut not_verified = Vec::new();
        if let Some((head, receipt)) = &l.reproduced {
            verified.push(format!(
                "the alert reproduced: `{FAILING_TEST}` fails at {} (receipt {receipt})",
                short(head)
            ));
        }
        match &l.verification {
            None if done.has(VERIFY) => verified.push(format!(
                "the tests at {} (verified by an earlier attempt)",
                short(commit)
            )),
            None => {
                not_verified.push(format!("the patch at {}: no test ran on it", short(commit)));
                not_verified.push(format!("the suite: {} tests not run", l.suite.len()));
            }
            Some(v) => {
                let ran = if v.selection.is_empty() {
                    "the full suite".to_owned()
                } else {
                    v.selection.join(", ")
                };
                let alert_ran = v.selection.is_empty()
                    || v.selection
                        .iter()
                        .any(|s| FAILING_TEST.starts_with(&format!("{s}::")));
                if !v.passed_all
                    && alert_ran
                    && !v.failing.iter().any(|f| f.starts_with(FAILING_TEST))
                {
                    verified.push(format!("`{FAILING_TEST}` passes at {}", short(commit)));
                }
                verified.push(format!(
                    "{} of {} tests pass at {} ({ran}; receipt {})",
                    v.passed,
                    v.tests,
                    short(commit),
                    v.receipt
                ));
                for f in &v.failing {
                    not_verified.push(format!("{f} — failed all {} tries", v.tries));
                }
                if !v.selection.is_empty() && v.suite > v.tests {
                    let mut others: Vec<&str> = l
                        .suite
                        .iter()
                        .filter_map(|t| t.split("::").next())
                        .filter(|f| !v.selection.iter().any(|s| s == f))
                        .collect();
                    others.dedup();
                    not_verified.push(format!(
                        "{} tests outside the change, not run ({})",
                        v.suite - v.tests,
                        others.join(", ")
                    ));
                }
            }
        }
        (verified, not_verified)
    }

    /// Stops before the deploy: writes report.md with what was and was not verified, and
    /// finishes `partially_delivered` (or `completed`, for "report only").
    pub(super) async fn stop(
        &self,
        run: &Run,
        repo: &Repo,
        mut done: Done,
        commit: &str,
        stop: Stop,
        approval: Option<DecisionSummary>,
    ) -> Result<DemoSummary, DemoError> {
        let (verified, mut not_verified) = self.lists(&done, commit);
        let not_done = match &stop {
            Stop::Budget(id) => format!(
                "the deploy to staging: not done — the budget choice `{DELIVER_PATCH}` ({id}) stopped the run before it"
            ),
            Stop::Exhausted(tries) => format!(
                "the deploy to staging: not done — verification did not pass in {tries} tries"
            ),
            Stop::Denied(id) => {
                format!("the deploy to staging: denied and did not happen (approval {id})")
            }
            Stop::ReportOnly(id) => format!(
                "the deploy to staging: not done — stop and only write the report, as asked (approval {id})"
            ),
        };
        not_verified.push(not_done.clone());
        let detail = self.client.task(run.task_id()).await?;
        let bullets =
            |items: &[String]| -> String { items.iter().map(|i| format!("* {i}\n")).collect() };
        let mut text = format!(
            "# Incident report: {SERVICE} percentage discount\n\n## What happened\n\n`{FAILING_TEST}` failed: a 10% discount divided by 10 instead of 100, so promo orders were charged the wrong total.\n\n## What was done\n\n"
        );
        for s in &done.steps {
            text.push_str(&format!(
                "* `{}` — verified: {}; artifacts: {}\n",
                s.step,
                s.verified,
                s.artifact_digests
                    .iter()
                    .map(|d| format!("`{}`", short(d)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        text.push_str("\n## Test receipts\n\n");
        for r in &detail.test_receipts {
            text.push_str(&format!(
                "* {} `{}` at {}: {} passed, {} failed — {}\n",
                r.step.as_deref().unwrap_or("-"),
                r.command,
                r.commit.as_deref().map(short).unwrap_or("-"),
                r.totals.passed,
                r.totals.failures + r.totals.errors,
                if r.passed { "pass" } else { "FAIL" }
            ));
        }
        text.push_str(&format!(
            "\n## Verified\n\n{}\n## Not verified\n\n{}\n## Not done\n\nThe fix ({}) was **not deployed** to staging: {}.\n",
            bullets(&verified),
            bullets(&not_verified),
            short(commit),
            not_done
                .split_once(": ")
                .map_or(not_done.as_str(), |(_, why)| why)
        ));
        let artifact = run
            .artifact(
                "report.md",
                "text/markdown",
                text.into_bytes(),
                Some(REPORT),
            )
            .await?;
        self.say(
            REPORT,
            format!(
                "report.md {} ({} bytes)",
                short(&artifact.sha256),
                artifact.size
            ),
        );
        done.add(CompletedStep {
            step: REPORT.into(),
            artifact_digests: vec![artifact.sha256.clone()],
            verified: false,
        });
        let cp = self
            .checkpoint(
                run,
                &done,
                "step_completed",
                None,
                vec![],
                "report written; not deployed".into(),
            )
            .await?;
        self.say(
            "checkpoint",
            format!("#{} {}", cp.sequence, short(&cp.digest)),
        );
        let diff = done.digest(FIX).unwrap_or_default();
        let (outcome, summary) = if let Stop::ReportOnly(_) = stop {
            let summary = format!(
                "Report only, as asked: patch {} verified by the tests, report.md {}; staging not deployed.",
                short(commit),
                short(&artifact.sha256)
            );
            run.say(summary.clone()).await?;
            run.finish(FinishOutcome::Completed, Some(summary.clone()))
                .await?;
            (FinishOutcome::Completed, summary)
        } else {
            let delivery = PartialDelivery {
                delivered: format!(
                    "the patch {} (fix.diff {}) and report.md {}",
                    short(commit),
                    short(&diff),
                    short(&artifact.sha256)
                ),
                verified: verified.clone(),
                not_verified: not_verified.clone(),
            };
            let summary = delivery.summary();
            run.say(summary.clone()).await?;
            run.deliver_partially(&delivery).await?;
            (FinishOutcome::PartiallyDelivered, summary)
        };
        {
            let mut l = self.ledger();
            l.verified = verified;
            l.not_verified = not_verified;
        }
        self.summary(run, repo, &done, outcome, summary, approval, None)
            .await
    }
}
