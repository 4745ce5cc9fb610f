//! `waymark chaos`: the fault-injection runner of issue 7. Recovery is only as good as what
//! survives the faults it exists for, so this breaks things on purpose — `kill -9` of the
//! server mid-write, a worker killed between the provider's commit and its receipt, a worker
//! stopped past its lease and woken after a take-over, commands and receipts delivered
//! several times out of order, a partition longer than the lease — and counts what must
//! never happen: an acknowledged write lost, an effect applied twice, a stale write accepted,
//! a task left in a state the rules forbid — and, for a machine's runner and its runtime
//! killed mid-run, a run lost (neither finished nor waiting on a person).
//!
//! Everything runs on loopback and is bounded in time. The server-kill scenario drives a real
//! `waymark serve` child (this same binary), because only a separate process can be killed
//! with SIGKILL; runner-kill drives real `waymark runner` children and a fake Claude Code
//! (this binary again) against an in-process control plane; the others run the control plane
//! and the deploy service in this process, so hundreds of runs take seconds. Exit 0 only when
//! every count of harm is zero and every run could be checked.

mod duplicates;
mod effects;
mod env;
pub(crate) mod fake_claude;
mod runner_kill;
mod server_kill;

use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use serde_json::json;
use tokio::sync::Semaphore;

use crate::output::{CliResult, Exit, Failure};

/// How many violations a scenario lists; the counts stay exact.
const SHOWN: usize = 10;

#[derive(Debug, Args)]
pub(crate) struct ChaosArgs {
    /// Runs per scenario.
    #[arg(long, default_value_t = 20)]
    runs: u32,
    /// Scenarios to run (repeatable; default: all).
    #[arg(long = "scenario", value_enum, num_args = 1..)]
    scenarios: Vec<Scenario>,
    /// Seed of the random schedule, to replay one (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// Runs of an in-process scenario at once (server-kill runs one at a time, runner-kill at
    /// most two).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Scenario {
    /// kill -9 the server (a `waymark serve` child) during writes; restart; nothing acknowledged lost.
    ServerKill,
    /// The worker dies after the deploy committed, before its receipt; the resume deploys nothing.
    CrashAfterCommit,
    /// The worker stops past its lease; after a take-over its old-fence writes are refused.
    StaleWorker,
    /// Signed commands and receipts delivered 1–5 times, shuffled: each applied once.
    DuplicateCommands,
    /// A proxy black-holes the worker's traffic past its lease; its buffered writes are refused.
    Partition,
    /// kill -9 a `waymark runner` child and/or its runtime mid-run; each run ends, no call twice.
    RunnerKill,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::ServerKill,
        Scenario::CrashAfterCommit,
        Scenario::StaleWorker,
        Scenario::DuplicateCommands,
        Scenario::Partition,
        Scenario::RunnerKill,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::ServerKill => "server-kill",
            Scenario::CrashAfterCommit => "crash-after-commit",
            Scenario::StaleWorker => "stale-worker",
            Scenario::DuplicateCommands => "duplicate-commands",
            Scenario::Partition => "partition",
            Scenario::RunnerKill => "runner-kill",
        }
    }

    /// Whether its runs share an in-process control plane.
    fn in_process(self) -> bool {
        self != Scenario::ServerKill
    }

    /// How many of its runs go at once: each runner-kill run is a runner and its runtimes,
    /// processes of their own.
    fn concurrency(self, asked: usize) -> usize {
        match self {
            Scenario::ServerKill => 1,
            Scenario::RunnerKill => asked.clamp(1, 2),
            _ => asked.max(1),
        }
    }
}

/// The counts of one scenario (or all).
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Figures {
    pub(crate) runs: u64,
    pub(crate) writes_acknowledged: u64,
    pub(crate) acknowledged_writes_lost: u64,
    pub(crate) duplicate_effects: u64,
    pub(crate) stale_writes_tried: u64,
    pub(crate) stale_writes_accepted: u64,
    pub(crate) invalid_states: u64,
    pub(crate) deploys: u64,
    /// Runs that neither finished nor wait on a person, in bounded time.
    pub(crate) runs_lost: u64,
    /// Runs left waiting on a person (runner-kill answers every card it can: none should be).
    pub(crate) runs_waiting: u64,
    /// `kill -9`s mid-run: of the server (server-kill), of a runner or a runtime's process
    /// group (runner-kill).
    pub(crate) kills: u64,
    /// Runtimes resumed after a kill (`claude -p --resume`).
    pub(crate) revives: u64,
    /// Recovery cards answered (truthfully, from what really happened).
    pub(crate) recovery_cards: u64,
    /// Runs that could not be carried out or checked.
    pub(crate) errors: u64,
}

