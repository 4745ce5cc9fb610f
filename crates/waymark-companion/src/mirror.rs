//! The local mirror: a SQLite file holding the threads a person may see, so inbox, thread
//! list and thread detail answer offline. Events from the server are applied idempotently (by
//! primary key) in batches inside transactions; the cursor advances in the same transaction.

use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Row, SqlitePool};
use waymark_proto::*;

use crate::error::Error;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/companion");

/// A plan step as progress shows it: done, in flight, or not started — from checkpoints,
/// never a guessed percentage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    /// Plan step id.
    pub step: String,
    /// Its title.
    pub title: String,
    /// Where it stands.
    pub status: StageStatus,
    /// Verified (tests passed) when done.
    pub verified: bool,
}

/// Where a plan step stands, from checkpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum StageStatus {
    /// A checkpoint recorded it done.
    Done,
    /// The newest checkpoint names it as the step under way.
    InFlight,
    /// Not started.
    Pending,
}

impl std::fmt::Display for StageStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            StageStatus::Done => "done",
            StageStatus::InFlight => "in_flight",
            StageStatus::Pending => "pending",
        })
    }
}

/// Where a command made on this device stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum OutboxStatus {
    /// Signed and waiting to be sent.
    Queued,
    /// The server applied it (or had already).
    Delivered,
    /// The agent saw it.
    Acknowledged,
    /// The plan moved on before it arrived: nothing was applied.
    Conflict,
    /// Refused.
    Rejected,
    /// It arrived after its signed lifetime.
    Expired,
}

impl OutboxStatus {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxStatus::Queued => "queued",
            OutboxStatus::Delivered => "delivered",
            OutboxStatus::Acknowledged => "acknowledged",
            OutboxStatus::Conflict => "conflict",
            OutboxStatus::Rejected => "rejected",
            OutboxStatus::Expired => "expired",
        }
    }

    fn parse(s: &str) -> Result<Self, Error> {
        [
            OutboxStatus::Queued,
            OutboxStatus::Delivered,
            OutboxStatus::Acknowledged,
            OutboxStatus::Conflict,
            OutboxStatus::Rejected,
            OutboxStatus::Expired,
        ]
        .into_iter()
        .find(|v| v.as_str() == s)
        .ok_or_else(|| Error::Mirror(format!("corrupt mirror row: outbox status `{s}`")))
    }
}

impl std::fmt::Display for OutboxStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A thread in the list.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadRow {
    /// The task.
    pub task: Task,
    /// Decisions waiting for a person.
    pub pending_decisions: i64,
    /// Effects whose outcome nobody knows.
    pub unknown_effects: i64,
    /// The newest checkpoint.
    pub last_checkpoint: Option<Checkpoint>,
    /// Plan stages.
    pub stages: Vec<Stage>,
    /// Pinned for offline review.
    pub pinned: bool,
}

/// A pending decision with what a person needs to decide it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InboxItem {
    /// The decision (approval, question, budget, recovery).
    pub decision: Decision,
    /// Its task's title.
    pub task_title: String,
    /// Whose task it is (another user's when they delegated their decisions to this one).
    #[serde(default)]
    pub task_owner: String,
    /// The task's plan revision now (an approval asked at an older one is stale).
    pub plan_revision: i64,
    /// Diffs attached to the task.
    pub diffs: Vec<Artifact>,
    /// Its test receipts, newest last.
    pub receipts: Vec<TestReceipt>,
}

/// A thread in full.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ThreadDetail {
    /// The task.
    pub task: Task,
    /// Plan stages.
    pub stages: Vec<Stage>,
    /// Attempts, oldest first.
    pub attempts: Vec<Attempt>,
    /// Checkpoint timeline.
    pub checkpoints: Vec<Checkpoint>,
    /// Effects (`unknown` first).
    pub effects: Vec<Effect>,
    /// Decisions, newest first.
    pub decisions: Vec<Decision>,
    /// Artifacts.
    pub artifacts: Vec<Artifact>,
    /// Test receipts.
    pub receipts: Vec<TestReceipt>,
    /// Session messages.
    pub messages: Vec<Message>,
    /// Commands this device sent about it.
    pub outbox: Vec<OutboxEntry>,
}

/// Where a command this device signed stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OutboxEntry {
    /// The command.
    pub command_id: String,
    /// Its task.
    pub task_id: String,
    /// Its operation.
    pub operation: Operation,
    /// The plan revision the person saw.
    pub based_on_revision: Option<i64>,
    /// Where it stands.
    pub status: OutboxStatus,
    /// The server's answer.
    pub result: Option<CommandResult>,
    /// For a conflict or rejection: what changed, for people.
    pub what_changed: Option<String>,
    /// Signed at (unix ms).
    pub created_at: i64,
    /// Answered at.
    pub delivered_at: Option<i64>,
    /// Seen by the agent at.
    pub acknowledged_at: Option<i64>,
}

