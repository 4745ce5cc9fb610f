//! Push to devices that are not connected: Web Push (VAPID-signed, aes128gcm-encrypted,
//! checked and decrypted by a local push service here) and UnifiedPush, content-free, with
//! failures recorded and retried.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode as AxStatus};
use axum::routing::post;
use p256::ecdsa::signature::Verifier;
use reqwest::StatusCode;
use serde_json::{Value, json};
use waymark_proto::signing::{b64, unb64};

use crate::support::{Harness, test_config};

/// (endpoint name, headers, body) of each request the push service received.
type Received = Vec<(String, HeaderMap, Vec<u8>)>;

#[derive(Default, Clone)]
struct PushService {
    got: Arc<Mutex<Received>>,
    flaky_left: Arc<Mutex<u32>>,
}

async fn receive(
    State(s): State<PushService>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> AxStatus {
    s.got
        .lock()
        .unwrap()
        .push((name.clone(), headers, body.to_vec()));
    match name.as_str() {
        "gone" => AxStatus::GONE,
        "flaky" => {
            let mut left = s.flaky_left.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                AxStatus::SERVICE_UNAVAILABLE
            } else {
                AxStatus::CREATED
            }
        }
        _ => AxStatus::CREATED,
    }
}

async fn push_service() -> (String, PushService) {
    let svc = PushService {
        flaky_left: Arc::new(Mutex::new(2)),
        ..Default::default()
    };
    let app = Router::new()
        .route("/push/{name}", post(receive))
        .with_state(svc.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), svc)
}

/// Checks the VAPID token the way a push service does: ES256 over `header.claims` with the key
/// in `k`, for this origin, not expired.
fn verify_vapid(headers: &HeaderMap, origin: &str, server_key: &str) {
    let auth = headers["authorization"].to_str().unwrap();
    let rest = auth.strip_prefix("vapid ").expect("vapid scheme");
    let mut t = "";
    let mut k = "";
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("t=") {
            t = v;
        }
        if let Some(v) = part.strip_prefix("k=") {
            k = v;
        }
    }
    assert_eq!(k, server_key, "the token names the server's VAPID key");
    let (signed, sig) = t.rsplit_once('.').unwrap();
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&unb64(k, "k").unwrap()).unwrap();
    let sig = p256::ecdsa::Signature::from_slice(&unb64(sig, "sig").unwrap()).unwrap();
    key.verify(signed.as_bytes(), &sig)
        .expect("the VAPID signature verifies");
    let claims: Value =
        serde_json::from_slice(&unb64(signed.split('.').nth(1).unwrap(), "claims").unwrap())
            .unwrap();
    assert_eq!(claims["aud"], origin);
    assert!(claims["exp"].as_i64().unwrap() > chrono::Utc::now().timestamp());
    assert!(claims["sub"].as_str().unwrap().starts_with("mailto:"));
}

