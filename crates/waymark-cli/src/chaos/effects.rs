//! The scenarios where the worker, not the server, fails around a deploy, driven through the
//! worker SDK exactly as an agent uses it (`run.effect(..).run(&reconciler, ..)` with the
//! reference deploy service as provider and `DeployClient` as its `Reconciler`):
//!
//! * `crash-after-commit`: the provider commits and the worker dies before the receipt is
//!   recorded (or the reply is lost, or it dies just before calling). A new attempt resumes;
//!   the deploy service's log must hold exactly one deploy per run.
//! * `stale-worker`: the worker stops heartbeating past its lease (what SIGSTOP looks like
//!   from outside), a new worker takes over and deploys, then the old one wakes and writes
//!   with its old fence — to the control plane and to the deploy service. Both must refuse.
//! * `partition`: the old worker talks through a proxy that black-holes traffic longer than
//!   the lease; its writes sent meanwhile arrive after the heal and must be refused, while
//!   the new worker's acknowledged writes all stay.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use waymark_proto::{
    Checkpoint, CheckpointBody, CreateTask, EffectRef, EffectStatus, FinishOutcome, TaskState,
};
use waymark_worker::deploy_service::DeployClient;
use waymark_worker::{
    AttemptOptions, EffectCtx, Error as SdkError, ProviderError, Resolution, Run,
};

use super::RunReport;
use super::env::{Acked, Env, Http, Proxy, TaskCheck, check_task, code};

const TARGET: &str = "staging";

/// Where the first worker dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashPoint {
    /// The provider committed; the worker is gone before the receipt is recorded.
    AfterCommit,
    /// The provider committed; its reply never reached the worker, which records `unknown`.
    ReplyLost,
    /// The effect is recorded `in_progress`; the worker dies before calling the provider.
    BeforeCall,
}

async fn new_task(env: &Env, title: &str) -> anyhow::Result<String> {
    let task = env
        .sdk(&env.url())?
        .create_task(&CreateTask {
            title: title.to_owned(),
            goal: "deploy to staging exactly once".into(),
            runtime: Some("waymark-chaos".into()),
            budget: Default::default(),
            plan: vec![],
            materials: Default::default(),
            external_key: None,
        })
        .await?;
    Ok(task.id)
}

fn body(summary: impl Into<String>, effects: Vec<EffectRef>) -> CheckpointBody {
    CheckpointBody {
        reason: "effect_boundary".into(),
        plan_revision: 1,
        summary: Some(summary.into()),
        effects,
        ..Default::default()
    }
}

/// Checkpoints through the SDK and records the acknowledgement.
async fn checkpoint(run: &Run, acked: &mut Acked, b: CheckpointBody) -> anyhow::Result<()> {
    let cp = run.checkpoint(b).await?;
    acked.checkpoints.insert(cp.sequence, cp.digest);
    acked.count += 1;
    Ok(())
}

/// The deploys the service made for `task`.
async fn deploys_of(deploy: &DeployClient, task: &str) -> anyhow::Result<Vec<Value>> {
    let log = deploy.log().await?;
    Ok(log
        .deploys
        .into_iter()
        .filter(|d| d.task_id == task)
        .map(|d| serde_json::to_value(d).unwrap_or_default())
        .collect())
}

/// Checks the deploy service's log for a run that must have deployed exactly once, with
/// `receipt` the one recorded in the control plane.
async fn check_one_deploy(
    env: &Env,
    task: &str,
    receipt: &Value,
    report: &mut RunReport,
) -> anyhow::Result<()> {
    let deploys = deploys_of(&env.deploy, task).await?;
    report.figures.deploys += deploys.len() as u64;
    match deploys.len() {
        1 => {
            if deploys[0]["deploy_id"] != receipt["deploy_id"] {
                report.lost(format!(
                    "{task}: the recorded receipt {} is not the deploy that happened ({})",
                    receipt["deploy_id"], deploys[0]["deploy_id"]
                ));
            }
        }
        0 => report.lost(format!(
            "{task}: the effect is confirmed but the deploy service has no deploy"
        )),
        n => report.duplicate(format!("{task}: the deploy service deployed {n} times")),
    }
    Ok(())
}

