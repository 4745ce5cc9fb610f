//! The demo agent: the seeds' incident scenario as a real run. An alert names a failing test
//! in a real git repository; the agent reproduces it, patches, re-verifies, asks approval to
//! deploy to staging, and deploys through the reference deploy service — checkpointing at each
//! boundary. It reports what each step spends against a token budget; the fix crosses 80%, and
//! the budget decision that opens decides how the patch is verified (only the tests touching
//! the change, the full suite, or none: deliver the patch as it is). Verification is retried
//! up to a bound; past it the run delivers partially, listing what was and was not verified.
//! Scenarios inject the failures recovery exists for (a crash after the provider committed, a
//! worker hung past its lease, a second worker resuming, a flaky upstream in the tests).
//! Nothing here prints: progress goes to a [`Reporter`], and the CLI decides how it reads.

mod budget;
mod repo;
mod verify;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};
use waymark_proto::digest::json_digest;
use waymark_proto::*;

use crate::client::Client;
use crate::deploy_service::{DeployClient, DeployServiceError};
use crate::effect::{ProviderError, Resolution};
use crate::error::Error;
use crate::run::{ApprovalOptions, AttemptOptions, Run, chosen_option};

pub use budget::{BudgetChoice, BudgetPlan};
use budget::{Ledger, TOKENS_DELIVER, TOKENS_FIX, TOKENS_REPRODUCE};
use repo::{FAILING_TEST, Repo};

/// Plan step ids.
const REPRODUCE: &str = "reproduce";
const FIX: &str = "fix";
const VERIFY: &str = "verify";
const DEPLOY: &str = "deploy_staging";
const REPORT: &str = "report";
const TARGET: &str = "staging";
const SERVICE: &str = "checkout-service";

/// Which failure the run injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// The whole run, no failure.
    #[default]
    Normal,
    /// Exit (code 70) right after the deploy service committed, before the receipt is recorded.
    CrashAfterCommit,
    /// Stop heartbeating before deploying and sleep past the lease until a newer worker has
    /// deployed; the late deploy is then refused by the deploy service.
    HangPastLease,
    /// Attach to an existing task (`task`), start a new attempt, reconcile and continue.
    Resume,
    /// The promo service the tests call times out, more times than verification may be tried:
    /// past the bound the run delivers the patch partially, listing what was not verified.
    FlakyTests,
}

/// How the demo answers its own approval (through the admin route, so it needs the admin
/// token).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AutoApprove {
    /// Approve the deploy.
    Yes,
    /// Deny it: the run delivers the patch and a report, `partially_delivered`.
    No,
    /// "Stop, only write the report": denied, and the run finishes `completed` with a report.
    Report,
}

/// The exit code of the `crash-after-commit` scenario.
pub const CRASH_EXIT_CODE: i32 = 70;

/// Where the demo runs and what it injects.
#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// Control plane URL.
    pub server: String,
    /// The fingerprint (`sha256:<hex>`) of the control plane's certificate, to trust it alone
    /// (see `ClientBuilder::pin`).
    pub server_fp: Option<String>,
    /// Worker token.
    pub token: String,
    /// Admin token, to resolve the approval itself (`approve`).
    pub admin_token: Option<String>,
    /// Deploy service URL.
    pub deploy_url: String,
    /// Where the sample repository and test output go.
    pub workdir: PathBuf,
    /// The failure to inject.
    pub scenario: Scenario,
    /// Answer the approval itself instead of waiting for a person.
    pub approve: Option<AutoApprove>,
    /// The task to resume (`Scenario::Resume`).
    pub task: Option<String>,
    /// Lease length.
    pub lease: Duration,
    /// The worker's name.
    pub worker: String,
}

impl DemoConfig {
    /// A client of the control plane with `token`, pinned when `server_fp` says.
    fn client(&self, token: &str) -> Result<Client, Error> {
        let mut b = Client::builder(&self.server, token.to_owned());
        if let Some(fp) = &self.server_fp {
            b = b.pin(fp.clone());
        }
        b.build()
    }
}

/// One line of progress.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Progress {
    /// The step (`repo`, `reproduce`, `approval`, `deploy`…).
    pub step: &'static str,
    /// What happened.
    pub text: String,
}

/// Receives progress as it happens.
pub type Reporter = Arc<dyn Fn(Progress) + Send + Sync>;

/// Why the demo stopped short.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// The control plane refused or could not be reached.
    #[error(transparent)]
    Sdk(#[from] Error),
    /// `git` or `python3` failed.
    #[error("`{command}` failed: {reason}")]
    Tool {
        /// The command.
        command: String,
        /// Why.
        reason: String,
    },
    /// The deploy service could not be used.
    #[error(transparent)]
    DeployService(#[from] DeployServiceError),
    /// The task cannot be resumed as asked.
    #[error("{0}")]
    Resume(String),
}

/// A decision, as the summary shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DecisionSummary {
    /// `dec_…`.
    pub id: String,
    /// What it asked.
    pub question: String,
    /// `resolved`, `expired`, `void`.
    pub status: DecisionStatus,
    /// The option that applied.
    pub option: Option<String>,
    /// Who decided.
    pub by: Option<String>,
    /// The intent digest it was bound to.
    pub intent_digest: Option<String>,
}

