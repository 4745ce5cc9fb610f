//! One transaction on PostgreSQL: every `StoreTx` method as one or two statements. The crate
//! docs say which locks a method takes and why.

use std::sync::LazyLock;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::types::Json;
use sqlx::{Postgres, Transaction};
use tokio::sync::watch;
use waymark_store::*;

use crate::rows::*;
use crate::{CURSOR_LOCK, EVENTS_CHANNEL, MESSAGES_LOCK, advance};

type Q<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

pub(crate) struct PgTx {
    tx: Transaction<'static, Postgres>,
    /// `Some` in write transactions: the watch raised after a commit that appended events.
    notify: Option<watch::Sender<i64>>,
    /// Whether this transaction holds the cursor lock (taken by its first event).
    cursor_locked: bool,
    /// The newest cursor this transaction appended.
    appended: Option<i64>,
    /// The cursor a statement of this transaction already announced with `pg_notify`.
    notified: Option<i64>,
}

/// Maps a driver error to the store's vocabulary.
pub(crate) fn db_err(e: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &e {
        match db.code().as_deref() {
            // unique_violation
            Some("23505") => return StoreError::Conflict(db.message().to_owned()),
            // serialization_failure, deadlock_detected, lock_not_available, query_canceled
            // (lock_timeout and statement_timeout)
            Some("40001" | "40P01" | "55P03" | "57014") => {
                return StoreError::Busy(db.message().to_owned());
            }
            // disk_full, and the insufficient_resources class around it
            Some("53100") => return StoreError::Full(db.message().to_owned()),
            // io_error
            Some("58030") => return StoreError::Io(db.message().to_owned()),
            // untranslatable_character: JSONB refuses `\u0000` in strings
            Some("22P05") => {
                return StoreError::Backend(format!(
                    "PostgreSQL cannot store this value: {}",
                    db.message()
                ));
            }
            _ => {}
        }
    }
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Busy("timed out waiting for a database connection".into());
    }
    StoreError::Backend(e.to_string())
}

impl PgTx {
    pub(crate) fn new(
        tx: Transaction<'static, Postgres>,
        notify: Option<watch::Sender<i64>>,
    ) -> Self {
        PgTx {
            tx,
            notify,
            cursor_locked: false,
            appended: None,
            notified: None,
        }
    }

    /// Remembers the newest cursor this transaction appended (announced at commit).
    fn note_appended(&mut self, cursor: i64) {
        self.appended = Some(self.appended.map_or(cursor, |c| c.max(cursor)));
    }

    fn is_write(&self) -> bool {
        self.notify.is_some()
    }

    async fn one<'q, T>(&mut self, q: Q<'q>, map: fn(&PgRow) -> Result<T>) -> Result<Option<T>> {
        q.fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)?
            .as_ref()
            .map(map)
            .transpose()
    }

    async fn all<'q, T>(&mut self, q: Q<'q>, map: fn(&PgRow) -> Result<T>) -> Result<Vec<T>> {
        q.fetch_all(&mut *self.tx)
            .await
            .map_err(db_err)?
            .iter()
            .map(map)
            .collect()
    }

    async fn exec<'q>(&mut self, q: Q<'q>) -> Result<u64> {
        Ok(q.execute(&mut *self.tx)
            .await
            .map_err(db_err)?
            .rows_affected())
    }

    /// Runs an `INSERT … ON CONFLICT DO NOTHING`: a row not written met an existing key. Unlike
    /// a raised unique violation this leaves the transaction usable, as on SQLite.
    async fn insert<'q>(&mut self, what: &str, q: Q<'q>) -> Result<()> {
        match self.exec(q).await? {
            0 => Err(StoreError::Conflict(format!(
                "{what}: a row with the same key exists"
            ))),
            _ => Ok(()),
        }
    }

    async fn scalar(&mut self, sql: &'static str) -> Result<i64> {
        sqlx::query_scalar(sql)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }
}

