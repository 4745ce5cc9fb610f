//! The OpenAPI document describes requests as the server validates them, and links each
//! answer's ids to the operations that take them, so a client (or `scripts/api-fuzz`'s stateful
//! run) can follow one answer into the next request.

use serde_json::{Value, json};

fn op<'a>(doc: &'a Value, path: &str, method: &str) -> &'a Value {
    let op = &doc["paths"][path][method];
    assert!(op.is_object(), "{method} {path} missing");
    op
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let s = &doc["components"]["schemas"][name];
    assert!(s.is_object(), "schema {name} missing");
    s
}

#[tokio::test]
async fn answers_link_their_ids_to_the_operations_that_take_them() {
    let doc = waymark_server::openapi_json();
    let ids: Vec<&str> = doc["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap().values())
        .filter_map(|op| op["operationId"].as_str())
        .collect();

    // A created task's id feeds its attempts (and a task found again by its runtime key, too).
    for status in ["201", "200"] {
        let link = &op(&doc, "/v1/tasks", "post")["responses"][status]["links"]["StartAttempt"];
        assert_eq!(link["operationId"], "start_attempt", "{link}");
        assert_eq!(link["parameters"]["path.task"], "$response.body#/id");
    }
    // An attempt's id and fence feed its heartbeat, and its task's fenced writes.
    let attempt = &op(&doc, "/v1/tasks/{task}/attempts", "post")["responses"]["201"]["links"];
    assert_eq!(attempt["Heartbeat"]["operationId"], "heartbeat");
    assert_eq!(
        attempt["Heartbeat"]["parameters"]["path.attempt"],
        "$response.body#/id"
    );
    assert_eq!(
        attempt["Heartbeat"]["requestBody"],
        json!({"fence": "$response.body#/fence"})
    );
    assert_eq!(
        attempt["DeclareEffect"]["requestBody"],
        json!({"attempt_id": "$response.body#/id", "fence": "$response.body#/fence"})
    );
    assert_eq!(
        attempt["DeclareEffect"]["parameters"]["path.task"],
        "$response.body#/task_id"
    );
    // An effect's id feeds its update.
    let effect = &op(&doc, "/v1/tasks/{task}/effects", "post")["responses"]["201"]["links"];
    assert_eq!(effect["UpdateEffect"]["operationId"], "update_effect");
    assert_eq!(
        effect["UpdateEffect"]["parameters"]["path.effect"],
        "$response.body#/effect/id"
    );

    // Every link names an operation of the document, spelled as OpenAPI spells it.
    let mut n = 0;
    for item in doc["paths"].as_object().unwrap().values() {
        for op in item.as_object().unwrap().values() {
            for response in op["responses"].as_object().unwrap().values() {
                let Some(links) = response["links"].as_object() else {
                    continue;
                };
                for (name, link) in links {
                    n += 1;
                    let target = link["operationId"].as_str().unwrap_or_default();
                    assert!(ids.contains(&target), "link {name} to unknown {link}");
                    assert!(link.get("operation_id").is_none(), "{link}");
                    assert!(link.get("request_body").is_none(), "{link}");
                }
            }
        }
    }
    assert!(n >= 30, "{n} links");
}

#[tokio::test]
async fn requests_are_described_as_the_server_validates_them() {
    let doc = waymark_server::openapi_json();
    let sha = "^sha256:[0-9a-f]{64}$";
    // Digests and ids have their shapes.
    let effect = &schema(&doc, "Effect")["properties"];
    assert_eq!(effect["intent_digest"]["pattern"], sha);
    assert_eq!(effect["id"]["pattern"], "^eff_[0-9a-f]{32}$");
    assert_eq!(
        schema(&doc, "RequestApproval")["properties"]["intent_digest"]["pattern"],
        sha
    );
    assert_eq!(
        schema(&doc, "Artifact")["properties"]["sha256"]["pattern"],
        "^[0-9a-f]{64}$"
    );
    let task_param = op(&doc, "/v1/tasks/{task}/attempts", "post")["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "task")
        .unwrap();
    assert_eq!(task_param["schema"]["pattern"], "^task_[0-9a-f]{32}$");

    // Bounds and lengths the domain checks.
    let checkpoint = &schema(&doc, "AppendCheckpoint")["properties"];
    assert_eq!(checkpoint["sequence"]["minimum"], 1);
    assert_eq!(checkpoint["sequence"]["maximum"], 9_007_199_254_740_991_i64);
    assert_eq!(checkpoint["fence"]["minimum"], 1);
    assert_eq!(checkpoint["attempt_id"]["pattern"], "^att_[0-9a-f]{32}$");
    let title = &schema(&doc, "CreateTask")["properties"]["title"];
    assert_eq!(
        (&title["minLength"], &title["maxLength"]),
        (&json!(1), &json!(200))
    );
    assert_eq!(title["pattern"], r"^[^\x00]*[^\s\x00][^\x00]*$");
    let approval = &schema(&doc, "RequestApproval")["properties"];
    assert_eq!(approval["expires_in_seconds"]["minimum"], 1);
    assert_eq!(approval["expires_in_seconds"]["maximum"], 30 * 24 * 3600);
    assert_eq!(
        schema(&doc, "AppendMessages")["properties"]["messages"]["maxItems"],
        1000
    );
    // No string of a request body carries NUL; approvals have their own route; a follow-up's
    // zone is one the server knows.
    assert_eq!(
        schema(&doc, "CreateTask")["properties"]["goal"]["pattern"],
        r"^[^\x00]*$"
    );
    let kinds = &schema(&doc, "AskedKind")["enum"];
    assert_eq!(kinds, &json!(["question", "budget", "recovery"]));
    let zones = schema(&doc, "CreateFollowup")["properties"]["time_zone"]["enum"]
        .as_array()
        .unwrap();
    assert!(zones.contains(&json!("Europe/Paris")) && zones.contains(&Value::Null));
}

/// `/v1/openapi.json` serves `openapi/v1.json`, checked in; it must be what the code generates
/// now. `WAYMARK_WRITE_OPENAPI=1` writes it instead (after changing a route or a wire type).
#[tokio::test]
async fn the_served_document_is_the_checked_in_one() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(waymark_server::OPENAPI_PATH);
    let now = waymark_server::openapi_file();
    if std::env::var_os("WAYMARK_WRITE_OPENAPI").is_some() {
        std::fs::write(&path, &now).unwrap();
    }
    let file = std::fs::read_to_string(&path).unwrap();
    assert!(
        file == now,
        "{} drifted from the code — regenerate it: WAYMARK_WRITE_OPENAPI=1 cargo nextest run -p waymark-server -E 'test(the_served_document_is_the_checked_in_one)'",
        path.display()
    );

    let h = crate::support::Harness::start().await;
    let (status, served) = h.get("", "/v1/openapi.json").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    assert_eq!(served, serde_json::from_str::<Value>(&file).unwrap());
}
