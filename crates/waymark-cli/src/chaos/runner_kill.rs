//! `runner-kill`: a machine's hands killed mid-run. Each run is a signed `start_run` on a
//! machine served by a real `waymark runner` child (this binary), whose runtime is the fake
//! Claude Code of [`super::fake_claude`]: its tool calls apply side effects to a ledger of
//! its own, and it holds still where the seeded schedule says, so a `kill -9` of the runtime's
//! process group, of the runner, or of both lands exactly there. The runner is started
//! again, every recovery card is answered truthfully from the ledger (the harness knows
//! whether the call happened), and the run is driven to its end. Counted: a call's side effect
//! applied twice, or a confirmed call run again (duplicates); a run that neither finished nor
//! waits on a person in bounded time (runs lost).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use waymark_proto::{
    AttemptState, DecisionKind, DecisionStatus, EffectStatus, Operation, SteerCommand, TaskDetail,
    TaskState,
};

use super::RunReport;
use super::duplicates::{Device, pair};
use super::env::{Acked, Env, Http, USER, check_task};
use super::fake_claude::{self, World};

/// How long one run may take to reach each point and its end, all told.
const RUN_BOUND: Duration = Duration::from_secs(60);

/// Who is killed at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// The runtime's process group; the runner sees it end.
    Runtime,
    /// The runner, then the runtime: nobody saw it end; the next runner finds it gone.
    Both,
    /// The runner only: the runtime goes on, and the next runner adopts it.
    Runner,
}

/// A `waymark runner` child, killed with `-9` when dropped.
struct RunnerChild(tokio::process::Child);

impl RunnerChild {
    fn start(
        bin: &Path,
        url: &str,
        token: &str,
        root: &Path,
        world: &World,
    ) -> anyhow::Result<RunnerChild> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("runner.log"))?;
        let child = tokio::process::Command::new(bin)
            .arg("runner")
            .args(["--server", url, "--approval-timeout", "30", "--allow"])
            .arg(root.join("project"))
            .arg("--claude")
            .arg(root.join("claude"))
            .arg("--state-dir")
            .arg(root.join("runner-state"))
            .env("WAYMARK_TOKEN", token)
            .env("WAYMARK_LOG", "info")
            .env(fake_claude::WORLD_ENV, world.dir())
            .env("CLAUDE_CONFIG_DIR", world.dir().join("claude-config"))
            .env_remove("WAYMARK_CLAUDE")
            .env_remove("WAYMARK_CODEX")
            .env_remove("WAYMARK_SERVER")
            .env_remove("WAYMARK_INHIBIT_SLEEP")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("starting `waymark runner`")?;
        Ok(RunnerChild(child))
    }

    async fn kill(mut self) {
        let _ = self.0.start_kill();
        let _ = self.0.wait().await;
    }
}

/// `kill -9` of a process group.
async fn kill_group(pid: u32) -> anyhow::Result<()> {
    let ok = tokio::process::Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .stderr(Stdio::null())
        .status()
        .await?
        .success();
    if !ok {
        bail!("kill -9 of the process group {pid} failed");
    }
    Ok(())
}

/// The harness's side of one run.
struct Harness<'a> {
    admin: Http,
    public: Http,
    device: &'a Device,
    world: &'a World,
    task: String,
    /// Recovery cards answered.
    answered: u64,
    /// Calls a card was answered "it happened" for, by the card's effect key.
    vouched: BTreeSet<String>,
    /// Effects a card was answered for, by id.
    asked: BTreeSet<String>,
    report: RunReport,
}

/// Where a run stands.
#[derive(Debug, PartialEq, Eq)]
enum Stands {
    Going,
    /// The turn ended (the runtime's `Stop` was taken) and nothing is left to recover.
    Finished,
    /// A card nobody here can answer: a person must.
    WaitsOnPerson,
}

