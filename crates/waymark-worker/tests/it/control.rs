use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use waymark_proto::Operation;
use waymark_worker::{AttemptOptions, Error, Run};

use crate::support::World;

/// A paired device of the `admin` user (who owns the tasks the test worker creates).
struct Device {
    id: String,
    key: ed25519_dalek::SigningKey,
}

impl Device {
    async fn pair(w: &World) -> Device {
        let (code, _) = waymark_server::steer::create_pairing(
            &*w.server.state.store,
            waymark_server::admin::DEFAULT_USER,
            &["view".to_owned(), "steer".to_owned()],
            600_000,
        )
        .await
        .unwrap();
        let key = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
        let res = reqwest::Client::new()
            .post(format!("{}/v1/devices/pair", w.server.url()))
            .json(&json!({"code": code, "name": "phone",
                          "public_key": waymark_proto::signing::public_key_b64(&key.verifying_key())}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        let v: Value = res.json().await.unwrap();
        Device {
            id: v["id"].as_str().unwrap().to_owned(),
            key,
        }
    }

    async fn steer(&self, w: &World, task: &str, op: Operation) -> Value {
        let now = chrono::Utc::now();
        let cmd = waymark_proto::SteerCommand {
            command_id: waymark_proto::ids::command(),
            task_id: Some(task.to_owned()),
            expected_plan_revision: Some(w.detail(task).await.task.plan_revision),
            operation: op,
            scope: vec![],
            args: json!({}),
            issued_by: "user:admin".into(),
            device_id: self.id.clone(),
            issued_at: now,
            expires_at: now + chrono::Duration::minutes(10),
        };
        let envelope = waymark_proto::signing::sign(&cmd, &self.key).unwrap();
        let res = reqwest::Client::new()
            .post(format!("{}/v1/commands", w.server.url()))
            .json(&envelope)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
        res.json().await.unwrap()
    }
}

/// Returns once the run's control stream is connected: a command applied from now on reaches
/// a worker that is already listening.
async fn stream_connected(run: &Run) {
    tokio::time::timeout(
        Duration::from_secs(10),
        run.control_connected().wait_for(|c| *c),
    )
    .await
    .expect("the control stream connected within 10 s")
    .expect("the run is alive");
}

#[tokio::test]
async fn a_cancel_reaches_the_worker_through_the_control_stream_without_a_heartbeat() {
    let w = World::start().await;
    let task = w.task("cancel me").await;
    // No heartbeat runs (a 60 s lease would beat first after 20 s; here none beats at all),
    // so nothing but the stream can bring the cancel.
    let run = w
        .client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    run.stop_heartbeat();
    let device = Device::pair(&w).await;
    stream_connected(&run).await;
    device.steer(&w, &task, Operation::Cancel).await;
    tokio::time::timeout(Duration::from_secs(10), run.cancelled().cancelled())
        .await
        .expect("the cancel reached the worker through the stream");
    assert!(run.control().borrow().cancelled);
    assert!(matches!(run.wait_if_paused().await, Err(Error::Cancelled)));
    assert!(matches!(
        run.say("still here?").await,
        Err(Error::Cancelled)
    ));
}

#[tokio::test]
async fn pause_holds_the_worker_at_its_next_step_boundary_until_resume() {
    let w = World::start().await;
    let task = w.task("pause me").await;
    let run = w
        .client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let device = Device::pair(&w).await;
    stream_connected(&run).await;
    device.steer(&w, &task, Operation::Pause).await;
    let mut control = run.control();
    tokio::time::timeout(Duration::from_secs(2), control.wait_for(|c| c.paused))
        .await
        .expect("the pause arrived within 2 s")
        .unwrap();
    let blocked = tokio::time::timeout(Duration::from_millis(500), run.wait_if_paused()).await;
    assert!(
        blocked.is_err(),
        "a paused worker does not start its next step"
    );
    let (resumed, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(3), run.wait_if_paused()),
        async {
            device.steer(&w, &task, Operation::Resume).await;
        }
    );
    resumed.expect("resume released the worker").unwrap();
    assert!(!run.cancelled().is_cancelled());
}

/// Forwards a worker's requests to the control plane; when armed, holds the reply to the next
/// heartbeat (already computed by the server) until released — a reply that arrives late.
struct LateReplies {
    url: String,
    armed: Arc<AtomicBool>,
    held: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
    passed: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LateReplies {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LateReplies {
    async fn start(upstream: String) -> LateReplies {
        let armed = Arc::new(AtomicBool::new(false));
        let held = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        let passed = Arc::new(tokio::sync::Notify::new());
        let http = reqwest::Client::new();
        let (a, h, r, p) = (armed.clone(), held.clone(), release.clone(), passed.clone());
        let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
            let (http, upstream, armed, held, release, passed) = (
                http.clone(),
                upstream.clone(),
                a.clone(),
                h.clone(),
                r.clone(),
                p.clone(),
            );
            async move {
                let (parts, body) = req.into_parts();
                let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
                let mut out = http.request(
                    parts.method.clone(),
                    format!("{upstream}{}", parts.uri.path_and_query().unwrap()),
                );
                for (k, v) in &parts.headers {
                    if k != "host" {
                        out = out.header(k, v);
                    }
                }
                let res = out.body(body).send().await.unwrap();
                let status = res.status();
                let headers = res.headers().clone();
                let hold =
                    parts.uri.path().ends_with("/heartbeat") && armed.swap(false, Ordering::SeqCst);
                let mut answer = if hold {
                    let bytes = res.bytes().await.unwrap();
                    let reply: Value = serde_json::from_slice(&bytes).unwrap();
                    assert_eq!(
                        reply["task_state"], "paused",
                        "the held reply was made while paused"
                    );
                    held.notify_one();
                    release.notified().await;
                    passed.notify_one();
                    axum::response::Response::new(axum::body::Body::from(bytes))
                } else {
                    axum::response::Response::new(axum::body::Body::from_stream(res.bytes_stream()))
                };
                *answer.status_mut() = status;
                *answer.headers_mut() = headers;
                answer
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        LateReplies {
            url,
            armed,
            held,
            release,
            passed,
            task,
        }
    }
}

/// Seen in the steer benchmark: the heartbeat that acknowledged a Pause was answered (task
/// paused) before a Resume applied, and its reply reached the worker after the Resume. The
/// worker must stay resumed: the reply is older than the command.
#[tokio::test]
async fn a_heartbeat_reply_that_arrives_after_a_resume_does_not_pause_the_worker_again() {
    let w = World::start().await;
    let task = w.task("pause, resume, late reply").await;
    let proxy = LateReplies::start(w.server.url()).await;
    let client = waymark_worker::Client::new(&proxy.url, w.token.clone()).unwrap();
    // A 60 s lease beats every 20 s: here every beat is the prompt one after a command.
    let run = client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let device = Device::pair(&w).await;
    let mut control = run.control();
    stream_connected(&run).await;

    proxy.armed.store(true, Ordering::SeqCst);
    device.steer(&w, &task, Operation::Pause).await;
    tokio::time::timeout(Duration::from_secs(5), control.wait_for(|c| c.paused))
        .await
        .expect("the pause arrived")
        .unwrap();
    // The worker acknowledged the pause; the server answered that heartbeat (paused) and the
    // answer is held on the way back.
    tokio::time::timeout(Duration::from_secs(5), proxy.held.notified())
        .await
        .expect("the acknowledging heartbeat was answered");
    device.steer(&w, &task, Operation::Resume).await;
    tokio::time::timeout(Duration::from_secs(5), control.wait_for(|c| !c.paused))
        .await
        .expect("the resume arrived through the stream")
        .unwrap();
    control.borrow_and_update();

    proxy.release.notify_one();
    tokio::time::timeout(Duration::from_secs(5), proxy.passed.notified())
        .await
        .expect("the late reply was delivered");
    // The worker has read the late reply once its control state was touched again.
    tokio::time::timeout(Duration::from_secs(5), control.changed())
        .await
        .expect("the worker took the late reply")
        .unwrap();
    assert!(
        !run.control().borrow().paused,
        "a reply older than the Resume paused the worker again"
    );
    tokio::time::timeout(Duration::from_secs(2), run.wait_if_paused())
        .await
        .expect("wait_if_paused returns at once after a Resume")
        .unwrap();
    assert_eq!(w.detail(&task).await.task.state.as_str(), "running");
}