/// The mirror database.
#[derive(Clone)]
pub struct Mirror {
    pool: SqlitePool,
}

fn db(e: sqlx::Error) -> Error {
    // A full disk (SQLITE_FULL, ENOSPC) or a failed write (SQLITE_IOERR) says so: the change
    // was not made here, and what the outbox held is still there.
    let code = match &e {
        sqlx::Error::Database(d) => d
            .code()
            .and_then(|c| c.parse::<i64>().ok())
            .map(|n| n & 0xff),
        sqlx::Error::Io(io) if io.raw_os_error() == Some(28) => Some(13),
        _ => None,
    };
    match code {
        Some(13) => Error::Mirror(format!(
            "this device's disk is full: nothing was changed in the mirror and the outbox keeps what it held; free some space and try again ({e})"
        )),
        // SQLite says a full disk this way too when it cannot grow its shared-memory file.
        Some(10) => Error::Mirror(format!(
            "this device's disk failed a write (is it full?): nothing was changed in the mirror and the outbox keeps what it held; free some space and try again ({e})"
        )),
        _ => Error::Mirror(e.to_string()),
    }
}

fn parse<T: DeserializeOwned>(s: &str) -> Result<T, Error> {
    serde_json::from_str(s).map_err(|e| Error::Mirror(format!("corrupt mirror row: {e}")))
}

fn text<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Rank for "what needs attention first": lower is more urgent.
fn attention(t: &Task, pending: i64, unknown: i64) -> i64 {
    match t.state {
        TaskState::NeedsHuman | TaskState::RecoveryCandidate => 0,
        _ if pending > 0 || unknown > 0 => 1,
        TaskState::WaitingApproval | TaskState::WaitingHuman => 1,
        TaskState::Running | TaskState::Verifying | TaskState::Paused => 2,
        TaskState::Queued => 3,
        _ => 4,
    }
}

/// Plan stages from the checkpoint timeline.
pub fn stages(task: &Task, checkpoints: &[Checkpoint]) -> Vec<Stage> {
    let mut done = std::collections::HashMap::new();
    for c in checkpoints {
        for s in &c.body.completed_steps {
            done.insert(s.step.clone(), s.verified);
        }
    }
    let in_flight = checkpoints
        .last()
        .and_then(|c| c.body.pending_step.as_ref())
        .map(|p| p.step.clone());
    task.plan
        .iter()
        .map(|p| {
            let (status, verified) = match done.get(&p.id) {
                Some(v) => (StageStatus::Done, *v),
                None if in_flight.as_deref() == Some(p.id.as_str()) => {
                    (StageStatus::InFlight, false)
                }
                None => (StageStatus::Pending, false),
            };
            Stage {
                step: p.id.clone(),
                title: p.title.clone(),
                status,
                verified,
            }
        })
        .collect()
}

impl Mirror {
    /// Opens (creating and migrating) the mirror at `path`.
    pub async fn open(path: &Path) -> Result<Self, Error> {
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .map_err(db)?;
        MIGRATOR.run(&pool).await.map_err(|e| match e {
            sqlx::migrate::MigrateError::VersionMissing(v) => Error::Mirror(format!(
                "the mirror was written by a newer waymark (migration {v}); upgrade waymark"
            )),
            other => Error::Mirror(other.to_string()),
        })?;
        Ok(Mirror { pool })
    }

