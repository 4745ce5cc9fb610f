//! The OpenClaw adapter against a real control plane (in-process) and the fake gateway
//! (`waymark-fake-openclaw`, a separate process on a real WebSocket), answered the way the
//! companion answers: a paired device's signed command over HTTP.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signature, VerifyingKey};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use support::{ControlPlane, Phone, eventually};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use waymark_adapters::openclaw::{self, AuthPayload, DeviceKey, OpenClawArgs, OpenClawError};
use waymark_proto::{CreateTask, Decision, EffectStatus, Operation, TaskDetail};

const GATEWAY_TOKEN: &str = "gw-secret";

// ---- the control plane and a paired phone ----------------------------------------------------

struct World {
    cp: ControlPlane,
}

impl World {
    async fn start() -> World {
        World {
            cp: ControlPlane::start("alice-openclaw").await,
        }
    }

    async fn phone(&self) -> Phone {
        self.cp.phone().await
    }

    /// The task of an OpenClaw session (found by its key, as the adapter finds it).
    async fn session_task(&self, key: &str) -> String {
        self.cp
            .client
            .create_task(&CreateTask {
                title: key.into(),
                goal: String::new(),
                runtime: Some("openclaw".into()),
                budget: Default::default(),
                plan: Vec::new(),
                materials: Default::default(),
                external_key: Some(key.into()),
            })
            .await
            .unwrap()
            .id
    }

    async fn detail(&self, task: &str) -> TaskDetail {
        self.cp.detail(task).await
    }

    /// The decisions opened for one OpenClaw approval id.
    async fn approvals_for(&self, task: &str, approval: &str) -> Vec<waymark_proto::Decision> {
        self.detail(task)
            .await
            .decisions
            .into_iter()
            .filter(|d| d.intent.as_ref().is_some_and(|i| i["id"] == approval))
            .collect()
    }

    /// The decision of OpenClaw approval `approval`, once it is expired.
    async fn expired(&self, task: &str, approval: &str) -> Decision {
        eventually(&format!("`{approval}` expired"), || async {
            self.approvals_for(task, approval)
                .await
                .into_iter()
                .find(|d| d.status == waymark_proto::DecisionStatus::Expired)
        })
        .await
    }

    /// The effect keyed `key`, once it is no longer `in_progress`.
    async fn settled_effect(&self, task: &str, key: &str) -> waymark_proto::Effect {
        eventually(&format!("the effect `{key}` closed"), || async {
            self.detail(task)
                .await
                .effects
                .into_iter()
                .find(|e| e.idempotency_key == key && e.status != EffectStatus::InProgress)
        })
        .await
    }

    fn key_path(&self) -> PathBuf {
        self.cp.dir.path().join("openclaw/device.json")
    }
}

/// Answers as the phone gives them, at the task's current plan revision.
trait Answers {
    async fn approve(&self, w: &World, task: &str, decision: &Decision, option: &str);
    async fn deny(&self, w: &World, task: &str, decision: &Decision);
}

impl Answers for Phone {
    async fn approve(&self, w: &World, task: &str, decision: &Decision, option: &str) {
        let revision = w.detail(task).await.task.plan_revision;
        self.command(
            task,
            revision,
            Operation::Approve,
            json!({"decision_id": decision.id, "intent_digest": decision.intent_digest, "option": option}),
        )
        .await;
    }

    async fn deny(&self, w: &World, task: &str, decision: &Decision) {
        let revision = w.detail(task).await.task.plan_revision;
        self.command(
            task,
            revision,
            Operation::Deny,
            json!({"decision_id": decision.id, "intent_digest": decision.intent_digest}),
        )
        .await;
    }
}

// ---- the fake gateway and the adapter --------------------------------------------------------

struct Gateway {
    _child: tokio::process::Child,
    port: u16,
    record: PathBuf,
}