/// What the first worker of a `crash-after-commit` run hands back when it ends on its own.
type FirstWorker = tokio::task::JoinHandle<anyhow::Result<(Checkpoint, Option<SdkError>)>>;

/// Starts the first worker, in a task of its own so that it can be killed mid-call: it takes
/// an attempt with `lease`, checkpoints, and runs the deploy effect, signalling on the channel
/// once it reached the point where it is to die.
fn first_worker(
    env: &Arc<Env>,
    task: &str,
    key: &str,
    intent: &Value,
    commit: &str,
    point: CrashPoint,
    lease: Duration,
) -> (FirstWorker, tokio::sync::oneshot::Receiver<()>) {
    let (committed_tx, committed_rx) = tokio::sync::oneshot::channel::<()>();
    let env = env.clone();
    let (task, key, intent, commit) = (
        task.to_owned(),
        key.to_owned(),
        intent.clone(),
        commit.to_owned(),
    );
    let handle = tokio::spawn(async move {
        let client = env.sdk(&env.url())?;
        let run = client
            .start_attempt(&task, AttemptOptions::new("chaos-first").lease(lease))
            .await?;
        let cp = run.checkpoint(body("about to deploy", vec![])).await?;
        let deploy = env.deploy.clone();
        let res = run
            .effect(key, "deploy", intent)
            .step("deploy")
            .run(&env.deploy, |ctx| async move {
                if point == CrashPoint::BeforeCall {
                    let _ = committed_tx.send(());
                    return std::future::pending().await;
                }
                let res = deploy.deploy(&ctx, TARGET, &commit).await;
                let _ = committed_tx.send(());
                match (point, res) {
                    (CrashPoint::ReplyLost, Ok(_)) => Err(ProviderError::Unknown {
                        reason: "the deploy reply was lost (chaos)".into(),
                    }),
                    (CrashPoint::AfterCommit, Ok(_)) => std::future::pending().await,
                    (_, r) => r,
                }
            })
            .await;
        anyhow::Ok((cp, res.err()))
    });
    (handle, committed_rx)
}

