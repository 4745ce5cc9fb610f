//! What every rule needs: the transaction type, loading a task as a caller may see it, events
//! written in the transaction of their change, refusals in the audit log, input checks, and
//! what a write answers (`Made`: new, or found again).

use serde::Serialize;
use serde_json::Value;
use waymark_proto::digest::{DigestError, json_digest};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::{Caller, CallerKind};
use crate::convert;
use crate::error::{ApiError, ApiResult};

/// A store transaction and the one "now" every rule in it sees, read from the server's
/// clock once the transaction is open (after any wait for the writer).
pub struct Tx {
    inner: Box<dyn StoreTx>,
    /// Now, in unix milliseconds.
    pub now: i64,
    /// Control commands this transaction queued, in order: handed to this replica's control
    /// streams once it commits (`handoff`).
    pub controls: Vec<waymark_proto::ControlCommand>,
    /// Round-trip stages this transaction recorded (stage, seconds since the decision
    /// opened): observed in the metrics once it commits.
    pub stages: Vec<(&'static str, f64)>,
    metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
}

impl Tx {
    /// A read-write transaction.
    pub async fn write(st: &Context) -> Result<Tx, StoreError> {
        let inner = st.store.write().await?;
        Ok(Tx {
            inner,
            now: st.now_ms(),
            controls: Vec::new(),
            stages: Vec::new(),
            metrics: Some(st.metrics.clone()),
        })
    }

    /// A read-only transaction.
    pub async fn read(st: &Context) -> Result<Tx, StoreError> {
        let inner = st.store.read().await?;
        Ok(Tx {
            inner,
            now: st.now_ms(),
            controls: Vec::new(),
            stages: Vec::new(),
            metrics: None,
        })
    }

    /// Commits; the change is durable when this returns.
    pub async fn commit(self) -> Result<(), StoreError> {
        self.inner.commit().await?;
        if let Some(m) = &self.metrics {
            for (stage, seconds) in &self.stages {
                m.approval_stage(stage, *seconds);
            }
        }
        Ok(())
    }

    /// Notes that a decision opened at `opened_at` (unix ms) reached `stage` now.
    pub fn stage(&mut self, stage: &'static str, opened_at: i64) {
        self.stages
            .push((stage, (self.now - opened_at).max(0) as f64 / 1000.0));
    }

    /// Now, as a time.
    pub fn now_utc(&self) -> chrono::DateTime<chrono::Utc> {
        convert::dt(self.now)
    }
}

impl std::ops::Deref for Tx {
    type Target = dyn StoreTx;
    fn deref(&self) -> &Self::Target {
        &*self.inner
    }
}

impl std::ops::DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut *self.inner
    }
}

/// Loads a task the caller may access; others' tasks look absent.
pub async fn task_for(tx: &mut Tx, caller: &Caller, id: &str) -> ApiResult<TaskRow> {
    visible_task(caller, id, tx.task(id).await?)
}

/// A task loaded by `id`, if the caller may access it; others' tasks look absent.
pub fn visible_task(caller: &Caller, id: &str, task: Option<TaskRow>) -> ApiResult<TaskRow> {
    match task {
        Some(t) if caller.may_access_task(&t) => Ok(t),
        _ => Err(ApiError::not_found("task", id)),
    }
}

/// The wire form of a task (with its owner's name).
pub async fn task_wire(tx: &mut Tx, t: &TaskRow) -> ApiResult<Task> {
    let owner = tx
        .user_by_id(&t.owner_id)
        .await?
        .map(|u| u.name)
        .unwrap_or_default();
    Ok(convert::task(t, &owner))
}

/// Appends an event for a task in the current transaction.
pub async fn emit(
    tx: &mut Tx,
    task: &TaskRow,
    kind: EventKind,
    data: impl Serialize,
) -> ApiResult<i64> {
    let event = new_event(tx, task, kind, data)?;
    Ok(tx.append_event(&event).await?)
}

/// An event for a task, at the transaction's now, for [`emit`] or a store call that writes it
/// with its change.
pub fn new_event(
    tx: &Tx,
    task: &TaskRow,
    kind: EventKind,
    data: impl Serialize,
) -> ApiResult<NewEvent> {
    let data = serde_json::to_value(data).map_err(|e| {
        tracing::error!(error = %e, "event data does not serialise");
        ApiError::new(
            ErrorCode::Internal,
            "the server could not record the change",
        )
    })?;
    Ok(NewEvent {
        task_id: task.id.clone(),
        owner_id: task.owner_id.clone(),
        kind,
        data,
        at: tx.now,
    })
}