impl Gateway {
    async fn start(w: &World, fixture: &str, paired: &[String]) -> Gateway {
        let record = w.cp.dir.path().join(format!("{fixture}.frames"));
        let fixture =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/openclaw/{fixture}.json"));
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_waymark-fake-openclaw"));
        cmd.arg("--fixture")
            .arg(&fixture)
            .arg("--record")
            .arg(&record);
        for k in paired {
            // `=`: a base64url key may start with `-`, which would read as a flag.
            cmd.arg(format!("--paired-key={k}"));
        }
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .await
            .unwrap();
        Gateway {
            _child: child,
            port: line.trim().parse().unwrap(),
            record,
        }
    }

    fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    /// Every frame the gateway received, in order.
    fn frames(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn requests(&self, method: &str) -> Vec<Value> {
        self.frames()
            .into_iter()
            .filter(|f| f["method"] == method)
            .collect()
    }

    /// Waits until the gateway has received `n` requests of `method`.
    async fn wait_for(&self, method: &str, n: usize) -> Vec<Value> {
        eventually(&format!("{n} × `{method}` at the gateway"), || async {
            let r = self.requests(method);
            (r.len() >= n).then_some(r)
        })
        .await
    }
}

struct Adapter {
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<Result<(), OpenClawError>>,
}

impl Adapter {
    fn start(w: &World, gw: &Gateway) -> Adapter {
        let shutdown = CancellationToken::new();
        let args = OpenClawArgs {
            gateway: gw.url(),
            gateway_token: Some(GATEWAY_TOKEN.into()),
            device_key: Some(w.key_path()),
            client_id: "gateway-client".into(),
            client_mode: "backend".into(),
            task: None,
            session_key: None,
            message: None,
            turn_key: None,
            cwd: None,
        };
        let handle = tokio::spawn(openclaw::run(args, w.cp.client.clone(), shutdown.clone()));
        Adapter { shutdown, handle }
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let res = tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .expect("the adapter stops")
            .unwrap();
        assert!(res.is_ok(), "{res:?}");
    }
}

/// The one pending decision for `approval`, once the adapter has opened it.
async fn pending_decision(w: &World, task: &str, approval: &str) -> waymark_proto::Decision {
    eventually(&format!("a decision for `{approval}`"), || async {
        w.approvals_for(task, approval).await.into_iter().next()
    })
    .await
}

fn paired_key(w: &World) -> String {
    DeviceKey::load_or_create(&w.key_path())
        .unwrap()
        .public_key()
}

// ---- tests -----------------------------------------------------------------------------------

#[tokio::test]
async fn the_handshake_is_signed_over_the_nonce_and_an_unpaired_key_is_refused() {
    let w = World::start().await;
    let someone_else = {
        let other = DeviceKey::load_or_create(&w.cp.dir.path().join("other.json")).unwrap();
        other.public_key()
    };
    let gw = Gateway::start(&w, "handshake", &[someone_else]).await;
    let err = tokio::time::timeout(Duration::from_secs(20), Adapter::start(&w, &gw).handle)
        .await
        .expect("a refused connect ends the adapter")
        .unwrap()
        .unwrap_err();
    let key = DeviceKey::load_or_create(&w.key_path()).unwrap();
    let text = err.to_string();
    // The signature and nonce were checked before pairing: a pairing refusal means they held.
    assert!(
        matches!(&err, OpenClawError::Refused { code, .. } if code == "PAIRING_REQUIRED"),
        "{text}"
    );
    assert!(text.contains("pairing required"), "{text}");
    assert!(text.contains(&key.device_id()), "{text}");
    assert!(
        text.contains(&format!(
            "openclaw devices approve req-{}",
            &key.device_id()[..8]
        )),
        "{text}"
    );

    // What went out: protocol 4, operator scopes, the token, the device signed over the nonce.
    let connects = gw.requests("connect");
    assert_eq!(connects.len(), 1, "a refusal is not retried");
    let p = &connects[0]["params"];
    assert_eq!(p["minProtocol"], 4);
    assert_eq!(p["maxProtocol"], 4);
    assert_eq!(p["role"], "operator");
    // An approver, as the real gateway needs one: it handles exec approvals and holds
    // `operator.admin` (without either the gateway neither routes nor shows approvals to it).
    assert_eq!(
        p["scopes"],
        json!([
            "operator.read",
            "operator.write",
            "operator.approvals",
            "operator.admin"
        ])
    );
    assert_eq!(p["caps"], json!(["exec-approvals"]));
    assert_eq!(p["auth"], json!({"token": GATEWAY_TOKEN}));
    assert_eq!(p["device"]["id"], key.device_id());
    assert_eq!(p["device"]["publicKey"], key.public_key());
    let scopes: Vec<String> = serde_json::from_value(p["scopes"].clone()).unwrap();
    let signed = AuthPayload {
        device_id: &key.device_id(),
        client_id: p["client"]["id"].as_str().unwrap(),
        client_mode: p["client"]["mode"].as_str().unwrap(),
        role: "operator",
        scopes: &scopes,
        signed_at_ms: p["device"]["signedAt"].as_i64().unwrap(),
        token: GATEWAY_TOKEN,
        nonce: p["device"]["nonce"].as_str().unwrap(),
        platform: p["client"]["platform"].as_str().unwrap(),
        device_family: "",
    };
    let pk: [u8; 32] = URL_SAFE_NO_PAD
        .decode(key.public_key())
        .unwrap()
        .try_into()
        .unwrap();
    let sig = Signature::from_slice(
        &URL_SAFE_NO_PAD
            .decode(p["device"]["signature"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    VerifyingKey::from_bytes(&pk)
        .unwrap()
        .verify_strict(&signed.to_bytes(), &sig)
        .expect("the signature covers the v3 payload with the gateway's nonce");

    // The gateway checks signatures: one over another nonce is refused.
    let mut ws = tokio_tungstenite::connect_async(gw.url()).await.unwrap().0;
    let challenge: Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        m => panic!("{m:?}"),
    };
    let nonce = challenge["payload"]["nonce"].as_str().unwrap();
    let mut forged = connects[0].clone();
    forged["params"]["device"]["nonce"] = json!(nonce);
    // Signed at the challenge's `ts` (the fake refuses any other time), over a stale nonce.
    forged["params"]["device"]["signedAt"] = challenge["payload"]["ts"].clone();
    let forged_sig = key.sign(&AuthPayload {
        nonce: "n-stale",
        signed_at_ms: forged["params"]["device"]["signedAt"].as_i64().unwrap(),
        ..signed
    });
    forged["params"]["device"]["signature"] = json!(forged_sig);
    ws.send(Message::text(forged.to_string())).await.unwrap();
    let res: Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        m => panic!("{m:?}"),
    };
    assert_eq!(res["ok"], false, "{res}");
    assert_eq!(
        res["error"]["code"], "DEVICE_AUTH_SIGNATURE_INVALID",
        "{res}"
    );
}

#[tokio::test]
async fn an_approval_answered_on_a_phone_is_resolved_in_openclaw_and_acknowledged() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "approval", &[paired_key(&w)]).await;
    let adapter = Adapter::start(&w, &gw);
    let phone = w.phone().await;
    let task = w.session_task("agent:main:main").await;
    let d = pending_decision(&w, &task, "ap_1").await;
    assert_eq!(d.status, waymark_proto::DecisionStatus::Pending);
    assert_eq!(
        d.durability,
        Some(waymark_proto::ApprovalDurability::ConnectionBound)
    );
    // The request lists `allow-always` unavailable (as the real gateway does for most
    // commands): it is not offered.
    assert_eq!(
        d.options.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["approve", "deny"]
    );
    assert_eq!(
        d.question,
        "OpenClaw wants to run `rm -rf build` in `/repo` (agent `main`)"
    );
    let intent = d.intent.clone().unwrap();
    assert_eq!(intent["request"]["command"], "rm -rf build");
    // Our expiry follows the gateway's (plus grace), not the server's one-hour default.
    let gateway_expiry = intent["expiresAtMs"].as_i64().unwrap();
    let ours = d.expires_at.timestamp_millis();
    assert!(
        ours > gateway_expiry && ours <= gateway_expiry + 31_000,
        "{ours} vs {gateway_expiry}"
    );
    // People are shown the gateway's own expiry: OpenClaw refuses the command then.
    let deadline = d.runtime_deadline.clone().expect("OpenClaw's deadline");
    assert_eq!(deadline.runtime, "OpenClaw");
    assert_eq!(deadline.then, waymark_proto::RuntimeFallback::Denies);
    let off = deadline.at.timestamp_millis() - gateway_expiry;
    assert!(
        (-1500..=1500).contains(&off),
        "{off} ms from the gateway's expiry"
    );
    assert_eq!(d.closing().runtime.as_deref(), Some("OpenClaw"));