impl Harness<'_> {
    /// Reads the task, answers its recovery cards truthfully, says where it stands.
    async fn look(&mut self) -> anyhow::Result<(Stands, TaskDetail)> {
        let d = self.admin.detail(&self.task).await?;
        let applied: BTreeSet<String> = self.world.applied().into_iter().map(|(_, k)| k).collect();
        let mut unanswerable = false;
        for card in d
            .decisions
            .iter()
            .filter(|c| c.kind == DecisionKind::Recovery && c.status == DecisionStatus::Pending)
        {
            let Some(e) = d
                .effects
                .iter()
                .find(|e| Some(&e.id) == card.effect_id.as_ref())
            else {
                unanswerable = true;
                continue;
            };
            if !self.asked.insert(e.id.clone()) {
                // Safe (the truth is given again), but a person is asked twice.
                self.report.note(format!(
                    "{}: asked again about {} (answered before; the run crashed again since)",
                    self.task, e.idempotency_key
                ));
            }
            let happened = applied.contains(&e.idempotency_key);
            let option = if happened {
                "mark_confirmed"
            } else {
                "mark_not_started"
            };
            self.choose(&card.id, option, d.task.plan_revision).await?;
            self.answered += 1;
            if happened {
                self.vouched.insert(e.idempotency_key.clone());
            }
        }
        let active = d.attempts.iter().any(|a| a.state == AttemptState::Active);
        let stopped = self
            .world
            .journal_entries()
            .iter()
            .any(|e| e["event"] == "hook" && e["hook"] == "Stop" && e["status"] == 200);
        let pending = d
            .decisions
            .iter()
            .any(|c| c.status == DecisionStatus::Pending);
        let stands = if stopped && !active && !pending && d.task.state != TaskState::NeedsHuman {
            Stands::Finished
        } else if unanswerable || (d.task.state == TaskState::NeedsHuman && !pending) {
            Stands::WaitsOnPerson
        } else {
            Stands::Going
        };
        Ok((stands, d))
    }

    /// A signed `choose_option` from the paired device.
    async fn choose(&self, decision: &str, option: &str, revision: i64) -> anyhow::Result<()> {
        let now = chrono::Utc::now();
        let cmd = SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(self.task.clone()),
            expected_plan_revision: Some(revision),
            operation: Operation::ChooseOption,
            scope: vec![],
            args: json!({"decision_id": decision, "option": option}),
            issued_by: format!("user:{USER}"),
            device_id: self.device.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(10),
        };
        let env = waymark_proto::signing::sign(&cmd, &self.device.key)?;
        let (s, v) = self
            .public
            .post("/v1/commands", &serde_json::to_value(env)?)
            .await?;
        if !s.is_success() || v["status"] != "applied" {
            bail!("answering the recovery card {decision} with {option}: {s} {v}");
        }
        Ok(())
    }
}