#[tokio::test]
async fn a_decision_reaches_an_offline_phone_through_web_push_and_unified_push_without_content() {
    // Retries wait an hour, then two: only the test's clock brings them about.
    let cfg = waymark_server::Config {
        push_retry_base: Duration::from_secs(3600),
        ..test_config()
    };
    let h = Harness::start_with(cfg).await;
    let (base, svc) = push_service().await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let token = h.session_token(&d).await;

    // The phone's own Web Push subscription keys.
    let (pair, auth) = ece::generate_keypair_and_auth_secret().unwrap();
    let keys = json!({"p256dh": b64(&pair.pub_as_raw().unwrap()), "auth": b64(&auth)});
    for (kind, name, with_keys) in [
        ("web_push", "ok", true),
        ("web_push", "flaky", true),
        ("web_push", "gone", true),
        ("unified_push", "up", false),
    ] {
        let mut body = json!({"kind": kind, "endpoint": format!("{base}/push/{name}")});
        if with_keys {
            body["keys"] = keys.clone();
        }
        let (s, v) = h
            .post(&token, &format!("/v1/devices/{}/push", d.id), body)
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    // Another device's session cannot touch these channels.
    let other = h.pair_device("alice", &["view"]).await;
    let other_token = h.session_token(&other).await;
    let (s, _) = h
        .get(&other_token, &format!("/v1/devices/{}/push", d.id))
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, _) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/approvals"),
              json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging", "secret_plan": "do not leak"}, "summary": "deploy to staging?", "expires_in_seconds": 86400}))
        .await;
    assert_eq!(s, StatusCode::CREATED);

    let count = |name: &str| {
        svc.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _, _)| n == name)
            .count()
    };
    // The first attempts; a flaky push service fails twice, then takes it on the third try.
    h.advance(Duration::ZERO).await;
    assert_eq!(
        (count("ok"), count("up"), count("gone"), count("flaky")),
        (1, 1, 1, 1)
    );
    h.advance(Duration::from_secs(3599)).await;
    assert_eq!(count("flaky"), 1, "no retry before its time");
    h.advance(Duration::from_secs(1)).await;
    assert_eq!(count("flaky"), 2, "the first retry after the base delay");
    h.advance(Duration::from_secs(2 * 3600)).await;
    assert_eq!(count("flaky"), 3, "the second after twice that");
    assert_eq!(
        (count("ok"), count("up"), count("gone")),
        (1, 1, 1),
        "each sent once"
    );

    let (_, vapid) = h.get("", "/v1/push/vapid").await;
    let server_key = vapid["public_key"].as_str().unwrap();
    let got = svc.got.lock().unwrap().clone();
    let (_, headers, body) = got.iter().find(|(n, _, _)| n == "ok").unwrap();
    assert_eq!(headers["content-encoding"], "aes128gcm");
    assert!(headers.contains_key("ttl"));
    verify_vapid(headers, &base, server_key);
    let plain = ece::decrypt(&pair.raw_components().unwrap(), &auth, body)
        .expect("the push decrypts with the phone's key");
    let payload: Value = serde_json::from_slice(&plain).unwrap();
    assert_eq!(payload["type"], "decision.requested");
    assert_eq!(payload["task_id"], task.as_str());
    assert_eq!(
        payload.as_object().unwrap().len(),
        4,
        "content-free: {payload}"
    );
    assert!(
        !String::from_utf8_lossy(&plain).contains("staging"),
        "no content in the push"
    );

    let (_, _, up) = got.iter().find(|(n, _, _)| n == "up").unwrap();
    let up: Value = serde_json::from_slice(up).unwrap();
    assert_eq!(up["type"], "decision.requested");

    // Failures are recorded and visible; a gone subscription is given up on. (Hours passed:
    // a new read session.)
    let token = h.session_token(&d).await;
    let (_, channels) = h.get(&token, &format!("/v1/devices/{}/push", d.id)).await;
    let by = |name: &str| {
        channels
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["endpoint"].as_str().unwrap().ends_with(name))
            .unwrap()
            .clone()
    };
    let flaky = by("/flaky");
    assert_eq!(flaky["failures"], 2, "{flaky}");
    assert_eq!(flaky["delivered"], 1, "{flaky}");
    assert!(
        flaky["last_error"].as_str().unwrap().contains("(5xx)"),
        "{flaky}"
    );
    let gone = by("/gone");
    assert!(gone["revoked_at"].is_string(), "{gone}");
    assert!(
        gone["last_error"].as_str().unwrap().contains("gone"),
        "{gone}"
    );
    assert_eq!(by("/ok")["delivered"], 1);
}