    phone.approve(&w, &task, &d, "approve").await;
    let resolves = gw.wait_for("exec.approval.resolve", 1).await;
    let mut sent = resolves[0].clone();
    assert!(sent["id"].as_str().is_some_and(|id| !id.is_empty()));
    sent["id"] = json!("<any>");
    assert_eq!(
        sent,
        json!({"type": "req", "id": "<any>", "method": "exec.approval.resolve",
               "params": {"id": "ap_1", "decision": "allow-once"}})
    );
    let done = eventually("the delivery acknowledged", || async {
        let d = w.approvals_for(&task, "ap_1").await.remove(0);
        d.delivery
            .clone()
            .filter(|x| x.state == waymark_proto::DeliveryState::Acknowledged)
            .map(|_| d)
    })
    .await;
    assert_eq!(done.status, waymark_proto::DecisionStatus::Resolved);
    assert_eq!(waymark_worker::chosen_option(&done), Some("approve"));
    let detail = done.delivery.unwrap().detail.unwrap();
    assert!(
        detail.starts_with("exec.approval.resolved: allow-once"),
        "{detail}"
    );
    assert_eq!(
        gw.requests("exec.approval.resolve").len(),
        1,
        "answered once"
    );
    adapter.stop().await;
}

#[tokio::test]
async fn tools_messages_and_the_task_ledger_are_mirrored_and_a_seq_gap_backfills() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "mirror", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let task = w.session_task("agent:main:main").await;
    let detail = eventually("the session mirrored", || async {
        let d = w.detail(&task).await;
        let all_green = d.messages.iter().any(|m| m.text == "All green.");
        let settled = d.effects.len() == 2 && d.effects.iter().all(|e| e.status.is_terminal());
        (all_green && settled).then_some(d)
    })
    .await;
    let by_key = |k: &str| {
        detail
            .effects
            .iter()
            .find(|e| e.idempotency_key == k)
            .unwrap()
    };
    let ok = by_key("agent:main:main:run_5:call_1");
    assert_eq!(ok.status, waymark_proto::EffectStatus::Confirmed);
    assert_eq!(ok.kind, "openclaw.exec");
    assert_eq!(ok.intent["args"], json!({"command": "npm test"}));
    assert_eq!(ok.receipt, Some(json!({"result": "3 passed"})));
    let failed = by_key("agent:main:main:run_5:call_2");
    assert_eq!(failed.status, waymark_proto::EffectStatus::Failed);
    assert_eq!(failed.receipt, Some(json!({"error": "remote rejected"})));

    let texts: Vec<(&str, &str)> = detail
        .messages
        .iter()
        .map(|m| (m.role.as_str(), m.text.as_str()))
        .collect();
    assert!(
        texts.contains(&("assistant", "Running the tests.")),
        "{texts:?}"
    );
    let ledger: Vec<&str> = texts
        .iter()
        .filter(|(_, t)| t.starts_with("OpenClaw task"))
        .map(|(_, t)| *t)
        .collect();
    assert_eq!(
        ledger,
        [
            "OpenClaw task `task_7` (subagent): running; child session `agent:main:subagent:x`; run `run_5`",
            "OpenClaw task `task_7` (subagent): completed; child session `agent:main:subagent:x`; run `run_5`",
        ],
        "one note per status, none repeated by the backfill after the gap"
    );
    // The child session is a task of its own.
    let child = w.session_task("agent:main:subagent:x").await;
    assert_ne!(child, task);
    assert_eq!(w.detail(&child).await.task.title, "run the suite");
    // The last event skipped three seqs: the adapter backfilled on the same connection.
    gw.wait_for("sessions.list", 2).await;
    assert_eq!(gw.requests("connect").len(), 1);
    adapter.stop().await;
}

