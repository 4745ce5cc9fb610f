//! A stand-in OpenClaw gateway for the adapter's tests: a WebSocket server on 127.0.0.1:0
//! (its port is the first line on stdout) speaking protocol v4. It sends `connect.challenge`,
//! verifies the device's Ed25519 signature over the nonce (its own reading of OpenClaw's `v3`
//! payload), serves `sessions.list`, `tasks.list` and `exec.approval.list` from a fixture
//! file, plays the fixture's scripted events, answers resolves, steers and aborts, and writes
//! every frame it receives, one per line, to `--record`. A fixture can drop a connection
//! after N frames or on a given method, and play events after a method's answer (`on`) or
//! before it (`before`, as a gateway's broadcasts can overtake an answer), and refuse a
//! connection's `connect` as a gateway still starting does (`starting`).
//!
//! Where it matters to an approver it behaves as the real `openclaw@2026.9.6` gateway was seen
//! to (frames recorded in `fixtures/openclaw/real/`): exec approvals reach only a client that
//! advertises `exec-approvals` (or `approvals`) and holds `operator.admin` — to anyone else
//! neither the event nor `exec.approval.list` shows them; `exec.approval.resolve` params are
//! closed (`{id, decision, reviewer?, grantExpiresInDays?}`, with the real refusal's wording);
//! `allow-always` is refused when the request lists it unavailable. One thing is stricter than
//! the real gateway, which only bounds the skew: `device.signedAt` must be the challenge's
//! `ts`, as OpenClaw documents and its own client signs.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::Parser;
use ed25519_dalek::{Signature, VerifyingKey};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

#[derive(Parser, Debug)]
#[command(about = "A fake OpenClaw gateway for tests")]
struct Args {
    /// The scenario: sessions, tasks, approvals, token, per-connection scripts.
    #[arg(long)]
    fixture: PathBuf,
    /// Every frame received is appended here, one JSON text per line.
    #[arg(long)]
    record: PathBuf,
    /// Public keys (base64url, raw) of paired devices; none: every device is paired.
    #[arg(long = "paired-key")]
    paired: Vec<String>,
}

struct Gateway {
    fixture: Value,
    paired: Vec<String>,
    /// Exec approvals still pending, oldest first.
    pending: Vec<Value>,
    /// Device tokens issued, by device id.
    device_tokens: HashMap<String, String>,
    /// The request of each resolved approval, for its `exec.approval.resolved` event.
    resolved_requests: HashMap<String, Value>,
    record: std::fs::File,
    connections: usize,
}

type Shared = Arc<Mutex<Gateway>>;

/// A frame recorded from the real `openclaw@2026.9.6` gateway, by its label.
fn recorded(label: &str) -> Value {
    include_str!("../../fixtures/openclaw/real/openclaw-2026.9.6.jsonl")
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["label"] == label)
        .unwrap_or_else(|| panic!("no recorded frame `{label}`"))["frame"]
        .clone()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Turns `expiresInMs` into `createdAtMs`/`expiresAtMs` from now.
fn stamp(mut approval: Value) -> Value {
    if let Some(ms) = approval.get("expiresInMs").and_then(Value::as_i64) {
        let now = now_ms();
        let obj = approval.as_object_mut().expect("an approval is an object");
        obj.remove("expiresInMs");
        obj.insert("createdAtMs".into(), json!(now));
        obj.insert("expiresAtMs".into(), json!(now + ms));
    }
    approval
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    let text = std::fs::read_to_string(&args.fixture)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", args.fixture.display()));
    let fixture: Value = serde_json::from_str(&text).expect("the fixture is JSON");
    let pending = fixture["approvals"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(stamp)
        .collect();
    let record = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.record)
        .expect("the record file opens");
    let gw = Arc::new(Mutex::new(Gateway {
        fixture,
        paired: args.paired,
        pending,
        device_tokens: HashMap::new(),
        resolved_requests: HashMap::new(),
        record,
        connections: 0,
    }));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{}", listener.local_addr().expect("an address").port());
    std::io::stdout().flush().ok();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let gw = gw.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(gw, stream).await {
                eprintln!("fake-openclaw: connection ended: {e}");
            }
        });
    }
}