#[tokio::test]
async fn a_revoked_device_is_sent_nothing_more_and_its_channels_end_with_it() {
    let h = Harness::start().await;
    let (base, svc) = push_service().await;
    let d = h.pair_device("alice", &["view", "steer", "approve"]).await;
    let token = h.session_token(&d).await;
    let (s, v) = h
        .post(
            &token,
            &format!("/v1/devices/{}/push", d.id),
            json!({"kind": "unified_push", "endpoint": format!("{base}/push/lost-phone")}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");

    waymark_server::steer::revoke_device(&*h.server.state.store, &d.id)
        .await
        .unwrap();
    let channels = h
        .server
        .state
        .store
        .read()
        .await
        .unwrap()
        .push_channels(Some(&d.id))
        .await
        .unwrap();
    assert_eq!(channels.len(), 1);
    assert!(channels[0].revoked_at.is_some(), "{channels:?}");
    assert_eq!(
        channels[0].last_error.as_deref(),
        Some("the device was revoked")
    );

    // A decision that would have been pushed: the background work runs, nothing is sent.
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/approvals"),
              json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"}, "summary": "deploy?"}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    h.advance(Duration::from_secs(5)).await;
    h.advance(Duration::from_secs(5)).await;
    assert!(
        svc.got.lock().unwrap().is_empty(),
        "a revoked device got a push"
    );
}

/// A loopback listener that counts connections and answers each request with `answer`
/// (status line and headers), or never answers when `None`.
async fn listener(answer: Option<&'static str>) -> (u16, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]);
                seen.lock()
                    .unwrap()
                    .push(head.lines().next().unwrap_or("").to_owned());
                match answer {
                    Some(a) => {
                        let _ = s
                            .write_all(format!("{a}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                            .await;
                    }
                    None => std::future::pending::<()>().await,
                }
            });
        }
    });
    (port, heads)
}

/// (task, decision) of a new approval asked by `token`'s worker.
async fn ask_approval(h: &Harness, token: &str, extra: Value) -> (String, String) {
    let task = h.create_task(token).await;
    let (att, fence) = h.attempt(token, &task, 3600).await;
    let mut body = json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging"},
                          "summary": "deploy to staging?"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (s, v) = h
        .post(token, &format!("/v1/tasks/{task}/approvals"), body)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    (task, v["id"].as_str().unwrap().to_owned())
}