/// More events than the adapter keeps arrive while it waits for an answer (its buffer is
/// bounded; the socket must be read to find the answer): the rest are dropped, not held, and
/// the adapter backfills on the same connection once it has handled the kept ones, so the
/// approval among the dropped events is still mirrored.
#[tokio::test]
async fn events_past_the_buffer_while_a_request_waits_are_dropped_and_backfilled() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "overflow", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let task = w.session_task("agent:main:main").await;
    let d = pending_decision(&w, &task, "ap_9").await;
    assert_eq!(d.status, waymark_proto::DecisionStatus::Pending);
    assert_eq!(
        d.intent.as_ref().unwrap()["request"]["command"],
        "make deploy"
    );
    // Found by a second backfill on the one connection, not by reconnecting.
    gw.wait_for("exec.approval.list", 2).await;
    assert_eq!(gw.requests("connect").len(), 1);
    assert_eq!(
        w.approvals_for(&task, "ap_9").await.len(),
        1,
        "mirrored once"
    );
    adapter.stop().await;
}

#[tokio::test]
async fn a_dropped_connection_backfills_without_duplicates_and_resends_the_answer() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "reconnect", &[paired_key(&w)]).await;
    let adapter = Adapter::start(&w, &gw);
    let phone = w.phone().await;
    let task = w.session_task("agent:main:main").await;
    // The first connection drops right after its backfill; the second backfills again.
    gw.wait_for("sessions.subscribe", 2).await;
    let ap1 = w.approvals_for(&task, "ap_1").await;
    let ap2 = w.approvals_for(&task, "ap_2").await;
    assert_eq!(
        ap1.len(),
        1,
        "ap_1 (listed on both connections) opened once"
    );
    assert_eq!(ap2.len(), 1, "ap_2 (requested, then listed) opened once");
    assert_eq!(
        ap1[0].status,
        waymark_proto::DecisionStatus::Pending,
        "a dropped connection expires nothing"
    );
    assert_eq!(ap2[0].status, waymark_proto::DecisionStatus::Pending);

    // Reconnects use the device token the gateway issued, kept beside the key.
    let key = DeviceKey::load_or_create(&w.key_path()).unwrap();
    let tokens: Value = serde_json::from_slice(&std::fs::read(key.token_path()).unwrap()).unwrap();
    let issued = tokens["tokens"][gw.url()]["deviceToken"]
        .as_str()
        .unwrap()
        .to_owned();
    let connects = gw.requests("connect");
    assert_eq!(
        connects[0]["params"]["auth"],
        json!({"token": GATEWAY_TOKEN})
    );
    assert_eq!(
        connects[1]["params"]["auth"],
        json!({"token": GATEWAY_TOKEN, "deviceToken": issued})
    );

    // The second connection drops on the answer before resolving it; the third gets it again.
    phone.approve(&w, &task, &ap1[0], "approve_always").await;
    let resolves = gw.wait_for("exec.approval.resolve", 2).await;
    for r in &resolves {
        assert_eq!(
            r["params"],
            json!({"id": "ap_1", "decision": "allow-always"})
        );
    }
    let acked = eventually("the resent answer acknowledged", || async {
        let d = w.approvals_for(&task, "ap_1").await.remove(0);
        d.delivery
            .clone()
            .filter(|x| x.state == waymark_proto::DeliveryState::Acknowledged)
    })
    .await;
    assert_eq!(
        acked.detail.as_deref(),
        Some("exec.approval.resolved: allow-always by waymark-adapter")
    );
    assert_eq!(gw.requests("connect").len(), 3);
    assert_eq!(
        w.approvals_for(&task, "ap_1").await.len(),
        1,
        "still one decision for ap_1"
    );
    assert_eq!(
        w.approvals_for(&task, "ap_2").await[0].status,
        waymark_proto::DecisionStatus::Pending
    );
    adapter.stop().await;
}