/// The deploy, as the summary shows it.
#[derive(Debug, Clone, Serialize)]
pub struct DeploySummary {
    /// `eff_…`.
    pub effect_id: String,
    /// The idempotency key.
    pub idempotency_key: String,
    /// Ran now, found confirmed, or reconciled with the deploy service.
    pub resolution: Resolution,
    /// The deploy service's receipt.
    pub receipt: Value,
}

/// How the patch was verified.
#[derive(Debug, Clone, Serialize)]
pub struct VerificationSummary {
    /// `relevant_tests` (the test files touching the change) or `full_suite`.
    pub scope: String,
    /// The test files run (empty: the whole suite).
    pub selection: Vec<String>,
    /// The pytest command of the last try.
    pub command: String,
    /// Tests the last try ran.
    pub tests: u64,
    /// Of which passed.
    pub passed: u64,
    /// Tests in the whole suite.
    pub suite: u64,
    /// Tries made (bounded).
    pub tries: u32,
    /// Whether the last try passed.
    pub passed_all: bool,
    /// The last try's failing tests (`node id: message`).
    pub failing: Vec<String>,
    /// The last try's receipt.
    pub receipt: String,
}

/// What a finished demo run produced.
#[derive(Debug, Clone, Serialize)]
pub struct DemoSummary {
    /// The task.
    pub task_id: String,
    /// The last attempt.
    pub attempt_id: String,
    /// Its fence.
    pub fence: i64,
    /// How it finished.
    pub outcome: FinishOutcome,
    /// The summary it finished with.
    pub summary: String,
    /// The sample repository.
    pub repo: PathBuf,
    /// The fixed commit.
    pub commit: Option<String>,
    /// The approval.
    pub decision: Option<DecisionSummary>,
    /// The budget decisions the run's spend opened, and how each closed.
    pub budget: Vec<DecisionSummary>,
    /// Spend reported, as the control plane totals it.
    pub usage: Usage,
    /// How the patch was verified (absent when no test ran on it).
    pub verification: Option<VerificationSummary>,
    /// What was verified (for a partial delivery: what the summary lists).
    pub verified: Vec<String>,
    /// What was not verified or not done.
    pub not_verified: Vec<String>,
    /// The deploy.
    pub deploy: Option<DeploySummary>,
    /// Artifacts: (name, sha256).
    pub artifacts: Vec<(String, String)>,
    /// Checkpoints written to the task.
    pub checkpoints: usize,
    /// Whether the checkpoint chain verifies.
    pub chain_intact: bool,
}

/// The first 12 hex digits of a digest or commit, for people.
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    &hex[..hex.len().min(12)]
}

/// What the run has done so far; rebuilt from the last checkpoint on resume.
#[derive(Debug, Default)]
struct Done {
    steps: Vec<CompletedStep>,
    commit: Option<String>,
}

impl Done {
    fn has(&self, step: &str) -> bool {
        self.steps.iter().any(|s| s.step == step)
    }

    fn digest(&self, step: &str) -> Option<String> {
        self.steps
            .iter()
            .find(|s| s.step == step)
            .and_then(|s| s.artifact_digests.first().cloned())
    }

    fn add(&mut self, step: CompletedStep) {
        self.steps.retain(|s| s.step != step.step);
        self.steps.push(step);
    }
}

struct Demo {
    cfg: DemoConfig,
    plan: BudgetPlan,
    report: Reporter,
    client: Client,
    deploy: DeployClient,
    ledger: std::sync::Mutex<Ledger>,
}

impl Demo {
    fn say(&self, step: &'static str, text: impl Into<String>) {
        (self.report)(Progress {
            step,
            text: text.into(),
        });
    }
}

/// Runs the demo scenario to its end; budget decisions wait for a person (or their default,
/// after [`BudgetPlan::default`]'s wait).
pub async fn run(cfg: DemoConfig, report: Reporter) -> Result<DemoSummary, DemoError> {
    run_with(cfg, BudgetPlan::default(), report).await
}

/// Runs the demo scenario to its end, answering budget decisions as `plan` says.
pub async fn run_with(
    cfg: DemoConfig,
    plan: BudgetPlan,
    report: Reporter,
) -> Result<DemoSummary, DemoError> {
    let client = cfg.client(&cfg.token)?;
    client.health().await?;
    let deploy = DeployClient::new(&cfg.deploy_url)?;
    let demo = Demo {
        cfg,
        plan,
        report,
        client,
        deploy,
        ledger: std::sync::Mutex::new(Ledger {
            last_report: Some(std::time::Instant::now()),
            ..Ledger::default()
        }),
    };
    match demo.cfg.scenario {
        Scenario::Resume => demo.resume().await,
        _ => demo.fresh().await,
    }
}

