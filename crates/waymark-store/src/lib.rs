//! The storage seam of the control plane. The server's rules (leases, fences, CAS, state
//! machines) are written once over [`StoreTx`]; a backend only stores and loads rows inside a
//! transaction. Rows are storage shapes, not wire types: the server converts at the boundary.

mod rows;
pub mod story;

pub use rows::*;

use async_trait::async_trait;
use tokio::sync::watch;

/// Why a storage call failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A unique constraint refused the row (e.g. a checkpoint sequence already taken).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The database was written by a newer Waymark.
    #[error(
        "the database was written by a newer waymark (schema version {found}, this build knows up to {known}) — upgrade waymark"
    )]
    NewerSchema {
        /// The newest migration found in the database.
        found: i64,
        /// The newest migration this build has.
        known: i64,
    },
    /// The database cannot be opened or created.
    #[error("cannot open the database at {path}: {reason}")]
    Open {
        /// Where.
        path: String,
        /// Why.
        reason: String,
    },
    /// The database is busy beyond the timeout; retry.
    #[error("storage busy: {0}")]
    Busy(String),
    /// A stored value could not be decoded (corruption or a hand edit).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// The disk holding the database is full: the write was not made (SQLite `SQLITE_FULL`,
    /// PostgreSQL `disk_full`). Retry once space is freed.
    #[error("storage full: {0}")]
    Full(String),
    /// The disk failed a write or a sync (SQLite `SQLITE_IOERR`, PostgreSQL `io_error`): the
    /// write was not acknowledged.
    #[error("storage I/O error: {0}")]
    Io(String),
    /// Anything else from the backend.
    #[error("storage: {0}")]
    Backend(String),
}

/// Storage result.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// A storage backend.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Begins a write transaction. Writes serialise per backend rules; the transaction sees
    /// the newest committed state — and, on a backend that commits in groups (SQLite), what
    /// the earlier transactions of its group wrote before their shared `COMMIT`. So an answer
    /// built from a write transaction's reads is given only after its `commit` returned
    /// (which waits for that `COMMIT`), even when it changed nothing; dropping it rolls back
    /// its own changes and returns at once.
    async fn write(&self) -> Result<Box<dyn StoreTx>>;

    /// Begins a read transaction: a consistent snapshot, never blocked by writers.
    async fn read(&self) -> Result<Box<dyn StoreTx>>;

    /// The newest committed event cursor, updated after every commit that appended events
    /// (by any replica, for backends that fan out).
    fn cursor_watch(&self) -> watch::Receiver<i64>;

    /// Which backend, for logs and `/healthz`.
    fn backend(&self) -> &'static str;
}