#[async_trait]
impl StoreTx for PgTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let PgTx {
            mut tx,
            notify,
            appended,
            notified,
            ..
        } = *self;
        if let Some(cursor) = appended.filter(|c| notified != Some(*c)) {
            // Delivered to every listener when (and only if) the transaction commits.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(EVENTS_CHANNEL)
                .bind(cursor.to_string())
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        if let (Some(cursor), Some(notify)) = (appended, notify) {
            advance(&notify, cursor);
        }
        Ok(())
    }

    async fn insert_user(&mut self, u: &UserRow) -> Result<()> {
        self.insert(
            "users",
            sqlx::query(
                "INSERT INTO users (id, name, created_at) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&u.id)
            .bind(&u.name)
            .bind(u.created_at),
        )
        .await
    }

    async fn user_by_name(&mut self, name: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE name = $1").bind(name),
            user_row,
        )
        .await
    }

    async fn user_by_id(&mut self, id: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE id = $1").bind(id),
            user_row,
        )
        .await
    }

    async fn list_users(&mut self) -> Result<Vec<UserRow>> {
        self.all(sqlx::query("SELECT * FROM users ORDER BY name"), user_row)
            .await
    }

    async fn insert_token(&mut self, t: &TokenRow) -> Result<()> {
        self.insert(
            "tokens",
            sqlx::query(
                "INSERT INTO tokens (id, kind, name, user_id, secret_hash, created_at, revoked_at,
                   machine_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(&t.id)
            .bind(t.kind.as_str())
            .bind(&t.name)
            .bind(&t.user_id)
            .bind(&t.secret_hash)
            .bind(t.created_at)
            .bind(t.revoked_at)
            .bind(&t.machine_id),
        )
        .await
    }

    async fn token_by_hash(&mut self, hash: &str) -> Result<Option<TokenRow>> {
        self.one(
            sqlx::query("SELECT * FROM tokens WHERE secret_hash = $1").bind(hash),
            token_row,
        )
        .await
    }

    async fn list_tokens(&mut self, kind: TokenKind) -> Result<Vec<TokenRow>> {
        self.all(
            sqlx::query("SELECT * FROM tokens WHERE kind = $1 ORDER BY created_at, id")
                .bind(kind.as_str()),
            token_row,
        )
        .await
    }

    async fn revoke_token(&mut self, id: &str, at: i64) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                )
                .bind(at)
                .bind(id),
            )
            .await?;
        Ok(n == 1)
    }
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.insert(
            "tasks",
            sqlx::query(
                "INSERT INTO tasks (id, owner_id, title, goal, runtime, state, plan, plan_revision,
                   budget, usage, materials, session_id, fence, outcome_summary, created_at, updated_at, parent_id,
                   external_key, machine_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&t.id)
            .bind(&t.owner_id)
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(Json(&t.plan))
            .bind(t.plan_revision)
            .bind(Json(&t.budget))
            .bind(Json(&t.usage))
            .bind(Json(&t.materials))
            .bind(&t.session_id)
            .bind(t.fence)
            .bind(&t.outcome_summary)
            .bind(t.created_at)
            .bind(t.updated_at)
            .bind(&t.parent_id)
            .bind(&t.external_key)
            .bind(&t.machine_id),
        )
        .await
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        // In a write transaction the task row is locked until commit: every read-check-write
        // on a task (lease, fence, sequence, plan revision) serialises across replicas.
        let sql = if self.is_write() {
            "SELECT * FROM tasks WHERE id = $1 FOR UPDATE"
        } else {
            "SELECT * FROM tasks WHERE id = $1"
        };
        self.one(sqlx::query(sql).bind(id), task_row).await
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE tasks SET title = $1, goal = $2, runtime = $3, state = $4, plan = $5,
                   plan_revision = $6, budget = $7, usage = $8, materials = $9, fence = $10,
                   outcome_summary = $11, updated_at = $12, parent_id = $13
                 WHERE id = $14",
            )
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(Json(&t.plan))
            .bind(t.plan_revision)
            .bind(Json(&t.budget))
            .bind(Json(&t.usage))
            .bind(Json(&t.materials))
            .bind(t.fence)
            .bind(&t.outcome_summary)
            .bind(t.updated_at)
            .bind(&t.parent_id)
            .bind(&t.id),
        )
        .await
        .map(drop)
    }

    async fn task_by_external_key(
        &mut self,
        owner_id: &str,
        runtime: &str,
        key: &str,
    ) -> Result<Option<TaskRow>> {
        self.one(
            sqlx::query(
                "SELECT * FROM tasks WHERE owner_id = $1 AND runtime = $2 AND external_key = $3",
            )
            .bind(owner_id)
            .bind(runtime)
            .bind(key),
            task_row,
        )
        .await
    }

    async fn list_tasks(&mut self, owners: Option<&[String]>) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM tasks WHERE ($1::text[] IS NULL OR owner_id = ANY($1))
                 ORDER BY created_at DESC, id DESC",
            )
            .bind(owners),
            task_row,
        )
        .await
    }

    async fn insert_session(&mut self, s: &SessionRow) -> Result<()> {
        self.insert(
            "sessions",
            sqlx::query(
                "INSERT INTO sessions (id, task_id, parent_id, created_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&s.id)
            .bind(&s.task_id)
            .bind(&s.parent_id)
            .bind(s.created_at),
        )
        .await
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM sessions WHERE id = $1").bind(id),
            session_row,
        )
        .await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.insert(
            "attempts",
            sqlx::query(
                "INSERT INTO attempts (id, task_id, worker, fence, expires_at, state, manifest_digest,
                   started_at, ended_at, outcome, released)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT DO NOTHING",
            )
            .bind(&a.id)
            .bind(&a.task_id)
            .bind(&a.worker)
            .bind(a.fence)
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(&a.manifest_digest)
            .bind(a.started_at)
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(Json)),
        )
        .await
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(
            sqlx::query("SELECT * FROM attempts WHERE id = $1").bind(id),
            attempt_row,
        )
        .await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE attempts SET expires_at = $1, state = $2, ended_at = $3, outcome = $4,
                   released = $5
                 WHERE id = $6",
            )
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(Json))
            .bind(&a.id),
        )
        .await
        .map(drop)
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT a.* FROM attempts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.state = 'active' AND a.expires_at <= $1
                   AND t.state IN ({})
                 ORDER BY a.expires_at, a.id",
                TaskState::lease_sweepable_sql()
            )
        });
        self.all(sqlx::query(SQL.as_str()).bind(now_ms), attempt_row)
            .await
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(
            sqlx::query("SELECT * FROM attempts WHERE task_id = $1 ORDER BY fence").bind(task_id),
            attempt_row,
        )
        .await
    }

    async fn insert_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.insert(
            "checkpoints",
            sqlx::query(
                "INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
                   digest, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(&c.task_id)
            .bind(c.sequence)
            .bind(&c.attempt_id)
            .bind(c.fence)
            .bind(&c.body)
            .bind(&c.prev_digest)
            .bind(&c.digest)
            .bind(c.created_at),
        )
        .await
    }

    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>> {
        self.one(
            sqlx::query(
                "SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY sequence DESC LIMIT 1",
            )
            .bind(task_id),
            checkpoint_row,
        )
        .await
    }

    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        // Two statements instead of three. The task is locked by a statement of its own: under
        // READ COMMITTED a statement's snapshot is taken before it waits for a row lock, so a
        // chain head read in the locking statement could predate the append that held the
        // lock. The statement after it sees every commit made before the lock was granted.
        let Some(task) = self.task(task_id).await? else {
            return Ok(AppendContext::default());
        };
        let r = sqlx::query(
            "SELECT a.*, c.sequence AS c_sequence, c.digest AS c_digest
             FROM (SELECT 1) one
             LEFT JOIN attempts a ON a.id = $2
             LEFT JOIN LATERAL (SELECT sequence, digest FROM checkpoints WHERE task_id = $1
                                ORDER BY sequence DESC LIMIT 1) c ON true",
        )
        .bind(task_id)
        .bind(attempt_id)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)?;
        let attempt = match get::<Option<String>>(&r, "id")? {
            Some(_) => Some(attempt_row(&r)?),
            None => None,
        };
        let head = match get::<Option<i64>>(&r, "c_sequence")? {
            Some(sequence) => Some(ChainHead {
                sequence,
                digest: get(&r, "c_digest")?,
            }),
            None => None,
        };
        Ok(AppendContext {
            task: Some(task),
            attempt,
            head,
        })
    }

    async fn insert_checkpoint_with_event(
        &mut self,
        c: &CheckpointRow,
        e: &NewEvent,
    ) -> Result<i64> {
        // One round trip for what `insert_checkpoint`, `append_event` and the commit's
        // `pg_notify` make in four, three of them under the cursor lock. The event's row is
        // built from a join with the lock's row, so its cursor is drawn after the lock is held
        // (the crate docs, "Cursors become visible …"); a checkpoint that exists returns no
        // row from `cp`, and then no event is written. The notification is delivered at commit.
        let cursor: Option<i64> = sqlx::query_scalar(
            "WITH cp AS (
               INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
                 digest, created_at)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1),
             cursor_lock AS (SELECT pg_advisory_xact_lock($9) FROM cp),
             ev AS (
               INSERT INTO events (task_id, owner_id, kind, data, at)
               SELECT $10, $11, $12, $13, $14 FROM cursor_lock
               RETURNING cursor)
             SELECT ev.cursor FROM ev, LATERAL (SELECT pg_notify($15, ev.cursor::text)) n",
        )
        .bind(&c.task_id)
        .bind(c.sequence)
        .bind(&c.attempt_id)
        .bind(c.fence)
        .bind(&c.body)
        .bind(&c.prev_digest)
        .bind(&c.digest)
        .bind(c.created_at)
        .bind(CURSOR_LOCK)
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(&e.data)
        .bind(e.at)
        .bind(EVENTS_CHANNEL)
        .fetch_optional(&mut *self.tx)
        .await
        .map_err(db_err)?;
        let Some(cursor) = cursor else {
            return Err(StoreError::Conflict(
                "checkpoints: a row with the same key exists".into(),
            ));
        };
        self.cursor_locked = true;
        self.note_appended(cursor);
        self.notified = self.appended;
        Ok(cursor)
    }

    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>> {
        self.all(
            sqlx::query("SELECT * FROM checkpoints WHERE task_id = $1 ORDER BY sequence")
                .bind(task_id),
            checkpoint_row,
        )
        .await
    }

    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.insert(
            "effects",
            sqlx::query(
                "INSERT INTO effects (id, task_id, idempotency_key, body_digest, kind, step, resource_id,
                   intent, intent_digest, status, receipt, attempt_id, fence, created_at, updated_at, flag)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&e.id)
            .bind(&e.task_id)
            .bind(&e.idempotency_key)
            .bind(&e.body_digest)
            .bind(e.kind.as_str())
            .bind(&e.step)
            .bind(&e.resource_id)
            .bind(&e.intent)
            .bind(&e.intent_digest)
            .bind(e.status.as_str())
            .bind(&e.receipt)
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(&e.flag),
        )
        .await
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE id = $1").bind(id),
            effect_row,
        )
        .await
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE task_id = $1 AND idempotency_key = $2")
                .bind(task_id)
                .bind(key),
            effect_row,
        )
        .await
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE effects SET resource_id = $1, status = $2, receipt = $3, attempt_id = $4,
                   fence = $5, updated_at = $6, flag = $7, intent = $8, intent_digest = $9
                 WHERE id = $10",
            )
            .bind(&e.resource_id)
            .bind(e.status.as_str())
            .bind(&e.receipt)
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.updated_at)
            .bind(&e.flag)
            .bind(&e.intent)
            .bind(&e.intent_digest)
            .bind(&e.id),
        )
        .await
        .map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(
            sqlx::query("SELECT * FROM effects WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            effect_row,
        )
        .await
    }

    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.insert(
            "decisions",
            sqlx::query(
                "INSERT INTO decisions (id, task_id, kind, status, step, question, options,
                   default_option, intent, intent_digest, effect_id, plan_revision, risky, expires_at,
                   created_at, outcome, durability, delivery, editable, runtime_deadline,
                   escalation, escalate_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20,
                   $21, $22)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&d.id)
            .bind(&d.task_id)
            .bind(d.kind.as_str())
            .bind(d.status.as_str())
            .bind(&d.step)
            .bind(&d.question)
            .bind(Json(&d.options))
            .bind(&d.default_option)
            .bind(&d.intent)
            .bind(&d.intent_digest)
            .bind(&d.effect_id)
            .bind(d.plan_revision)
            .bind(d.risky)
            .bind(d.expires_at)
            .bind(d.created_at)
            .bind(d.outcome.as_ref().map(Json))
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.delivery.as_ref().map(Json))
            .bind(&d.editable)
            .bind(d.runtime_deadline.as_ref().map(Json))
            .bind(d.escalation.as_ref().map(Json))
            .bind(d.escalate_at),
        )
        .await
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(
            sqlx::query("SELECT * FROM decisions WHERE id = $1").bind(id),
            decision_row,
        )
        .await
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE decisions SET status = $1, expires_at = $2, outcome = $3, delivery = $4,
                   escalation = $5, escalate_at = $6, durability = $7, runtime_deadline = $8
                 WHERE id = $9",
            )
            .bind(d.status.as_str())
            .bind(d.expires_at)
            .bind(d.outcome.as_ref().map(Json))
            .bind(d.delivery.as_ref().map(Json))
            .bind(d.escalation.as_ref().map(Json))
            .bind(d.escalate_at)
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.runtime_deadline.as_ref().map(Json))
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query("SELECT * FROM decisions WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            decision_row,
        )
        .await
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND expires_at <= $1
                 ORDER BY expires_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn due_escalations(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND escalate_at <= $1
                 ORDER BY escalate_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>> {
        let value: Option<Value> =
            sqlx::query_scalar("SELECT policy FROM escalation_policies WHERE user_id = $1")
                .bind(user_id)
                .fetch_optional(&mut *self.tx)
                .await
                .map_err(db_err)?;
        value
            .map(|v| decode_json_value("escalation_policies.policy", v))
            .transpose()
    }

    async fn put_escalation_policy(
        &mut self,
        user_id: &str,
        policy: &EscalationPolicy,
        now_ms: i64,
    ) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO escalation_policies (user_id, policy, updated_at) VALUES ($1, $2, $3)
                 ON CONFLICT (user_id) DO UPDATE SET policy = excluded.policy,
                   updated_at = excluded.updated_at",
            )
            .bind(user_id)
            .bind(Json(policy))
            .bind(now_ms),
        )
        .await
        .map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        self.exec(sqlx::query("DELETE FROM escalation_policies WHERE user_id = $1").bind(user_id))
            .await
            .map(|n| n > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO delegations (owner_id, delegate_id, created_at, accepted_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(&d.owner_id)
            .bind(&d.delegate_id)
            .bind(d.created_at)
            .bind(d.accepted_at),
        )
        .await
        .map(drop)
    }

    async fn accept_delegation(
        &mut self,
        owner_id: &str,
        delegate_id: &str,
        at: i64,
    ) -> Result<bool> {
        self.exec(
            sqlx::query(
                "UPDATE delegations SET accepted_at = $1
                 WHERE owner_id = $2 AND delegate_id = $3 AND accepted_at IS NULL",
            )
            .bind(at)
            .bind(owner_id)
            .bind(delegate_id),
        )
        .await
        .map(|n| n > 0)
    }

    async fn delete_delegation(&mut self, owner_id: &str, delegate_id: &str) -> Result<bool> {
        self.exec(
            sqlx::query("DELETE FROM delegations WHERE owner_id = $1 AND delegate_id = $2")
                .bind(owner_id)
                .bind(delegate_id),
        )
        .await
        .map(|n| n > 0)
    }

    async fn delegations(
        &mut self,
        owner_id: Option<&str>,
        delegate_id: Option<&str>,
    ) -> Result<Vec<DelegationRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM delegations WHERE ($1::text IS NULL OR owner_id = $1)
                   AND ($2::text IS NULL OR delegate_id = $2)
                 ORDER BY created_at, owner_id, delegate_id",
            )
            .bind(owner_id)
            .bind(delegate_id),
            delegation_row,
        )
        .await
    }

    async fn pending_decision_count(&mut self, task_id: &str) -> Result<i64> {
        sqlx::query_scalar(
            "SELECT COUNT(*) FROM decisions WHERE task_id = $1 AND status = 'pending'",
        )
        .bind(task_id)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
    }

    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO blobs (sha256, size, data) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            )
            .bind(sha256)
            .bind(data.len() as i64)
            .bind(data),
        )
        .await
        .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.insert(
            "artifacts",
            sqlx::query(
                "INSERT INTO artifacts (id, task_id, sha256, name, media_type, size, step, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(&a.id)
            .bind(&a.task_id)
            .bind(&a.sha256)
            .bind(&a.name)
            .bind(&a.media_type)
            .bind(a.size)
            .bind(&a.step)
            .bind(a.created_at),
        )
        .await
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sqlx::query("SELECT * FROM artifacts WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            artifact_row,
        )
        .await
    }

    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM artifacts a JOIN tasks t ON t.id = a.task_id
                            WHERE a.sha256 = $1 AND ($2::text[] IS NULL OR t.owner_id = ANY($2)))",
        )
        .bind(sha256)
        .bind(owners)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
    }

    async fn insert_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.insert(
            "test_receipts",
            sqlx::query(
                "INSERT INTO test_receipts (id, task_id, step, command, exit_code, commit_id, totals,
                   failures, duration_seconds, passed, junit_sha256, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT DO NOTHING",
            )
            .bind(&r.id)
            .bind(&r.task_id)
            .bind(&r.step)
            .bind(&r.command)
            .bind(r.exit_code)
            .bind(&r.commit)
            .bind(&r.totals)
            .bind(&r.failures)
            .bind(r.duration_seconds)
            .bind(r.passed)
            .bind(&r.junit_sha256)
            .bind(r.created_at),
        )
        .await
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(
            sqlx::query("SELECT * FROM test_receipts WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            receipt_row,
        )
        .await
    }

    async fn insert_message(&mut self, m: &MessageRow) -> Result<i64> {
        // The session lock is taken in its own statement, before the one that reads MAX(seq):
        // at READ COMMITTED that statement's snapshot then includes the previous holder's row.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(MESSAGES_LOCK)
            .bind(&m.session_id)
            .execute(&mut *self.tx)
            .await
            .map_err(db_err)?;
        sqlx::query_scalar(
            "INSERT INTO messages (session_id, seq, task_id, role, text, created_at)
             VALUES ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = $1),
                     $2, $3, $4, $5)
             RETURNING seq",
        )
        .bind(&m.session_id)
        .bind(&m.task_id)
        .bind(&m.role)
        .bind(&m.text)
        .bind(m.created_at)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)
    }

    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>> {
        self.all(
            sqlx::query("SELECT * FROM messages WHERE session_id = $1 ORDER BY seq")
                .bind(session_id),
            message_row,
        )
        .await
    }

    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        if !self.cursor_locked {
            // Held to commit: event-writing transactions draw cursors and commit one at a time,
            // so cursors become visible in order (crate docs, "Cursors become visible …").
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(CURSOR_LOCK)
                .execute(&mut *self.tx)
                .await
                .map_err(db_err)?;
            self.cursor_locked = true;
        }
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO events (task_id, owner_id, kind, data, at) VALUES ($1, $2, $3, $4, $5)
             RETURNING cursor",
        )
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(&e.data)
        .bind(e.at)
        .fetch_one(&mut *self.tx)
        .await
        .map_err(db_err)?;
        self.note_appended(cursor);
        Ok(cursor)
    }

    async fn events_after(
        &mut self,
        cursor: i64,
        limit: i64,
        owners: Option<&[String]>,
    ) -> Result<Vec<EventRow>> {
        match owners {
            Some([o]) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM events WHERE owner_id = $1 AND cursor > $2
                         ORDER BY cursor LIMIT $3",
                    )
                    .bind(o)
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            // A delegate's view: several owners, merged by cursor.
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM events WHERE owner_id = ANY($1) AND cursor > $2
                         ORDER BY cursor LIMIT $3",
                    )
                    .bind(os)
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM events WHERE cursor > $1 ORDER BY cursor LIMIT $2")
                        .bind(cursor)
                        .bind(limit),
                    event_row,
                )
                .await
            }
        }
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The pruned mark remembers the newest cursor even after pruning deleted it.
        self.scalar(
            "SELECT GREATEST(COALESCE((SELECT MAX(cursor) FROM events), 0),
                             (SELECT pruned_through FROM event_retention WHERE id = 1))",
        )
        .await
    }

    async fn pruned_through(&mut self) -> Result<i64> {
        self.scalar("SELECT pruned_through FROM event_retention WHERE id = 1")
            .await
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self
            .exec(sqlx::query("DELETE FROM events WHERE cursor <= $1").bind(cursor))
            .await?;
        self.exec(
            sqlx::query(
                "UPDATE event_retention SET pruned_through = GREATEST(pruned_through, $1)
                 WHERE id = 1",
            )
            .bind(cursor),
        )
        .await?;
        Ok(n)
    }

    async fn insert_audit(&mut self, a: &AuditRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO audit (at, actor, action, task_id, code, detail)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(a.at)
            .bind(&a.actor)
            .bind(&a.action)
            .bind(&a.task_id)
            .bind(&a.code)
            .bind(&a.detail),
        )
        .await
        .map(drop)
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self
            .exec(sqlx::query("DELETE FROM audit WHERE at < $1").bind(before))
            .await?;
        let over = self
            .exec(
                sqlx::query(
                    "DELETE FROM audit WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - $1",
                )
                .bind(keep.max(0)),
            )
            .await?;
        Ok(old + over)
    }

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM audit WHERE ($1::text IS NULL OR task_id = $1)
                 ORDER BY id DESC LIMIT $2",
            )
            .bind(task_id)
            .bind(limit),
            audit_row,
        )
        .await
    }

    async fn insert_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.insert(
            "devices",
            sqlx::query(
                "INSERT INTO devices (id, user_id, name, public_key, scopes, created_at, revoked_at,
                   last_seen_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(&d.id)
            .bind(&d.user_id)
            .bind(&d.name)
            .bind(&d.public_key)
            .bind(Json(&d.scopes))
            .bind(d.created_at)
            .bind(d.revoked_at)
            .bind(d.last_seen_at),
        )
        .await
    }

    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>> {
        self.one(
            sqlx::query("SELECT * FROM devices WHERE id = $1").bind(id),
            device_row,
        )
        .await
    }

    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM devices WHERE ($1::text IS NULL OR user_id = $1)
                 ORDER BY created_at, id",
            )
            .bind(user_id),
            device_row,
        )
        .await
    }

    async fn update_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE devices SET name = $1, scopes = $2, revoked_at = $3, last_seen_at = $4
                 WHERE id = $5",
            )
            .bind(&d.name)
            .bind(Json(&d.scopes))
            .bind(d.revoked_at)
            .bind(d.last_seen_at)
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn insert_delivery(&mut self, d: &DeliveryRow) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "INSERT INTO deliveries (decision_id, device_id, step, at, detail)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                )
                .bind(&d.decision_id)
                .bind(&d.device_id)
                .bind(d.step.as_str())
                .bind(d.at)
                .bind(&d.detail),
            )
            .await?;
        Ok(n == 1)
    }

    async fn deliveries(&mut self, decision_ids: &[String]) -> Result<Vec<DeliveryRow>> {
        if decision_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.all(
            sqlx::query(
                "SELECT * FROM deliveries WHERE decision_id = ANY($1) ORDER BY at, device_id, step",
            )
            .bind(decision_ids),
            delivery_row,
        )
        .await
    }

    async fn insert_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.insert(
            "pairing_codes",
            sqlx::query(
                "INSERT INTO pairing_codes (code_hash, user_id, scopes, created_at, expires_at,
                   used_at, device_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            )
            .bind(&p.code_hash)
            .bind(&p.user_id)
            .bind(Json(&p.scopes))
            .bind(p.created_at)
            .bind(p.expires_at)
            .bind(p.used_at)
            .bind(&p.device_id),
        )
        .await
    }

    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>> {
        self.one(
            sqlx::query("SELECT * FROM pairing_codes WHERE code_hash = $1").bind(code_hash),
            pairing_row,
        )
        .await
    }

    async fn update_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE pairing_codes SET used_at = $1, device_id = $2 WHERE code_hash = $3",
            )
            .bind(p.used_at)
            .bind(&p.device_id)
            .bind(&p.code_hash),
        )
        .await
        .map(drop)
    }

    async fn insert_device_session(&mut self, d: &DeviceSessionRow) -> Result<()> {
        self.insert(
            "device_sessions",
            sqlx::query(
                "INSERT INTO device_sessions (token_hash, device_id, created_at, expires_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(&d.token_hash)
            .bind(&d.device_id)
            .bind(d.created_at)
            .bind(d.expires_at),
        )
        .await
    }

    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM device_sessions WHERE token_hash = $1").bind(token_hash),
            device_session_row,
        )
        .await
    }

    async fn insert_command(&mut self, c: &CommandRow) -> Result<()> {
        self.insert(
            "commands",
            sqlx::query(
                "INSERT INTO commands (command_id, task_id, device_id, body_digest, operation,
                   envelope, status, result, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(&c.device_id)
            .bind(&c.body_digest)
            .bind(c.operation.as_str())
            .bind(&c.envelope)
            .bind(c.status.as_str())
            .bind(&c.result)
            .bind(c.created_at),
        )
        .await
    }

    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>> {
        self.one(
            sqlx::query("SELECT * FROM commands WHERE command_id = $1").bind(command_id),
            command_row,
        )
        .await
    }

    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM commands WHERE task_id = $1 ORDER BY created_at, command_id",
            )
            .bind(task_id),
            command_row,
        )
        .await
    }

    async fn insert_control(&mut self, c: &ControlRow) -> Result<i64> {
        // The task's row is locked by this transaction (`task()` is FOR UPDATE), so
        // MAX + 1 cannot race another replica.
        self.one(
            sqlx::query(
                "INSERT INTO control_commands (command_id, task_id, operation, args, plan_revision,
                   applied_at, acknowledged_at, acknowledged_by, seq)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
                   (SELECT COALESCE(MAX(seq), 0) + 1 FROM control_commands WHERE task_id = $2))
                 ON CONFLICT DO NOTHING RETURNING seq",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(c.operation.as_str())
            .bind(&c.args)
            .bind(c.plan_revision)
            .bind(c.applied_at)
            .bind(c.acknowledged_at)
            .bind(&c.acknowledged_by),
            |r| get(r, "seq"),
        )
        .await?
        .ok_or_else(|| {
            StoreError::Conflict("control_commands: a row with the same key exists".into())
        })
    }

    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM control_commands WHERE task_id = $1 AND acknowledged_at IS NULL
                 ORDER BY seq",
            )
            .bind(task_id),
            control_row,
        )
        .await
    }

    async fn insert_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO followups (id, task_id, schedule, time_zone, catch_up, message, state,
                   next_run_at, last_run_at, runs, missed, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(&f.id)
            .bind(&f.task_id)
            .bind(&f.schedule)
            .bind(&f.time_zone)
            .bind(f.catch_up.as_str())
            .bind(&f.message)
            .bind(f.state.as_str())
            .bind(f.next_run_at)
            .bind(f.last_run_at)
            .bind(f.runs)
            .bind(f.missed)
            .bind(f.created_at),
        )
        .await
        .map(drop)
    }

    async fn followup(&mut self, id: &str) -> Result<Option<FollowupRow>> {
        self.one(
            sqlx::query("SELECT * FROM followups WHERE id = $1").bind(id),
            followup_row,
        )
        .await
    }

    async fn update_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE followups SET state = $1, next_run_at = $2, last_run_at = $3, runs = $4,
                   missed = $5
                 WHERE id = $6",
            )
            .bind(f.state.as_str())
            .bind(f.next_run_at)
            .bind(f.last_run_at)
            .bind(f.runs)
            .bind(f.missed)
            .bind(&f.id),
        )
        .await
        .map(drop)
    }

    async fn due_followups(&mut self, now_ms: i64) -> Result<Vec<FollowupRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM followups WHERE state = 'active' AND next_run_at <= $1
                 ORDER BY next_run_at, id",
            )
            .bind(now_ms),
            followup_row,
        )
        .await
    }

    async fn list_followups(&mut self, task_id: &str) -> Result<Vec<FollowupRow>> {
        self.all(
            sqlx::query("SELECT * FROM followups WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            followup_row,
        )
        .await
    }

    async fn insert_followup_run(
        &mut self,
        followup_id: &str,
        nominal_at: i64,
        ran_at: i64,
        missed: i64,
    ) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "INSERT INTO followup_runs (followup_id, nominal_at, ran_at, missed)
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(followup_id)
                .bind(nominal_at)
                .bind(ran_at)
                .bind(missed),
            )
            .await?;
        Ok(n == 1)
    }

    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.insert(
            "machines",
            sqlx::query(
                "INSERT INTO machines (id, owner_id, name, info, registered_at, last_seen_at, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
            )
            .bind(&m.id)
            .bind(&m.owner_id)
            .bind(&m.name)
            .bind(&m.info)
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(m.created_at),
        )
        .await
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE id = $1").bind(id),
            machine_row,
        )
        .await
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE owner_id = $1 AND name = $2")
                .bind(owner_id)
                .bind(name),
            machine_row,
        )
        .await
    }

    async fn list_machines(&mut self, owners: Option<&[String]>) -> Result<Vec<MachineRow>> {
        match owners {
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM machines WHERE owner_id = ANY($1)
                         ORDER BY name, id",
                    )
                    .bind(os),
                    machine_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM machines ORDER BY name, id"),
                    machine_row,
                )
                .await
            }
        }
    }

    async fn update_machine(&mut self, m: &MachineRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machines SET info = $1, registered_at = $2, last_seen_at = $3 WHERE id = $4",
            )
            .bind(&m.info)
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(&m.id),
        )
        .await
        .map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query("SELECT * FROM tasks WHERE machine_id = $1 ORDER BY created_at, id")
                .bind(machine_id),
            task_row,
        )
        .await
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.insert(
            "machine_work",
            sqlx::query(
                "INSERT INTO machine_work (id, machine_id, task_id, kind, args, state, detail,
                   created_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            )
            .bind(&w.id)
            .bind(&w.machine_id)
            .bind(&w.task_id)
            .bind(w.kind.as_str())
            .bind(&w.args)
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.created_at)
            .bind(w.updated_at),
        )
        .await
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(
            sqlx::query("SELECT * FROM machine_work WHERE id = $1").bind(id),
            work_row,
        )
        .await
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machine_work SET state = $1, detail = $2, updated_at = $3 WHERE id = $4",
            )
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.updated_at)
            .bind(&w.id),
        )
        .await
        .map(drop)
    }

    async fn open_work(&mut self, machine_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM machine_work WHERE machine_id = $1 AND state IN ('pending', 'taken')
                 ORDER BY created_at, id",
            )
            .bind(machine_id),
            work_row,
        )
        .await
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query("SELECT * FROM machine_work WHERE task_id = $1 ORDER BY created_at, id")
                .bind(task_id),
            work_row,
        )
        .await
    }

    async fn insert_rule(&mut self, r: &RuleRow) -> Result<()> {
        self.insert(
            "rules",
            sqlx::query(
                "INSERT INTO rules (id, owner_id, device_id, command_id, spec, digest, answer,
                   created_at, expires_at, revoked_at, revoked_by, uses, last_used_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&r.id)
            .bind(&r.owner_id)
            .bind(&r.device_id)
            .bind(&r.command_id)
            .bind(&r.spec)
            .bind(&r.digest)
            .bind(r.answer.as_str())
            .bind(r.created_at)
            .bind(r.expires_at)
            .bind(r.revoked_at)
            .bind(&r.revoked_by)
            .bind(r.uses)
            .bind(r.last_used_at),
        )
        .await
    }

    async fn rule(&mut self, id: &str) -> Result<Option<RuleRow>> {
        self.one(
            sqlx::query("SELECT * FROM rules WHERE id = $1").bind(id),
            rule_row,
        )
        .await
    }

    async fn list_rules(
        &mut self,
        owner_id: &str,
        live_at: Option<i64>,
        limit: i64,
    ) -> Result<Vec<RuleRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM rules WHERE owner_id = $1
                   AND ($2::bigint IS NULL OR (revoked_at IS NULL AND expires_at > $2))
                 ORDER BY created_at DESC, id DESC LIMIT $3",
            )
            .bind(owner_id)
            .bind(live_at)
            .bind(limit),
            rule_row,
        )
        .await
    }

    async fn revoke_rule(&mut self, id: &str, at: i64, device_id: &str) -> Result<bool> {
        Ok(self
            .exec(
                sqlx::query(
                    "UPDATE rules SET revoked_at = $1, revoked_by = $2 WHERE id = $3 AND revoked_at IS NULL",
                )
                .bind(at)
                .bind(device_id)
                .bind(id),
            )
            .await?
            == 1)
    }

    async fn count_rule_use(&mut self, id: &str, at: i64) -> Result<()> {
        self.exec(
            sqlx::query("UPDATE rules SET uses = uses + 1, last_used_at = $1 WHERE id = $2")
                .bind(at)
                .bind(id),
        )
        .await
        .map(drop)
    }

    async fn insert_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO push_channels (id, device_id, user_id, kind, endpoint, p256dh, auth, cursor,
                   attempts, delivered, failures, consecutive_failures, last_error, last_attempt_at,
                   next_attempt_at, created_at, revoked_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)",
            )
            .bind(&c.id)
            .bind(&c.device_id)
            .bind(&c.user_id)
            .bind(c.kind.as_str())
            .bind(&c.endpoint)
            .bind(&c.p256dh)
            .bind(&c.auth)
            .bind(c.cursor)
            .bind(c.attempts)
            .bind(c.delivered)
            .bind(c.failures)
            .bind(c.consecutive_failures)
            .bind(&c.last_error)
            .bind(c.last_attempt_at)
            .bind(c.next_attempt_at)
            .bind(c.created_at)
            .bind(c.revoked_at),
        )
        .await
        .map(drop)
    }

    async fn push_channels(&mut self, device_id: Option<&str>) -> Result<Vec<PushChannelRow>> {
        match device_id {
            Some(d) => {
                self.all(
                    sqlx::query("SELECT * FROM push_channels WHERE device_id = $1 ORDER BY created_at, id").bind(d),
                    push_channel_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM push_channels WHERE revoked_at IS NULL ORDER BY created_at, id"),
                    push_channel_row,
                )
                .await
            }
        }
    }

    async fn update_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE push_channels SET cursor = $1, attempts = $2, delivered = $3, failures = $4,
                   consecutive_failures = $5, last_error = $6, last_attempt_at = $7, next_attempt_at = $8,
                   revoked_at = $9
                 WHERE id = $10",
            )
            .bind(c.cursor)
            .bind(c.attempts)
            .bind(c.delivered)
            .bind(c.failures)
            .bind(c.consecutive_failures)
            .bind(&c.last_error)
            .bind(c.last_attempt_at)
            .bind(c.next_attempt_at)
            .bind(c.revoked_at)
            .bind(&c.id),
        )
        .await
        .map(drop)
    }

    async fn server_secret(&mut self, name: &str) -> Result<Option<String>> {
        sqlx::query_scalar("SELECT value FROM server_secrets WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()> {
        self.exec(
            sqlx::query("INSERT INTO server_secrets (name, value) VALUES ($1, $2)")
                .bind(name)
                .bind(value),
        )
        .await
        .map(drop)
    }

    async fn try_claim(&mut self, job: &str) -> Result<bool> {
        // A transaction-scoped advisory lock: released at commit or rollback, so a replica that
        // dies mid-job frees it at once.
        sqlx::query_scalar("SELECT pg_try_advisory_xact_lock(hashtext('waymark-job:' || $1))")
            .bind(job)
            .fetch_one(&mut *self.tx)
            .await
            .map_err(db_err)
    }

    async fn ack_control(
        &mut self,
        task_id: &str,
        command_id: &str,
        at: i64,
        attempt_id: &str,
    ) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "UPDATE control_commands SET acknowledged_at = $1, acknowledged_by = $2
                     WHERE task_id = $3 AND command_id = $4 AND acknowledged_at IS NULL",
                )
                .bind(at)
                .bind(attempt_id)
                .bind(task_id)
                .bind(command_id),
            )
            .await?;
        Ok(n == 1)
    }
}
