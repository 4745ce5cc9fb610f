//! `duplicate-commands`: what an outbox that resends until answered, and a network that
//! repeats and reorders, do to the control plane. Signed steer commands (pause, resume,
//! replan) and effect receipts (declarations and status reports) are each delivered 1–5
//! times, shuffled, a few at a time concurrently. Each must take effect once: one ledger
//! entry and at most one `command.applied` event per command id, a plan revision that moved
//! once per applied replan, one effect per key and one event per status it reached.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::{EffectStatus, EventKind, Operation, SteerCommand};

use super::RunReport;
use super::env::{Acked, Env, Http, check_task};

/// One delivery.
#[derive(Debug, Clone)]
enum Delivery {
    /// A signed envelope (index into the commands).
    Command(usize),
    /// A status report of an effect (index into the effects).
    Receipt(usize, EffectStatus),
}

/// A device of [`super::env::USER`] with its key, paired for this run.
pub(crate) struct Device {
    pub(crate) id: String,
    pub(crate) key: ed25519_dalek::SigningKey,
}

pub(crate) async fn pair(env: &Env) -> anyhow::Result<Device> {
    let scopes = ["view", "steer", "approve"].map(String::from);
    let (code, _) = waymark_server::steer::create_pairing(
        &*env.server.state.store,
        super::env::USER,
        &scopes,
        600_000,
    )
    .await?;
    let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let http = Http::new(&env.url(), "", Duration::from_secs(10))?;
    let (s, v) = http
        .post(
            "/v1/devices/pair",
            &json!({"code": code, "name": "chaos phone",
                "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}),
        )
        .await?;
    if s != StatusCode::CREATED {
        bail!("pairing answered {s}: {v}");
    }
    Ok(Device {
        id: v["id"].as_str().context("a device without id")?.to_owned(),
        key,
    })
}

async fn task_with_attempt(http: &Http, title: &str) -> anyhow::Result<(String, String, i64)> {
    let (s, t) = http.post("/v1/tasks", &json!({"title": title})).await?;
    if s != StatusCode::CREATED {
        bail!("creating a task answered {s}: {t}");
    }
    let task = t["id"].as_str().context("no task id")?.to_owned();
    let (s, a) = http
        .post(
            &format!("/v1/tasks/{task}/attempts"),
            &json!({"worker": "chaos-duplicates", "lease_seconds": 120}),
        )
        .await?;
    if s != StatusCode::CREATED {
        bail!("starting an attempt answered {s}: {a}");
    }
    Ok((
        task,
        a["id"].as_str().context("no attempt id")?.to_owned(),
        a["fence"].as_i64().context("no fence")?,
    ))
}

/// One run.
pub(crate) async fn run(env: Arc<Env>, rng: &mut StdRng) -> anyhow::Result<RunReport> {
    let mut report = RunReport::default();
    let admin = env.admin()?;
    let worker = env.worker_http()?;
    let public = Http::new(&env.url(), "", Duration::from_secs(10))?;
    let start_cursor = admin.cursor().await?;
    let device = pair(&env).await?;

    // Commands steer one task; receipts go to another, so a pause cannot interfere with them.
    let (steered, _, _) = task_with_attempt(&worker, "chaos: steered").await?;
    let (reported, attempt, fence) = task_with_attempt(&worker, "chaos: receipts").await?;

    let now = chrono::Utc::now();
    let n_commands = rng.gen_range(3..=6);
    let mut commands = Vec::new();
    for _ in 0..n_commands {
        let (operation, args) = match rng.gen_range(0..3) {
            0 => (Operation::Pause, json!({})),
            1 => (Operation::Resume, json!({})),
            _ => (
                Operation::Replan,
                json!({"instructions": "write the report only"}),
            ),
        };
        let cmd = SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(steered.clone()),
            // Signed against the revision the person saw; some will meet a newer one.
            expected_plan_revision: Some(rng.gen_range(1..=2)),
            operation,
            scope: vec![],
            args,
            issued_by: format!("user:{}", super::env::USER),
            device_id: device.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(10),
        };
        let env = waymark_proto::signing::sign(&cmd, &device.key)?;
        commands.push((cmd, serde_json::to_value(env)?));
    }

    // Effects, declared (each declaration delivered 1–5 times) before their reports.
    let n_effects = rng.gen_range(2..=4);
    let mut effects = Vec::new();
    let mut declarations = Vec::new();
    for i in 0..n_effects {
        let key = format!("receipt-{reported}-{i}");
        for _ in 0..rng.gen_range(1..=5) {
            declarations.push(i);
        }
        effects.push((key, String::new()));
    }
    declarations.shuffle(rng);
    let mut declared_created = BTreeMap::<usize, u32>::new();
    for i in declarations {
        let (s, v) = worker
            .post(
                &format!("/v1/tasks/{reported}/effects"),
                &json!({"attempt_id": attempt, "fence": fence, "idempotency_key": effects[i].0,
                    "kind": "deploy", "intent": {"target": "staging", "n": i}}),
            )
            .await?;
        if !s.is_success() {
            bail!("declaring {} answered {s}: {v}", effects[i].0);
        }
        effects[i].1 = v["effect"]["id"]
            .as_str()
            .context("no effect id")?
            .to_owned();
        if v["created"] == true {
            *declared_created.entry(i).or_default() += 1;
        }
    }

    let mut deliveries = Vec::new();
    for i in 0..commands.len() {
        for _ in 0..rng.gen_range(1..=5) {
            deliveries.push(Delivery::Command(i));
        }
    }
    for i in 0..effects.len() {
        for status in [EffectStatus::InProgress, EffectStatus::Confirmed] {
            for _ in 0..rng.gen_range(1..=5) {
                deliveries.push(Delivery::Receipt(i, status));
            }
        }
    }
    deliveries.shuffle(rng);

    // Delivered a few at a time, concurrently: a resend may race its original.
    let mut answers: Vec<(Delivery, StatusCode, Value)> = Vec::new();
    for batch in deliveries.chunks(3) {
        let sent = batch.iter().map(|d| {
            let d = d.clone();
            let (public, worker) = (&public, &worker);
            let (commands, effects, attempt) = (&commands, &effects, &attempt);
            async move {
                let r = match &d {
                    Delivery::Command(i) => public.post("/v1/commands", &commands[*i].1).await,
                    Delivery::Receipt(i, status) => {
                        let receipt = (*status == EffectStatus::Confirmed)
                            .then(|| json!({"deploy_id": format!("dep-{i}")}));
                        worker
                            .patch(
                                &format!("/v1/effects/{}", effects[*i].1),
                                &json!({"attempt_id": attempt, "fence": fence, "status": status, "receipt": receipt}),
                            )
                            .await
                    }
                };
                r.map(|(s, v)| (d, s, v))
            }
        });
        for r in futures::future::join_all(sent).await {
            answers.push(r?);
        }
    }

    // Commands: one ledger entry each; every delivery but one answered `duplicate` with it.
    let ledger = admin
        .get(&format!("/v1/admin/tasks/{steered}/commands"))
        .await?;
    let ledger = ledger.as_array().context("the ledger is not a list")?;
    let mut applied_replans = 0;
    let mut applied = 0;
    for (i, (cmd, _)) in commands.iter().enumerate() {
        let entries: Vec<&Value> = ledger
            .iter()
            .filter(|e| e["command_id"] == cmd.command_id.as_str())
            .collect();
        let mine: Vec<&(Delivery, StatusCode, Value)> = answers
            .iter()
            .filter(|(d, _, _)| matches!(d, Delivery::Command(j) if *j == i))
            .collect();
        let firsts = mine
            .iter()
            .filter(|(_, _, v)| v["status"] != "duplicate")
            .count();
        match entries.len() {
            0 => report.lost(format!(
                "command {} was answered but is not in the ledger",
                cmd.command_id
            )),
            1 => {}
            n => report.duplicate(format!("command {} has {n} ledger entries", cmd.command_id)),
        }
        if firsts != 1 {
            report.duplicate(format!(
                "command {} delivered {}× was answered as new {firsts}×",
                cmd.command_id,
                mine.len()
            ));
        }
        if let Some(e) = entries.first() {
            for (_, _, v) in mine.iter().filter(|(_, _, v)| v["status"] == "duplicate") {
                if v["original"]["status"] != e["status"] {
                    report.note(format!(
                        "a resend of {} answered original {}, the ledger says {}",
                        cmd.command_id, v["original"]["status"], e["status"]
                    ));
                }
            }
            if e["status"] == "applied" {
                applied += 1;
                report.figures.writes_acknowledged += 1;
                if cmd.operation == Operation::Replan {
                    applied_replans += 1;
                }
            }
        }
    }
    let d = admin.detail(&steered).await?;
    if d.task.plan_revision != 1 + applied_replans {
        report.duplicate(format!(
            "{steered}: {applied_replans} replans applied but the plan revision is {}",
            d.task.plan_revision
        ));
    }
    let through = admin.cursor().await?;
    let events = admin.events(start_cursor, through).await?;
    let applied_events = events
        .iter()
        .filter(|e| e.task_id == steered && e.kind == EventKind::CommandApplied)
        .count();
    if applied_events != applied {
        report.duplicate(format!(
            "{steered}: {applied} commands applied, {applied_events} command.applied events"
        ));
    }

    // Receipts: one effect per key, one event per status reached, the acknowledged status kept.
    let d = admin.detail(&reported).await?;
    let mut acked = Acked::default();
    for (i, (key, id)) in effects.iter().enumerate() {
        let same_key = d
            .effects
            .iter()
            .filter(|e| &e.idempotency_key == key)
            .count();
        if same_key != 1 {
            report.duplicate(format!("{reported}: {same_key} effects under key {key}"));
        }
        if declared_created.get(&i).copied().unwrap_or(0) != 1 {
            report.duplicate(format!(
                "{key}: {} declarations answered `created`",
                declared_created.get(&i).copied().unwrap_or(0)
            ));
        }
        let mine = answers
            .iter()
            .filter(|(d, s, _)| matches!(d, Delivery::Receipt(j, _) if *j == i) && s.is_success());
        let mut newest = None;
        for (d, _, _) in mine {
            if let Delivery::Receipt(_, st) = d {
                // Confirmed is final; an in_progress acknowledged before it is superseded.
                if newest != Some(EffectStatus::Confirmed) {
                    newest = Some(*st);
                }
            }
        }
        if newest.is_none() {
            bail!("{key}: no report of it was acknowledged");
        }
        report.figures.writes_acknowledged += 1;
        if let Some(st) = newest {
            acked.effects.insert(id.clone(), st);
        }
        for status in [EffectStatus::InProgress, EffectStatus::Confirmed] {
            let n = events
                .iter()
                .filter(|e| {
                    e.kind == EventKind::EffectUpdated
                        && e.data["id"] == id.as_str()
                        && e.data["status"] == status.as_str()
                })
                .count();
            if n > 1 {
                report.duplicate(format!("{key}: {n} `effect.updated` events to {status}"));
            }
        }
        let declared = events
            .iter()
            .filter(|e| e.kind == EventKind::EffectDeclared && e.data["id"] == id.as_str())
            .count();
        if declared != 1 {
            report.duplicate(format!("{key}: {declared} `effect.declared` events"));
        }
    }
    let mut check = check_task(&d, &acked);
    for e in &d.effects {
        if e.status != EffectStatus::Confirmed {
            check.lost(format!(
                "{}: every report ended confirmed, the effect is {}",
                e.idempotency_key, e.status
            ));
        }
    }
    report.absorb(check);
    Ok(report)
}
