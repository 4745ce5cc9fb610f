use std::time::{Duration, Instant};

use serde_json::{Value, json};
use waymark_proto::Operation;
use waymark_worker::{AttemptOptions, Error};

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

#[tokio::test]
async fn a_cancel_reaches_the_worker_through_the_control_stream_well_before_a_heartbeat() {
    let w = World::start().await;
    let task = w.task("cancel me").await;
    // A 60 s lease heartbeats every 20 s: only the stream can deliver within the bound.
    let run = w
        .client
        .start_attempt(
            &task,
            AttemptOptions::new("w").lease(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let device = Device::pair(&w).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // the stream is connected
    let sent = Instant::now();
    device.steer(&w, &task, Operation::Cancel).await;
    tokio::time::timeout(Duration::from_secs(2), run.cancelled().cancelled())
        .await
        .expect("the cancel reached the worker within 2 s");
    assert!(sent.elapsed() < Duration::from_secs(2));
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
    tokio::time::sleep(Duration::from_millis(200)).await;
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