fn plan() -> Vec<PlanStep> {
    let step = |id: &str, title: &str, after: &[&str]| PlanStep {
        id: id.into(),
        title: title.into(),
        depends_on: after.iter().map(|s| (*s).to_owned()).collect(),
    };
    vec![
        step(REPRODUCE, "Reproduce the failing test", &[]),
        step(FIX, "Patch the bug", &[REPRODUCE]),
        step(
            VERIFY,
            "Re-run the tests (as the budget allows, retried up to a bound)",
            &[FIX],
        ),
        step(DEPLOY, "Deploy to staging (needs approval)", &[VERIFY]),
    ]
}

impl Demo {
    fn options(&self) -> AttemptOptions {
        AttemptOptions::new(self.cfg.worker.clone())
            .lease(self.cfg.lease)
            .manifest_digest(
                json_digest(
                    &json!({"agent": "waymark-demo", "version": env!("CARGO_PKG_VERSION")}),
                )
                .unwrap_or_default(),
            )
    }

    async fn fresh(&self) -> Result<DemoSummary, DemoError> {
        let mut repo = Repo::create(&self.cfg.workdir.join(SERVICE)).await?;
        let head = repo.head().await?;
        let suite = repo.collect().await?;
        self.say(
            "repo",
            format!(
                "created {} at {} ({} tests)",
                repo.path.display(),
                short(&head),
                suite.len()
            ),
        );
        if self.cfg.scenario == Scenario::FlakyTests {
            let outage = self.cfg.workdir.join("promo-outage");
            std::fs::write(&outage, budget::PROMO_OUTAGE_CALLS.to_string()).map_err(|e| {
                DemoError::Tool {
                    command: format!("write {}", outage.display()),
                    reason: e.to_string(),
                }
            })?;
            repo.test_env
                .push(("DEMO_PROMO_OUTAGE".into(), outage.display().to_string()));
            self.say(
                "scenario",
                format!(
                    "the promo service the tests call will time out on its next {} calls (a flaky upstream)",
                    budget::PROMO_OUTAGE_CALLS
                ),
            );
        }
        let alert_file = FAILING_TEST.split("::").next().unwrap_or_default();
        let relevant = suite
            .iter()
            .filter(|t| t.starts_with(&format!("{alert_file}::")))
            .count();
        let task_budget = self.plan.budget(suite.len(), relevant);
        self.ledger().suite = suite;
        let alert = format!(
            "ALERT {SERVICE}: `{FAILING_TEST}` fails on main at {} — orders with a 10% promo are charged the wrong total",
            short(&head)
        );
        self.say("alert", alert.clone());
        let task = self
            .client
            .create_task(&CreateTask {
                title: "Fix the failing checkout discount test and deploy to staging".into(),
                goal: format!(
                    "{alert}.\nAcceptance: the tests pass at the fixed commit (the whole suite, or what the budget allows), the diff is reviewed, and staging runs it after approval."
                ),
                runtime: Some("waymark-demo".into()),
                budget: task_budget,
                plan: plan(),
                materials: Materials {
                    repo: Some(repo.path.display().to_string()),
                    commit: Some(head.clone()),
                    tree: None,
                },
                external_key: None,
            })
            .await?;
        self.say("task", format!("{} — {}", task.id, task.title));
        self.say(
            "budget",
            format!(
                "{} tokens; at 80% and 100% a person chooses how to go on (default `{}`, after {} s)",
                budget::thousands(task.budget.max_tokens.unwrap_or_default()),
                task.budget.default_option.as_deref().unwrap_or("-"),
                task.budget.decision_seconds.unwrap_or_default()
            ),
        );
        let run = self.client.start_attempt(&task.id, self.options()).await?;
        self.say(
            "attempt",
            format!(
                "{} holds the lease (fence {}, {} s, renewed every {} s)",
                run.attempt().id,
                run.fence(),
                self.cfg.lease.as_secs(),
                (self.cfg.lease / 3).as_secs().max(1)
            ),
        );
        run.messages(vec![
            NewMessage {
                role: "user".into(),
                text: alert,
            },
            NewMessage {
                role: "assistant".into(),
                text: "I'll reproduce the failure first, then patch, re-run the tests as far as the budget allows and ask before deploying to staging.".into(),
            },
        ])
        .await?;
        self.drive(&run, &repo, Done::default()).await
    }