/// Tells the streams of every replica, through the log they all follow, that these users'
/// access changed (a device revoked, a delegation accepted, declined or ended): each of their
/// streams re-reads what it may see before it sends anything more. The event is the server's
/// own ([`ACCESS_OWNER`]); no stream, push or page ever carries it.
pub async fn access_changed(
    tx: &mut dyn StoreTx,
    users: &[&str],
    now: i64,
) -> Result<i64, StoreError> {
    tx.append_event(&NewEvent {
        task_id: String::new(),
        owner_id: ACCESS_OWNER.to_owned(),
        kind: EventKind::AccessChanged,
        data: serde_json::json!({ "users": users }),
        at: now,
    })
    .await
}

pub async fn emit_task(tx: &mut Tx, task: &TaskRow, kind: EventKind) -> ApiResult<i64> {
    let wire = task_wire(tx, task).await?;
    emit(tx, task, kind, wire).await
}

/// Records a refusal in the audit log, in its own transaction (the refused one rolled back).
pub async fn audit_refusal(st: &Context, caller: &Caller, action: &str, err: &ApiError) {
    if !err.is_refusal() {
        return;
    }
    let code = err.code().as_str();
    record_refusal(
        st,
        &caller.actor(),
        action,
        err.task_id.as_deref(),
        code,
        &err.problem.detail,
    )
    .await;
}

/// Longest actor, action, task id and code an audit entry keeps (ids are far shorter).
const AUDIT_NAME_CHARS: usize = 120;
/// Longest detail an audit entry keeps.
const AUDIT_DETAIL_CHARS: usize = 500;

pub use crate::text::clip;

/// An audit entry at `at`, each field clipped ([`clip`]).
pub fn audit_row(
    at: i64,
    actor: &str,
    action: &str,
    task_id: Option<&str>,
    code: &str,
    detail: &str,
) -> AuditRow {
    AuditRow {
        at,
        actor: clip(actor, AUDIT_NAME_CHARS),
        action: clip(action, AUDIT_NAME_CHARS),
        task_id: task_id.map(|t| clip(t, AUDIT_NAME_CHARS)),
        code: clip(code, AUDIT_NAME_CHARS),
        detail: clip(detail, AUDIT_DETAIL_CHARS),
    }
}

/// Appends a message to the task's session in the current transaction, with its event.
pub async fn say(tx: &mut Tx, task: &TaskRow, role: &str, text: String) -> ApiResult<MessageRow> {
    let mut m = MessageRow {
        session_id: task.session_id.clone(),
        task_id: task.id.clone(),
        seq: 0,
        role: role.to_owned(),
        text,
        created_at: tx.now,
    };
    m.seq = tx.insert_message(&m).await?;
    emit(
        tx,
        task,
        EventKind::MessagesAppended,
        serde_json::json!({"messages": [convert::message(&m)]}),
    )
    .await?;
    Ok(m)
}

/// Writes an audit entry (and counts the refusal) in its own transaction. Each field is
/// clipped ([`clip`]): the callers name what an unverified sender sent.
pub async fn record_refusal(
    st: &Context,
    actor: &str,
    action: &str,
    task_id: Option<&str>,
    code: &str,
    detail: &str,
) {
    st.metrics.refusal_code(code);
    let row = audit_row(st.now_ms(), actor, action, task_id, code, detail);
    let res = async {
        let mut tx = Tx::write(st).await?;
        tx.insert_audit(&row).await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "could not record a refusal in the audit log");
    }
}

/// Runs a write and audits it when refused.
pub async fn audited<T>(
    st: &Context,
    caller: &Caller,
    action: &str,
    f: impl std::future::Future<Output = ApiResult<T>>,
) -> ApiResult<T> {
    let res = f.await;
    if let Err(e) = &res {
        audit_refusal(st, caller, action, e).await;
    }
    res
}

pub fn invalid(detail: impl Into<String>) -> ApiError {
    ApiError::new(ErrorCode::ValidationFailed, detail)
}

/// A 422 for a request field that has no exact canonical form: it names the field and, for an
/// integer beyond ±(2^53 − 1), where in it the integer is (`pointer`, into the request body).
pub fn not_exact(field: &str, e: DigestError) -> ApiError {
    match e {
        DigestError::NotPlainJson => invalid(format!("`{field}` is not plain JSON")),
        DigestError::InexactNumber { pointer, value } => invalid(format!(
            "`{field}` holds the integer {value} (at `/{field}{pointer}`), beyond ±(2^53 − 1): digests are taken over canonical JSON, which cannot carry it exactly — send it as a string"
        ))
        .with("pointer", format!("/{field}{pointer}")),
    }
}