#[tokio::test]
async fn a_replan_steers_the_session_and_a_cancel_aborts_it() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "steer", &[paired_key(&w)]).await;
    let adapter = Adapter::start(&w, &gw);
    let phone = w.phone().await;
    gw.wait_for("sessions.subscribe", 1).await;
    let task = w.session_task("agent:main:main").await;
    let revision = w.detail(&task).await.task.plan_revision;
    phone
        .command(
            &task,
            revision,
            Operation::Replan,
            json!({"instructions": "keep the public API; only split the lexer"}),
        )
        .await;
    let steers = gw.wait_for("sessions.steer", 1).await;
    assert_eq!(
        steers[0]["params"],
        json!({"key": "agent:main:main", "message": "keep the public API; only split the lexer",
               "idempotencyKey": format!("waymark:{task}:r{}", revision + 1)})
    );
    phone
        .command(&task, revision + 1, Operation::Cancel, json!({}))
        .await;
    let aborts = gw.wait_for("sessions.abort", 1).await;
    assert_eq!(aborts[0]["params"], json!({"key": "agent:main:main"}));
    assert_eq!(gw.requests("sessions.steer").len(), 1, "steered once");
    adapter.stop().await;
}

/// A cancel while OpenClaw waits on an exec approval: the session is aborted and the exec
/// request itself denied in OpenClaw, so the command cannot run even where the abort does not
/// reach the run that asked; the voided decision is not asked again.
#[tokio::test]
async fn a_cancel_under_a_pending_approval_aborts_and_denies_the_exec_request() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "approval", &[paired_key(&w)]).await;
    let adapter = Adapter::start(&w, &gw);
    let phone = w.phone().await;
    let task = w.session_task("agent:main:main").await;
    let d = pending_decision(&w, &task, "ap_1").await;
    let revision = w.detail(&task).await.task.plan_revision;
    phone
        .command(&task, revision, Operation::Cancel, json!({}))
        .await;
    gw.wait_for("sessions.abort", 1).await;
    let resolves = gw.wait_for("exec.approval.resolve", 1).await;
    assert_eq!(
        resolves[0]["params"],
        json!({"id": "ap_1", "decision": "deny"})
    );
    let asked = w.approvals_for(&task, "ap_1").await;
    assert_eq!(asked.len(), 1, "not asked again: {asked:?}");
    assert_eq!(asked[0].id, d.id);
    assert_eq!(asked[0].status, waymark_proto::DecisionStatus::Void);
    adapter.stop().await;
    assert_eq!(gw.requests("exec.approval.resolve").len(), 1, "denied once");
}

