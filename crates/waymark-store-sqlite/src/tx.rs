//! One transaction on SQLite: every `StoreTx` method as one or two statements, on a read-only
//! reader (a snapshot) or as a member of the writer's current group.

use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::sqlite::SqliteRow;
use sqlx::{Sqlite, SqliteConnection, Transaction};
use waymark_store::*;

use crate::group;
use crate::rows::*;

pub(crate) struct SqliteTx {
    pub(crate) tx: Tx,
    /// The newest event cursor this transaction appended.
    pub(crate) appended: Option<i64>,
}

pub(crate) enum Tx {
    /// A snapshot on a reader connection.
    Read(Transaction<'static, Sqlite>),
    /// A savepoint on the writer connection, committed in a group.
    Write(group::Member),
}

pub(crate) type Q<'q> = sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

impl SqliteTx {
    fn db(&mut self) -> &mut SqliteConnection {
        match &mut self.tx {
            Tx::Read(tx) => tx,
            Tx::Write(member) => member.db(),
        }
    }

    async fn one<'q, T>(
        &mut self,
        q: Q<'q>,
        map: fn(&SqliteRow) -> Result<T>,
    ) -> Result<Option<T>> {
        q.fetch_optional(self.db())
            .await
            .map_err(backend)?
            .as_ref()
            .map(map)
            .transpose()
    }

    async fn all<'q, T>(&mut self, q: Q<'q>, map: fn(&SqliteRow) -> Result<T>) -> Result<Vec<T>> {
        q.fetch_all(self.db())
            .await
            .map_err(backend)?
            .iter()
            .map(map)
            .collect()
    }

    async fn exec<'q>(&mut self, q: Q<'q>) -> Result<u64> {
        Ok(q.execute(self.db()).await.map_err(backend)?.rows_affected())
    }
}

#[async_trait]
impl StoreTx for SqliteTx {
    async fn commit(self: Box<Self>) -> Result<()> {
        let SqliteTx { tx, appended } = *self;
        match tx {
            Tx::Read(tx) => tx.commit().await.map_err(backend),
            // Returns once the group's COMMIT made it durable; the cursor watch moved then.
            Tx::Write(member) => member.commit(appended).await,
        }
    }

    async fn insert_user(&mut self, u: &UserRow) -> Result<()> {
        self.exec(
            sqlx::query("INSERT INTO users (id, name, created_at) VALUES (?, ?, ?)")
                .bind(&u.id)
                .bind(&u.name)
                .bind(u.created_at),
        )
        .await
        .map(drop)
    }