/// One transaction. Dropping it without [`StoreTx::commit`] rolls back. What it reads and
/// writes comes in one trait per table family ([`UsersTx`] to [`SecretsTx`]), so a backend
/// implements each family in a module of its own. A `dyn StoreTx` answers them all as it is;
/// generic code brings them in with `use waymark_store::*`.
#[async_trait]
pub trait StoreTx:
    UsersTx
    + TasksTx
    + CheckpointsTx
    + EffectsTx
    + DecisionsTx
    + ArtifactsTx
    + MessagesTx
    + EventsTx
    + DevicesTx
    + FollowupsTx
    + MachinesTx
    + RulesTx
    + PushTx
    + SecretsTx
    + Send
{
    /// Makes the transaction's writes durable and visible.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// Users and their credentials.
#[async_trait]
pub trait UsersTx: Send {
    /// Adds a user; `Conflict` when the name is taken.
    async fn insert_user(&mut self, user: &UserRow) -> Result<()>;
    /// A user by name.
    async fn user_by_name(&mut self, name: &str) -> Result<Option<UserRow>>;
    /// A user by id.
    async fn user_by_id(&mut self, id: &str) -> Result<Option<UserRow>>;
    /// All users, by name.
    async fn list_users(&mut self) -> Result<Vec<UserRow>>;
    /// Adds a credential.
    async fn insert_token(&mut self, token: &TokenRow) -> Result<()>;
    /// A credential by the sha256 of its secret.
    async fn token_by_hash(&mut self, hash: &str) -> Result<Option<TokenRow>>;
    /// Credentials of one kind.
    async fn list_tokens(&mut self, kind: TokenKind) -> Result<Vec<TokenRow>>;
    /// Revokes a credential at `at` (unix ms); `false` when there is no such one or it was
    /// revoked already (the first revocation's time stands).
    async fn revoke_token(&mut self, id: &str, at: i64) -> Result<bool>;
}

/// Tasks, their sessions and their attempts (leases).
#[async_trait]
pub trait TasksTx: Send {
    /// Adds a task.
    async fn insert_task(&mut self, task: &TaskRow) -> Result<()>;
    /// A task by id.
    async fn task(&mut self, id: &str) -> Result<Option<TaskRow>>;
    /// Writes every mutable column of a task.
    async fn update_task(&mut self, task: &TaskRow) -> Result<()>;
    /// Tasks, newest first; only those of the given owners when given.
    async fn list_tasks(&mut self, owners: Option<&[String]>) -> Result<Vec<TaskRow>>;
    /// The task a runtime adapter created for its own id (`external_key`), if any.
    async fn task_by_external_key(
        &mut self,
        owner_id: &str,
        runtime: &str,
        key: &str,
    ) -> Result<Option<TaskRow>>;
    /// Adds a session.
    async fn insert_session(&mut self, session: &SessionRow) -> Result<()>;
    /// A session by id.
    async fn session(&mut self, id: &str) -> Result<Option<SessionRow>>;
    /// Adds an attempt.
    async fn insert_attempt(&mut self, attempt: &AttemptRow) -> Result<()>;
    /// An attempt by id.
    async fn attempt(&mut self, id: &str) -> Result<Option<AttemptRow>>;
    /// Writes every mutable column of an attempt.
    async fn update_attempt(&mut self, attempt: &AttemptRow) -> Result<()>;
    /// A task's attempts, oldest first.
    async fn list_attempts(&mut self, task_id: &str) -> Result<Vec<AttemptRow>>;
    /// Active attempts whose lease ran out at or before `now_ms`, on tasks a worker was
    /// running or waiting on (the sweeper's work list).
    async fn expired_leases(&mut self, now_ms: i64) -> Result<Vec<AttemptRow>>;
}

/// The checkpoint chain of a task. The provided methods read tasks and append events too.
#[async_trait]
pub trait CheckpointsTx: TasksTx + EventsTx + Send {
    /// Adds a checkpoint; `Conflict` when `(task_id, sequence)` exists.
    async fn insert_checkpoint(&mut self, cp: &CheckpointRow) -> Result<()>;
    /// Adds a checkpoint and the event that announces it, and returns the event's cursor;
    /// `Conflict`, with neither written, when `(task_id, sequence)` exists. The default makes
    /// the two calls; a backend may make them in one round trip.
    async fn insert_checkpoint_with_event(
        &mut self,
        cp: &CheckpointRow,
        event: &NewEvent,
    ) -> Result<i64> {
        self.insert_checkpoint(cp).await?;
        self.append_event(event).await
    }
    /// The newest checkpoint of a task.
    async fn last_checkpoint(&mut self, task_id: &str) -> Result<Option<CheckpointRow>>;
    /// What a checkpoint append checks before it writes: the task (as [`TasksTx::task`] reads
    /// it, so locked where that locks), the attempt, and the head of the task's chain. `None`
    /// for the task means the rest was not looked up. The default makes the three calls; a
    /// backend may answer in one round trip (SQLite: one statement, which shortens the time a
    /// write holds the one writer connection).
    async fn append_context(&mut self, task_id: &str, attempt_id: &str) -> Result<AppendContext> {
        let Some(task) = self.task(task_id).await? else {
            return Ok(AppendContext::default());
        };
        let attempt = self.attempt(attempt_id).await?;
        let head = self.last_checkpoint(task_id).await?.map(|c| ChainHead {
            sequence: c.sequence,
            digest: c.digest,
        });
        Ok(AppendContext {
            task: Some(task),
            attempt,
            head,
        })
    }
    /// A task's checkpoints by sequence.
    async fn list_checkpoints(&mut self, task_id: &str) -> Result<Vec<CheckpointRow>>;
}

/// Effects and their idempotency keys.
#[async_trait]
pub trait EffectsTx: Send {
    /// Adds an effect; `Conflict` when `(task_id, idempotency_key)` exists.
    async fn insert_effect(&mut self, effect: &EffectRow) -> Result<()>;
    /// An effect by id.
    async fn effect(&mut self, id: &str) -> Result<Option<EffectRow>>;
    /// An effect by its task and idempotency key.
    async fn effect_by_key(&mut self, task_id: &str, key: &str) -> Result<Option<EffectRow>>;
    /// Writes every mutable column of an effect.
    /// Writes an effect's status, receipt, owner and flag — and its intent, which changes only
    /// when a person edited it before approving.
    async fn update_effect(&mut self, effect: &EffectRow) -> Result<()>;
    /// A task's effects, oldest first.
    async fn list_effects(&mut self, task_id: &str) -> Result<Vec<EffectRow>>;
}

/// Decisions (approvals included), escalation policies and delegations.
#[async_trait]
pub trait DecisionsTx: Send {
    /// Adds a decision.
    async fn insert_decision(&mut self, decision: &DecisionRow) -> Result<()>;
    /// A decision by id.
    async fn decision(&mut self, id: &str) -> Result<Option<DecisionRow>>;
    /// Writes every mutable column of a decision.
    async fn update_decision(&mut self, decision: &DecisionRow) -> Result<()>;
    /// A task's decisions, oldest first.
    async fn list_decisions(&mut self, task_id: &str) -> Result<Vec<DecisionRow>>;
    /// Pending decisions whose expiry is at or before `now_ms`.
    async fn due_decisions(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>>;
    /// Pending decisions whose escalation moves by `now_ms`, soonest first.
    async fn due_escalations(&mut self, now_ms: i64) -> Result<Vec<DecisionRow>>;
    /// A user's escalation policy.
    async fn escalation_policy(&mut self, user_id: &str) -> Result<Option<EscalationPolicy>>;
    /// Sets (or replaces) a user's escalation policy.
    async fn put_escalation_policy(
        &mut self,
        user_id: &str,
        policy: &EscalationPolicy,
        now_ms: i64,
    ) -> Result<()>;
    /// Removes a user's escalation policy; returns whether there was one.
    async fn delete_escalation_policy(&mut self, user_id: &str) -> Result<bool>;
    /// Offers `delegate_id` to read `owner_id`'s tasks and answer their decisions (or records
    /// one as given); a second put of the same pair keeps the first (its `created_at` and
    /// `accepted_at` stand).
    async fn put_delegation(&mut self, delegation: &DelegationRow) -> Result<()>;
    /// The delegate accepts an offered delegation at `at`; returns whether one was waiting
    /// (`false`: none, or already accepted — its `accepted_at` stands).
    async fn accept_delegation(
        &mut self,
        owner_id: &str,
        delegate_id: &str,
        at: i64,
    ) -> Result<bool>;
    /// Ends a delegation, offered or accepted; returns whether there was one.
    async fn delete_delegation(&mut self, owner_id: &str, delegate_id: &str) -> Result<bool>;
    /// Delegations given by `owner_id` and/or to `delegate_id` (every one when both are
    /// `None`), oldest first: offered and accepted alike (`DelegationRow::accepted` tells them
    /// apart; only an accepted one lets the delegate in).
    async fn delegations(
        &mut self,
        owner_id: Option<&str>,
        delegate_id: Option<&str>,
    ) -> Result<Vec<DelegationRow>>;
    /// Pending decisions per task, for lists.
    async fn pending_decision_count(&mut self, task_id: &str) -> Result<i64>;
}

/// Blobs, the artifacts that name them, and test receipts.
#[async_trait]
pub trait ArtifactsTx: Send {
    /// Stores content under its sha256; a second put of the same content is a no-op.
    async fn put_blob(&mut self, sha256: &str, data: &[u8]) -> Result<()>;
    /// Content by sha256.
    async fn blob(&mut self, sha256: &str) -> Result<Option<Vec<u8>>>;
    /// Adds an artifact.
    async fn insert_artifact(&mut self, artifact: &ArtifactRow) -> Result<()>;
    /// A task's artifacts, oldest first.
    async fn list_artifacts(&mut self, task_id: &str) -> Result<Vec<ArtifactRow>>;
    /// Whether any artifact of a task owned by one of `owners` (any owner when `None`) has
    /// this content.
    async fn blob_visible(&mut self, sha256: &str, owners: Option<&[String]>) -> Result<bool>;
    /// Adds a test receipt.
    async fn insert_receipt(&mut self, receipt: &ReceiptRow) -> Result<()>;
    /// A task's test receipts, oldest first.
    async fn list_receipts(&mut self, task_id: &str) -> Result<Vec<ReceiptRow>>;
}

/// A session's messages.
#[async_trait]
pub trait MessagesTx: Send {
    /// Appends a message; its `seq` is the session's last plus one and is returned.
    async fn insert_message(&mut self, message: &MessageRow) -> Result<i64>;
    /// A session's messages in order.
    async fn list_messages(&mut self, session_id: &str) -> Result<Vec<MessageRow>>;
}

/// The event log and the audit log.
#[async_trait]
pub trait EventsTx: Send {
    /// Appends an event and returns its cursor (strictly greater than every earlier one).
    async fn append_event(&mut self, event: &NewEvent) -> Result<i64>;
    /// Up to `limit` events after `cursor`, by cursor; only those of the given owners' tasks
    /// when given.
    async fn events_after(
        &mut self,
        cursor: i64,
        limit: i64,
        owners: Option<&[String]>,
    ) -> Result<Vec<EventRow>>;
    /// The newest cursor (0 when the log is empty).
    async fn max_cursor(&mut self) -> Result<i64>;
    /// Every event at or below this cursor has been pruned (0 when none).
    async fn pruned_through(&mut self) -> Result<i64>;
    /// Deletes events at or below `cursor` and records it as pruned.
    async fn prune_events_through(&mut self, cursor: i64) -> Result<u64>;
    /// Records a refusal or other security-relevant fact.
    async fn insert_audit(&mut self, audit: &AuditRow) -> Result<()>;
    /// The newest audit entries first; only one task's when given.
    async fn list_audit(&mut self, task_id: Option<&str>, limit: i64) -> Result<Vec<AuditRow>>;
    /// The audit log's retention: deletes entries recorded before `before` (unix ms) and those
    /// more than `keep` ids below the newest (so at most `keep` stay); returns how many went.
    async fn prune_audit(&mut self, before: i64, keep: i64) -> Result<u64>;
}

/// Devices (deliveries, pairing codes, read sessions) and the commands they sign: the
/// ledger and the control commands queued for workers.
#[async_trait]
pub trait DevicesTx: Send {
    /// Adds a device; `Conflict` when its public key is already paired.
    async fn insert_device(&mut self, device: &DeviceRow) -> Result<()>;
    /// A device by id.
    async fn device(&mut self, id: &str) -> Result<Option<DeviceRow>>;
    /// All devices, oldest first; only `user_id`'s when given.
    async fn list_devices(&mut self, user_id: Option<&str>) -> Result<Vec<DeviceRow>>;
    /// Writes a device's mutable columns (name, scopes, revocation, last seen).
    async fn update_device(&mut self, device: &DeviceRow) -> Result<()>;
    /// Records a step a decision reached on a device, once: `false` when it was recorded
    /// before (the first time stands).
    async fn insert_delivery(&mut self, delivery: &DeliveryRow) -> Result<bool>;
    /// The steps recorded for these decisions, by time.
    async fn deliveries(&mut self, decision_ids: &[String]) -> Result<Vec<DeliveryRow>>;
    /// Adds a pairing code.
    async fn insert_pairing(&mut self, pairing: &PairingRow) -> Result<()>;
    /// A pairing code by its hash.
    async fn pairing(&mut self, code_hash: &str) -> Result<Option<PairingRow>>;
    /// Marks a pairing code used.
    async fn update_pairing(&mut self, pairing: &PairingRow) -> Result<()>;
    /// Adds a device read session.
    async fn insert_device_session(&mut self, session: &DeviceSessionRow) -> Result<()>;
    /// A device read session by its token hash.
    async fn device_session(&mut self, token_hash: &str) -> Result<Option<DeviceSessionRow>>;
    /// Adds a ledger entry; `Conflict` when the command id exists.
    async fn insert_command(&mut self, command: &CommandRow) -> Result<()>;
    /// A ledger entry by command id.
    async fn command(&mut self, command_id: &str) -> Result<Option<CommandRow>>;
    /// A task's ledger entries, oldest first.
    async fn list_commands(&mut self, task_id: &str) -> Result<Vec<CommandRow>>;
    /// Queues a control command for a task's worker, numbered after the task's last one
    /// (`seq`); returns that number.
    async fn insert_control(&mut self, control: &ControlRow) -> Result<i64>;
    /// A task's control commands not yet acknowledged, in the order they applied (`seq`).
    async fn pending_controls(&mut self, task_id: &str) -> Result<Vec<ControlRow>>;
    /// Marks a control command acknowledged; returns whether it was pending.
    async fn ack_control(
        &mut self,
        task_id: &str,
        command_id: &str,
        at: i64,
        attempt_id: &str,
    ) -> Result<bool>;
}

/// Scheduled follow-ups and their runs.
#[async_trait]
pub trait FollowupsTx: Send {
    /// Adds a follow-up.
    async fn insert_followup(&mut self, f: &FollowupRow) -> Result<()>;
    /// A follow-up by id.
    async fn followup(&mut self, id: &str) -> Result<Option<FollowupRow>>;
    /// Writes a follow-up's mutable columns (state, next and last run, counts).
    async fn update_followup(&mut self, f: &FollowupRow) -> Result<()>;
    /// Active follow-ups whose next run is at or before `now_ms`.
    async fn due_followups(&mut self, now_ms: i64) -> Result<Vec<FollowupRow>>;
    /// A task's follow-ups, oldest first.
    async fn list_followups(&mut self, task_id: &str) -> Result<Vec<FollowupRow>>;
    /// Records a run of `(followup, nominal time)`; `false` when it already ran.
    async fn insert_followup_run(
        &mut self,
        followup_id: &str,
        nominal_at: i64,
        ran_at: i64,
        missed: i64,
    ) -> Result<bool>;
}

/// Machines and their runners' work.
#[async_trait]
pub trait MachinesTx: Send {
    /// Adds a machine; `Conflict` when its owner has one of that name.
    async fn insert_machine(&mut self, m: &MachineRow) -> Result<()>;
    /// A machine by id.
    async fn machine(&mut self, id: &str) -> Result<Option<MachineRow>>;
    /// A machine by its owner and name.
    async fn machine_by_name(&mut self, owner_id: &str, name: &str) -> Result<Option<MachineRow>>;
    /// Machines, by name: those of the given owners, or every one when `None`.
    async fn list_machines(&mut self, owners: Option<&[String]>) -> Result<Vec<MachineRow>>;
    /// Writes a machine's mutable columns (info, registered and last seen).
    async fn update_machine(&mut self, m: &MachineRow) -> Result<()>;
    /// The tasks of a machine, oldest first.
    async fn machine_tasks(&mut self, machine_id: &str) -> Result<Vec<TaskRow>>;
    /// Adds a work item.
    async fn insert_work(&mut self, w: &WorkRow) -> Result<()>;
    /// A work item by id.
    async fn work(&mut self, id: &str) -> Result<Option<WorkRow>>;
    /// Writes a work item's state, detail and update time.
    async fn update_work(&mut self, w: &WorkRow) -> Result<()>;
    /// A machine's work items that are pending or taken, oldest first.
    async fn open_work(&mut self, machine_id: &str) -> Result<Vec<WorkRow>>;
    /// A task's work items, oldest first.
    async fn task_work(&mut self, task_id: &str) -> Result<Vec<WorkRow>>;
}

/// Standing rules.
#[async_trait]
pub trait RulesTx: Send {
    /// Adds a rule.
    async fn insert_rule(&mut self, r: &RuleRow) -> Result<()>;
    /// A rule by id.
    async fn rule(&mut self, id: &str) -> Result<Option<RuleRow>>;
    /// A user's rules, newest first, at most `limit`: every one, or (`live_at`) only those
    /// neither revoked nor expired at that time.
    async fn list_rules(
        &mut self,
        owner_id: &str,
        live_at: Option<i64>,
        limit: i64,
    ) -> Result<Vec<RuleRow>>;
    /// Revokes a rule at `at` by `device_id`; returns whether it was not revoked before.
    async fn revoke_rule(&mut self, id: &str, at: i64, device_id: &str) -> Result<bool>;
    /// Counts one use of a rule (an increment, so concurrent uses all count).
    async fn count_rule_use(&mut self, id: &str, at: i64) -> Result<()>;
}

/// Push channels.
#[async_trait]
pub trait PushTx: Send {
    /// Adds a push channel.
    async fn insert_push_channel(&mut self, c: &PushChannelRow) -> Result<()>;
    /// Push channels, oldest first: one device's, or every live one when `None`.
    async fn push_channels(&mut self, device_id: Option<&str>) -> Result<Vec<PushChannelRow>>;
    /// Writes a push channel's mutable columns.
    async fn update_push_channel(&mut self, c: &PushChannelRow) -> Result<()>;
}

/// Server secrets and background-job claims.
#[async_trait]
pub trait SecretsTx: Send {
    /// A server secret by name.
    async fn server_secret(&mut self, name: &str) -> Result<Option<String>>;
    /// Stores a server secret; `Conflict` when it exists (the first writer wins).
    async fn insert_server_secret(&mut self, name: &str, value: &str) -> Result<()>;
    /// Claims a background job for this transaction: `true` for exactly one replica at a time
    /// (held until the transaction ends), so sweeps and expiries run once.
    async fn try_claim(&mut self, job: &str) -> Result<bool>;
}

/// A stored value of one of the domain's enums (`col` names its column, for the message): a
/// value the enum does not know is corruption, never a default. Each backend reads the text,
/// this decides what it means.
pub fn decode_enum<T: std::str::FromStr>(col: &str, value: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
}

/// A stored JSON column's text as the type it holds (`col` names the column): text that is not
/// JSON, or JSON not of that shape, is corruption, never a default — a usage reset to zero
/// would reopen a spent budget. Each backend reads the text (or its JSON type), this decides
/// what it means.
pub fn decode_json<T: serde::de::DeserializeOwned>(col: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
}

/// As [`decode_json`], for a backend whose driver already parsed the JSON.
pub fn decode_json_value<T: serde::de::DeserializeOwned>(
    col: &str,
    value: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(value).map_err(|e| StoreError::Corrupt(format!("column `{col}`: {e}")))
}