#[tokio::test]
async fn approvals_closed_in_openclaw_expire_ours_never_approve_them() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "elsewhere", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let task = w.session_task("agent:main:main").await;
    // Answered in OpenClaw's own UI first.
    let ap3 = w.expired(&task, "ap_3").await;
    let out = ap3.outcome.unwrap();
    assert_eq!(out.option, None, "no option applies");
    assert_eq!(out.by, "runtime");
    assert_eq!(
        out.text.as_deref(),
        Some(
            "answered in OpenClaw itself (deny by openclaw-control-ui) before anyone answered here"
        )
    );
    // Timed out in the gateway (1.5 s).
    let ap4 = w.expired(&task, "ap_4").await;
    let out = ap4.outcome.unwrap();
    assert_eq!(out.option, None);
    assert_eq!(out.text.as_deref(), Some("it timed out in OpenClaw"));
    assert!(
        gw.requests("exec.approval.resolve").is_empty(),
        "nothing answered for anyone"
    );
    adapter.stop().await;
}

/// A gateway that dies under a pending approval and comes back no longer holds it: once the
/// adapter reconnects and lists, the approval is expired by the runtime with no option (never
/// approved), and the exec it guarded — started, never reported ended — becomes `unknown`
/// (it may have been answered in OpenClaw meanwhile), not left `in_progress`.
#[tokio::test]
async fn a_gateway_restarted_without_the_approval_expires_it_and_its_exec_becomes_unknown() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "restart", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let task = w.session_task("agent:main:main").await;
    let key = "agent:main:main:run_7:call_1";
    eventually("the exec under way", || async {
        w.detail(&task)
            .await
            .effects
            .into_iter()
            .find(|e| e.idempotency_key == key)
    })
    .await;
    let expired = w.expired(&task, "ap_1").await;
    let out = expired.outcome.unwrap();
    assert_eq!(out.option, None, "never approved");
    assert_eq!(out.by, "runtime");
    assert!(
        out.text
            .as_deref()
            .is_some_and(|t| t.starts_with("OpenClaw no longer holds it")),
        "{out:?}"
    );
    let effect = w.settled_effect(&task, key).await;
    assert_eq!(effect.status, EffectStatus::Unknown, "{effect:?}");
    assert_eq!(gw.requests("connect").len(), 2);
    assert!(gw.requests("exec.approval.resolve").is_empty());
    adapter.stop().await;
}