    async fn user_by_name(&mut self, name: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE name = ?").bind(name),
            user_row,
        )
        .await
    }

    async fn user_by_id(&mut self, id: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE id = ?").bind(id),
            user_row,
        )
        .await
    }

    async fn list_users(&mut self) -> Result<Vec<UserRow>> {
        self.all(sqlx::query("SELECT * FROM users ORDER BY name"), user_row)
            .await
    }

    async fn insert_token(&mut self, t: &TokenRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO tokens (id, kind, name, user_id, secret_hash, created_at, revoked_at,
                   machine_id)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
        .map(drop)
    }

    async fn token_by_hash(&mut self, hash: &str) -> Result<Option<TokenRow>> {
        self.one(
            sqlx::query("SELECT * FROM tokens WHERE secret_hash = ?").bind(hash),
            token_row,
        )
        .await
    }

    async fn list_tokens(&mut self, kind: TokenKind) -> Result<Vec<TokenRow>> {
        self.all(
            sqlx::query("SELECT * FROM tokens WHERE kind = ? ORDER BY created_at, id")
                .bind(kind.as_str()),
            token_row,
        )
        .await
    }

    async fn revoke_token(&mut self, id: &str, at: i64) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query("UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL")
                    .bind(at)
                    .bind(id),
            )
            .await?;
        Ok(n == 1)
    }
    async fn insert_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO tasks (id, owner_id, title, goal, runtime, state, plan, plan_revision,
                   budget, usage, materials, session_id, fence, outcome_summary, created_at, updated_at, parent_id,
                   external_key, machine_id)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&t.id)
            .bind(&t.owner_id)
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(json_text(&t.plan))
            .bind(t.plan_revision)
            .bind(json_text(&t.budget))
            .bind(json_text(&t.usage))
            .bind(json_text(&t.materials))
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
        .map(drop)
    }

    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>> {
        self.one(
            sqlx::query("SELECT * FROM tasks WHERE id = ?").bind(id),
            task_row,
        )
        .await
    }

    async fn update_task(&mut self, t: &TaskRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE tasks SET title = ?, goal = ?, runtime = ?, state = ?, plan = ?,
                   plan_revision = ?, budget = ?, usage = ?, materials = ?, fence = ?,
                   outcome_summary = ?, updated_at = ?, parent_id = ?
                 WHERE id = ?",
            )
            .bind(&t.title)
            .bind(&t.goal)
            .bind(&t.runtime)
            .bind(t.state.as_str())
            .bind(json_text(&t.plan))
            .bind(t.plan_revision)
            .bind(json_text(&t.budget))
            .bind(json_text(&t.usage))
            .bind(json_text(&t.materials))
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
                "SELECT * FROM tasks WHERE owner_id = ? AND runtime = ? AND external_key = ?",
            )
            .bind(owner_id)
            .bind(runtime)
            .bind(key),
            task_row,
        )
        .await
    }

    async fn list_tasks(&mut self, owners: Option<&[String]>) -> Result<Vec<TaskRow>> {
        match owners {
            Some([o]) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM tasks WHERE owner_id = ? ORDER BY created_at DESC, id DESC",
                    )
                    .bind(o),
                    task_row,
                )
                .await
            }
            Some(os) => {
                self.all(
                    sqlx::query(
                        "SELECT * FROM tasks WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY created_at DESC, id DESC",
                    )
                    .bind(json_list(os)),
                    task_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM tasks ORDER BY created_at DESC, id DESC"),
                    task_row,
                )
                .await
            }
        }
    }

    async fn insert_session(&mut self, s: &SessionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO sessions (id, task_id, parent_id, created_at) VALUES (?, ?, ?, ?)",
            )
            .bind(&s.id)
            .bind(&s.task_id)
            .bind(&s.parent_id)
            .bind(s.created_at),
        )
        .await
        .map(drop)
    }

    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM sessions WHERE id = ?").bind(id),
            session_row,
        )
        .await
    }

    async fn insert_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO attempts (id, task_id, worker, fence, expires_at, state, manifest_digest,
                   started_at, ended_at, outcome, released)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            .bind(a.released.as_ref().map(json_text)),
        )
        .await
        .map(drop)
    }

    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>> {
        self.one(
            sqlx::query("SELECT * FROM attempts WHERE id = ?").bind(id),
            attempt_row,
        )
        .await
    }

    async fn update_attempt(&mut self, a: &AttemptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE attempts SET expires_at = ?, state = ?, ended_at = ?, outcome = ?, released = ?
                 WHERE id = ?",
            )
            .bind(a.expires_at)
            .bind(a.state.as_str())
            .bind(a.ended_at)
            .bind(a.outcome.map(|x| x.as_str()))
            .bind(a.released.as_ref().map(json_text))
            .bind(&a.id),
        )
        .await
        .map(drop)
    }

    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>> {
        self.all(
            sqlx::query("SELECT * FROM attempts WHERE task_id = ? ORDER BY fence").bind(task_id),
            attempt_row,
        )
        .await
    }

    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>> {
        static SQL: LazyLock<String> = LazyLock::new(|| {
            format!(
                "SELECT a.* FROM attempts a JOIN tasks t ON t.id = a.task_id
                 WHERE a.state = 'active' AND a.expires_at <= ?
                   AND t.state IN ({})
                 ORDER BY a.expires_at, a.id",
                TaskState::lease_sweepable_sql()
            )
        });
        self.all(sqlx::query(SQL.as_str()).bind(now_ms), attempt_row)
            .await
    }

    async fn insert_checkpoint(&mut self, c: &CheckpointRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
                   digest, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.task_id)
            .bind(c.sequence)
            .bind(&c.attempt_id)
            .bind(c.fence)
            .bind(json_text(&c.body))
            .bind(&c.prev_digest)
            .bind(&c.digest)
            .bind(c.created_at),
        )
        .await
        .map(drop)
    }

    async fn insert_checkpoint_with_event(
        &mut self,
        c: &CheckpointRow,
        e: &NewEvent,
    ) -> Result<i64> {
        // Both statements in one query, so one round trip to the connection's thread while
        // the writer is held. SQLite runs them in order and stops at the first error: a
        // checkpoint that exists fails the first (`Conflict`) and no event is written. The
        // event's `RETURNING` row is the query's only row. (The column lists are those of
        // `insert_checkpoint` and `append_event`.)
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO checkpoints (task_id, sequence, attempt_id, fence, body, prev_digest,
               digest, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?);
             INSERT INTO events (task_id, owner_id, kind, data, at) VALUES (?, ?, ?, ?, ?)
             RETURNING cursor",
        )
        .bind(&c.task_id)
        .bind(c.sequence)
        .bind(&c.attempt_id)
        .bind(c.fence)
        .bind(json_text(&c.body))
        .bind(&c.prev_digest)
        .bind(&c.digest)
        .bind(c.created_at)
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(json_text(&e.data))
        .bind(e.at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        self.appended = Some(cursor);
        Ok(cursor)
    }

    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>> {
        self.one(
            sqlx::query(
                "SELECT * FROM checkpoints WHERE task_id = ? ORDER BY sequence DESC LIMIT 1",
            )
            .bind(task_id),
            checkpoint_row,
        )
        .await
    }

    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        // One statement instead of three: on the writer, every statement is a round trip to
        // the connection's thread made while the connection is held.
        let row = sqlx::query(
            "SELECT t.*,
               a.id AS a_id, a.task_id AS a_task_id, a.worker AS a_worker, a.fence AS a_fence,
               a.expires_at AS a_expires_at, a.state AS a_state,
               a.manifest_digest AS a_manifest_digest, a.started_at AS a_started_at,
               a.ended_at AS a_ended_at, a.outcome AS a_outcome, a.released AS a_released,
               c.sequence AS c_sequence, c.digest AS c_digest
             FROM tasks t
             LEFT JOIN attempts a ON a.id = ?2
             LEFT JOIN (SELECT sequence, digest FROM checkpoints WHERE task_id = ?1
                        ORDER BY sequence DESC LIMIT 1) c ON 1
             WHERE t.id = ?1",
        )
        .bind(task_id)
        .bind(attempt_id)
        .fetch_optional(self.db())
        .await
        .map_err(backend)?;
        let Some(r) = row else {
            return Ok(AppendContext::default());
        };
        let attempt = match get::<Option<String>>(&r, "a_id")? {
            Some(_) => Some(attempt_at(&r, "a_")?),
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
            task: Some(task_row(&r)?),
            attempt,
            head,
        })
    }

    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>> {
        self.all(
            sqlx::query("SELECT * FROM checkpoints WHERE task_id = ? ORDER BY sequence")
                .bind(task_id),
            checkpoint_row,
        )
        .await
    }

    async fn insert_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO effects (id, task_id, idempotency_key, body_digest, kind, step, resource_id,
                   intent, intent_digest, status, receipt, attempt_id, fence, created_at, updated_at, flag)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&e.id)
            .bind(&e.task_id)
            .bind(&e.idempotency_key)
            .bind(&e.body_digest)
            .bind(e.kind.as_str())
            .bind(&e.step)
            .bind(&e.resource_id)
            .bind(json_text(&e.intent))
            .bind(&e.intent_digest)
            .bind(e.status.as_str())
            .bind(e.receipt.as_ref().map(json_text))
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.created_at)
            .bind(e.updated_at)
            .bind(&e.flag),
        )
        .await
        .map(drop)
    }

    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE id = ?").bind(id),
            effect_row,
        )
        .await
    }

    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>> {
        self.one(
            sqlx::query("SELECT * FROM effects WHERE task_id = ? AND idempotency_key = ?")
                .bind(task_id)
                .bind(key),
            effect_row,
        )
        .await
    }

    async fn update_effect(&mut self, e: &EffectRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE effects SET resource_id = ?, status = ?, receipt = ?, attempt_id = ?, fence = ?,
                   updated_at = ?, flag = ?, intent = ?, intent_digest = ?
                 WHERE id = ?",
            )
            .bind(&e.resource_id)
            .bind(e.status.as_str())
            .bind(e.receipt.as_ref().map(json_text))
            .bind(&e.attempt_id)
            .bind(e.fence)
            .bind(e.updated_at)
            .bind(&e.flag)
            .bind(json_text(&e.intent))
            .bind(&e.intent_digest)
            .bind(&e.id),
        )
        .await
        .map(drop)
    }

    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>> {
        self.all(
            sqlx::query("SELECT * FROM effects WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            effect_row,
        )
        .await
    }

    async fn insert_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO decisions (id, task_id, kind, status, step, question, options,
                   default_option, intent, intent_digest, effect_id, plan_revision, risky, expires_at,
                   created_at, outcome, durability, delivery, editable, runtime_deadline,
                   escalation, escalate_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&d.id)
            .bind(&d.task_id)
            .bind(d.kind.as_str())
            .bind(d.status.as_str())
            .bind(&d.step)
            .bind(&d.question)
            .bind(json_text(&d.options))
            .bind(&d.default_option)
            .bind(d.intent.as_ref().map(json_text))
            .bind(&d.intent_digest)
            .bind(&d.effect_id)
            .bind(d.plan_revision)
            .bind(d.risky)
            .bind(d.expires_at)
            .bind(d.created_at)
            .bind(d.outcome.as_ref().map(json_text))
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.delivery.as_ref().map(json_text))
            .bind(&d.editable)
            .bind(d.runtime_deadline.as_ref().map(json_text))
            .bind(d.escalation.as_ref().map(json_text))
            .bind(d.escalate_at),
        )
        .await
        .map(drop)
    }

    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>> {
        self.one(
            sqlx::query("SELECT * FROM decisions WHERE id = ?").bind(id),
            decision_row,
        )
        .await
    }

    async fn update_decision(&mut self, d: &DecisionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE decisions SET status = ?, expires_at = ?, outcome = ?, delivery = ?,
                   escalation = ?, escalate_at = ?, durability = ?, runtime_deadline = ?
                 WHERE id = ?",
            )
            .bind(d.status.as_str())
            .bind(d.expires_at)
            .bind(d.outcome.as_ref().map(json_text))
            .bind(d.delivery.as_ref().map(json_text))
            .bind(d.escalation.as_ref().map(json_text))
            .bind(d.escalate_at)
            .bind(d.durability.map(|x| x.as_str()))
            .bind(d.runtime_deadline.as_ref().map(json_text))
            .bind(&d.id),
        )
        .await
        .map(drop)
    }

    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query("SELECT * FROM decisions WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            decision_row,
        )
        .await
    }

    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM decisions WHERE status = 'pending' AND expires_at <= ?
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
                "SELECT * FROM decisions WHERE status = 'pending' AND escalate_at <= ?
                 ORDER BY escalate_at, id",
            )
            .bind(now_ms),
            decision_row,
        )
        .await
    }

    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>> {
        let text: Option<String> =
            sqlx::query_scalar("SELECT policy FROM escalation_policies WHERE user_id = ?")
                .bind(user_id)
                .fetch_optional(self.db())
                .await
                .map_err(backend)?;
        text.map(|t| decode_json("escalation_policies.policy", &t))
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
                "INSERT INTO escalation_policies (user_id, policy, updated_at) VALUES (?, ?, ?)
                 ON CONFLICT (user_id) DO UPDATE SET policy = excluded.policy,
                   updated_at = excluded.updated_at",
            )
            .bind(user_id)
            .bind(json_text(policy))
            .bind(now_ms),
        )
        .await
        .map(drop)
    }

    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool> {
        self.exec(sqlx::query("DELETE FROM escalation_policies WHERE user_id = ?").bind(user_id))
            .await
            .map(|n| n > 0)
    }

    async fn put_delegation(&mut self, d: &DelegationRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO delegations (owner_id, delegate_id, created_at, accepted_at)
                 VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
                "UPDATE delegations SET accepted_at = ?
                 WHERE owner_id = ? AND delegate_id = ? AND accepted_at IS NULL",
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
            sqlx::query("DELETE FROM delegations WHERE owner_id = ? AND delegate_id = ?")
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
                "SELECT * FROM delegations WHERE (?1 IS NULL OR owner_id = ?1)
                   AND (?2 IS NULL OR delegate_id = ?2)
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
            "SELECT COUNT(*) FROM decisions WHERE task_id = ? AND status = 'pending'",
        )
        .bind(task_id)
        .fetch_one(self.db())
        .await
        .map_err(backend)
    }

    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO blobs (sha256, size, data) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            )
            .bind(sha256)
            .bind(data.len() as i64)
            .bind(data),
        )
        .await
        .map(drop)
    }

    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>> {
        sqlx::query_scalar("SELECT data FROM blobs WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(self.db())
            .await
            .map_err(backend)
    }

    async fn insert_artifact(&mut self, a: &ArtifactRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO artifacts (id, task_id, sha256, name, media_type, size, step, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
        .map(drop)
    }

    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>> {
        self.all(
            sqlx::query("SELECT * FROM artifacts WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            artifact_row,
        )
        .await
    }

    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM artifacts a JOIN tasks t ON t.id = a.task_id
             WHERE a.sha256 = ? AND (? IS NULL OR t.owner_id IN (SELECT value FROM json_each(?)))",
        )
        .bind(sha256)
        .bind(owners.map(json_list))
        .bind(owners.map(json_list))
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        Ok(n > 0)
    }

    async fn insert_receipt(&mut self, r: &ReceiptRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO test_receipts (id, task_id, step, command, exit_code, commit_id, totals,
                   failures, duration_seconds, passed, junit_sha256, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&r.id)
            .bind(&r.task_id)
            .bind(&r.step)
            .bind(&r.command)
            .bind(r.exit_code)
            .bind(&r.commit)
            .bind(json_text(&r.totals))
            .bind(json_text(&r.failures))
            .bind(r.duration_seconds)
            .bind(r.passed)
            .bind(&r.junit_sha256)
            .bind(r.created_at),
        )
        .await
        .map(drop)
    }

    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>> {
        self.all(
            sqlx::query("SELECT * FROM test_receipts WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            receipt_row,
        )
        .await
    }

    async fn insert_message(&mut self, m: &MessageRow) -> Result<i64> {
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO messages (session_id, seq, task_id, role, text, created_at)
             VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE session_id = ?), ?, ?, ?, ?)
             RETURNING seq",
        )
        .bind(&m.session_id)
        .bind(&m.session_id)
        .bind(&m.task_id)
        .bind(&m.role)
        .bind(&m.text)
        .bind(m.created_at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        Ok(seq)
    }

    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>> {
        self.all(
            sqlx::query("SELECT * FROM messages WHERE session_id = ? ORDER BY seq")
                .bind(session_id),
            message_row,
        )
        .await
    }

    async fn append_event(&mut self, e: &NewEvent) -> Result<i64> {
        let cursor: i64 = sqlx::query_scalar(
            "INSERT INTO events (task_id, owner_id, kind, data, at) VALUES (?, ?, ?, ?, ?)
             RETURNING cursor",
        )
        .bind(&e.task_id)
        .bind(&e.owner_id)
        .bind(e.kind.as_str())
        .bind(json_text(&e.data))
        .bind(e.at)
        .fetch_one(self.db())
        .await
        .map_err(backend)?;
        self.appended = Some(cursor);
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
                        "SELECT * FROM events WHERE owner_id = ? AND cursor > ? ORDER BY cursor LIMIT ?",
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
                        "SELECT * FROM events
                         WHERE owner_id IN (SELECT value FROM json_each(?)) AND cursor > ?
                         ORDER BY cursor LIMIT ?",
                    )
                    .bind(json_list(os))
                    .bind(cursor)
                    .bind(limit),
                    event_row,
                )
                .await
            }
            None => {
                self.all(
                    sqlx::query("SELECT * FROM events WHERE cursor > ? ORDER BY cursor LIMIT ?")
                        .bind(cursor)
                        .bind(limit),
                    event_row,
                )
                .await
            }
        }
    }

    async fn max_cursor(&mut self) -> Result<i64> {
        // The sequence table remembers the newest cursor even after pruning deleted it.
        sqlx::query_scalar(
            "SELECT MAX(COALESCE((SELECT MAX(cursor) FROM events), 0),
                        (SELECT pruned_through FROM event_retention WHERE id = 1))",
        )
        .fetch_one(self.db())
        .await
        .map_err(backend)
    }

    async fn pruned_through(&mut self) -> Result<i64> {
        sqlx::query_scalar("SELECT pruned_through FROM event_retention WHERE id = 1")
            .fetch_one(self.db())
            .await
            .map_err(backend)
    }

    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64> {
        let n = self
            .exec(sqlx::query("DELETE FROM events WHERE cursor <= ?").bind(cursor))
            .await?;
        self.exec(
            sqlx::query(
                "UPDATE event_retention SET pruned_through = MAX(pruned_through, ?) WHERE id = 1",
            )
            .bind(cursor),
        )
        .await?;
        Ok(n)
    }

    async fn insert_audit(&mut self, a: &AuditRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO audit (at, actor, action, task_id, code, detail) VALUES (?, ?, ?, ?, ?, ?)",
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

    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM audit WHERE (? IS NULL OR task_id = ?) ORDER BY id DESC LIMIT ?",
            )
            .bind(task_id)
            .bind(task_id)
            .bind(limit),
            audit_row,
        )
        .await
    }

    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64> {
        // Two range deletes (by the `at` index, then by id) rather than one `OR`.
        let old = self
            .exec(sqlx::query("DELETE FROM audit WHERE at < ?").bind(before))
            .await?;
        let over = self
            .exec(
                sqlx::query(
                    "DELETE FROM audit WHERE id <= (SELECT COALESCE(MAX(id), 0) FROM audit) - ?",
                )
                .bind(keep.max(0)),
            )
            .await?;
        Ok(old + over)
    }

    async fn insert_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO devices (id, user_id, name, public_key, scopes, created_at, revoked_at,
                   last_seen_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&d.id)
            .bind(&d.user_id)
            .bind(&d.name)
            .bind(&d.public_key)
            .bind(json_text(&d.scopes))
            .bind(d.created_at)
            .bind(d.revoked_at)
            .bind(d.last_seen_at),
        )
        .await
        .map(drop)
    }

    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>> {
        self.one(
            sqlx::query("SELECT * FROM devices WHERE id = ?").bind(id),
            device_row,
        )
        .await
    }

    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM devices WHERE (? IS NULL OR user_id = ?) ORDER BY created_at, id",
            )
            .bind(user_id)
            .bind(user_id),
            device_row,
        )
        .await
    }

    async fn update_device(&mut self, d: &DeviceRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE devices SET name = ?, scopes = ?, revoked_at = ?, last_seen_at = ? WHERE id = ?",
            )
            .bind(&d.name)
            .bind(json_text(&d.scopes))
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
                     VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
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
        let ids = serde_json::to_string(decision_ids).unwrap_or_default();
        self.all(
            sqlx::query(
                "SELECT * FROM deliveries WHERE decision_id IN (SELECT value FROM json_each(?))
                 ORDER BY at, device_id, step",
            )
            .bind(ids),
            delivery_row,
        )
        .await
    }

    async fn insert_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO pairing_codes (code_hash, user_id, scopes, created_at, expires_at, used_at, device_id)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&p.code_hash)
            .bind(&p.user_id)
            .bind(json_text(&p.scopes))
            .bind(p.created_at)
            .bind(p.expires_at)
            .bind(p.used_at)
            .bind(&p.device_id),
        )
        .await
        .map(drop)
    }

    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>> {
        self.one(
            sqlx::query("SELECT * FROM pairing_codes WHERE code_hash = ?").bind(code_hash),
            pairing_row,
        )
        .await
    }

    async fn update_pairing(&mut self, p: &PairingRow) -> Result<()> {
        self.exec(
            sqlx::query("UPDATE pairing_codes SET used_at = ?, device_id = ? WHERE code_hash = ?")
                .bind(p.used_at)
                .bind(&p.device_id)
                .bind(&p.code_hash),
        )
        .await
        .map(drop)
    }

    async fn insert_device_session(&mut self, d: &DeviceSessionRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO device_sessions (token_hash, device_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
            )
            .bind(&d.token_hash)
            .bind(&d.device_id)
            .bind(d.created_at)
            .bind(d.expires_at),
        )
        .await
        .map(drop)
    }

    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>> {
        self.one(
            sqlx::query("SELECT * FROM device_sessions WHERE token_hash = ?").bind(token_hash),
            device_session_row,
        )
        .await
    }

    async fn insert_command(&mut self, c: &CommandRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO commands (command_id, task_id, device_id, body_digest, operation, envelope,
                   status, result, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(&c.device_id)
            .bind(&c.body_digest)
            .bind(c.operation.as_str())
            .bind(json_text(&c.envelope))
            .bind(c.status.as_str())
            .bind(json_text(&c.result))
            .bind(c.created_at),
        )
        .await
        .map(drop)
    }

    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>> {
        self.one(
            sqlx::query("SELECT * FROM commands WHERE command_id = ?").bind(command_id),
            command_row,
        )
        .await
    }

    async fn insert_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO followups (id, task_id, schedule, time_zone, catch_up, message, state,
                   next_run_at, last_run_at, runs, missed, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&f.id)
            .bind(&f.task_id)
            .bind(json_text(&f.schedule))
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
            sqlx::query("SELECT * FROM followups WHERE id = ?").bind(id),
            followup_row,
        )
        .await
    }

    async fn update_followup(&mut self, f: &FollowupRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE followups SET state = ?, next_run_at = ?, last_run_at = ?, runs = ?, missed = ?
                 WHERE id = ?",
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
                "SELECT * FROM followups WHERE state = 'active' AND next_run_at <= ?
                 ORDER BY next_run_at, id",
            )
            .bind(now_ms),
            followup_row,
        )
        .await
    }

    async fn list_followups(&mut self, task_id: &str) -> Result<Vec<FollowupRow>> {
        self.all(
            sqlx::query("SELECT * FROM followups WHERE task_id = ? ORDER BY created_at, id")
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
                    "INSERT INTO followup_runs (followup_id, nominal_at, ran_at, missed) VALUES (?, ?, ?, ?)
                     ON CONFLICT DO NOTHING",
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
        self.exec(
            sqlx::query(
                "INSERT INTO machines (id, owner_id, name, info, registered_at, last_seen_at, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&m.id)
            .bind(&m.owner_id)
            .bind(&m.name)
            .bind(json_text(&m.info))
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(m.created_at),
        )
        .await
        .map(drop)
    }

    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE id = ?").bind(id),
            machine_row,
        )
        .await
    }

    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>> {
        self.one(
            sqlx::query("SELECT * FROM machines WHERE owner_id = ? AND name = ?")
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
                        "SELECT * FROM machines WHERE owner_id IN (SELECT value FROM json_each(?))
                         ORDER BY name, id",
                    )
                    .bind(json_list(os)),
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
                "UPDATE machines SET info = ?, registered_at = ?, last_seen_at = ? WHERE id = ?",
            )
            .bind(json_text(&m.info))
            .bind(m.registered_at)
            .bind(m.last_seen_at)
            .bind(&m.id),
        )
        .await
        .map(drop)
    }

    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>> {
        self.all(
            sqlx::query("SELECT * FROM tasks WHERE machine_id = ? ORDER BY created_at, id")
                .bind(machine_id),
            task_row,
        )
        .await
    }

    async fn insert_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO machine_work (id, machine_id, task_id, kind, args, state, detail,
                   created_at, updated_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&w.id)
            .bind(&w.machine_id)
            .bind(&w.task_id)
            .bind(w.kind.as_str())
            .bind(json_text(&w.args))
            .bind(w.state.as_str())
            .bind(&w.detail)
            .bind(w.created_at)
            .bind(w.updated_at),
        )
        .await
        .map(drop)
    }

    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>> {
        self.one(
            sqlx::query("SELECT * FROM machine_work WHERE id = ?").bind(id),
            work_row,
        )
        .await
    }

    async fn update_work(&mut self, w: &WorkRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "UPDATE machine_work SET state = ?, detail = ?, updated_at = ? WHERE id = ?",
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
                "SELECT * FROM machine_work WHERE machine_id = ? AND state IN ('pending', 'taken')
                 ORDER BY created_at, id",
            )
            .bind(machine_id),
            work_row,
        )
        .await
    }

    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>> {
        self.all(
            sqlx::query("SELECT * FROM machine_work WHERE task_id = ? ORDER BY created_at, id")
                .bind(task_id),
            work_row,
        )
        .await
    }

    async fn insert_rule(&mut self, r: &RuleRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO rules (id, owner_id, device_id, command_id, spec, digest, answer,
                   created_at, expires_at, revoked_at, revoked_by, uses, last_used_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&r.id)
            .bind(&r.owner_id)
            .bind(&r.device_id)
            .bind(&r.command_id)
            .bind(json_text(&r.spec))
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
        .map(drop)
    }

    async fn rule(&mut self, id: &str) -> Result<Option<RuleRow>> {
        self.one(
            sqlx::query("SELECT * FROM rules WHERE id = ?").bind(id),
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
                "SELECT * FROM rules WHERE owner_id = ?1
                   AND (?2 IS NULL OR (revoked_at IS NULL AND expires_at > ?2))
                 ORDER BY created_at DESC, id DESC LIMIT ?3",
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
                    "UPDATE rules SET revoked_at = ?, revoked_by = ? WHERE id = ? AND revoked_at IS NULL",
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
            sqlx::query("UPDATE rules SET uses = uses + 1, last_used_at = ? WHERE id = ?")
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
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                    sqlx::query("SELECT * FROM push_channels WHERE device_id = ? ORDER BY created_at, id").bind(d),
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
                "UPDATE push_channels SET cursor = ?, attempts = ?, delivered = ?, failures = ?,
                   consecutive_failures = ?, last_error = ?, last_attempt_at = ?, next_attempt_at = ?,
                   revoked_at = ?
                 WHERE id = ?",
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
        sqlx::query_scalar("SELECT value FROM server_secrets WHERE name = ?")
            .bind(name)
            .fetch_optional(self.db())
            .await
            .map_err(backend)
    }

    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()> {
        self.exec(
            sqlx::query("INSERT INTO server_secrets (name, value) VALUES (?, ?)")
                .bind(name)
                .bind(value),
        )
        .await
        .map(drop)
    }

    async fn try_claim(&mut self, _job: &str) -> Result<bool> {
        // One file, one writer: a write transaction already excludes every other.
        Ok(true)
    }

    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>> {
        self.all(
            sqlx::query("SELECT * FROM commands WHERE task_id = ? ORDER BY created_at, command_id")
                .bind(task_id),
            command_row,
        )
        .await
    }

    async fn insert_control(&mut self, c: &ControlRow) -> Result<i64> {
        // The task's row is this writer's alone until commit, so MAX + 1 cannot race.
        self.one(
            sqlx::query(
                "INSERT INTO control_commands (command_id, task_id, operation, args, plan_revision, applied_at,
                   acknowledged_at, acknowledged_by, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
                   (SELECT COALESCE(MAX(seq), 0) + 1 FROM control_commands WHERE task_id = ?2))
                 RETURNING seq",
            )
            .bind(&c.command_id)
            .bind(&c.task_id)
            .bind(c.operation.as_str())
            .bind(json_text(&c.args))
            .bind(c.plan_revision)
            .bind(c.applied_at)
            .bind(c.acknowledged_at)
            .bind(&c.acknowledged_by),
            |r| get(r, "seq"),
        )
        .await?
        .ok_or_else(|| StoreError::Conflict("control_commands: the row was not written".into()))
    }

    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM control_commands WHERE task_id = ? AND acknowledged_at IS NULL
                 ORDER BY seq",
            )
            .bind(task_id),
            control_row,
        )
        .await
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
                    "UPDATE control_commands SET acknowledged_at = ?, acknowledged_by = ?
                     WHERE task_id = ? AND command_id = ? AND acknowledged_at IS NULL",
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

/// A list of owners as the JSON array `json_each` reads.
fn json_list(owners: &[String]) -> String {
    serde_json::to_string(owners).unwrap_or_else(|_| "[]".into())
}