struct Conn {
    ws: WebSocketStream<TcpStream>,
    seq: u64,
}

impl Conn {
    async fn send(&mut self, v: Value) -> Result<(), String> {
        self.ws
            .send(Message::text(v.to_string()))
            .await
            .map_err(|e| e.to_string())
    }

    async fn event(&mut self, event: &str, payload: Value, skip: u64) -> Result<(), String> {
        self.seq += 1 + skip;
        let seq = self.seq;
        self.send(json!({"type": "event", "event": event, "payload": payload, "seq": seq}))
            .await
    }

    async fn res(&mut self, id: &Value, payload: Value) -> Result<(), String> {
        self.send(json!({"type": "res", "id": id, "ok": true, "payload": payload}))
            .await
    }

    async fn fail(
        &mut self,
        id: &Value,
        code: &str,
        message: &str,
        details: Value,
    ) -> Result<(), String> {
        let mut error = json!({"code": code, "message": message});
        if !details.is_null() {
            error["details"] = details;
        }
        self.send(json!({"type": "res", "id": id, "ok": false, "error": error}))
            .await
    }
}

async fn serve(gw: Shared, stream: TcpStream) -> Result<(), String> {
    let ws = tokio_tungstenite::accept_async(stream)
        .await
        .map_err(|e| e.to_string())?;
    let mut conn = Conn { ws, seq: 0 };
    let (index, script) = {
        let mut g = gw.lock().unwrap();
        let index = g.connections;
        g.connections += 1;
        let script = g.fixture["connections"]
            .get(index)
            .cloned()
            .unwrap_or(Value::Null);
        // A gateway started again forgets the exec approvals it held (they lived in the
        // process, with the runs that asked them).
        if script.get("restarted").and_then(Value::as_bool) == Some(true) {
            g.pending.clear();
        }
        (index, script)
    };
    let drop_after = script.get("dropAfterFrames").and_then(Value::as_u64);
    let drop_on = script
        .get("dropOnMethod")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let nonce = hex::encode(rand::random::<[u8; 16]>());
    // Back-dated a little, so a client that signs with its own clock is caught.
    let challenge_ts = now_ms() - 1_000;
    conn.send(json!({"type": "event", "event": "connect.challenge",
                     "payload": {"nonce": nonce, "ts": challenge_ts, "capabilities": ["model-catalog-snapshot"]}}))
        .await?;
    let mut frames = 0u64;
    let mut hello = false;
    let mut fired = std::collections::HashSet::new();
    let mut fired_before = std::collections::HashSet::new();
    let mut client_name = String::from("operator");
    let mut approver = false;
    while let Some(msg) = conn.ws.next().await {
        let msg = msg.map_err(|e| e.to_string())?;
        let text = match msg {
            Message::Text(t) => t.to_string(),
            Message::Close(_) => return Ok(()),
            _ => continue,
        };
        {
            let mut g = gw.lock().unwrap();
            writeln!(g.record, "{text}").map_err(|e| e.to_string())?;
            g.record.flush().map_err(|e| e.to_string())?;
        }
        frames += 1;
        let frame: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let id = frame["id"].clone();
        let method = frame["method"].as_str().unwrap_or("").to_owned();
        let params = frame["params"].clone();
        if drop_on.as_deref() == Some(method.as_str()) {
            eprintln!("fake-openclaw: connection {index}: dropping on `{method}`");
            return Ok(());
        }
        if !hello {
            if method != "connect" {
                conn.fail(&id, "INVALID_REQUEST", "connect first", Value::Null)
                    .await?;
                return Ok(());
            }
            if script.get("starting").and_then(Value::as_bool) == Some(true) {
                // What the real gateway answered while its sidecars started, whoever connects.
                eprintln!("fake-openclaw: connection {index}: still starting");
                let mut refused = recorded("starting: connect refused");
                refused["id"] = id;
                conn.send(refused).await?;
                let close = &recorded("starting: close")["close"];
                let _ = conn
                    .ws
                    .close(Some(CloseFrame {
                        code: CloseCode::from(close["code"].as_u64().unwrap_or(1013) as u16),
                        reason: close["reason"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned()
                            .into(),
                    }))
                    .await;
                return Ok(());
            }
            match check_connect(&gw, &params, &nonce, challenge_ts) {
                Ok(hello_ok) => {
                    approver = is_approver(&params);
                    client_name = params["client"]["displayName"]
                        .as_str()
                        .or(params["client"]["id"].as_str())
                        .unwrap_or("operator")
                        .to_owned();
                    conn.res(&id, hello_ok).await?;
                    hello = true;
                }
                Err((code, message, details)) => {
                    eprintln!("fake-openclaw: connection {index}: refused: {message}");
                    conn.fail(&id, code, &message, details).await?;
                    let _ = conn.ws.close(None).await;
                    return Ok(());
                }
            }
        } else {
            if let Some(events) = script["before"].get(&method).and_then(Value::as_array)
                && fired_before.insert(method.clone())
            {
                play(&gw, &mut conn, events, approver).await?;
            }
            handle(
                &gw,
                &mut conn,
                &id,
                &method,
                &params,
                &client_name,
                approver,
            )
            .await?;
            if let Some(events) = script["on"].get(&method).and_then(Value::as_array)
                && fired.insert(method.clone())
            {
                play(&gw, &mut conn, events, approver).await?;
            }
        }
        if drop_after.is_some_and(|n| frames >= n) {
            eprintln!("fake-openclaw: connection {index}: dropping after {frames} frames");
            return Ok(());
        }
    }
    Ok(())
}

/// Whether the gateway routes exec approvals to this client and shows them to it: it says it
/// handles them and holds `operator.admin`.
fn is_approver(p: &Value) -> bool {
    let has = |field: &str, want: &[&str]| {
        p[field].as_array().is_some_and(|a| {
            a.iter()
                .any(|v| v.as_str().is_some_and(|v| want.contains(&v)))
        })
    };
    has("caps", &["exec-approvals", "approvals"]) && has("scopes", &["operator.admin"])
}

/// Verifies `connect`; the `hello-ok` payload, or (code, message, details).
fn check_connect(
    gw: &Shared,
    p: &Value,
    nonce: &str,
    challenge_ts: i64,
) -> Result<Value, (&'static str, String, Value)> {
    let bad = |code: &'static str, m: &str| (code, m.to_owned(), Value::Null);
    let (min, max) = (
        p["minProtocol"].as_u64().unwrap_or(0),
        p["maxProtocol"].as_u64().unwrap_or(0),
    );
    if !(min <= 4 && 4 <= max) {
        return Err(bad(
            "INVALID_REQUEST",
            "protocol mismatch: the gateway speaks 4",
        ));
    }
    let device = &p["device"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    let public_key = s(&device["publicKey"]);
    let raw: [u8; 32] = URL_SAFE_NO_PAD
        .decode(&public_key)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            bad(
                "DEVICE_AUTH_PUBLIC_KEY_INVALID",
                "device public key invalid",
            )
        })?;
    let device_id = hex::encode(Sha256::digest(raw));
    if s(&device["id"]) != device_id {
        return Err(bad(
            "DEVICE_AUTH_DEVICE_ID_MISMATCH",
            "device identity mismatch",
        ));
    }
    if s(&device["nonce"]) != nonce {
        return Err(bad("DEVICE_AUTH_NONCE_MISMATCH", "device nonce mismatch"));
    }
    let signed_at = device["signedAt"].as_i64().unwrap_or(0);
    if signed_at != challenge_ts {
        return Err(bad(
            "DEVICE_AUTH_SIGNATURE_EXPIRED",
            "device signature must be signed at the challenge's ts",
        ));
    }
    if (now_ms() - signed_at).abs() > 120_000 {
        return Err(bad(
            "DEVICE_AUTH_SIGNATURE_EXPIRED",
            "device signature expired",
        ));
    }
    let auth = &p["auth"];
    let token = auth["token"]
        .as_str()
        .or(auth["deviceToken"].as_str())
        .unwrap_or("");
    let scopes: Vec<&str> = p["scopes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let payload = [
        "v3".to_owned(),
        device_id.clone(),
        s(&p["client"]["id"]),
        s(&p["client"]["mode"]),
        s(&p["role"]),
        scopes.join(","),
        signed_at.to_string(),
        token.to_owned(),
        nonce.to_owned(),
        s(&p["client"]["platform"]).trim().to_lowercase(),
        s(&p["client"]["deviceFamily"]).trim().to_lowercase(),
    ]
    .join("|");
    let verified = VerifyingKey::from_bytes(&raw).ok().zip(
        URL_SAFE_NO_PAD
            .decode(s(&device["signature"]))
            .ok()
            .and_then(|b| Signature::from_slice(&b).ok()),
    );
    match verified {
        Some((vk, sig)) if vk.verify_strict(payload.as_bytes(), &sig).is_ok() => {}
        _ => {
            return Err(bad(
                "DEVICE_AUTH_SIGNATURE_INVALID",
                "device signature invalid",
            ));
        }
    }
    let mut g = gw.lock().unwrap();
    if !g.paired.is_empty() && !g.paired.contains(&public_key) {
        let request = format!("req-{}", &device_id[..8]);
        return Err((
            "PAIRING_REQUIRED",
            "pairing required".into(),
            json!({"requestId": request, "deviceId": device_id}),
        ));
    }
    let issued = g.device_tokens.get(&device_id).cloned();
    let token_ok = match g.fixture["token"].as_str() {
        None => true,
        Some(t) => {
            auth["token"].as_str() == Some(t)
                || (issued.is_some() && auth["deviceToken"].as_str() == issued.as_deref())
        }
    };
    if !token_ok {
        return Err(bad(
            "AUTH_TOKEN_MISMATCH",
            "unauthorized: gateway token mismatch",
        ));
    }
    if p["role"] != "operator" {
        return Err(bad("INVALID_REQUEST", "this fake serves operators only"));
    }
    let device_token =
        issued.unwrap_or_else(|| format!("dt-{}", hex::encode(rand::random::<[u8; 8]>())));
    g.device_tokens.insert(device_id, device_token.clone());
    Ok(json!({
        "type": "hello-ok",
        "protocol": 4,
        "server": {"version": "fake-2026.9", "connId": format!("conn-{}", g.connections)},
        "features": {"methods": ["sessions.list", "sessions.subscribe", "sessions.messages.subscribe", "sessions.steer", "sessions.abort", "tasks.list", "exec.approval.list", "exec.approval.resolve"],
                     "events": ["exec.approval.requested", "exec.approval.resolved", "session.tool", "session.message", "tick"]},
        "snapshot": {},
        "auth": {"deviceToken": device_token, "role": "operator", "scopes": scopes, "issuedAtMs": now_ms()},
        "policy": {"maxPayload": 26_214_400, "maxBufferedBytes": 52_428_800, "tickIntervalMs": 30_000},
    }))
}