/// Waits until the runner registered its machine with Claude Code.
async fn registered(admin: &Http, name: &str, deadline: Instant) -> anyhow::Result<()> {
    loop {
        let v = admin.get("/v1/machines").await?;
        let ready = v["machines"].as_array().into_iter().flatten().any(|m| {
            m["name"] == name
                && m["runtimes"]
                    .as_array()
                    .is_some_and(|r| r.iter().any(|r| r["runtime"] == "claude-code"))
        });
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the runner of {name} did not register");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The points a run passes, in order: before its first hook (only when asked: see
/// [`run`]), around each call, and after its turn's end.
fn points(calls: &[String], before_session: bool) -> Vec<String> {
    let mut out: Vec<String> = before_session
        .then(|| "start".to_owned())
        .into_iter()
        .chain(calls.iter().flat_map(|c| {
            [
                format!("pre:{c}"),
                format!("effect:{c}"),
                format!("post:{c}"),
            ]
        }))
        .collect();
    out.push("stop".into());
    out
}

/// One run. `before_session`: the schedule may also kill the runtime before its first hook,
/// when its session has not begun: nothing ran under the record, and the control plane starts
/// it again (`domain::machines::ended_before_reaching_us`).
pub(crate) async fn run(
    env: Arc<Env>,
    rng: &mut StdRng,
    before_session: bool,
) -> anyhow::Result<RunReport> {
    let bin = crate::adapters::this_binary().map_err(|f| anyhow!(f.message))?;
    let root = tempfile::tempdir()?;
    let root_path = root.path().canonicalize()?;
    std::fs::create_dir_all(root_path.join("project"))?;
    std::fs::create_dir_all(root_path.join("runner-state"))?;
    let world = World::new(root_path.join("world"))?;
    write_wrapper(&root_path.join("claude"), &bin)?;

    let name = format!("chaos-{:012x}", rng.r#gen::<u64>() & 0xffff_ffff_ffff);
    let (token, _, _) =
        waymark_server::admin::create_runner_token(&*env.server.state.store, &name, Some(USER))
            .await?;
    let device = pair(&env).await?;
    let admin = env.admin()?;
    let deadline = Instant::now() + RUN_BOUND;
    let url = env.url();
    let start_runner = || RunnerChild::start(&bin, &url, &token, &root_path, &world);
    let mut runner = Some(start_runner()?);
    registered(&admin, &name, deadline).await?;

    // The schedule: 2–4 calls, 1–3 kills at distinct points in order, each of someone.
    let calls: Vec<String> = (1..=rng.gen_range(2..=4))
        .map(|i| format!("c{i}"))
        .collect();
    let all = points(&calls, before_session);
    let n = rng.gen_range(1..=3usize).min(all.len());
    let mut at = rand::seq::index::sample(rng, all.len(), n).into_vec();
    at.sort_unstable();
    let schedule: Vec<(String, Victim)> = at
        .into_iter()
        .map(|i| {
            let victim = match rng.gen_range(0..3) {
                0 => Victim::Runtime,
                1 => Victim::Both,
                _ => Victim::Runner,
            };
            (all[i].clone(), victim)
        })
        .collect();
    world.set_hold(schedule.first().map_or("none", |(p, _)| p))?;

    let task = waymark_proto::ids::task();
    let now = chrono::Utc::now();
    let cmd = SteerCommand {
        command_id: waymark_proto::ids::command(),
        task_id: Some(task.clone()),
        expected_plan_revision: None,
        operation: Operation::StartRun,
        scope: vec![],
        args: json!({"machine": name, "runtime": "claude-code",
                     "directory": root_path.join("project"), "prompt": fake_claude::prompt(&calls)}),
        issued_by: format!("user:{USER}"),
        device_id: device.id.clone(),
        issued_at: now,
        expires_at: now + chrono::Duration::minutes(10),
    };
    let signed = waymark_proto::signing::sign(&cmd, &device.key)?;
    let public = Http::new(&url, "", Duration::from_secs(10))?;
    let (s, v) = public
        .post("/v1/commands", &serde_json::to_value(signed)?)
        .await?;
    if !s.is_success() || v["status"] != "applied" {
        bail!("start_run answered {s}: {v}");
    }

    let mut h = Harness {
        admin,
        public,
        device: &device,
        world: &world,
        task: task.clone(),
        answered: 0,
        vouched: BTreeSet::new(),
        asked: BTreeSet::new(),
        report: RunReport::default(),
    };
    let mut kills = 0u64;
    let mut stands = Stands::Going;
    'schedule: for (i, (point, victim)) in schedule.iter().enumerate() {
        // Until the runtime holds at the point, or the run ends without reaching it (a call
        // vouched for is not made again, so the points after its effect never come). The
        // point after the turn's end comes right after the end is seen: wait for it.
        let pid = loop {
            if let Some((p, pid)) = world.holding_at()
                && &p == point
            {
                break pid;
            }
            let (now_stands, _) = h.look().await?;
            if now_stands == Stands::WaitsOnPerson
                || (now_stands == Stands::Finished && point != "stop")
            {
                stands = now_stands;
                break 'schedule;
            }
            if Instant::now() > deadline {
                break 'schedule;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let next = schedule.get(i + 1).map_or("none", |(p, _)| p.as_str());
        if matches!(victim, Victim::Runner | Victim::Both)
            && let Some(r) = runner.take()
        {
            r.kill().await;
            kills += 1;
        }
        if matches!(victim, Victim::Runtime | Victim::Both) {
            kill_group(pid).await?;
            kills += 1;
        }
        if *victim == Victim::Runtime {
            world.set_hold(next)?;
        } else {
            // The next runner finds the run again: gone (reported), or alive (adopted and
            // then let go on under its watch).
            runner = Some(start_runner()?);
            world.set_hold(next)?;
        }
    }
    // Nothing stays held past the schedule, whatever cut it short.
    world.set_hold("none")?;
    while stands == Stands::Going && Instant::now() < deadline {
        stands = h.look().await?.0;
        if stands == Stands::Going {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if let Some(r) = runner.take() {
        r.kill().await;
    }
    let (_, d) = h.look().await?;
    let mut report = std::mem::take(&mut h.report);
    report.figures.kills = kills;
    report.figures.recovery_cards = h.answered;
    let journal = world.journal_entries();
    report.figures.revives = journal
        .iter()
        .filter(|e| e["event"] == "started" && e["resume"] == true)
        .count() as u64;
    match stands {
        Stands::Finished => {}
        Stands::WaitsOnPerson => {
            report.figures.runs_waiting += 1;
            report.note(format!(
                "{task}: waits on a person ({}, {})",
                d.task.state,
                d.task.outcome_summary.as_deref().unwrap_or("")
            ));
        }
        Stands::Going => {
            report.figures.runs_lost += 1;
            report.violations.push(format!(
                "run lost: {task} neither finished nor waits on a person after {RUN_BOUND:?} (state {}, attempts {:?}, schedule {schedule:?}); the fake's last steps: {}; the runner's last lines: {}",
                d.task.state,
                d.attempts.iter().map(|a| a.state.to_string()).collect::<Vec<_>>(),
                tail_journal(&journal),
                tail_log(&root_path.join("runner.log")),
            ));
        }
    }
    count(&mut report, &d, &world, &calls, &journal, &h.vouched);
    if std::env::var_os("WAYMARK_CHAOS_KEEP").is_some() {
        let kept = root.keep();
        report.note(format!("{task}: kept in {}", kept.display()));
    }
    Ok(report)
}

/// The counts: each call's side effect applied once, confirmed once in the record, and never
/// made again once it was confirmed; every acknowledged receipt in the record. A call done
/// twice shows in all three; it is one duplicate per extra time, by the view that saw most.
fn count(
    report: &mut RunReport,
    d: &TaskDetail,
    world: &World,
    calls: &[String],
    journal: &[Value],
    vouched: &BTreeSet<String>,
) {
    let task = &d.task.id;
    let finished = journal
        .iter()
        .any(|e| e["event"] == "hook" && e["hook"] == "Stop" && e["status"] == 200);
    // Per call: the times its side effect happened, its effects confirmed in the record, and
    // the times it was made again after it was confirmed.
    let mut seen: BTreeMap<String, [u64; 3]> =
        calls.iter().map(|c| (c.clone(), [0, 0, 0])).collect();
    for (call, _) in world.applied() {
        seen.entry(call).or_default()[0] += 1;
    }
    for e in d
        .effects
        .iter()
        .filter(|e| e.status == EffectStatus::Confirmed)
    {
        if let Some(c) = e.intent["input"]["command"]
            .as_str()
            .and_then(fake_claude::call_of)
        {
            seen.entry(c.to_owned()).or_default()[1] += 1;
        }
    }
    // Confirmed by its receipt, or by a person who said it happened.
    let mut done: BTreeSet<String> = BTreeSet::new();
    let mut acked = Acked::default();
    for e in journal.iter().filter(|e| e["event"] == "hook") {
        let (Some(call), Some(key)) = (e["call"].as_str(), e["key"].as_str()) else {
            continue;
        };
        match e["hook"].as_str() {
            Some("PreToolUse") if done.contains(call) => {
                seen.entry(call.to_owned()).or_default()[2] += 1;
            }
            // Taken by the control plane: an http hook's 200, a command hook's exit 0 (the
            // hook command exits 1 when the control plane refused it, 3 when unreachable).
            Some("PostToolUse") if e["status"] == 200 || e["status"] == 0 => {
                done.insert(call.to_owned());
                acked.count += 1;
                match d.effects.iter().find(|x| x.idempotency_key == key) {
                    Some(eff) => {
                        acked
                            .effects
                            .insert(eff.id.clone(), EffectStatus::Confirmed);
                    }
                    None => report.lost(format!(
                        "{task}: the receipt of {key} was acknowledged, and no effect has that key"
                    )),
                }
            }
            _ => {}
        }
        if vouched.contains(key) {
            done.insert(call.to_owned());
        }
    }
    for (call, [happened, confirmed, again]) in seen {
        if happened == 0 && finished {
            report.lost(format!(
                "{task}: the run finished, yet the side effect of {call} never happened"
            ));
        }
        let extra = happened
            .saturating_sub(1)
            .max(confirmed.saturating_sub(1))
            .max(again);
        for _ in 0..extra {
            report.duplicate(format!(
                "{task}: {call} happened {happened} time(s), is confirmed {confirmed} time(s) in the record, and was made {again} time(s) after it was confirmed"
            ));
        }
    }
    report.figures.writes_acknowledged += acked.count;
    report.absorb(check_task(d, &acked));
}

fn tail_journal(journal: &[Value]) -> String {
    journal
        .iter()
        .rev()
        .take(4)
        .rev()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(" | ")
}

fn tail_log(path: &Path) -> String {
    let t = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// The `claude` the runner is given: a shell script that runs this binary's fake.
fn write_wrapper(path: &PathBuf, bin: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let quoted = format!("'{}'", bin.to_string_lossy().replace('\'', r"'\''"));
    std::fs::write(
        path,
        format!("#!/bin/sh\nexec {quoted} chaos-fake-claude \"$@\"\n"),
    )?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}