    /// A write transaction that takes the write lock at once (`BEGIN IMMEDIATE`), so it waits
    /// its turn behind another writer. A deferred one that reads first cannot: SQLite refuses
    /// its upgrade to a writer at once with `database is locked`, without the busy timeout
    /// (found by the `mirror_events` fuzz target).
    async fn write_tx(&self) -> Result<Tx<'static>, Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await.map_err(db)
    }

    /// A meta value.
    pub async fn meta(&self, key: &str) -> Result<Option<String>, Error> {
        sqlx::query_scalar("SELECT value FROM meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)
    }

    /// Sets a meta value.
    pub async fn set_meta(&self, key: &str, value: &str) -> Result<(), Error> {
        sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
            .bind(key)
            .bind(value)
            .execute(&self.pool)
            .await
            .map_err(db)
            .map(drop)
    }

    /// The event cursor the mirror is current to.
    pub async fn cursor(&self) -> Result<Option<i64>, Error> {
        Ok(self.meta("cursor").await?.and_then(|c| c.parse().ok()))
    }

    /// Replaces every mirrored thread with a fresh snapshot, at `cursor`. The outbox, the
    /// blob cache and pins are kept.
    pub async fn replace_all(&self, cursor: i64, threads: &[TaskDetail]) -> Result<(), Error> {
        let mut tx = self.write_tx().await?;
        let pins: Vec<String> = sqlx::query_scalar("SELECT id FROM tasks WHERE pinned = 1")
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
        for table in [
            "tasks",
            "attempts",
            "checkpoints",
            "effects",
            "decisions",
            "artifacts",
            "receipts",
            "messages",
            "deliveries",
        ] {
            sqlx::query(&format!("DELETE FROM {table}"))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        let mut rows = Rows::default();
        for d in threads {
            rows.tasks.push(d.task.clone());
            rows.attempts.extend(d.attempts.iter().cloned());
            rows.checkpoints.extend(d.checkpoints.iter().cloned());
            rows.effects.extend(d.effects.iter().cloned());
            rows.decisions.extend(d.decisions.iter().cloned());
            rows.deliveries.extend(
                d.decisions
                    .iter()
                    .flat_map(|x| x.deliveries.iter().cloned()),
            );
            rows.artifacts.extend(d.artifacts.iter().cloned());
            rows.receipts.extend(d.test_receipts.iter().cloned());
            rows.messages
                .extend(d.messages.iter().map(|m| (m.clone(), d.task.id.clone())));
        }
        rows.write(&mut tx).await?;
        for id in pins {
            sqlx::query("UPDATE tasks SET pinned = 1 WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        set_meta_tx(&mut tx, "cursor", &cursor.to_string()).await?;
        tx.commit().await.map_err(db)
    }

    /// Applies a batch of events in one transaction and advances the cursor to the last.
    /// Applying an event twice changes nothing. Rows are written per table, many to a
    /// statement, in event order (so the newest version of an object wins); the cursor only
    /// moves forward.
    pub async fn apply(&self, events: &[Event]) -> Result<(), Error> {
        let Some(last) = events.last() else {
            return Ok(());
        };
        let mut rows = Rows::default();
        for ev in events {
            rows.add(ev)?;
        }
        let mut tx = self.write_tx().await?;
        rows.write(&mut tx).await?;
        sqlx::query(
            "INSERT INTO meta (key, value) VALUES ('cursor', ?1), ('last_event_at', ?2)
             ON CONFLICT(key) DO UPDATE SET value = CASE
               WHEN key = 'cursor' AND CAST(value AS INTEGER) >= CAST(excluded.value AS INTEGER) THEN value
               ELSE excluded.value END",
        )
        .bind(last.cursor.to_string())
        .bind(last.at.timestamp_millis().to_string())
        .execute(&mut *tx)
        .await
        .map_err(db)?;
        tx.commit().await.map_err(db)
    }

    /// Pins or unpins a thread for offline review (its artifacts are prefetched).
    pub async fn pin(&self, task_id: &str, pinned: bool) -> Result<bool, Error> {
        let n = sqlx::query("UPDATE tasks SET pinned = ? WHERE id = ?")
            .bind(pinned)
            .bind(task_id)
            .execute(&self.pool)
            .await
            .map_err(db)?
            .rows_affected();
        Ok(n == 1)
    }

    /// A mirrored task.
    pub async fn task(&self, id: &str) -> Result<Option<Task>, Error> {
        let row: Option<String> = sqlx::query_scalar("SELECT data FROM tasks WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.map(|s| parse(&s)).transpose()
    }

    async fn list_all<T: DeserializeOwned>(&self, sql: &str) -> Result<Vec<T>, Error> {
        let rows: Vec<String> = sqlx::query_scalar(sql)
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.iter().map(|s| parse(s)).collect()
    }

    async fn list<T: DeserializeOwned>(&self, sql: &str, task_id: &str) -> Result<Vec<T>, Error> {
        let rows: Vec<String> = sqlx::query_scalar(sql)
            .bind(task_id)
            .fetch_all(&self.pool)
            .await
            .map_err(db)?;
        rows.iter().map(|s| parse(s)).collect()
    }

    /// Threads, what needs attention first.
    pub async fn threads(&self) -> Result<Vec<ThreadRow>, Error> {
        let rows = sqlx::query(
            "SELECT t.data, t.pinned,
               (SELECT COUNT(*) FROM decisions d WHERE d.task_id = t.id AND d.status = 'pending') AS pending,
               (SELECT COUNT(*) FROM effects e WHERE e.task_id = t.id AND e.status = 'unknown') AS unknown
             FROM tasks t",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let task: Task = parse(&r.get::<String, _>("data"))?;
            let cps: Vec<Checkpoint> = self
                .list(
                    "SELECT data FROM checkpoints WHERE task_id = ? ORDER BY sequence",
                    &task.id,
                )
                .await?;
            out.push(ThreadRow {
                stages: stages(&task, &cps),
                last_checkpoint: cps.last().cloned(),
                pending_decisions: r.get("pending"),
                unknown_effects: r.get("unknown"),
                pinned: r.get::<i64, _>("pinned") != 0,
                task,
            });
        }
        out.sort_by(|a, b| {
            attention(&a.task, a.pending_decisions, a.unknown_effects)
                .cmp(&attention(&b.task, b.pending_decisions, b.unknown_effects))
                .then(b.task.updated_at.cmp(&a.task.updated_at))
        });
        Ok(out)
    }

    /// Pending decisions, most urgent (soonest expiry) first, with their evidence.
    pub async fn inbox(&self) -> Result<Vec<InboxItem>, Error> {
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "{DECISIONS} WHERE status = 'pending' ORDER BY expires_at, id"
        ))
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        let mut out = Vec::new();
        for s in rows {
            let decision: Decision = parse(&s)?;
            let Some(task) = self.task(&decision.task_id).await? else {
                continue;
            };
            let artifacts: Vec<Artifact> = self
                .list(
                    "SELECT data FROM artifacts WHERE task_id = ? ORDER BY rowid",
                    &task.id,
                )
                .await?;
            let receipts: Vec<TestReceipt> = self
                .list(
                    "SELECT data FROM receipts WHERE task_id = ? ORDER BY rowid",
                    &task.id,
                )
                .await?;
            out.push(InboxItem {
                task_title: task.title.clone(),
                task_owner: task.owner.clone(),
                plan_revision: task.plan_revision,
                diffs: artifacts
                    .into_iter()
                    .filter(|a| {
                        a.media_type.contains("diff")
                            || a.name.ends_with(".diff")
                            || a.name.ends_with(".patch")
                    })
                    .collect(),
                receipts,
                decision,
            });
        }
        Ok(out)
    }

    /// The pending decisions alone (with their deliveries), soonest expiry first.
    pub async fn pending_decisions(&self) -> Result<Vec<Decision>, Error> {
        self.list_all(&format!(
            "{DECISIONS} WHERE status = 'pending' ORDER BY expires_at, id"
        ))
        .await
    }

    /// A pending or closed decision by id.
    pub async fn decision(&self, id: &str) -> Result<Option<Decision>, Error> {
        let row: Option<String> = sqlx::query_scalar(&format!("{DECISIONS} WHERE id = ?"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        row.map(|s| parse(&s)).transpose()
    }

    /// A thread in full, from the mirror alone.
    pub async fn thread(&self, id: &str) -> Result<Option<ThreadDetail>, Error> {
        let Some(task) = self.task(id).await? else {
            return Ok(None);
        };
        let checkpoints: Vec<Checkpoint> = self
            .list(
                "SELECT data FROM checkpoints WHERE task_id = ? ORDER BY sequence",
                id,
            )
            .await?;
        let mut effects: Vec<Effect> = self
            .list(
                "SELECT data FROM effects WHERE task_id = ? ORDER BY rowid",
                id,
            )
            .await?;
        effects.sort_by_key(|e| e.status != EffectStatus::Unknown);
        Ok(Some(ThreadDetail {
            stages: stages(&task, &checkpoints),
            attempts: self
                .list(
                    "SELECT data FROM attempts WHERE task_id = ? ORDER BY fence",
                    id,
                )
                .await?,
            checkpoints,
            effects,
            decisions: self
                .list(
                    &format!("{DECISIONS} WHERE task_id = ? ORDER BY rowid DESC"),
                    id,
                )
                .await?,
            artifacts: self
                .list(
                    "SELECT data FROM artifacts WHERE task_id = ? ORDER BY rowid",
                    id,
                )
                .await?,
            receipts: self
                .list(
                    "SELECT data FROM receipts WHERE task_id = ? ORDER BY rowid",
                    id,
                )
                .await?,
            messages: self
                .list(
                    "SELECT data FROM messages WHERE task_id = ? ORDER BY seq",
                    id,
                )
                .await?,
            outbox: self.outbox(Some(id)).await?,
            task,
        }))
    }

    // outbox

    /// Queues a signed command.
    pub(crate) async fn enqueue(
        &self,
        task_id: &str,
        op: Operation,
        based_on: Option<i64>,
        command_id: &str,
        envelope: &SignedEnvelope,
    ) -> Result<(), Error> {
        sqlx::query(
            "INSERT INTO outbox (command_id, task_id, operation, based_on_revision, envelope, status, created_at)
             VALUES (?, ?, ?, ?, ?, 'queued', ?)",
        )
        .bind(command_id)
        .bind(task_id)
        .bind(op.as_str())
        .bind(based_on)
        .bind(text(envelope))
        .bind(chrono::Utc::now().timestamp_millis())
        .execute(&self.pool)
        .await
        .map_err(db)
        .map(drop)
    }

    /// Queued commands, in the order they were made.
    pub async fn queued(&self) -> Result<Vec<(String, SignedEnvelope)>, Error> {
        let rows = sqlx::query(
            "SELECT command_id, envelope FROM outbox WHERE status = 'queued' ORDER BY seq",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        rows.iter()
            .map(|r| Ok((r.get("command_id"), parse(&r.get::<String, _>("envelope"))?)))
            .collect()
    }

    /// Records the server's answer to a queued command.
    pub(crate) async fn record_result(
        &self,
        command_id: &str,
        status: OutboxStatus,
        result: &CommandResult,
    ) -> Result<(), Error> {
        sqlx::query("UPDATE outbox SET status = ?, result = ?, delivered_at = ? WHERE command_id = ? AND status = 'queued'")
            .bind(status.as_str())
            .bind(text(result))
            .bind(chrono::Utc::now().timestamp_millis())
            .bind(command_id)
            .execute(&self.pool)
            .await
            .map_err(db)
            .map(drop)
    }

    /// The outbox, newest first; one task's when given.
    pub async fn outbox(&self, task_id: Option<&str>) -> Result<Vec<OutboxEntry>, Error> {
        let rows =
            sqlx::query("SELECT * FROM outbox WHERE (? IS NULL OR task_id = ?) ORDER BY seq DESC")
                .bind(task_id)
                .bind(task_id)
                .fetch_all(&self.pool)
                .await
                .map_err(db)?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let result: Option<CommandResult> = r
                .get::<Option<String>, _>("result")
                .map(|s| parse(&s))
                .transpose()?;
            let status = OutboxStatus::parse(r.get("status"))?;
            let operation: String = r.get("operation");
            let operation: Operation = operation
                .parse()
                .map_err(|e| Error::Mirror(format!("corrupt mirror row: outbox operation: {e}")))?;
            let based_on: Option<i64> = r.get("based_on_revision");
            let what_changed = match (&result, status) {
                (Some(res), OutboxStatus::Conflict) => Some(format!(
                    "you decided at plan revision {}; the plan is now at revision {} ({}) — review the thread and decide again",
                    based_on.map_or("?".into(), |b| b.to_string()),
                    res.plan_revision.map_or("?".into(), |p| p.to_string()),
                    res.task_state
                        .map_or("unknown state".into(), |s| s.to_string()),
                )),
                (Some(res), OutboxStatus::Rejected | OutboxStatus::Expired) => {
                    Some(res.detail.clone())
                }
                _ => None,
            };
            out.push(OutboxEntry {
                command_id: r.get("command_id"),
                task_id: r.get("task_id"),
                operation,
                based_on_revision: based_on,
                status,
                result,
                what_changed,
                created_at: r.get("created_at"),
                delivered_at: r.get("delivered_at"),
                acknowledged_at: r.get("acknowledged_at"),
            });
        }
        Ok(out)
    }

    // blobs

    /// A cached blob (and marks it used).
    pub async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>, Error> {
        let data: Option<Vec<u8>> = sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await
            .map_err(db)?;
        if data.is_some() {
            sqlx::query("UPDATE blobs SET last_access = ? WHERE sha256 = ?")
                .bind(chrono::Utc::now().timestamp_millis())
                .bind(sha256)
                .execute(&self.pool)
                .await
                .map_err(db)?;
        }
        Ok(data)
    }

    /// Caches a blob, then evicts the least recently used ones beyond `cap_bytes`.
    pub async fn put_blob(&self, sha256: &str, data: &[u8], cap_bytes: i64) -> Result<(), Error> {
        let mut tx = self.pool.begin().await.map_err(db)?;
        sqlx::query("INSERT INTO blobs (sha256, size, data, last_access) VALUES (?, ?, ?, ?) ON CONFLICT(sha256) DO UPDATE SET last_access = excluded.last_access")
            .bind(sha256)
            .bind(data.len() as i64)
            .bind(data)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        let total: i64 = sqlx::query_scalar("SELECT COALESCE(SUM(size), 0) FROM blobs")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        if total > cap_bytes {
            let rows = sqlx::query(
                "SELECT sha256, size FROM blobs WHERE sha256 != ? ORDER BY last_access, sha256",
            )
            .bind(sha256)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?;
            let mut over = total - cap_bytes;
            for r in rows {
                if over <= 0 {
                    break;
                }
                sqlx::query("DELETE FROM blobs WHERE sha256 = ?")
                    .bind(r.get::<String, _>("sha256"))
                    .execute(&mut *tx)
                    .await
                    .map_err(db)?;
                over -= r.get::<i64, _>("size");
            }
        }
        tx.commit().await.map_err(db)
    }

    /// Artifacts of pinned threads and threads with pending decisions that are not cached.
    pub async fn blobs_to_prefetch(&self) -> Result<Vec<(String, i64)>, Error> {
        let rows = sqlx::query(
            "SELECT DISTINCT a.sha256, a.size FROM artifacts a JOIN tasks t ON t.id = a.task_id
             WHERE (t.pinned = 1 OR EXISTS (SELECT 1 FROM decisions d WHERE d.task_id = t.id AND d.status = 'pending'))
               AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.sha256 = a.sha256)",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(db)?;
        Ok(rows
            .iter()
            .map(|r| (r.get("sha256"), r.get("size")))
            .collect())
    }

    /// Whether a notification with this key was shown; marks it shown.
    pub async fn first_notification(&self, key: &str) -> Result<bool, Error> {
        let n = sqlx::query("INSERT INTO notified (key, at) VALUES (?, ?) ON CONFLICT DO NOTHING")
            .bind(key)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&self.pool)
            .await
            .map_err(db)?
            .rows_affected();
        Ok(n == 1)
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

async fn set_meta_tx(tx: &mut Tx<'_>, key: &str, value: &str) -> Result<(), Error> {
    sqlx::query("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value")
        .bind(key)
        .bind(value)
        .execute(&mut **tx)
        .await
        .map_err(db)
        .map(drop)
}

/// Decisions as their `data`, with `deliveries` put back from their own table (a newer
/// version of a decision arrives without them).
const DECISIONS: &str = "SELECT CASE WHEN EXISTS (SELECT 1 FROM deliveries x WHERE x.decision_id = decisions.id) \
     THEN json_set(data, '$.deliveries', json((SELECT json_group_array(json(x.data)) \
     FROM deliveries x WHERE x.decision_id = decisions.id))) ELSE data END AS data FROM decisions";

/// Rows per statement (at most 6 columns each, far below SQLite's limit on parameters).
const CHUNK: usize = 256;

/// One batch's rows, per table, in the order the events came.
#[derive(Default)]
struct Rows {
    tasks: Vec<Task>,
    attempts: Vec<Attempt>,
    checkpoints: Vec<Checkpoint>,
    effects: Vec<Effect>,
    decisions: Vec<Decision>,
    artifacts: Vec<Artifact>,
    receipts: Vec<TestReceipt>,
    /// With their task's id.
    messages: Vec<(Message, String)>,
    acks: Vec<CommandAck>,
    deliveries: Vec<DeviceDelivery>,
}

fn data<T: DeserializeOwned>(ev: &Event) -> Result<T, Error> {
    T::deserialize(&ev.data)
        .map_err(|e| Error::Mirror(format!("event {} ({}): {e}", ev.cursor, ev.kind.as_str())))
}

/// `INSERT INTO <head> VALUES (…), (…)… <tail>`, `CHUNK` rows at a time.
async fn insert_many<T>(
    tx: &mut Tx<'_>,
    head: &str,
    tail: &str,
    rows: &[T],
    bind: impl Fn(&mut sqlx::query_builder::Separated<'_, '_, sqlx::Sqlite, &'static str>, &T),
) -> Result<(), Error> {
    for chunk in rows.chunks(CHUNK) {
        let mut q = sqlx::QueryBuilder::<sqlx::Sqlite>::new(head);
        q.push_values(chunk, |mut b, row| bind(&mut b, row));
        q.push(tail);
        q.build().execute(&mut **tx).await.map_err(db)?;
    }
    Ok(())
}

impl Rows {
    /// Takes in one event's object.
    fn add(&mut self, ev: &Event) -> Result<(), Error> {
        match ev.kind {
            EventKind::TaskCreated | EventKind::TaskUpdated => self.tasks.push(data(ev)?),
            EventKind::AttemptStarted | EventKind::AttemptEnded | EventKind::AttemptUpdated => {
                self.attempts.push(data(ev)?)
            }
            EventKind::CheckpointAppended => self.checkpoints.push(data(ev)?),
            EventKind::EffectDeclared | EventKind::EffectUpdated => self.effects.push(data(ev)?),
            EventKind::DecisionRequested
            | EventKind::DecisionClosed
            | EventKind::DecisionUpdated
            | EventKind::DecisionEscalated => {
                let d: Decision = data(ev)?;
                self.deliveries.extend(d.deliveries.iter().cloned());
                self.decisions.push(d);
            }
            EventKind::DecisionDelivered => self.deliveries.push(data(ev)?),
            EventKind::ArtifactAdded => self.artifacts.push(data(ev)?),
            EventKind::TestReceiptAdded => self.receipts.push(data(ev)?),
            EventKind::MessagesAppended => {
                #[derive(Deserialize)]
                struct Batch {
                    messages: Vec<Message>,
                }
                let b: Batch = data(ev)?;
                self.messages
                    .extend(b.messages.into_iter().map(|m| (m, ev.task_id.clone())));
            }
            // The server's own access signal is never sent; nothing to keep if it were.
            EventKind::CommandApplied | EventKind::FollowupFired | EventKind::AccessChanged => {}
            EventKind::CommandAcknowledged => self.acks.push(data(ev)?),
        }
        Ok(())
    }

    /// Writes every row: objects that change are upserted (the last version wins), the
    /// append-only ones inserted once.
    async fn write(&self, tx: &mut Tx<'_>) -> Result<(), Error> {
        insert_many(
            tx,
            "INSERT INTO tasks (id, data, state, plan_revision, updated_at) ",
            " ON CONFLICT(id) DO UPDATE SET data = excluded.data, state = excluded.state,
               plan_revision = excluded.plan_revision, updated_at = excluded.updated_at",
            &self.tasks,
            |b, t| {
                b.push_bind(t.id.clone())
                    .push_bind(text(t))
                    .push_bind(t.state.as_str())
                    .push_bind(t.plan_revision)
                    .push_bind(t.updated_at.timestamp_millis());
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO attempts (id, task_id, fence, data) ",
            " ON CONFLICT(id) DO UPDATE SET data = excluded.data",
            &self.attempts,
            |b, a| {
                b.push_bind(a.id.clone())
                    .push_bind(a.task_id.clone())
                    .push_bind(a.fence)
                    .push_bind(text(a));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO checkpoints (task_id, sequence, data) ",
            " ON CONFLICT DO NOTHING",
            &self.checkpoints,
            |b, c| {
                b.push_bind(c.task_id.clone())
                    .push_bind(c.sequence)
                    .push_bind(text(c));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO effects (id, task_id, status, data) ",
            " ON CONFLICT(id) DO UPDATE SET status = excluded.status, data = excluded.data",
            &self.effects,
            |b, e| {
                b.push_bind(e.id.clone())
                    .push_bind(e.task_id.clone())
                    .push_bind(e.status.as_str())
                    .push_bind(text(e));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO decisions (id, task_id, status, kind, expires_at, data) ",
            " ON CONFLICT(id) DO UPDATE SET status = excluded.status, data = excluded.data",
            &self.decisions,
            |b, d| {
                b.push_bind(d.id.clone())
                    .push_bind(d.task_id.clone())
                    .push_bind(d.status.as_str())
                    .push_bind(d.kind.as_str())
                    .push_bind(d.expires_at.timestamp_millis())
                    .push_bind(text(d));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO artifacts (id, task_id, sha256, size, data) ",
            " ON CONFLICT(id) DO NOTHING",
            &self.artifacts,
            |b, a| {
                b.push_bind(a.id.clone())
                    .push_bind(a.task_id.clone())
                    .push_bind(a.sha256.clone())
                    .push_bind(a.size)
                    .push_bind(text(a));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO receipts (id, task_id, data) ",
            " ON CONFLICT(id) DO NOTHING",
            &self.receipts,
            |b, r| {
                b.push_bind(r.id.clone())
                    .push_bind(r.task_id.clone())
                    .push_bind(text(r));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO messages (session_id, seq, task_id, data) ",
            " ON CONFLICT DO NOTHING",
            &self.messages,
            |b, (m, task_id)| {
                b.push_bind(m.session_id.clone())
                    .push_bind(m.seq)
                    .push_bind(task_id.clone())
                    .push_bind(text(m));
            },
        )
        .await?;
        insert_many(
            tx,
            "INSERT INTO deliveries (decision_id, device_id, step, data) ",
            " ON CONFLICT DO NOTHING",
            &self.deliveries,
            |b, d| {
                b.push_bind(d.decision_id.clone())
                    .push_bind(d.device_id.clone())
                    .push_bind(d.step.as_str())
                    .push_bind(text(d));
            },
        )
        .await?;
        for ack in &self.acks {
            sqlx::query("UPDATE outbox SET status = 'acknowledged', acknowledged_at = ? WHERE command_id = ? AND status IN ('queued', 'delivered')")
                .bind(ack.at.timestamp_millis())
                .bind(&ack.command_id)
                .execute(&mut **tx)
                .await
                .map_err(db)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn task(revision: i64, title: &str) -> Task {
        Task {
            id: "task_1".into(),
            owner: "alice".into(),
            title: title.into(),
            goal: "goal".into(),
            runtime: None,
            external_key: None,
            state: TaskState::Running,
            plan: vec![],
            plan_revision: revision,
            budget: Budget::default(),
            usage: Usage::default(),
            materials: Materials::default(),
            session_id: "ses_1".into(),
            fence: 1,
            outcome_summary: None,
            created_at: Utc.timestamp_millis_opt(0).unwrap(),
            updated_at: Utc.timestamp_millis_opt(revision).unwrap(),
            parent_id: None,
            machine_id: None,
        }
    }

    fn checkpoint(sequence: i64) -> Checkpoint {
        Checkpoint {
            task_id: "task_1".into(),
            sequence,
            attempt_id: "att_1".into(),
            fence: 1,
            body: CheckpointBody::default(),
            prev_digest: None,
            digest: format!("d{sequence}"),
            created_at: Utc.timestamp_millis_opt(sequence).unwrap(),
        }
    }

    fn event<T: Serialize>(cursor: i64, kind: EventKind, data: &T) -> Event {
        Event {
            cursor,
            task_id: "task_1".into(),
            kind,
            at: Utc.timestamp_millis_opt(cursor).unwrap(),
            data: serde_json::to_value(data).unwrap(),
        }
    }

    /// A batch with the same task changed several times, many checkpoints (more than one
    /// statement's worth) and a repeated one: the newest task wins, every checkpoint is there
    /// once, applying the batch again changes nothing, and an older batch does not move the
    /// cursor back.
    #[tokio::test]
    async fn a_batch_applies_in_order_once_and_the_cursor_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let m = Mirror::open(&dir.path().join("mirror.db")).await.unwrap();
        let mut events = vec![event(1, EventKind::TaskCreated, &task(1, "first"))];
        let n = (CHUNK as i64) * 2 + 10;
        for seq in 1..=n {
            events.push(event(
                1 + seq,
                EventKind::CheckpointAppended,
                &checkpoint(seq),
            ));
        }
        events.push(event(n + 2, EventKind::TaskUpdated, &task(2, "second")));
        events.push(event(n + 3, EventKind::CheckpointAppended, &checkpoint(3)));
        events.push(event(n + 4, EventKind::TaskUpdated, &task(3, "third")));
        m.apply(&events).await.unwrap();
        m.apply(&events).await.unwrap();
        m.apply(&events[1..5]).await.unwrap();

        let t = m.task("task_1").await.unwrap().unwrap();
        assert_eq!((t.title.as_str(), t.plan_revision), ("third", 3));
        let cps: Vec<Checkpoint> = m
            .list(
                "SELECT data FROM checkpoints WHERE task_id = ? ORDER BY sequence",
                "task_1",
            )
            .await
            .unwrap();
        assert_eq!(
            cps.iter().map(|c| c.sequence).collect::<Vec<_>>(),
            (1..=n).collect::<Vec<_>>()
        );
        assert_eq!(m.cursor().await.unwrap(), Some(n + 4));
    }

    /// Found by the `mirror_events` fuzz target: `replace_all` (and `apply` of a batch whose
    /// first event writes nothing) read before writing in a deferred transaction, so another
    /// writer made them fail at once with `database is locked` instead of waiting.
    #[tokio::test]
    async fn a_write_waits_for_another_writer_instead_of_failing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mirror.db");
        let mirror = Mirror::open(&path).await.unwrap();
        let other = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(SqliteConnectOptions::new().filename(&path))
            .await
            .unwrap();
        let noop = Event {
            cursor: 7,
            task_id: "task_1".into(),
            kind: EventKind::CommandApplied,
            at: chrono::Utc::now(),
            data: serde_json::json!({}),
        };
        for write in ["replace_all", "apply"] {
            let mut conn = other.acquire().await.unwrap();
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *conn)
                .await
                .unwrap();
            sqlx::query("INSERT INTO notified (key, at) VALUES (?, 0)")
                .bind(write)
                .execute(&mut *conn)
                .await
                .unwrap();
            let m = mirror.clone();
            let batch = vec![noop.clone()];
            let pending = tokio::spawn(async move {
                match write {
                    "replace_all" => m.replace_all(3, &[]).await,
                    _ => m.apply(&batch).await,
                }
            });
            tokio::time::sleep(Duration::from_millis(300)).await;
            sqlx::query("COMMIT").execute(&mut *conn).await.unwrap();
            pending
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{write}: {e}"));
        }
        assert_eq!(mirror.cursor().await.unwrap(), Some(7));
    }
}
