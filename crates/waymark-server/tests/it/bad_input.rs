use reqwest::StatusCode;
use serde_json::json;

use crate::support::{Harness, assert_problem, test_config};

async fn raw(
    h: &Harness,
    path: &str,
    content_type: Option<&str>,
    body: impl Into<reqwest::Body>,
) -> (StatusCode, String, serde_json::Value) {
    let mut req = h.http.post(h.url(path)).bearer_auth(&h.alice).body(body);
    if let Some(ct) = content_type {
        req = req.header("content-type", ct);
    }
    let res = req.send().await.unwrap();
    let status = res.status();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = res.text().await.unwrap();
    (
        status,
        ct,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    )
}

/// (path, content type, body, expected status, expected code)
type Case = (
    &'static str,
    Option<&'static str>,
    Vec<u8>,
    u16,
    &'static str,
);

async fn state(h: &Harness) -> (usize, i64) {
    let (_, snap) = h.get(&h.admin, "/v1/snapshot").await;
    (
        snap["tasks"].as_array().unwrap().len(),
        snap["cursor"].as_i64().unwrap(),
    )
}

#[tokio::test]
async fn bad_bodies_get_problem_json_and_write_nothing() {
    let h = Harness::start_with(waymark_server::Config {
        max_json_bytes: 4096,
        max_blob_bytes: 1024,
        ..test_config()
    })
    .await;
    let task = h.create_task(&h.alice).await;
    let before = state(&h).await;

    let cases: Vec<Case> = vec![
        ("/v1/tasks", Some("application/json"), b"{\"title\": \"x\",".to_vec(), 400, "malformed_json"),
        ("/v1/tasks", Some("application/json"), b"not json at all".to_vec(), 400, "malformed_json"),
        ("/v1/tasks", Some("application/json"), br#"{"title": 42}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("application/json"), br#"{"title": "x", "plan": "steps"}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("application/json"), br#"{"title": "x", "colour": "red"}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("application/json"), br#"{"title": "  "}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("application/json"),
         br#"{"title": "x", "plan": [{"id": "a", "depends_on": ["b"]}, {"id": "b", "depends_on": ["a"]}]}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("application/json"), br#"{"title": "a\u0000b"}"#.to_vec(), 422, "validation_failed"),
        ("/v1/tasks", Some("text/plain"), br#"{"title": "x"}"#.to_vec(), 415, "unsupported_media_type"),
        ("/v1/tasks", None, br#"{"title": "x"}"#.to_vec(), 415, "unsupported_media_type"),
        ("/v1/tasks", Some("application/json"),
         format!(r#"{{"title": "x", "goal": "{}"}}"#, "a".repeat(10_000)).into_bytes(), 413, "payload_too_large"),
    ];
    for (path, ct, body, status, code) in cases {
        let (s, rct, v) = raw(&h, path, ct, body).await;
        assert_problem(s, &v, status, code);
        assert_eq!(rct, "application/problem+json");
    }
    let checkpoint_path = format!("/v1/tasks/{task}/checkpoints");
    let (s, _, v) = raw(
        &h,
        &checkpoint_path,
        Some("application/json"),
        r#"{"attempt_id": "a", "fence": "one", "sequence": 1, "body": {}}"#,
    )
    .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, _, v) = raw(
        &h,
        &checkpoint_path,
        Some("application/json"),
        r#"{"attempt_id": "a", "fence": 1, "sequence": 0, "body": {}}"#,
    )
    .await;
    assert_problem(s, &v, 422, "validation_failed");
    let (s, _, v) = raw(
        &h,
        &format!("/v1/tasks/{task}/artifacts?name=big.bin"),
        Some("application/octet-stream"),
        vec![0u8; 4096],
    )
    .await;
    assert_problem(s, &v, 413, "payload_too_large");
    assert_eq!(v["context"]["limit_bytes"], 1024);

    assert_eq!(state(&h).await, before, "a refused request wrote something");
    assert!(
        h.detail(&task).await["artifacts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn unknown_credentials_routes_and_methods_get_problem_json() {
    let h = Harness::start().await;
    let res = h.http.get(h.url("/v1/snapshot")).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    let v: serde_json::Value = res.json().await.unwrap();
    assert_eq!(v["code"], "unauthorized");
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("waymark admin worker-token")
    );

    let (s, v) = h.get("wmk_w_forged", "/v1/snapshot").await;
    assert_problem(s, &v, 401, "unauthorized");
    let (s, v) = h.get(&h.alice, "/v1/nope").await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = h
        .send(reqwest::Method::DELETE, &h.alice, "/v1/tasks", None)
        .await;
    assert_problem(s, &v, 405, "method_not_allowed");
    let (s, v) = h
        .post(
            &h.alice,
            "/v1/tasks/task_missing/attempts",
            json!({"worker": "w"}),
        )
        .await;
    assert_problem(s, &v, 404, "not_found");
    let (s, v) = h.get(&h.alice, "/v1/events?after=-4").await;
    assert_problem(s, &v, 400, "bad_request");
    let (s, v) = h.get(&h.alice, "/v1/blobs/not-a-digest").await;
    assert_problem(s, &v, 400, "bad_request");
}

#[tokio::test]
async fn the_operational_surface_answers() {
    let h = Harness::start().await;
    let (s, v) = h.get("", "/healthz").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["status"], "ok");

    let (s, doc) = h.get("", "/v1/openapi.json").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(doc["openapi"].as_str().unwrap().chars().next(), Some('3'));
    for path in [
        "/v1/tasks",
        "/v1/tasks/{task}/checkpoints",
        "/v1/effects/{effect}",
        "/v1/events",
        "/v1/snapshot",
        "/v1/tasks/{task}/decisions/{decision}",
        "/v1/attempts/{attempt}/finish",
        "/v1/blobs/{sha256}",
    ] {
        assert!(
            doc["paths"][path].is_object(),
            "{path} missing from the OpenAPI document"
        );
    }
    assert!(doc["components"]["schemas"]["Problem"].is_object());

    h.create_task(&h.alice).await;
    let text = h.metrics().await;
    assert!(text.contains("waymark_tasks_created_total 1"), "{text}");
    assert!(text.contains("waymark_http_requests_total{"), "{text}");
}

#[tokio::test]
async fn a_credential_over_its_rate_is_told_when_to_retry_and_others_are_not_slowed() {
    let h = Harness::start_with(waymark_server::Config {
        rate_per_second: 5,
        rate_burst: 5,
        ..test_config()
    })
    .await;
    let mut limited = None;
    for _ in 0..20 {
        let res = h
            .http
            .get(h.url("/v1/snapshot"))
            .bearer_auth(&h.alice)
            .send()
            .await
            .unwrap();
        if res.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(res);
            break;
        }
    }
    let res = limited.expect("20 rapid requests must exceed 5/s");
    let retry_after: u64 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let v: serde_json::Value = res.json().await.unwrap();
    assert_eq!(v["code"], "rate_limited");
    assert!(v["context"]["retry_after_ms"].as_u64().unwrap() > 0);
    // bob and the host's admin are not slowed by alice's worker.
    let (s, _) = h.get(&h.bob, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
    let (s, _) = h.get(&h.admin, "/v1/snapshot").await;
    assert_eq!(s, StatusCode::OK);
}

/// Found by `scripts/api-fuzz` (schemathesis): a query string that did not deserialise was
/// answered by axum's plain-text rejection, not the problem document the API promises.
#[tokio::test]
async fn a_bad_query_string_is_a_problem_document() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    for path in [
        "/v1/events?after=yesterday".to_owned(),
        "/v1/admin/audit?limit=many".to_owned(),
        format!("/v1/tasks/{task}/artifacts?name=a&unknown=1"),
    ] {
        let token = if path.starts_with("/v1/admin") {
            &h.admin
        } else {
            &h.alice
        };
        let method = if path.contains("/artifacts") {
            reqwest::Method::POST
        } else {
            reqwest::Method::GET
        };
        let res = h
            .http
            .request(method, h.url(&path))
            .bearer_auth(token)
            .header("content-type", "application/octet-stream")
            .body("x")
            .send()
            .await
            .unwrap();
        let status = res.status();
        let ct = res.headers()["content-type"].to_str().unwrap().to_owned();
        let body: serde_json::Value = res.json().await.unwrap();
        assert_eq!(ct, "application/problem+json", "{path}: {body}");
        assert_problem(status, &body, 400, "bad_request");
    }
}

/// The OpenAPI document lists, on every route, the problems the shared layers answer with, as
/// `application/problem+json` (found missing by `scripts/api-fuzz`).
#[tokio::test]
async fn the_openapi_document_lists_the_common_problems() {
    let doc = waymark_server::openapi_json();
    let op = &doc["paths"]["/v1/tasks/{task}/checkpoints"]["post"]["responses"];
    for status in ["400", "401", "403", "404", "413", "415", "422", "429"] {
        assert_eq!(
            op[status]["content"]["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem",
            "{status}: {op}"
        );
    }
    // The route's own 409 moved to the problem media type; its 201 did not.
    assert!(
        op["409"]["content"]["application/problem+json"].is_object(),
        "{op}"
    );
    assert!(op["201"]["content"]["application/json"].is_object(), "{op}");
    // Public routes promise no 401.
    let health = &doc["paths"]["/healthz"]["get"]["responses"];
    assert!(health.get("401").is_none(), "{health}");
    // A signed command's refusal stays a CommandResult; a body that is no envelope at all is
    // a problem document under the same status.
    let submit = &doc["paths"]["/v1/commands"]["post"]["responses"];
    assert_eq!(
        submit["403"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/CommandResult"
    );
    assert_eq!(
        submit["422"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/CommandResult"
    );
    assert!(
        submit["422"]["content"]["application/problem+json"].is_object(),
        "{submit}"
    );
    // Writes that carry a fence can meet a newer attempt (409), in the body or the query.
    for (path, method) in [
        ("/v1/tasks/{task}/usage", "post"),
        ("/v1/tasks/{task}/decisions", "post"),
        ("/v1/tasks/{task}/artifacts", "post"),
    ] {
        let r = &doc["paths"][path][method]["responses"];
        assert!(
            r["409"]["content"]["application/problem+json"].is_object(),
            "{path}: {r}"
        );
    }
    assert!(
        doc["paths"]["/v1/tasks"]["post"]["responses"]
            .get("409")
            .is_none()
    );
}

/// JSON Schema's `integer` admits `1.0`; so does the server.
#[tokio::test]
async fn a_whole_number_spelled_as_a_float_is_the_integer() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (attempt, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{attempt}/heartbeat"),
            json!({"fence": fence as f64, "lease_seconds": 60.0}),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{attempt}/heartbeat"),
            json!({"fence": 1.5}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{v}");
}

/// An intent is a JSON object, as the document says (found by `scripts/api-fuzz`: `null` was
/// stored, then answered against that document).
#[tokio::test]
async fn an_intent_that_is_not_an_object_is_refused() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    for intent in [json!(null), json!(1), json!("deploy"), json!([])] {
        let (s, v) = h
            .post(
                &h.alice,
                &format!("/v1/tasks/{task}/effects"),
                json!({"attempt_id": att, "fence": fence, "idempotency_key": "k", "kind": "deploy",
                       "intent": intent}),
            )
            .await;
        assert_problem(s, &v, 422, "validation_failed");
        let (s, v) = h
            .post(
                &h.alice,
                &format!("/v1/tasks/{task}/approvals"),
                json!({"attempt_id": att, "fence": fence, "summary": "deploy?", "intent": intent}),
            )
            .await;
        assert_problem(s, &v, 422, "validation_failed");
    }
}

#[tokio::test]
async fn made_up_methods_do_not_grow_the_metrics() {
    let h = Harness::start().await;
    let before = h.metrics().await.len();
    for i in 0..300 {
        let method = reqwest::Method::from_bytes(format!("X{i}Y").as_bytes()).unwrap();
        let res = h
            .http
            .request(method, h.url(&format!("/v1/tasks/{i}")))
            .send()
            .await
            .unwrap();
        assert!(res.status().is_client_error(), "{}", res.status());
    }
    let text = h.metrics().await;
    assert!(!text.contains("X1Y"), "a made-up method became a label");
    assert!(text.contains("method=\"other\""), "{text}");
    // One series of each family for every made-up method at most: a few KB, not 300 series.
    assert!(
        text.len() < before + 8 * 1024,
        "{} → {} bytes",
        before,
        text.len()
    );
}