    async fn resume(&self) -> Result<DemoSummary, DemoError> {
        let task_id = self.cfg.task.clone().ok_or_else(|| {
            DemoError::Resume("`--scenario resume` needs the task: add `--task TASK_ID`".into())
        })?;
        let detail = self.client.task(&task_id).await?;
        if detail.task.state.is_terminal() {
            return Err(DemoError::Resume(format!(
                "task {task_id} is already {}; there is nothing to resume",
                detail.task.state
            )));
        }
        if !detail.chain.intact {
            return Err(DemoError::Resume(format!(
                "the checkpoint chain of {task_id} is broken ({}); a person must look before it resumes",
                detail.chain.reason.unwrap_or_default()
            )));
        }
        let repo_path = detail.task.materials.repo.clone().ok_or_else(|| {
            DemoError::Resume(format!(
                "task {task_id} names no repository in its materials"
            ))
        })?;
        let repo_path = PathBuf::from(repo_path);
        if !repo_path.join(".git").exists() {
            return Err(DemoError::Resume(format!(
                "the task's repository {} is not on this machine; resume where the first run ran",
                repo_path.display()
            )));
        }
        let repo = Repo::create(&repo_path).await?;
        {
            let suite = repo.collect().await?;
            let mut ledger = self.ledger();
            ledger.suite = suite;
            ledger.choice = detail
                .decisions
                .iter()
                .filter(|d| d.kind == DecisionKind::Budget)
                .filter_map(|d| chosen_option(d).map(str::to_owned))
                .next_back();
            ledger.usage = detail.task.usage.clone();
            ledger.budget = detail.task.budget.clone();
        }
        if let Some(holder) = detail
            .attempts
            .iter()
            .rev()
            .find(|a| a.state == AttemptState::Active)
        {
            self.say(
                "resume",
                format!(
                    "{} of `{}` holds the lease until {}; waiting for it to run out",
                    holder.id,
                    holder.worker,
                    holder.expires_at.format("%H:%M:%S")
                ),
            );
        }
        let run = self
            .client
            .start_attempt(
                &task_id,
                self.options().wait_for_lease(
                    Duration::from_secs(3600).min(self.cfg.lease * 20 + Duration::from_secs(60)),
                ),
            )
            .await?;
        let mut done = Done::default();
        if let Some(cp) = run.resumed_from() {
            done.steps = cp.body.completed_steps.clone();
            done.commit = cp.body.materials.as_ref().and_then(|m| m.commit.clone());
            self.say(
                "resume",
                format!(
                    "{} took over with fence {}; last checkpoint #{} ({}): done {}",
                    run.attempt().id,
                    run.fence(),
                    cp.sequence,
                    cp.body.reason,
                    done.steps
                        .iter()
                        .map(|s| s.step.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        } else {
            self.say(
                "resume",
                format!(
                    "{} took over with fence {}; no checkpoint yet, starting from the top",
                    run.attempt().id,
                    run.fence()
                ),
            );
        }
        run.say(format!(
            "Resuming as attempt {} (fence {}). I'll ask the deploy service about anything left in progress before doing it again.",
            run.attempt().id,
            run.fence()
        ))
        .await?;
        self.drive(&run, &repo, done).await
    }

    async fn checkpoint(
        &self,
        run: &Run,
        done: &Done,
        reason: &str,
        pending: Option<PendingStep>,
        effects: Vec<EffectRef>,
        summary: String,
    ) -> Result<Checkpoint, DemoError> {
        let cp = run
            .checkpoint(CheckpointBody {
                reason: reason.into(),
                plan_revision: run.plan_revision(),
                manifest_digest: run.attempt().manifest_digest.clone(),
                completed_steps: done.steps.clone(),
                pending_step: pending,
                effects,
                budget_remaining: self.remaining(),
                materials: Some(Materials {
                    repo: None,
                    commit: done.commit.clone(),
                    tree: None,
                }),
                summary: Some(summary),
            })
            .await?;
        Ok(cp)
    }

    /// Runs every step not done yet, then asks approval and deploys or reports.
    async fn drive(
        &self,
        run: &Run,
        repo: &Repo,
        mut done: Done,
    ) -> Result<DemoSummary, DemoError> {
        let workdir = &self.cfg.workdir;
        std::fs::create_dir_all(workdir).map_err(|e| DemoError::Tool {
            command: format!("mkdir {}", workdir.display()),
            reason: e.to_string(),
        })?;
        if !done.has(REPRODUCE) {
            run.wait_if_paused().await?;
            let head = repo.head().await?;
            let t = repo
                .test(&workdir.join("junit-reproduce.xml"), &[FAILING_TEST.into()])
                .await?;
            let receipt = run
                .test_receipt(
                    Some(REPRODUCE),
                    &t.command,
                    t.exit_code,
                    Some(&head),
                    t.junit_xml,
                )
                .await?;
            let failing = receipt
                .failures
                .iter()
                .map(|f| format!("{}: {}", f.name, f.message.lines().next().unwrap_or("")))
                .collect::<Vec<_>>()
                .join("; ");
            let line = format!(
                "{} passed, {} failed at {} — {failing} (receipt {}, junit {})",
                receipt.totals.passed,
                receipt.totals.failures + receipt.totals.errors,
                short(&head),
                receipt.id,
                short(&receipt.junit_sha256)
            );
            self.say(REPRODUCE, line.clone());
            self.ledger().reproduced =
                (!receipt.passed).then(|| (head.clone(), receipt.id.clone()));
            done.commit = Some(head);
            done.add(CompletedStep {
                step: REPRODUCE.into(),
                artifact_digests: vec![receipt.junit_sha256.clone()],
                verified: !receipt.passed,
            });
            run.say(format!("Reproduced the alert: {line}.")).await?;
            self.spend(run, &done, REPRODUCE, TOKENS_REPRODUCE, FIX)
                .await?;
            let cp = self
                .checkpoint(
                    run,
                    &done,
                    "step_completed",
                    None,
                    vec![],
                    "failure reproduced".into(),
                )
                .await?;
            self.say(
                "checkpoint",
                format!("#{} {}", cp.sequence, short(&cp.digest)),
            );
        }
        if !done.has(FIX) {
            run.wait_if_paused().await?;
            repo.apply_fix().await?;
            let (commit, diff) = repo.commit_fix().await?;
            let artifact = run
                .artifact("fix.diff", "text/x-diff", diff.clone(), Some(FIX))
                .await?;
            let changed: Vec<String> = String::from_utf8_lossy(&diff)
                .lines()
                .filter(|l| {
                    (l.starts_with('+') || l.starts_with('-'))
                        && !l.starts_with("+++")
                        && !l.starts_with("---")
                })
                .map(|l| l.trim().to_owned())
                .collect();
            self.say(
                FIX,
                format!(
                    "committed {} — fix.diff {} ({} bytes): {}",
                    short(&commit),
                    short(&artifact.sha256),
                    artifact.size,
                    changed.join("  ")
                ),
            );
            done.commit = Some(commit.clone());
            done.add(CompletedStep {
                step: FIX.into(),
                artifact_digests: vec![artifact.sha256.clone()],
                verified: false,
            });
            run.say(format!(
                "The discount divided by 10 instead of 100, so a 10% promo took the whole amount off. Patched `checkout/cart.py` and committed {}; the diff is attached as fix.diff.",
                short(&commit)
            ))
            .await?;
            let cp = self
                .checkpoint(
                    run,
                    &done,
                    "step_completed",
                    None,
                    vec![],
                    format!("patched at {}", short(&commit)),
                )
                .await?;
            self.say(
                "checkpoint",
                format!("#{} {}", cp.sequence, short(&cp.digest)),
            );
            // The fix is where the budget runs low: a person chooses how it is verified.
            self.spend(run, &done, FIX, TOKENS_FIX, VERIFY).await?;
        }
        if !done.has(VERIFY) {
            match self.verify(run, repo, done).await? {
                verify::Next::Continue(d) => done = d,
                verify::Next::Finished(summary) => return Ok(*summary),
            }
        }
        self.deliver(run, repo, done).await
    }

    /// A person replanned ("do not deploy; write the report only"): say so, write the report,
    /// deploy nothing.
    #[allow(clippy::too_many_arguments)]
    async fn follow_replan(
        &self,
        run: &Run,
        repo: &Repo,
        done: Done,
        commit: &str,
        instructions: &str,
        voided: String,
        decision: Option<DecisionSummary>,
    ) -> Result<DemoSummary, DemoError> {
        self.say(
            "replan",
            format!("the plan was revised: \"{instructions}\" — no deploy; writing the report"),
        );
        run.say(format!(
            "Replanned by a person: \"{instructions}\". Not deploying; writing the report."
        ))
        .await?;
        self.stop(
            run,
            repo,
            done,
            commit,
            verify::Stop::ReportOnly(voided),
            decision,
        )
        .await
    }

    /// Asks approval for the deploy (or finds the one already asked), then deploys or reports.
    async fn deliver(
        &self,
        run: &Run,
        repo: &Repo,
        mut done: Done,
    ) -> Result<DemoSummary, DemoError> {
        let commit = done.commit.clone().ok_or_else(|| {
            DemoError::Resume("the checkpoints record no commit to deploy".into())
        })?;
        let diff = done.digest(FIX).unwrap_or_default();
        let junit = done.digest(VERIFY).unwrap_or_default();
        let intent = json!({
            "action": "deploy",
            "service": SERVICE,
            "target": TARGET,
            "commit": commit,
            "artifact_digests": {"fix.diff": diff, "junit-verify.xml": junit},
        });
        let intent_digest = json_digest(&intent).unwrap_or_default();
        let key = format!("{}/{DEPLOY}/{commit}", run.task_id());

        let detail = self.client.task(run.task_id()).await?;
        // Replanned while no worker ran (e.g. the laptop slept and a phone said "do not
        // deploy; write the report only"): the pending replan reaches this attempt on its
        // control stream; follow it instead of asking to deploy under the old plan.
        if detail.task.plan_revision > 1
            && let Some(instructions) = replanned(run, detail.task.plan_revision).await
        {
            let voided = detail
                .decisions
                .iter()
                .rev()
                .find(|d| d.kind == DecisionKind::Approval)
                .map(|d| d.id.clone())
                .unwrap_or_default();
            return self
                .follow_replan(run, repo, done, &commit, &instructions, voided, None)
                .await;
        }
        // An approval already asked for this very intent at this plan revision still counts.
        let existing = detail.decisions.iter().rev().find(|d| {
            d.kind == DecisionKind::Approval
                && d.intent_digest.as_deref() == Some(intent_digest.as_str())
                && d.plan_revision == detail.task.plan_revision
                && d.status != DecisionStatus::Void
        });
        let decision = match existing {
            Some(d) if d.status != DecisionStatus::Pending => {
                self.say(
                    "approval",
                    format!(
                        "{} was already answered: {}",
                        d.id,
                        chosen_option(d).unwrap_or("none")
                    ),
                );
                d.clone()
            }
            Some(d) => {
                self.say("approval", format!("{} is still pending", d.id));
                self.wait_for(run, d).await?
            }
            None => {
                // Preparing the deploy spends too; a budget decision it opens comes first.
                if self
                    .spend(run, &done, DEPLOY, TOKENS_DELIVER, DEPLOY)
                    .await?
                    .as_deref()
                    == Some(budget::DELIVER_PATCH)
                {
                    let by = self.ledger().last_budget_decision();
                    return self
                        .stop(run, repo, done, &commit, verify::Stop::Budget(by), None)
                        .await;
                }
                let summary = format!(
                    "Deploy {SERVICE} {} to staging? {}; diff fix.diff {}.",
                    short(&commit),
                    self.ledger().verified_line(),
                    short(&diff)
                );
                let d = run
                    .open_approval(
                        intent.clone(),
                        &summary,
                        ApprovalOptions {
                            step: Some(DEPLOY.into()),
                            expires_in: Some(Duration::from_secs(3600)),
                            default_option: Some("deny".into()),
                            ..ApprovalOptions::default()
                        },
                    )
                    .await?;
                self.say(
                    "approval",
                    format!(
                        "{} asks \"{summary}\" — intent {}",
                        d.id,
                        short(&intent_digest)
                    ),
                );
                // Nothing is in progress while a person decides: the deploy is not even declared.
                let cp = self
                    .checkpoint(
                        run,
                        &done,
                        "human_wait",
                        Some(PendingStep {
                            step: DEPLOY.into(),
                            intent_digest: Some(intent_digest.clone()),
                            idempotency_key: Some(key.clone()),
                            approval_id: Some(d.id.clone()),
                        }),
                        vec![],
                        "waiting for approval to deploy to staging".into(),
                    )
                    .await?;
                self.say(
                    "checkpoint",
                    format!(
                        "#{} {} (waiting for a person)",
                        cp.sequence,
                        short(&cp.digest)
                    ),
                );
                run.say(format!(
                    "Ready to deploy {} to staging. Waiting for approval {}.",
                    short(&commit),
                    d.id
                ))
                .await?;
                self.wait_for(run, &d).await?
            }
        };
        let option = chosen_option(&decision).map(str::to_owned);
        let by = decision.outcome.as_ref().map(|o| o.by.clone());
        self.say(
            "approval",
            format!(
                "{} {} by {}",
                decision.id,
                match (&decision.status, option.as_deref()) {
                    (DecisionStatus::Expired, Some(o)) =>
                        format!("expired; the default `{o}` applies"),
                    (_, Some(o)) => format!("answered `{o}`"),
                    (s, None) => format!("is {s}"),
                },
                by.as_deref().unwrap_or("nobody")
            ),
        );
        let decision_summary = DecisionSummary {
            id: decision.id.clone(),
            question: decision.question.clone(),
            status: decision.status,
            option: option.clone(),
            by,
            intent_digest: decision.intent_digest.clone(),
        };
        // A person replanned while the deploy waited (e.g. "do not deploy; write the report
        // only"): the replan voided the approval; follow the new instructions, never the old
        // plan. The control stream may deliver the replan just after the void: give it a moment.
        let want = if decision.status == DecisionStatus::Void {
            decision.plan_revision + 1
        } else {
            0
        };
        if let Some(instructions) = replanned(run, want).await {
            return self
                .follow_replan(
                    run,
                    repo,
                    done,
                    &commit,
                    &instructions,
                    decision.id.clone(),
                    Some(decision_summary),
                )
                .await;
        }
        if option.as_deref() != Some("approve") {
            let stop = if self.cfg.approve == Some(AutoApprove::Report) {
                verify::Stop::ReportOnly(decision.id.clone())
            } else {
                verify::Stop::Denied(decision.id.clone())
            };
            return self
                .stop(run, repo, done, &commit, stop, Some(decision_summary))
                .await;
        }

        run.wait_if_paused().await?;
        let scenario = self.cfg.scenario;
        let to_deploy = commit.as_str();
        let effect = run
            .effect(key.clone(), "deploy", intent)
            .step(DEPLOY)
            .run(&self.deploy, |ctx| async move {
                match scenario {
                    Scenario::HangPastLease => self.hang(run, &ctx.effect_id).await?,
                    _ => self.say("deploy", format!("{} in progress; calling the deploy service with key {} and fence {}", ctx.effect_id, ctx.idempotency_key, ctx.fence)),
                }
                let res = self.deploy.deploy(&ctx, TARGET, to_deploy).await;
                match (&res, scenario) {
                    (Ok(r), Scenario::CrashAfterCommit) => {
                        self.say(
                            "crash",
                            format!(
                                "the deploy service committed {}; exiting with {CRASH_EXIT_CODE} before the receipt is recorded — resume with `waymark demo --scenario resume --task {}`",
                                r["deploy_id"].as_str().unwrap_or("?"),
                                ctx.task_id
                            ),
                        );
                        std::process::exit(CRASH_EXIT_CODE);
                    }
                    (Err(ProviderError::Failed { reason, .. }), _) => self.say("deploy", format!("refused: {reason}")),
                    _ => {}
                }
                res
            })
            .await;
        let effect = match effect {
            Ok(e) => e,
            Err(e @ Error::EffectUnknown { .. }) => {
                self.say("deploy", format!("{e}"));
                let _ = run
                    .say(format!("I could not tell whether the deploy happened: {e}. Leaving it `unknown` for a person; I will not retry."))
                    .await;
                let _ = run
                    .finish(
                        FinishOutcome::Released,
                        Some(format!("deploy outcome unknown: {e}")),
                    )
                    .await;
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        let deploy_id = effect.receipt["deploy_id"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        self.say(
            "deploy",
            match effect.resolution {
                Resolution::Ran => format!("{deploy_id} confirmed: {} is on staging", short(&commit)),
                Resolution::Reconciled => format!(
                    "the deploy service already has {deploy_id} under this key: recorded confirmed, nothing resent"
                ),
                Resolution::AlreadyConfirmed => format!("{deploy_id} was already recorded confirmed; nothing resent"),
            },
        );
        done.add(CompletedStep {
            step: DEPLOY.into(),
            artifact_digests: vec![],
            verified: true,
        });
        let cp = self
            .checkpoint(
                run,
                &done,
                "effect_boundary",
                None,
                vec![EffectRef {
                    effect_id: effect.effect.id.clone(),
                    status: effect.effect.status,
                }],
                format!("deployed {} to staging ({deploy_id})", short(&commit)),
            )
            .await?;
        self.say(
            "checkpoint",
            format!("#{} {}", cp.sequence, short(&cp.digest)),
        );
        let verified = self.ledger().verified_line();
        let summary = format!(
            "Fixed the percentage discount (fix.diff {}); at {}: {}{}; deployed to staging as {deploy_id} with approval {}.",
            short(&diff),
            short(&commit),
            verified[..1].to_lowercase(),
            &verified[1..],
            decision.id
        );
        run.say(summary.clone()).await?;
        run.finish(FinishOutcome::Completed, Some(summary.clone()))
            .await?;
        let deploy = DeploySummary {
            effect_id: effect.effect.id.clone(),
            idempotency_key: key,
            resolution: effect.resolution,
            receipt: effect.receipt,
        };
        self.summary(
            run,
            repo,
            &done,
            FinishOutcome::Completed,
            summary,
            Some(decision_summary),
            Some(deploy),
        )
        .await
    }

    /// Answers decision `id` with `option` through the admin route.
    async fn resolve_as_admin(&self, admin: &str, id: &str, option: &str) -> Result<(), DemoError> {
        let admin = self.cfg.client(admin)?;
        let _: Decision = admin
            .call(
                reqwest::Method::POST,
                &format!("/v1/admin/decisions/{id}/resolve"),
                &[],
                crate::client::Payload::json(&json!({ "option": option }))?,
                crate::client::Resend::IfUndelivered,
                None,
            )
            .await?;
        Ok(())
    }

    /// Resolves the approval itself when told to, else tells a person how, and waits.
    async fn wait_for(&self, run: &Run, d: &Decision) -> Result<Decision, DemoError> {
        let path = format!("/v1/admin/decisions/{}/resolve", d.id);
        match (self.cfg.approve, &self.cfg.admin_token) {
            (Some(answer), Some(admin)) => {
                let option = if answer == AutoApprove::Yes {
                    "approve"
                } else {
                    "deny"
                };
                self.resolve_as_admin(admin, &d.id, option).await?;
                self.say(
                    "approval",
                    format!("answered `{option}` through the admin route (--approve)"),
                );
            }
            (Some(_), None) => {
                return Err(DemoError::Resume(
                    "`--approve` resolves the approval through the admin route and needs the admin token: add `--admin-token`, or leave `--approve` out and answer it yourself".into(),
                ));
            }
            (None, admin) => {
                let bearer = admin
                    .as_deref()
                    .unwrap_or("<admin token from the data dir's admin.token>");
                self.say(
                    "approval",
                    format!(
                        "waiting for a person. Approve with:\n    curl -sX POST {}{path} -H 'authorization: Bearer {bearer}' -H 'content-type: application/json' -d '{{\"option\":\"approve\"}}'\n  or deny with `{{\"option\":\"deny\"}}`",
                        self.cfg.server.trim_end_matches('/')
                    ),
                );
            }
        }
        Ok(run.await_decision(&d.id).await?)
    }

    /// The hung worker: stops heartbeating, sleeps past its lease, and wakes once a newer
    /// worker has deployed — then carries on as a partitioned worker would.
    async fn hang(&self, run: &Run, effect_id: &str) -> Result<(), ProviderError> {
        run.stop_heartbeat();
        self.say(
            "hang",
            format!(
                "{effect_id} is in progress; this worker stops heartbeating and sleeps past its {} s lease",
                self.cfg.lease.as_secs()
            ),
        );
        tokio::time::sleep(self.cfg.lease + Duration::from_secs(1)).await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            if let Ok(d) = self.client.task(run.task_id()).await {
                let settled = d
                    .effects
                    .iter()
                    .find(|e| e.id == effect_id)
                    .is_some_and(|e| {
                        !matches!(e.status, EffectStatus::Intended | EffectStatus::InProgress)
                    });
                if d.task.fence > run.fence() && settled {
                    self.say(
                        "hang",
                        format!(
                            "woke up: a newer worker holds the task with fence {} and settled the deploy; deploying anyway with stale fence {}, as a partitioned worker would",
                            d.task.fence,
                            run.fence()
                        ),
                    );
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() > deadline {
                self.say(
                    "hang",
                    "woke up after 10 minutes without a newer worker; deploying",
                );
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn summary(
        &self,
        run: &Run,
        repo: &Repo,
        done: &Done,
        outcome: FinishOutcome,
        summary: String,
        decision: Option<DecisionSummary>,
        deploy: Option<DeploySummary>,
    ) -> Result<DemoSummary, DemoError> {
        let detail = self.client.task(run.task_id()).await?;
        let ledger = self.ledger().clone();
        self.say(
            "finish",
            format!(
                "{} — {} checkpoints, chain {}",
                outcome,
                detail.checkpoints.len(),
                if detail.chain.intact {
                    "intact"
                } else {
                    "BROKEN"
                }
            ),
        );
        Ok(DemoSummary {
            task_id: run.task_id().to_owned(),
            attempt_id: run.attempt().id.clone(),
            fence: run.fence(),
            outcome,
            summary,
            repo: repo.path.clone(),
            commit: done.commit.clone(),
            decision,
            deploy,
            budget: ledger.decisions,
            usage: detail.task.usage.clone(),
            verification: ledger.verification,
            verified: ledger.verified,
            not_verified: ledger.not_verified,
            artifacts: detail
                .artifacts
                .iter()
                .map(|a| (a.name.clone(), a.sha256.clone()))
                .collect(),
            checkpoints: detail.checkpoints.len(),
            chain_intact: detail.chain.intact,
        })
    }
}

/// A fresh directory for a demo run under the system's temp dir. It is kept after the run, so
/// the repository, test output and server data can be looked at (and a run resumed).
pub fn new_workdir() -> std::io::Result<PathBuf> {
    Ok(tempfile::Builder::new()
        .prefix("waymark-demo-")
        .tempdir()?
        .keep())
}

/// The instructions of a replan this run has heard of. When the plan is known to be at
/// revision `want` or later, waits a moment for the control stream to deliver that replan
/// (it may arrive just after the voided approval or the attempt's start).
async fn replanned(run: &Run, want: i64) -> Option<String> {
    if want > 0 {
        let mut control = run.control();
        let _ = tokio::time::timeout(
            Duration::from_secs(3),
            control.wait_for(|c| c.plan_revision >= want),
        )
        .await;
    }
    run.control()
        .borrow()
        .instructions
        .clone()
        .filter(|i| !i.trim().is_empty())
}
