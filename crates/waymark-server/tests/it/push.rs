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
              json!({"attempt_id": att, "fence": fence, "intent": {"target": "staging", "secret_plan": "do not leak"}, "summary": "deploy to staging?"}))
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
        flaky["last_error"].as_str().unwrap().contains("503"),
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