#[tokio::test]
async fn a_push_endpoint_reaches_only_public_addresses_follows_no_redirect_and_says_only_what_class_failed()
 {
    // No allow-list: the suite's loopback services are not public.
    let h = Harness::start_with(waymark_server::Config {
        push_allow: vec![],
        ..test_config()
    })
    .await;
    let (port, heads) = listener(Some("HTTP/1.1 201 Created")).await;
    let d = h.pair_device("alice", &["view", "approve"]).await;
    let token = h.session_token(&d).await;
    let register = |kind: &'static str, endpoint: String| {
        let (h, token, id) = (&h, token.clone(), d.id.clone());
        async move {
            let mut body = json!({"kind": kind, "endpoint": endpoint});
            if kind == "web_push" {
                let (pair, auth) = ece::generate_keypair_and_auth_secret().unwrap();
                body["keys"] =
                    json!({"p256dh": b64(&pair.pub_as_raw().unwrap()), "auth": b64(&auth)});
            }
            h.post(&token, &format!("/v1/devices/{id}/push"), body)
                .await
        }
    };
    for (kind, endpoint, says) in [
        (
            "unified_push",
            format!("http://127.0.0.1:{port}/up"),
            "not public",
        ),
        (
            "unified_push",
            format!("http://2130706433:{port}/up"),
            "not public",
        ),
        (
            "unified_push",
            format!("http://0x7f.0.0.1:{port}/up"),
            "not public",
        ),
        (
            "unified_push",
            format!("http://[::1]:{port}/up"),
            "not public",
        ),
        (
            "unified_push",
            format!("http://[::ffff:127.0.0.1]:{port}/up"),
            "not public",
        ),
        (
            "unified_push",
            "http://169.254.169.254/latest/meta-data".into(),
            "not public",
        ),
        ("unified_push", "http://10.0.0.1/up".into(), "not public"),
        (
            "unified_push",
            "https://user:secret@push.example.com/up".into(),
            "user name or password",
        ),
        ("web_push", "http://push.example.com/wp".into(), "https"),
        (
            "unified_push",
            "file:///etc/passwd".into(),
            "not an http(s) URL",
        ),
    ] {
        let (s, v) = register(kind, endpoint.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{endpoint}: {v}");
        assert!(
            v["detail"].as_str().unwrap().contains(says),
            "{endpoint}: {v}"
        );
    }
    // A name is taken, and checked when connecting: `localhost` resolves to loopback only,
    // so nothing is sent (however it resolves later — a rebinding name is checked each time).
    let (s, v) = register("unified_push", format!("http://localhost:{port}/up")).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    ask_approval(&h, &h.alice, json!({})).await;
    h.advance(Duration::ZERO).await;
    assert!(
        heads.lock().unwrap().is_empty(),
        "nothing reached loopback: {:?}",
        heads.lock().unwrap()
    );
    let (_, channels) = h.get(&token, &format!("/v1/devices/{}/push", d.id)).await;
    let err = channels[0]["last_error"].as_str().unwrap().to_owned();
    assert!(err.contains("not public"), "{err}");
    assert!(
        !err.contains("127.0.0.1") && !err.contains(&port.to_string()),
        "{err}"
    );

    // Allowed (an operator's LAN ntfy): a redirect is not followed, and a refusal is told as
    // its class, not its status.
    let h = Harness::start().await;
    let (redirect, redirected) = listener(Some(
        "HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/elsewhere",
    ))
    .await;
    let (forbidden, _) = listener(Some("HTTP/1.1 403 Forbidden")).await;
    let d = h.pair_device("alice", &["view", "approve"]).await;
    let token = h.session_token(&d).await;
    for port in [redirect, forbidden] {
        let (s, v) = h
            .post(
                &token,
                &format!("/v1/devices/{}/push", d.id),
                json!({"kind": "unified_push", "endpoint": format!("http://127.0.0.1:{port}/up")}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    ask_approval(&h, &h.alice, json!({})).await;
    h.advance(Duration::ZERO).await;
    assert_eq!(
        redirected.lock().unwrap().len(),
        1,
        "one request, the redirect not followed"
    );
    let (_, channels) = h.get(&token, &format!("/v1/devices/{}/push", d.id)).await;
    let errors: Vec<String> = channels
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["last_error"].as_str().unwrap_or("").to_owned())
        .collect();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("redirected (not followed)")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("refused the push (4xx)")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .all(|e| !e.contains("403") && !e.contains("307")),
        "{errors:?}"
    );
}

#[tokio::test]
async fn a_device_with_silent_push_endpoints_holds_up_no_one_elses_decision_default() {
    let h = Harness::start().await;
    let (silent, connections) = listener(None).await;
    // The endpoints' own path: another test's server retrying an endpoint on a port this
    // listener took over after that test let it go is not counted as ours.
    let ours = waymark_proto::ids::task();
    // mallory's phone registers 200 channels at a socket that never answers.
    let mallory = h.pair_device("bob", &["view", "approve"]).await;
    let token = h.session_token(&mallory).await;
    for i in 0..200 {
        let (s, v) = h
            .post(&token, &format!("/v1/devices/{}/push", mallory.id),
                  json!({"kind": "unified_push", "endpoint": format!("http://127.0.0.1:{silent}/{ours}/{i}")}))
            .await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let (_, channels) = h
        .get(&token, &format!("/v1/devices/{}/push", mallory.id))
        .await;
    let live = channels
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["revoked_at"].is_null())
        .count();
    assert_eq!(live, 10, "at most 10 live channels per device, the newest");
    // Registering the same subscription again is the channel it has.
    let (_, again) = h
        .post(&token, &format!("/v1/devices/{}/push", mallory.id),
              json!({"kind": "unified_push", "endpoint": format!("http://127.0.0.1:{silent}/{ours}/199")}))
        .await;
    assert!(
        channels
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["id"] == again["id"]),
        "{again}"
    );

    // A round of delivery already under way (it lists channels as they were) is let finish
    // before the decisions below, so only the live channels can be sent their push.
    h.server.deliver_pushes().await;
    // bob's approval (so the silent endpoints are pushed to) and alice's, which defaults in a
    // minute. The background pass must apply alice's default on time while the pushes hang.
    ask_approval(&h, &h.bob, json!({})).await;
    let (task, decision) = ask_approval(&h, &h.alice, json!({"expires_in_seconds": 60})).await;
    let pass = async {
        h.server.advance(Duration::ZERO).await.unwrap();
        h.server.advance(Duration::from_secs(61)).await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(4), pass)
        .await
        .expect("the background pass never waits for a push endpoint");
    let (s, v) = h
        .get(&h.alice, &format!("/v1/tasks/{task}/decisions/{decision}"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_ne!(v["status"], "pending", "the default applied on time: {v}");
    // Meanwhile the pushes are under way (the round started beside the pass), at most one
    // connection per live channel.
    for _ in 0..300 {
        if connections
            .lock()
            .unwrap()
            .iter()
            .any(|h| h.contains(&format!("/{ours}/")))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let heads: Vec<String> = connections
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.contains(&format!("/{ours}/")))
        .cloned()
        .collect();
    // Channels, not connections: a channel may be tried again (a retry come due as the clock
    // moved, on a loaded machine); the cap is on channels.
    let channels: std::collections::BTreeSet<&String> = heads.iter().collect();
    let n = channels.len();
    assert!(
        (1..=10).contains(&n),
        "{n} channels of the silent socket tried: {heads:#?}"
    );
}

/// A decision that closes (here by its default) is withdrawn from every device it was pushed
/// to: each gets a `decision.closed` push naming only the decision, so its service worker or
/// app replaces the notification tagged with it. A device it was never pushed to gets nothing.
#[tokio::test]
async fn a_closed_decision_is_withdrawn_from_the_devices_it_was_pushed_to_and_no_others() {
    let h = Harness::start().await;
    let (base, svc) = push_service().await;
    let register = |name: &'static str| {
        let h = &h;
        let base = base.clone();
        async move {
            let d = h.pair_device("alice", &["view", "approve"]).await;
            let token = h.session_token(&d).await;
            let (s, v) = h
                .post(
                    &token,
                    &format!("/v1/devices/{}/push", d.id),
                    json!({"kind": "unified_push", "endpoint": format!("{base}/push/{name}")}),
                )
                .await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
        }
    };
    register("phone").await;
    register("laptop").await;
    let (task, decision) = ask_approval(&h, &h.alice, json!({"expires_in_seconds": 60})).await;
    h.advance(Duration::ZERO).await;
    // A device that turned push on after the decision went out was never shown it.
    register("tablet").await;
    h.advance(Duration::from_secs(61)).await;
    h.advance(Duration::ZERO).await;
    let got = |name: &str| -> Vec<Value> {
        svc.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, b)| serde_json::from_slice(b).unwrap())
            .collect()
    };
    for name in ["phone", "laptop"] {
        let pushes = got(name);
        let kinds: Vec<&str> = pushes.iter().map(|p| p["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["decision.requested", "decision.closed"],
            "{name}: {pushes:?}"
        );
        let closed = &pushes[1];
        assert_eq!(closed["decision_id"], decision.as_str(), "{closed}");
        assert_eq!(closed["task_id"], task.as_str(), "{closed}");
        assert_eq!(
            closed.as_object().unwrap().len(),
            5,
            "content-free, the decision's id only: {closed}"
        );
        assert!(
            pushes[0].get("decision_id").is_none(),
            "a request says only what to fetch: {}",
            pushes[0]
        );
    }
    assert_eq!(
        got("tablet"),
        Vec::<Value>::new(),
        "never pushed, nothing to withdraw"
    );
}