async fn handle(
    gw: &Shared,
    conn: &mut Conn,
    id: &Value,
    method: &str,
    params: &Value,
    client: &str,
    approver: bool,
) -> Result<(), String> {
    let answer = {
        let mut g = gw.lock().unwrap();
        match method {
            "sessions.list" => Ok(json!({"sessions": g.fixture["sessions"].clone()})),
            "tasks.list" => Ok(json!({"tasks": g.fixture["tasks"].clone(), "nextCursor": null})),
            "exec.approval.list" if approver => Ok(Value::Array(g.pending.clone())),
            "exec.approval.list" => Ok(json!([])),
            "sessions.subscribe" | "sessions.messages.subscribe" => Ok(json!({"subscribed": true})),
            "sessions.steer" => Ok(json!({"status": "steered", "runId": "run_steer"})),
            "sessions.abort" => Ok(json!({"ok": true, "aborted": true})),
            "exec.approval.resolve" => {
                const ALLOWED: [&str; 4] = ["id", "decision", "reviewer", "grantExpiresInDays"];
                let extra = params
                    .as_object()
                    .and_then(|o| o.keys().find(|k| !ALLOWED.contains(&k.as_str())).cloned());
                let approval = params["id"].as_str().unwrap_or("");
                let decision = params["decision"].as_str().unwrap_or("");
                let position = g.pending.iter().position(|a| a["id"] == approval);
                if let Some(key) = extra {
                    Err((
                        "INVALID_REQUEST",
                        format!(
                            "invalid exec.approval.resolve params: at root: unexpected property '{key}'"
                        ),
                        Value::Null,
                    ))
                } else if let Some(i) = position {
                    let request = &g.pending[i]["request"];
                    let listed = |field: &str| {
                        request[field]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|d| d == decision))
                    };
                    let unlisted =
                        request["allowedDecisions"].is_array() && !listed("allowedDecisions");
                    if decision == "allow-always" && (listed("unavailableDecisions") || unlisted) {
                        Err((
                            "INVALID_REQUEST",
                            "allow-always is unavailable for this command".to_owned(),
                            json!({"reason": "APPROVAL_ALLOW_ALWAYS_UNAVAILABLE"}),
                        ))
                    } else {
                        let removed = g.pending.remove(i);
                        g.resolved_requests
                            .insert(approval.to_owned(), removed["request"].clone());
                        Ok(json!({"ok": true}))
                    }
                } else {
                    Err((
                        "INVALID_REQUEST",
                        "unknown approval id".to_owned(),
                        Value::Null,
                    ))
                }
            }
            other => Err((
                "INVALID_REQUEST",
                format!("unknown method: {other}"),
                Value::Null,
            )),
        }
    };
    match answer {
        Ok(payload) => {
            if method == "exec.approval.resolve" {
                let emit = gw.lock().unwrap().fixture["resolvedEvent"]
                    .as_bool()
                    .unwrap_or(true);
                // Like the real gateway: broadcast first, then answer.
                if emit {
                    let request = gw
                        .lock()
                        .unwrap()
                        .resolved_requests
                        .get(params["id"].as_str().unwrap_or(""))
                        .cloned()
                        .unwrap_or(Value::Null);
                    conn.event(
                        "exec.approval.resolved",
                        json!({"id": params["id"], "decision": params["decision"], "resolvedBy": client, "ts": now_ms(), "request": request}),
                        0,
                    )
                    .await?;
                }
            }
            conn.res(id, payload).await
        }
        Err((code, message, details)) => conn.fail(id, code, &message, details).await,
    }
}