/// The digest of a request field, or a 422 saying why it has none.
pub fn field_digest(field: &str, value: &Value) -> ApiResult<String> {
    json_digest(value).map_err(|e| not_exact(field, e))
}

pub fn check_text(field: &str, value: &str, max: usize, required: bool) -> ApiResult<()> {
    if required && value.trim().is_empty() {
        return Err(invalid(format!("`{field}` must not be empty")));
    }
    if value.len() > max {
        return Err(invalid(format!("`{field}` is longer than {max} bytes")));
    }
    Ok(())
}

/// An intent is a JSON object (target, parameters, digests), as the API document says; `null` or
/// a bare value was stored and then answered against that document (found by `scripts/api-fuzz`).
pub fn check_intent(intent: &Value) -> ApiResult<()> {
    if !intent.is_object() {
        return Err(invalid("`intent` must be a JSON object"));
    }
    Ok(())
}

pub fn refuse_terminal(task: &TaskRow) -> ApiResult<()> {
    if task.state.is_terminal() {
        return Err(ApiError::new(
            ErrorCode::TaskTerminal,
            format!("task `{}` is {}", task.id, task.state),
        )
        .with("state", task.state)
        .on_task(&task.id));
    }
    Ok(())
}

pub fn to_value<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// What a write made: the value, the cursor of the event that announced it, and whether it
/// is new or was found again (an idempotent repeat, a runtime session's task).
#[derive(Debug)]
pub struct Made<T> {
    pub value: T,
    pub cursor: i64,
    pub new: bool,
}

/// A new row.
pub fn created<T>(cursor: i64, value: T) -> Made<T> {
    Made {
        value,
        cursor,
        new: true,
    }
}

/// A row found again.
pub fn found<T>(cursor: i64, value: T) -> Made<T> {
    Made {
        value,
        cursor,
        new: false,
    }
}

/// A secret every replica shares (the VAPID key, the pairing-code key), kept in the store:
/// the stored one, or one `make` makes, stored once — whoever stores first wins and every
/// other caller gets that one.
pub async fn shared_secret<E: From<StoreError>>(
    store: &dyn Store,
    name: &str,
    make: impl FnOnce() -> Result<String, E>,
) -> Result<String, E> {
    if let Some(k) = store.read().await?.server_secret(name).await? {
        return Ok(k);
    }
    let fresh = make()?;
    let mut tx = store.write().await?;
    match tx.insert_server_secret(name, &fresh).await {
        Ok(()) => {
            tx.commit().await?;
            return Ok(fresh);
        }
        Err(StoreError::Conflict(_)) => {
            // Made first by another request or replica — perhaps in this very group commit,
            // which this transaction sees and readers do not yet (SQLite); where the failed
            // statement ended the transaction (PostgreSQL), the other one is committed.
            if let Ok(Some(k)) = tx.server_secret(name).await {
                tx.commit().await?;
                return Ok(k);
            }
        }
        Err(e) => return Err(e.into()),
    }
    drop(tx);
    store
        .read()
        .await?
        .server_secret(name)
        .await?
        .ok_or_else(|| {
            StoreError::Corrupt(format!("`{name}` was made elsewhere but cannot be read")).into()
        })
}

/// Whose settings a caller reads or writes (escalation policy, delegates, rules): a device's
/// user, or (admin) the named user.
pub async fn whose(tx: &mut Tx, caller: &Caller, user: Option<&str>) -> ApiResult<UserRow> {
    let id = match (caller.kind, user) {
        (CallerKind::Device, None) => caller.user_id.clone(),
        (CallerKind::Admin, Some(name)) => match tx.user_by_name(name).await? {
            Some(u) => u.id,
            None => {
                return Err(ApiError::new(
                    ErrorCode::NotFound,
                    format!("no user `{name}`"),
                ));
            }
        },
        (CallerKind::Admin, None) => caller.user_id.clone(),
        (CallerKind::Device, Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "a device manages its own user's policy; `user` is for admins",
            ));
        }
        _ => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "the escalation policy is a person's: set it from a paired device (or an admin token)",
            ));
        }
    };
    tx.user_by_id(&id)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no user with id `{id}`")))
}