/// `crash-after-commit`, one run.
pub(crate) async fn crash_after_commit(
    env: Arc<Env>,
    rng: &mut StdRng,
) -> anyhow::Result<RunReport> {
    let point = match rng.gen_range(0..10) {
        0..=5 => CrashPoint::AfterCommit,
        6..=7 => CrashPoint::ReplyLost,
        _ => CrashPoint::BeforeCall,
    };
    // Half the resumes report what the provider says through the reconciliation route first;
    // the others leave it to the SDK's own query-before-retry.
    let via_route = rng.gen_bool(0.5);
    let mut report = RunReport::default();
    let commit = format!("{:032x}", rng.r#gen::<u128>());
    let intent = json!({"target": TARGET, "commit": commit});
    // The first worker's lease is short so that the second can take over soon after the
    // crash. On a loaded machine it can run out before the worker even reaches the deploy:
    // then the crash this run is about did not happen, so it starts over on a fresh task with
    // twice the lease (and says so), rather than report a loaded machine as a failure.
    let mut lease = Duration::from_secs(1);
    let (task, key, mut acked, first) = loop {
        let mut acked = Acked::default();
        let task = new_task(&env, "chaos: crash after commit").await?;
        acked.count += 1;
        let key = format!("deploy-{task}");
        let (first, committed_rx) = first_worker(&env, &task, &key, &intent, &commit, point, lease);
        if committed_rx.await.is_ok() {
            break (task, key, acked, first);
        }
        // Say why it ended (a lost lease, a refusal), not just that a channel closed.
        let (why, lost_lease) = match first.await {
            Ok(Ok((_, Some(e)))) => (
                format!("its effect failed before the call: {e}"),
                matches!(e, SdkError::LeaseLost { .. }),
            ),
            Ok(Ok((_, None))) => (
                "its effect completed without calling the provider".to_owned(),
                false,
            ),
            Ok(Err(e)) => {
                let lost = matches!(
                    e.downcast_ref::<SdkError>(),
                    Some(SdkError::LeaseLost { .. })
                );
                (format!("{e:#}"), lost)
            }
            Err(e) => (format!("it panicked: {e}"), false),
        };
        if lost_lease && lease < Duration::from_secs(16) {
            report.note(format!(
                "{task}: the first worker lost its {}s lease before the deploy ({why}); started over with {}s",
                lease.as_secs(),
                lease.as_secs() * 2
            ));
            lease *= 2;
            continue;
        }
        bail!("the first worker ended before reaching the provider: {why}");
    };
    let first_error = if point == CrashPoint::ReplyLost {
        // It records `unknown` and gives up; then the process is gone.
        let (cp, err) = first.await.context("the first worker panicked")??;
        acked.checkpoints.insert(cp.sequence, cp.digest);
        acked.count += 1;
        err
    } else {
        // kill -9 of the worker: its future is dropped mid-call, the heartbeat stops.
        first.abort();
        let _ = first.await;
        None
    };
    if point == CrashPoint::ReplyLost {
        match &first_error {
            Some(SdkError::EffectUnknown { .. }) => {}
            // On a loaded machine the 1 s lease can run out between the call and recording
            // `unknown`: the server then refuses the stale write (as it must), the effect stays
            // `in_progress`, and the second worker reconciles it the same way — by asking the
            // provider by key. Said in the report; the checks below still hold the run.
            Some(SdkError::LeaseLost { .. }) => report.note(format!(
                "{task}: the first worker's {}s lease ran out after the lost reply, before it could record `unknown`; the effect stays in progress for the second worker to reconcile",
                lease.as_secs()
            )),
            other => bail!(
                "a lost deploy reply should leave the effect unknown, the SDK said {other:?}"
            ),
        }
    }
    if let Some(cp) = env.admin()?.detail(&task).await?.checkpoints.first() {
        acked
            .checkpoints
            .entry(cp.sequence)
            .or_insert(cp.digest.clone());
    }

    // The second worker waits for the lease to run out, resumes and reconciles.
    let client = env.sdk(&env.url())?;
    let run = client
        .start_attempt(
            &task,
            AttemptOptions::new("chaos-second")
                .lease(Duration::from_secs(10))
                .wait_for_lease(Duration::from_secs(20)),
        )
        .await?;
    acked.count += 1;
    if via_route {
        reconcile_via_route(&env, &run, &task).await?;
    }
    let calls = AtomicU32::new(0);
    let done = run
        .effect(key, "deploy", intent)
        .step("deploy")
        .run(&env.deploy, |ctx: EffectCtx| {
            calls.fetch_add(1, Ordering::SeqCst);
            let deploy = env.deploy.clone();
            let commit = commit.clone();
            async move { deploy.deploy(&ctx, TARGET, &commit).await }
        })
        .await?;
    acked.count += 1;
    acked
        .effects
        .insert(done.effect.id.clone(), done.effect.status);
    let calls = calls.load(Ordering::SeqCst);
    let committed_before = point != CrashPoint::BeforeCall;
    if committed_before && calls > 0 {
        report.duplicate(format!(
            "{task}: the resumed worker sent the committed deploy again ({calls}×); it should have reconciled"
        ));
    }
    let expected = if !committed_before {
        Resolution::Ran
    } else if via_route {
        Resolution::AlreadyConfirmed
    } else {
        Resolution::Reconciled
    };
    if done.resolution != expected {
        report.note(format!(
            "{task}: {point:?} resumed as {:?}, expected {expected:?}",
            done.resolution
        ));
    }
    checkpoint(
        &run,
        &mut acked,
        body(
            "deployed",
            vec![EffectRef {
                effect_id: done.effect.id.clone(),
                status: done.effect.status,
            }],
        ),
    )
    .await?;
    run.finish(FinishOutcome::Completed, Some("deployed once".into()))
        .await?;
    acked.count += 1;
    report.figures.writes_acknowledged += acked.count;

    let d = env.admin()?.detail(&task).await?;
    let mut check = check_task(&d, &acked);
    if d.task.state != TaskState::Completed {
        check.invalid(format!("{task} ended {}, not completed", d.task.state));
    }
    report.absorb(check);
    check_one_deploy(&env, &task, &done.receipt, &mut report).await?;
    Ok(report)
}

/// Reports what the provider says about the task's open effects through
/// `POST /v1/tasks/{task}/reconciliation`, as a resuming worker may.
async fn reconcile_via_route(env: &Env, run: &Run, task: &str) -> anyhow::Result<()> {
    use waymark_worker::{ProviderStatus, Reconciler};
    let d = env.admin()?.detail(task).await?;
    let mut reports = Vec::new();
    for e in d.effects.iter().filter(|e| !e.status.is_terminal()) {
        let ctx = EffectCtx {
            idempotency_key: e.idempotency_key.clone(),
            fence: run.fence(),
            attempt_id: run.attempt().id.clone(),
            task_id: task.to_owned(),
            effect_id: e.id.clone(),
        };
        let (status, receipt) = match env.deploy.query(&ctx).await {
            ProviderStatus::NotStarted => ("not_started", None),
            ProviderStatus::Confirmed(r) => ("confirmed", Some(r)),
            ProviderStatus::InProgress => ("in_progress", None),
            ProviderStatus::Failed {
                compensable: true, ..
            } => ("failed_compensable", None),
            ProviderStatus::Failed { .. } => ("failed", None),
            ProviderStatus::Unknown { .. } => ("unknown", None),
        };
        reports.push(json!({"effect_id": e.id, "provider_status": status, "receipt": receipt}));
    }
    let http = env.worker_http()?;
    let (s, v) = http
        .post(
            &format!("/v1/tasks/{task}/reconciliation"),
            &json!({"attempt_id": run.attempt().id, "fence": run.fence(), "reports": reports}),
        )
        .await?;
    if !s.is_success() {
        bail!("the reconciliation route answered {s}: {v}");
    }
    Ok(())
}

/// A write with a stale fence: counted, and refused for the right reason, or counted accepted.
fn stale(
    report: &mut RunReport,
    what: &str,
    s: reqwest::StatusCode,
    v: &Value,
) -> anyhow::Result<()> {
    report.figures.stale_writes_tried += 1;
    if s.is_success() {
        report.stale(format!("{what} with a stale fence was accepted ({s}): {v}"));
        return Ok(());
    }
    let c = code(v);
    let fencing = ["fenced", "lease_expired", "attempt_closed", "stale_fence"];
    if !fencing.contains(&c) && !fencing.contains(&v["error"].as_str().unwrap_or("")) {
        // Refused for another reason would prove nothing about fencing.
        bail!("{what} with a stale fence was refused for another reason ({s}): {v}");
    }
    Ok(())
}

/// The old worker's writes, sent with its old attempt and fence after a newer attempt took
/// the task: a checkpoint at the right next sequence (so only the fence can refuse it), a
/// receipt, a new effect, a message, a heartbeat, and a fresh deploy.
async fn stale_writes(
    env: &Env,
    http: &Http,
    report: &mut RunReport,
    task: &str,
    old: (&str, i64),
    effect: &str,
) -> anyhow::Result<()> {
    let (attempt, fence) = old;
    let next = env.admin()?.detail(task).await?.checkpoints.len() as i64 + 1;
    let (s, v) = http
        .post(
            &format!("/v1/tasks/{task}/checkpoints"),
            &json!({"attempt_id": attempt, "fence": fence, "sequence": next,
                "body": {"reason": "step_completed", "plan_revision": 1, "summary": "stale"}}),
        )
        .await?;
    stale(report, "a checkpoint", s, &v)?;
    let (s, v) = http
        .patch(
            &format!("/v1/effects/{effect}"),
            &json!({"attempt_id": attempt, "fence": fence, "status": "failed", "receipt": {"error": "stale"}}),
        )
        .await?;
    stale(report, "an effect receipt", s, &v)?;
    let (s, v) = http
        .post(
            &format!("/v1/tasks/{task}/effects"),
            &json!({"attempt_id": attempt, "fence": fence, "idempotency_key": format!("stale-{task}"),
                "kind": "deploy", "intent": {"target": TARGET, "commit": "stale"}}),
        )
        .await?;
    stale(report, "an effect declaration", s, &v)?;
    let (s, v) = http
        .post(
            &format!("/v1/tasks/{task}/messages"),
            &json!({"attempt_id": attempt, "fence": fence, "messages": [{"role": "assistant", "text": "stale"}]}),
        )
        .await?;
    stale(report, "a message", s, &v)?;
    let (s, v) = http
        .post(
            &format!("/v1/attempts/{attempt}/heartbeat"),
            &json!({"fence": fence}),
        )
        .await?;
    stale(report, "a heartbeat", s, &v)?;
    // The deploy service sees only the fence: a fresh key with the old one must be refused.
    let ctx = EffectCtx {
        idempotency_key: format!("stale-{task}"),
        fence,
        attempt_id: attempt.to_owned(),
        task_id: task.to_owned(),
        effect_id: String::new(),
    };
    report.figures.stale_writes_tried += 1;
    match env.deploy.deploy(&ctx, TARGET, "stale").await {
        Ok(r) => report.stale(format!(
            "the deploy service accepted a stale-fence deploy: {r}"
        )),
        Err(ProviderError::Failed { reason, .. }) if reason.contains("older than fence") => {}
        Err(e) => bail!("the deploy service refused a stale deploy for another reason: {e:?}"),
    }
    Ok(())
}

/// `stale-worker`, one run.
pub(crate) async fn stale_worker(env: Arc<Env>, rng: &mut StdRng) -> anyhow::Result<RunReport> {
    let mut report = RunReport::default();
    let mut acked = Acked::default();
    let task = new_task(&env, "chaos: stale worker").await?;
    acked.count += 1;
    let key = format!("deploy-{task}");
    let commit = format!("{:032x}", rng.r#gen::<u128>());
    let intent = json!({"target": TARGET, "commit": commit});

    let (hung_tx, hung_rx) = tokio::sync::oneshot::channel::<(String, i64)>();
    let (wake_tx, wake_rx) = tokio::sync::oneshot::channel::<()>();
    let old = {
        let env = env.clone();
        let (task, key, intent, commit) =
            (task.clone(), key.clone(), intent.clone(), commit.clone());
        tokio::spawn(async move {
            let client = env.sdk(&env.url())?;
            let run = client
                .start_attempt(
                    &task,
                    AttemptOptions::new("chaos-old").lease(Duration::from_secs(1)),
                )
                .await?;
            let cp = run.checkpoint(body("about to deploy", vec![])).await?;
            let deploy = env.deploy.clone();
            let accepted = Arc::new(AtomicU32::new(0));
            let seen = accepted.clone();
            let res = run
                .effect(key, "deploy", intent)
                .step("deploy")
                .run(&env.deploy, |ctx| {
                    let run = &run;
                    async move {
                        // Stopped: no heartbeat, the lease runs out, a new worker takes over.
                        run.stop_heartbeat();
                        let _ = hung_tx.send((ctx.attempt_id.clone(), ctx.fence));
                        let _ = wake_rx.await;
                        // Woken: it carries on with its old fence, as a stopped process does.
                        let r = deploy.deploy(&ctx, TARGET, &commit).await;
                        if r.is_ok() {
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                        r
                    }
                })
                .await;
            anyhow::Ok((cp, res, accepted.load(Ordering::SeqCst)))
        })
    };
    let (old_attempt, old_fence) = hung_rx
        .await
        .context("the old worker ended before it hung")?;

    let client = env.sdk(&env.url())?;
    let run = client
        .start_attempt(
            &task,
            AttemptOptions::new("chaos-new")
                .lease(Duration::from_secs(10))
                .wait_for_lease(Duration::from_secs(20)),
        )
        .await?;
    acked.count += 1;
    let done = run
        .effect(key, "deploy", intent)
        .step("deploy")
        .run(&env.deploy, |ctx| {
            let deploy = env.deploy.clone();
            let commit = commit.clone();
            async move { deploy.deploy(&ctx, TARGET, &commit).await }
        })
        .await?;
    acked.count += 1;
    acked
        .effects
        .insert(done.effect.id.clone(), done.effect.status);
    checkpoint(&run, &mut acked, body("deployed", vec![])).await?;

    // Wake the old worker: its deploy and its receipt carry the old fence.
    let _ = wake_tx.send(());
    let (cp, res, deploy_accepted) = old.await.context("the old worker panicked")??;
    acked.checkpoints.insert(cp.sequence, cp.digest);
    acked.count += 1;
    report.figures.stale_writes_tried += 2;
    if deploy_accepted > 0 {
        report.stale(format!(
            "{task}: the deploy service accepted the old worker's deploy"
        ));
    }
    match res {
        Ok(e) => report.stale(format!(
            "{task}: the control plane accepted the old worker's receipt ({:?})",
            e.effect.status
        )),
        Err(SdkError::Fenced { .. } | SdkError::LeaseLost { .. }) => {}
        Err(e) => bail!("the old worker's receipt was refused for another reason: {e}"),
    }
    stale_writes(
        &env,
        &env.worker_http()?,
        &mut report,
        &task,
        (&old_attempt, old_fence),
        &done.effect.id,
    )
    .await?;

    run.finish(FinishOutcome::Completed, Some("deployed once".into()))
        .await?;
    acked.count += 1;
    report.figures.writes_acknowledged += acked.count;
    let d = env.admin()?.detail(&task).await?;
    let mut check = check_task(&d, &acked);
    let effect = d.effects.iter().find(|e| e.id == done.effect.id);
    if effect.is_none_or(|e| e.status != EffectStatus::Confirmed || e.fence != run.fence()) {
        check.invalid(format!(
            "{task}: the deploy effect should be confirmed by fence {}: {effect:?}",
            run.fence()
        ));
    }
    if d.task.state != TaskState::Completed {
        check.invalid(format!("{task} ended {}, not completed", d.task.state));
    }
    report.absorb(check);
    check_one_deploy(&env, &task, &done.receipt, &mut report).await?;
    Ok(report)
}

/// `partition`, one run.
pub(crate) async fn partition(env: Arc<Env>, rng: &mut StdRng) -> anyhow::Result<RunReport> {
    let mut report = RunReport::default();
    let mut acked = Acked::default();
    let task = new_task(&env, "chaos: partition").await?;
    acked.count += 1;
    let key = format!("deploy-{task}");
    let commit = format!("{:032x}", rng.r#gen::<u128>());
    let proxy = Proxy::start(env.server.addr).await?;

    // The old worker reaches the control plane only through the proxy.
    let old = Arc::new(
        env.sdk(&proxy.url)?
            .start_attempt(
                &task,
                AttemptOptions::new("chaos-partitioned").lease(Duration::from_secs(1)),
            )
            .await?,
    );
    acked.count += 1;
    checkpoint(&old, &mut acked, body("before the partition", vec![])).await?;
    let old_attempt = old.attempt().id.clone();
    let old_fence = old.fence();

    proxy.partition();
    // Writes the old worker sends into the black hole; they arrive after the heal.
    let buffered_checkpoint = {
        let old = old.clone();
        tokio::spawn(async move {
            old.checkpoint(body("written during the partition", vec![]))
                .await
        })
    };
    let buffered_message = {
        let old = old.clone();
        tokio::spawn(async move { old.say("written during the partition").await })
    };
    let raw = Http::new(&proxy.url, &env.worker_token, Duration::from_secs(30))?;
    let buffered_raw = {
        let (raw, task, attempt) = (raw.clone(), task.clone(), old_attempt.clone());
        tokio::spawn(async move {
            raw.post(
                &format!("/v1/tasks/{task}/effects"),
                &json!({"attempt_id": attempt, "fence": old_fence, "idempotency_key": format!("partitioned-{task}"),
                    "kind": "deploy", "intent": {"target": TARGET, "commit": "partitioned"}}),
            )
            .await
        })
    };

    // Longer than the lease: a new worker, talking directly, takes over and deploys.
    let run = env
        .sdk(&env.url())?
        .start_attempt(
            &task,
            AttemptOptions::new("chaos-new")
                .lease(Duration::from_secs(10))
                .wait_for_lease(Duration::from_secs(20)),
        )
        .await?;
    acked.count += 1;
    let done = run
        .effect(key, "deploy", json!({"target": TARGET, "commit": commit}))
        .step("deploy")
        .run(&env.deploy, |ctx| {
            let deploy = env.deploy.clone();
            let commit = commit.clone();
            async move { deploy.deploy(&ctx, TARGET, &commit).await }
        })
        .await?;
    acked.count += 1;
    acked
        .effects
        .insert(done.effect.id.clone(), done.effect.status);
    checkpoint(&run, &mut acked, body("deployed", vec![])).await?;
    let said = run
        .messages(vec![waymark_proto::NewMessage {
            role: "assistant".into(),
            text: "deployed once".into(),
        }])
        .await?;
    for m in said {
        acked.messages.insert(m.seq, m.text);
        acked.count += 1;
    }

    proxy.heal();
    let wait = Duration::from_secs(30);
    report.figures.stale_writes_tried += 2;
    match tokio::time::timeout(wait, buffered_checkpoint).await {
        Ok(Ok(Ok(cp))) => report.stale(format!(
            "{task}: the partitioned worker's checkpoint #{} was accepted",
            cp.sequence
        )),
        Ok(Ok(Err(
            SdkError::Fenced { .. }
            | SdkError::LeaseLost { .. }
            | SdkError::SequenceConflict { .. },
        ))) => {}
        Ok(Ok(Err(e))) => bail!("the partitioned worker's checkpoint failed otherwise: {e}"),
        Ok(Err(e)) => bail!("the buffered checkpoint panicked: {e}"),
        Err(_) => bail!("the buffered checkpoint was not answered {wait:?} after the heal"),
    }
    match tokio::time::timeout(wait, buffered_message).await {
        Ok(Ok(Ok(()))) => report.stale(format!(
            "{task}: the partitioned worker's message was accepted"
        )),
        Ok(Ok(Err(SdkError::Fenced { .. } | SdkError::LeaseLost { .. }))) => {}
        Ok(Ok(Err(e))) => bail!("the partitioned worker's message failed otherwise: {e}"),
        Ok(Err(e)) => bail!("the buffered message panicked: {e}"),
        Err(_) => bail!("the buffered message was not answered {wait:?} after the heal"),
    }
    match tokio::time::timeout(wait, buffered_raw).await {
        Ok(Ok(Ok((s, v)))) => stale(&mut report, "a buffered effect declaration", s, &v)?,
        Ok(Ok(Err(e))) => bail!("the buffered declaration got no answer: {e}"),
        Ok(Err(e)) => bail!("the buffered declaration panicked: {e}"),
        Err(_) => bail!("the buffered declaration was not answered {wait:?} after the heal"),
    }
    // Once healed, the old worker hears that it lost the task.
    if tokio::time::timeout(Duration::from_secs(10), old.cancelled().cancelled())
        .await
        .is_err()
    {
        report.note(format!(
            "{task}: the partitioned worker did not learn within 10 s that it was fenced off"
        ));
    }
    stale_writes(
        &env,
        &raw,
        &mut report,
        &task,
        (&old_attempt, old_fence),
        &done.effect.id,
    )
    .await?;

    run.finish(FinishOutcome::Completed, Some("deployed once".into()))
        .await?;
    acked.count += 1;
    report.figures.writes_acknowledged += acked.count;
    let d = env.admin()?.detail(&task).await?;
    let mut check: TaskCheck = check_task(&d, &acked);
    if d.task.state != TaskState::Completed {
        check.invalid(format!("{task} ended {}, not completed", d.task.state));
    }
    report.absorb(check);
    check_one_deploy(&env, &task, &done.receipt, &mut report).await?;
    Ok(report)
}