/// A gateway started again listens before it serves: until its sidecars are up it refuses
/// every `connect` as "gateway starting" (retryable). The adapter waits that out — it keeps
/// its device token and runs on, where it used to take the refusal for a verdict, forget the
/// token, and end at the second — and once served it lists, so the approval the restarted
/// gateway no longer holds is expired and its exec becomes `unknown`.
#[tokio::test]
async fn a_gateway_still_starting_is_waited_for_and_the_adapter_keeps_its_device_token() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "restart-starting", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let task = w.session_task("agent:main:main").await;
    let expired = w.expired(&task, "ap_1").await;
    let out = expired.outcome.unwrap();
    assert_eq!((out.option, out.by.as_str()), (None, "runtime"));
    let key = "agent:main:main:run_7:call_1";
    let effect = w.settled_effect(&task, key).await;
    assert_eq!(effect.status, EffectStatus::Unknown, "{effect:?}");
    let connects = gw.requests("connect");
    assert_eq!(connects.len(), 4, "two refused while starting, then served");
    let issued = connects[1]["params"]["auth"]["deviceToken"].clone();
    assert!(
        issued.is_string(),
        "the first hello issued a token: {issued}"
    );
    for c in &connects[2..] {
        assert_eq!(
            c["params"]["auth"]["deviceToken"], issued,
            "the token is kept through the refusals"
        );
    }
    assert!(!adapter.handle.is_finished(), "the adapter runs on");
    adapter.stop().await;
}

