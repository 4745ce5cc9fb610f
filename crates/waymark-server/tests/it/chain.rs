use reqwest::StatusCode;
use sqlx::sqlite::SqliteConnectOptions;

use crate::support::Harness;

#[tokio::test]
async fn a_checkpoint_edited_in_the_sqlite_file_breaks_the_chain_visibly() {
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

    // Someone with the file rewrites history: checkpoint 2 now claims another summary.
    let db = h.dir.path().join("waymark.db");
    let pool = sqlx::SqlitePool::connect_with(SqliteConnectOptions::new().filename(&db))
        .await
        .unwrap();
    let n = sqlx::query(
        "UPDATE checkpoints SET body = json_set(body, '$.summary', 'tests passed') WHERE task_id = ? AND sequence = 2",
    )
    .bind(&task)
    .execute(&pool)
    .await
    .unwrap()
    .rows_affected();
    assert_eq!(n, 1);
    pool.close().await;

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
    let db = h.dir.path().join("waymark.db");
    let pool = sqlx::SqlitePool::connect_with(SqliteConnectOptions::new().filename(&db))
        .await
        .unwrap();
    sqlx::query("DELETE FROM checkpoints WHERE task_id = ? AND sequence = 2")
        .bind(&task)
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let d = h.detail(&task).await;
    assert_eq!(d["chain"]["intact"], false);
    assert_eq!(d["chain"]["broken_at"], 3);
}
