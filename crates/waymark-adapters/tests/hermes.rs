//! The Hermes mirror against a real SQLite `state.db` built from `fixtures/hermes/*.sql` and a
//! real control plane: sessions, messages, tool-call effects and lineage arrive, the database
//! is never written, and a second pass adds only what is new.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use support::{ControlPlane, eventually};
use tokio_util::sync::CancellationToken;
use waymark_adapters::hermes::{self, MirrorArgs};
use waymark_proto::{EffectStatus, FinishOutcome, TaskDetail};

const ROOT: &str = "20260901_090000_cd34";
const CHILD: &str = "20260901_101500_ab12";
const BRANCH: &str = "20260901_111111_ef56";

struct World {
    cp: ControlPlane,
}

impl World {
    async fn start() -> World {
        let w = World {
            cp: ControlPlane::start("hermes").await,
        };
        w.hermes_writes(&["schema.sql", "rows.sql"]).await;
        w
    }

    /// A world whose `state.db` is Hermes 0.19.0's real schema, still empty.
    async fn start_real() -> World {
        let w = World {
            cp: ControlPlane::start("hermes").await,
        };
        w.hermes_writes(&["real/schema-22.sql"]).await;
        w
    }

    fn state_db(&self) -> PathBuf {
        self.cp.dir.path().join("hermes/state.db")
    }

    /// Hermes writing its store (WAL, as Hermes opens it); the pool closes at the end.
    async fn hermes_writes(&self, fixtures: &[&str]) {
        std::fs::create_dir_all(self.state_db().parent().unwrap()).unwrap();
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(self.state_db())
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal),
            )
            .await
            .unwrap();
        for f in fixtures {
            let sql = std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("fixtures/hermes")
                    .join(f),
            )
            .unwrap();
            sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
        }
        pool.close().await;
    }

    async fn mirror_once(&self) {
        let args = MirrorArgs {
            state_db: self.state_db(),
            once: true,
            follow: false,
            interval_ms: 2000,
            state_file: Some(self.cp.dir.path().join("mirror-state.json")),
            worker: "hermes-mirror-test".into(),
        };
        tokio::time::timeout(
            Duration::from_secs(60),
            hermes::mirror(args, self.cp.client.clone(), CancellationToken::new()),
        )
        .await
        .expect("one pass ends")
        .unwrap();
    }

    /// The task of a Hermes session.
    async fn task(&self, session: &str) -> TaskDetail {
        self.find(session)
            .await
            .unwrap_or_else(|| panic!("no task for Hermes session {session}"))
    }

    /// The task of a Hermes session, if the mirror has made it.
    async fn find(&self, session: &str) -> Option<TaskDetail> {
        let id = self
            .cp
            .tasks_of("hermes", session)
            .await
            .into_iter()
            .next()?;
        Some(self.cp.detail(&id).await)
    }

    /// The database file's bytes (digest) and modification time.
    fn fingerprint(&self) -> (String, SystemTime) {
        let bytes = std::fs::read(self.state_db()).unwrap();
        let mtime = std::fs::metadata(self.state_db())
            .unwrap()
            .modified()
            .unwrap();
        (hex::encode(Sha256::digest(&bytes)), mtime)
    }
}

fn texts(d: &TaskDetail) -> Vec<(&str, &str)> {
    d.messages
        .iter()
        .map(|m| (m.role.as_str(), m.text.as_str()))
        .collect()
}