impl Figures {
    fn add(&mut self, o: &Figures) {
        self.runs += o.runs;
        self.writes_acknowledged += o.writes_acknowledged;
        self.acknowledged_writes_lost += o.acknowledged_writes_lost;
        self.duplicate_effects += o.duplicate_effects;
        self.stale_writes_tried += o.stale_writes_tried;
        self.stale_writes_accepted += o.stale_writes_accepted;
        self.invalid_states += o.invalid_states;
        self.deploys += o.deploys;
        self.runs_lost += o.runs_lost;
        self.runs_waiting += o.runs_waiting;
        self.kills += o.kills;
        self.revives += o.revives;
        self.recovery_cards += o.recovery_cards;
        self.errors += o.errors;
    }

    /// The invariants broken, in words; empty when none.
    fn broken(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut say = |n: u64, what: &str| {
            if n > 0 {
                out.push(format!("{n} {what}"));
            }
        };
        say(self.acknowledged_writes_lost, "acknowledged write(s) lost");
        say(self.duplicate_effects, "duplicate effect(s)");
        say(self.stale_writes_accepted, "stale write(s) accepted");
        say(self.invalid_states, "task(s) in an invalid state");
        say(
            self.runs_lost,
            "run(s) lost (neither finished nor waiting on a person)",
        );
        say(self.errors, "run(s) could not be completed or checked");
        out
    }
}

/// What one run found.
#[derive(Debug, Default)]
pub(crate) struct RunReport {
    pub(crate) figures: Figures,
    /// What went wrong, for people.
    pub(crate) violations: Vec<String>,
    /// Observations that break no invariant (e.g. an unexpected but safe path).
    pub(crate) notes: Vec<String>,
}

impl RunReport {
    pub(crate) fn lost(&mut self, what: String) {
        self.figures.acknowledged_writes_lost += 1;
        self.violations.push(format!("lost: {what}"));
    }

    pub(crate) fn duplicate(&mut self, what: String) {
        self.figures.duplicate_effects += 1;
        self.violations.push(format!("duplicate: {what}"));
    }

    pub(crate) fn stale(&mut self, what: String) {
        self.figures.stale_writes_accepted += 1;
        self.violations.push(format!("stale accepted: {what}"));
    }

    pub(crate) fn note(&mut self, what: String) {
        self.notes.push(what);
    }

    /// Takes in a task check's counts and notes.
    pub(crate) fn absorb(&mut self, c: env::TaskCheck) {
        self.figures.acknowledged_writes_lost += c.lost;
        self.figures.invalid_states += c.invalid;
        self.violations.extend(c.notes);
    }
}

/// One run of a scenario, type-erased.
type BoxedRun<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<RunReport>> + Send + 'a>>;

/// A scenario's results.
#[derive(Debug, Serialize)]
struct ScenarioResult {
    scenario: Scenario,
    #[serde(flatten)]
    figures: Figures,
    seconds: f64,
    violations: Vec<String>,
    notes: Vec<String>,
}

/// Runs `runs` runs of one scenario and gathers their reports.
async fn scenario(
    s: Scenario,
    runs: u32,
    seed: u64,
    concurrency: usize,
    before_session: bool,
) -> ScenarioResult {
    let started = Instant::now();
    let env = if s.in_process() {
        match env::Env::start().await {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => {
                return ScenarioResult {
                    scenario: s,
                    figures: Figures {
                        errors: u64::from(runs),
                        ..Figures::default()
                    },
                    seconds: started.elapsed().as_secs_f64(),
                    violations: vec![format!("the test environment did not start: {e:#}")],
                    notes: vec![],
                };
            }
        }
    } else {
        None
    };
    let limit = Arc::new(Semaphore::new(s.concurrency(concurrency)));
    let mut handles = Vec::new();
    for i in 0..runs {
        let env = env.clone();
        let limit = limit.clone();
        // Each run's schedule comes from the seed, the scenario and its index.
        let run_seed = seed ^ ((s as u64) << 56) ^ u64::from(i).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        handles.push(tokio::spawn(async move {
            let _permit = limit.acquire_owned().await;
            let mut rng = StdRng::seed_from_u64(run_seed);
            // Boxed here, where the borrows are concrete: rustc cannot prove `Send` for
            // these futures inside `tokio::spawn`'s higher-ranked context (rust#110338).
            let work: BoxedRun<'_> = match (s, env) {
                (Scenario::ServerKill, _) => Box::pin(server_kill::run(&mut rng)),
                (Scenario::CrashAfterCommit, Some(env)) => {
                    Box::pin(effects::crash_after_commit(env, &mut rng))
                }
                (Scenario::StaleWorker, Some(env)) => {
                    Box::pin(effects::stale_worker(env, &mut rng))
                }
                (Scenario::DuplicateCommands, Some(env)) => {
                    Box::pin(duplicates::run(env, &mut rng))
                }
                (Scenario::Partition, Some(env)) => Box::pin(effects::partition(env, &mut rng)),
                (Scenario::RunnerKill, Some(env)) => {
                    Box::pin(runner_kill::run(env, &mut rng, before_session))
                }
                (_, None) => Box::pin(async { anyhow::bail!("no environment") }),
            };
            let r = tokio::time::timeout(std::time::Duration::from_secs(120), work).await;
            let mut report = match r {
                Ok(Ok(r)) => r,
                Ok(Err(e)) => RunReport {
                    figures: Figures {
                        errors: 1,
                        ..Figures::default()
                    },
                    violations: vec![format!("run {i}: could not complete: {e:#}")],
                    notes: vec![],
                },
                Err(_) => RunReport {
                    figures: Figures {
                        errors: 1,
                        ..Figures::default()
                    },
                    violations: vec![format!("run {i}: did not finish within 120 s")],
                    notes: vec![],
                },
            };
            report.figures.runs = 1;
            report
        }));
    }
    let mut figures = Figures::default();
    let mut violations = Vec::new();
    let mut notes = Vec::new();
    for (i, h) in handles.into_iter().enumerate() {
        let r = h.await.unwrap_or_else(|e| RunReport {
            figures: Figures {
                runs: 1,
                errors: 1,
                ..Figures::default()
            },
            violations: vec![format!("run {i}: panicked: {e}")],
            notes: vec![],
        });
        figures.add(&r.figures);
        violations.extend(r.violations);
        notes.extend(r.notes);
    }
    if let Some(env) = env.and_then(|e| Arc::try_unwrap(e).ok()) {
        env.stop().await;
    }
    violations.truncate(SHOWN);
    notes.truncate(SHOWN);
    ScenarioResult {
        scenario: s,
        figures,
        seconds: started.elapsed().as_secs_f64(),
        violations,
        notes,
    }
}

