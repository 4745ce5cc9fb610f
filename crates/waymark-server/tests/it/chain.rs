use reqwest::StatusCode;

use crate::support::Harness;

#[tokio::test]
async fn a_checkpoint_edited_in_the_database_breaks_the_chain_visibly() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    for seq in 1..=4 {
        let (s, v) = h.checkpoint(&h.alice, &task, &att, fence, seq).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }
    let d = h.detail(&task).await;
    assert_eq!(d["chain"]["intact"], true);
    assert_eq!(d["chain"]["checked"], 4);
    assert_eq!(
        d["checkpoints"][2]["prev_digest"],
        d["checkpoints"][1]["digest"]
    );

    // Someone with the database rewrites history: checkpoint 2 now claims another summary.
    let n = h
        .raw_sql(
            "UPDATE checkpoints SET body = json_set(body, '$.summary', 'tests passed') WHERE task_id = ? AND sequence = 2",
            "UPDATE checkpoints SET body = jsonb_set(body, '{summary}', '\"tests passed\"') WHERE task_id = $1 AND sequence = 2",
            &task,
        )
        .await;
    assert_eq!(n, 1);

    let d = h.detail(&task).await;
    assert_eq!(d["chain"]["intact"], false, "{}", d["chain"]);
    assert_eq!(d["chain"]["broken_at"], 2);
    assert!(
        d["chain"]["reason"]
            .as_str()
            .unwrap()
            .contains("changed after it was written"),
        "{}",
        d["chain"]
    );
}

#[tokio::test]
async fn a_deleted_checkpoint_breaks_the_chain_at_the_gap() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    for seq in 1..=3 {
        h.checkpoint(&h.alice, &task, &att, fence, seq).await;
    }
    let n = h
        .raw_sql(
            "DELETE FROM checkpoints WHERE task_id = ? AND sequence = 2",
            "DELETE FROM checkpoints WHERE task_id = $1 AND sequence = 2",
            &task,
        )
        .await;
    assert_eq!(n, 1);
    let d = h.detail(&task).await;
    assert_eq!(d["chain"]["intact"], false);
    assert_eq!(d["chain"]["broken_at"], 3);
}

/// A state this build does not know (a hand edit, a newer writer) is corruption said out
/// loud: the heartbeat fails with `internal` and names it, instead of taking the task for
/// `running` as a silent default once did.
#[tokio::test]
async fn a_task_state_edited_in_the_database_is_reported_never_taken_for_running() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let n = h
        .raw_sql(
            "UPDATE tasks SET state = 'sleeping' WHERE id = ?",
            "UPDATE tasks SET state = 'sleeping' WHERE id = $1",
            &task,
        )
        .await;
    assert_eq!(n, 1);
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/attempts/{att}/heartbeat"),
            serde_json::json!({"fence": fence}),
        )
        .await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR, "{v}");
    assert_eq!(v["code"], "internal", "{v}");
}