#[tokio::test]
async fn hermes_mirror_reads_sessions_messages_effects_and_lineage_without_writing() {
    let w = World::start().await;
    let before = w.fingerprint();
    w.mirror_once().await;
    assert_eq!(w.fingerprint(), before, "the state database was written");
    // SQLite may leave the usual WAL side file of a reader; nothing is written into it.
    let wal = w.state_db().with_extension("db-wal");
    assert_eq!(std::fs::metadata(&wal).map_or(0, |m| m.len()), 0);

    // The root: its messages, its tool call paired with the tool row, its end by compression.
    let root = w.task(ROOT).await;
    assert_eq!(root.task.title, "fix parser");
    assert_eq!(
        texts(&root),
        [
            ("user", "the parser chokes on nested lists"),
            (
                "assistant",
                r#"[tool call call_1] terminal {"command":"pytest"}"#
            ),
            ("tool", "[tool result call_1 terminal] 1 failed, 2 passed"),
            ("assistant", "Found it: the recursion drops the inner list."),
        ]
    );
    let e = &root.effects[0];
    assert_eq!(root.effects.len(), 1);
    assert_eq!(e.idempotency_key, format!("{ROOT}:call_1"));
    assert_eq!(e.kind, "tool:terminal");
    assert_eq!(e.intent["arguments"]["command"], "pytest");
    assert_eq!(e.status, EffectStatus::Confirmed);
    assert_eq!(e.receipt.as_ref().unwrap()["output"], "1 failed, 2 passed");
    assert_eq!(root.attempts.len(), 1);
    assert_eq!(root.attempts[0].outcome, Some(FinishOutcome::Completed));
    let cp = root.checkpoints.last().unwrap();
    assert_eq!(cp.body.reason, "compaction");
    assert!(cp.body.summary.as_deref().unwrap().contains(CHILD));

    // The compression child: lineage first, the hidden row left out, the answered call an
    // effect, the running one (call_3) not yet; still open, so the attempt is released.
    let child = w.task(CHILD).await;
    let t = texts(&child);
    assert_eq!(
        t[0],
        (
            "system",
            "continues Hermes session `20260901_090000_cd34` after compression"
        )
    );
    assert!(
        !t.iter().any(|(_, x)| x.contains("CONTEXT SUMMARY")),
        "{t:?}"
    );
    assert_eq!(t.len(), 5, "{t:?}");
    let keys: Vec<&str> = child
        .effects
        .iter()
        .map(|e| e.idempotency_key.as_str())
        .collect();
    assert_eq!(keys, [format!("{CHILD}:call_2").as_str()]);
    assert_eq!(
        child.effects[0].receipt.as_ref().unwrap()["output"],
        "3 passed"
    );
    assert_eq!(child.attempts[0].outcome, Some(FinishOutcome::Released));

    // The branch: a branch note, and the call it never answered left unknown.
    let branch = w.task(BRANCH).await;
    assert_eq!(
        texts(&branch)[0],
        (
            "system",
            "branched from Hermes session `20260901_101500_ab12`"
        )
    );
    let e = &branch.effects[0];
    assert_eq!(e.idempotency_key, format!("{BRANCH}:call_9"));
    assert_eq!(e.status, EffectStatus::Unknown);
    assert_eq!(branch.attempts[0].outcome, Some(FinishOutcome::Completed));
    assert!(
        branch.attempts[0].state.as_str() != "active",
        "{:?}",
        branch.attempts[0]
    );
}

#[tokio::test]
async fn hermes_mirror_second_once_adds_only_new_messages() {
    let w = World::start().await;
    w.mirror_once().await;
    let root_before = w.task(ROOT).await;
    let child_before = w.task(CHILD).await;

    // Hermes goes on: call_3 answered, one more message, the session closed by its agent.
    w.hermes_writes(&["rows-later.sql"]).await;
    let written = w.fingerprint();
    w.mirror_once().await;
    assert_eq!(w.fingerprint(), written, "the state database was written");

    let child = w.task(CHILD).await;
    let before = texts(&child_before);
    let after = texts(&child);
    assert_eq!(&after[..before.len()], &before[..], "history unchanged");
    assert_eq!(
        &after[before.len()..],
        [
            ("tool", "[tool result call_3 write_file] wrote 12 lines"),
            ("assistant", "Fixed; the changelog says how."),
        ]
    );
    let mut seen = std::collections::HashSet::new();
    assert!(
        after.iter().all(|m| seen.insert(*m)),
        "a duplicate: {after:?}"
    );
    let call_3 = child
        .effects
        .iter()
        .find(|e| e.idempotency_key == format!("{CHILD}:call_3"))
        .unwrap();
    assert_eq!(call_3.status, EffectStatus::Confirmed);
    assert_eq!(call_3.intent["arguments"]["path"], "CHANGELOG.md");
    assert_eq!(child.effects.len(), 2);
    assert_eq!(child.attempts.len(), 2);
    assert_eq!(child.attempts[1].outcome, Some(FinishOutcome::Released));

    // Nothing new in the root: no new attempt, no new message.
    let root = w.task(ROOT).await;
    assert_eq!(root.messages.len(), root_before.messages.len());
    assert_eq!(root.attempts.len(), 1);

    // A third pass with nothing new changes nothing.
    w.mirror_once().await;
    let again = w.task(CHILD).await;
    assert_eq!(again.messages.len(), child.messages.len());
    assert_eq!(again.attempts.len(), 2);
}

#[tokio::test]
async fn hermes_mirror_follow_keeps_one_attempt_per_open_session_and_picks_up_new_rows() {
    let w = World::start().await;
    let shutdown = CancellationToken::new();
    let args = MirrorArgs {
        state_db: w.state_db(),
        once: false,
        follow: true,
        interval_ms: 100,
        state_file: Some(w.cp.dir.path().join("mirror-state.json")),
        worker: "hermes-mirror-test".into(),
    };
    let mirror = tokio::spawn(hermes::mirror(args, w.cp.client.clone(), shutdown.clone()));
    let open = eventually("the open session mirrored", || async {
        w.find(CHILD).await.filter(|d| d.messages.len() == 5)
    })
    .await;
    assert_eq!(open.attempts.len(), 1);
    assert_eq!(open.attempts[0].state.as_str(), "active", "kept open");

    // Hermes writes while the mirror follows.
    w.hermes_writes(&["rows-later.sql"]).await;
    let ended = eventually("the session's end mirrored", || async {
        let d = w.task(CHILD).await;
        d.attempts[0].outcome.is_some().then_some(d)
    })
    .await;
    assert_eq!(ended.attempts.len(), 1, "one attempt across the passes");
    assert_eq!(ended.attempts[0].outcome, Some(FinishOutcome::Released));
    assert_eq!(ended.messages.len(), 7);

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), mirror)
        .await
        .expect("the mirror stops")
        .unwrap()
        .unwrap();
}