pub(crate) async fn run(args: ChaosArgs, json: bool) -> CliResult {
    if args.runs == 0 {
        return Err(Failure::new(
            Exit::Usage,
            "usage",
            "`--runs` must be at least 1",
        ));
    }
    let mut chosen = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios.clone()
    };
    chosen.sort();
    chosen.dedup();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    if !json {
        println!(
            "waymark chaos: {} run(s) of {} — seed {seed} (replay with `--seed {seed}`)\n",
            args.runs,
            chosen
                .iter()
                .map(|s| s.name())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut results = Vec::new();
    for s in chosen {
        let r = scenario(s, args.runs, seed, args.concurrency, true).await;
        if !json {
            println!(
                "{}",
                row(s.name(), &r.figures, Some(r.seconds), results.is_empty())
            );
        }
        results.push(r);
    }
    let mut total = Figures::default();
    for r in &results {
        total.add(&r.figures);
    }
    let broken = total.broken();
    if json {
        println!(
            "{}",
            json!({
                "ok": broken.is_empty(),
                "seed": seed,
                "runs_per_scenario": args.runs,
                "totals": total,
                "scenarios": results,
                "broken": broken,
            })
        );
    } else {
        if results.len() > 1 {
            println!("{}", "─".repeat(HEADER.len()));
            println!("{}", row("total", &total, None, false));
        }
        for r in &results {
            for v in &r.violations {
                println!("  ✘ {}: {v}", r.scenario.name());
            }
            for n in &r.notes {
                println!("  · {}: {n}", r.scenario.name());
            }
        }
        if broken.is_empty() {
            println!(
                "\n✔ {} acknowledged write(s), none lost; no duplicate effect; {} stale write(s) tried, none accepted; every task valid",
                total.writes_acknowledged, total.stale_writes_tried
            );
            if total.kills > 0 {
                println!(
                    "✔ {} kill -9(s) mid-run, {} revive(s), {} recovery card(s) answered; no run lost",
                    total.kills, total.revives, total.recovery_cards
                );
            }
        }
    }
    if broken.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            Exit::Refused,
            "invariant_broken",
            format!("invariant broken: {}", broken.join("; ")),
        ))
    }
}

const HEADER: &str = "scenario               runs  acked writes  lost  duplicates  stale tried  stale accepted  invalid  deploys  runs lost  kills  revives  errors    time";

/// One table row (with the header before the first).
fn row(name: &str, f: &Figures, seconds: Option<f64>, header: bool) -> String {
    let line = format!(
        "{name:<20} {:>6} {:>13} {:>5} {:>11} {:>12} {:>15} {:>8} {:>8} {:>10} {:>6} {:>8} {:>7} {:>7}",
        f.runs,
        f.writes_acknowledged,
        f.acknowledged_writes_lost,
        f.duplicate_effects,
        f.stale_writes_tried,
        f.stale_writes_accepted,
        f.invalid_states,
        f.deploys,
        f.runs_lost,
        f.kills,
        f.revives,
        f.errors,
        seconds.map(|s| format!("{s:.1}s")).unwrap_or_default()
    );
    if header {
        format!("{HEADER}\n{line}")
    } else {
        line
    }
}