/// The gateway's `exec.approval.resolve` takes `{id, decision, reviewer?, grantExpiresInDays?}`
/// and nothing else, and refuses `allow-always` where the request lists it unavailable: the
/// adapter offers only what is allowed (a phone's `approve_always` is refused by the control
/// plane, never sent) and sends the closed params, once.
#[tokio::test]
async fn an_answer_goes_back_with_only_the_params_the_gateway_takes_and_only_allowed_options() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "closed", &[]).await;
    let adapter = Adapter::start(&w, &gw);
    let phone = w.phone().await;
    let task = w.session_task("agent:main:main").await;
    let d = pending_decision(&w, &task, "ap_1").await;
    assert_eq!(
        d.options.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(),
        ["approve", "deny"]
    );
    let revision = w.detail(&task).await.task.plan_revision;
    let (status, body) = phone
        .submit(
            &task,
            revision,
            Operation::Approve,
            json!({"decision_id": d.id, "intent_digest": d.intent_digest, "option": "approve_always"}),
        )
        .await;
    assert!(
        status != 200 || body["status"] != "applied",
        "an option not offered is refused: {status} {body}"
    );
    phone.deny(&w, &task, &d).await;
    let resolves = gw.wait_for("exec.approval.resolve", 1).await;
    assert_eq!(
        resolves[0]["params"],
        json!({"id": "ap_1", "decision": "deny"})
    );
    let delivery = eventually("the delivery acknowledged", || async {
        let d = w.approvals_for(&task, "ap_1").await.remove(0);
        d.delivery
            .clone()
            .filter(|x| x.state == waymark_proto::DeliveryState::Acknowledged)
    })
    .await;
    assert_eq!(
        delivery.detail.as_deref(),
        Some("exec.approval.resolved: deny by waymark-adapter")
    );
    assert_eq!(gw.requests("exec.approval.resolve").len(), 1, "sent once");
    adapter.stop().await;
}

/// A client that does not say it handles exec approvals, or lacks `operator.admin`, is
/// neither sent nor shown them by the gateway (the real one, and so the fake): an adapter
/// connected as such would mirror nothing. Ours does (the other tests), this one does not.
#[tokio::test]
async fn the_fake_gateway_hides_approvals_from_a_client_that_is_not_an_approver() {
    let w = World::start().await;
    let gw = Gateway::start(&w, "approval", &[]).await;
    let mut ws = tokio_tungstenite::connect_async(gw.url()).await.unwrap().0;
    let challenge: Value = match ws.next().await.unwrap().unwrap() {
        Message::Text(t) => serde_json::from_str(&t).unwrap(),
        m => panic!("{m:?}"),
    };
    let nonce = challenge["payload"]["nonce"].as_str().unwrap();
    let ts = challenge["payload"]["ts"].as_i64().unwrap();
    let key = DeviceKey::load_or_create(&w.key_path()).unwrap();
    let scopes: Vec<String> = ["operator.read", "operator.write", "operator.approvals"]
        .map(String::from)
        .to_vec();
    let signature = key.sign(&AuthPayload {
        device_id: &key.device_id(),
        client_id: "gateway-client",
        client_mode: "backend",
        role: "operator",
        scopes: &scopes,
        signed_at_ms: ts,
        token: GATEWAY_TOKEN,
        nonce,
        platform: "linux",
        device_family: "",
    });
    let connect = json!({"type": "req", "id": "c1", "method": "connect", "params": {
        "minProtocol": 4, "maxProtocol": 4,
        "client": {"id": "gateway-client", "displayName": "not-an-approver", "version": "0", "platform": "linux", "mode": "backend"},
        "role": "operator", "scopes": scopes, "caps": [], "auth": {"token": GATEWAY_TOKEN},
        "device": {"id": key.device_id(), "publicKey": key.public_key(), "signature": signature, "signedAt": ts, "nonce": nonce}}});
    ws.send(Message::text(connect.to_string())).await.unwrap();
    let mut seen = Vec::new();
    for (id, method) in [("s1", "sessions.subscribe"), ("l1", "exec.approval.list")] {
        ws.send(Message::text(
            json!({"type": "req", "id": id, "method": method, "params": {}}).to_string(),
        ))
        .await
        .unwrap();
    }
    while let Ok(Some(Ok(Message::Text(t)))) =
        tokio::time::timeout(Duration::from_millis(500), ws.next()).await
    {
        seen.push(serde_json::from_str::<Value>(&t).unwrap());
    }
    let hello = seen.iter().find(|f| f["id"] == "c1").unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    let list = seen.iter().find(|f| f["id"] == "l1").unwrap();
    assert_eq!(list["payload"], json!([]), "{list}");
    assert!(
        !seen.iter().any(|f| f["event"] == "exec.approval.requested"),
        "{seen:?}"
    );
}