/// Plays scripted steps (once per connection and method): `{"event", "payload", "seqSkip"?,
/// "repeat"?}` (`repeat`: sent that many times) or `{"delayMs"}`. Played approvals and ledger
/// entries change what the lists answer.
async fn play(gw: &Shared, conn: &mut Conn, steps: &[Value], approver: bool) -> Result<(), String> {
    for step in steps {
        if let Some(ms) = step.get("delayMs").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            continue;
        }
        let event = step["event"].as_str().unwrap_or("tick").to_owned();
        let mut payload = step["payload"].clone();
        {
            let mut g = gw.lock().unwrap();
            match event.as_str() {
                "exec.approval.requested" => {
                    payload = stamp(payload);
                    if !g.pending.iter().any(|a| a["id"] == payload["id"]) {
                        g.pending.push(payload.clone());
                    }
                    if !approver {
                        // Neither routed nor shown to this client.
                        continue;
                    }
                }
                "exec.approval.resolved" => g.pending.retain(|a| a["id"] != payload["id"]),
                "task" => {
                    let entry = payload.get("task").cloned().unwrap_or(payload.clone());
                    if let Some(tasks) = g.fixture["tasks"].as_array_mut() {
                        tasks.retain(|t| t["id"] != entry["id"]);
                        tasks.push(entry);
                    }
                }
                _ => {}
            }
        }
        let skip = step.get("seqSkip").and_then(Value::as_u64).unwrap_or(0);
        conn.event(&event, payload.clone(), skip).await?;
        for _ in 1..step.get("repeat").and_then(Value::as_u64).unwrap_or(1) {
            conn.event(&event, payload.clone(), 0).await?;
        }
    }
    Ok(())
}