/// Issue #21: a session run through `hermes acp` was refused by the mirror (the live adapter
/// had completed its task), so its history never arrived. Now the live adapter releases the
/// attempt and the mirror adds, to the same task, only what it did not record.
#[tokio::test]
async fn hermes_acp_session_then_the_mirror_is_one_task_and_nothing_twice() {
    let w = World::start_real().await;
    // The live adapter runs the session (the recorded Hermes 0.19 exchange)…
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/acp/hermes-allow-session.json");
    let args = waymark_adapters::acp::AcpArgs {
        agent_cmd: format!(
            "'{}' --scenario '{}'",
            env!("CARGO_BIN_EXE_waymark-fake-acp"),
            fixture.display()
        ),
        cwd: Some(w.cp.dir.path().to_owned()),
        prompt: "clean up the build and run the tests".into(),
        runtime: "hermes".into(),
        title: None,
        worker: "waymark-hermes".into(),
        approval_expires_in: None,
        bind: Default::default(),
    };
    let client = w.cp.client.clone();
    let live = tokio::spawn(async move {
        waymark_adapters::acp::run(args, client, CancellationToken::new()).await
    });
    let task = w.cp.task_of("hermes", CHILD).await;
    let d = eventually("the approval", || async {
        w.cp.detail(&task)
            .await
            .decisions
            .into_iter()
            .find(|d| d.status == waymark_proto::DecisionStatus::Pending)
    })
    .await;
    let phone = w.cp.phone().await;
    let revision = w.cp.detail(&task).await.task.plan_revision;
    phone
        .command(
            &task,
            revision,
            waymark_proto::Operation::Approve,
            serde_json::json!({"decision_id": d.id, "intent_digest": d.intent_digest}),
        )
        .await;
    tokio::time::timeout(Duration::from_secs(30), live)
        .await
        .expect("the turn ends")
        .unwrap()
        .unwrap();
    let before = w.task(CHILD).await;
    assert_eq!(before.attempts[0].outcome, Some(FinishOutcome::Released));

    // …and Hermes' store holds it as Hermes 0.19 writes it (cwd NULL, ended_at NULL).
    w.hermes_writes(&["real/acp-session.sql"]).await;
    w.mirror_once().await;

    assert_eq!(
        w.cp.tasks_of("hermes", CHILD).await,
        vec![task.clone()],
        "one task per session"
    );
    let after = w.task(CHILD).await;
    assert_eq!(
        after.attempts.len(),
        2,
        "the mirror's attempt on the same task"
    );
    assert_eq!(after.attempts[1].worker, "hermes-mirror-test");
    let all = texts(&after);
    let count = |role: &str, text: &str| {
        all.iter()
            .filter(|(r, t)| *r == role && t.contains(text))
            .count()
    };
    assert_eq!(count("user", "clean up the build"), 1, "{all:?}");
    assert_eq!(count("assistant", "All 3 tests pass."), 1, "{all:?}");
    // What the live adapter did not see: the model's call and the tool's own result.
    assert_eq!(
        count("assistant", "[tool call call_0_1] terminal"),
        1,
        "{all:?}"
    );
    assert_eq!(
        count("tool", "[tool result call_0_1 terminal]"),
        1,
        "{all:?}"
    );
    // The tool call is the live adapter's effect, not recorded again under the model's id.
    assert_eq!(after.effects.len(), 1, "{:?}", after.effects);
    assert_eq!(after.effects[0].status, EffectStatus::Confirmed);
    // The directory comes from `model_config` (Hermes leaves `sessions.cwd` NULL for ACP).
    assert_eq!(
        after.task.goal, before.task.goal,
        "the live adapter's goal stays"
    );
}

/// Hermes 0.19 leaves `sessions.cwd` NULL for ACP sessions and keeps the directory in
/// `model_config.cwd`; its `messages` has no `display_kind`.
#[tokio::test]
async fn hermes_mirror_reads_hermes_0_19s_real_schema_and_finds_an_acp_sessions_directory() {
    let w = World::start_real().await;
    w.hermes_writes(&["real/acp-session.sql"]).await;
    w.mirror_once().await;
    let d = w.task(CHILD).await;
    assert!(d.task.goal.contains("from `acp`"), "{}", d.task.goal);
    assert!(d.task.goal.contains("in `/work/repo`"), "{}", d.task.goal);
    assert_eq!(d.task.title, "Fake title");
    assert_eq!(texts(&d).len(), 4, "{:?}", texts(&d));
    assert_eq!(d.effects.len(), 1);
    assert_eq!(d.effects[0].kind, "tool:terminal");
    assert_eq!(d.effects[0].status, EffectStatus::Confirmed);
    // `ended_at` stays NULL: the session is open, the attempt released.
    assert_eq!(d.attempts[0].outcome, Some(FinishOutcome::Released));
}
