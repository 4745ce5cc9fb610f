//! Delegation (issue 19): an owner lets another user read their tasks and answer their
//! decisions with that user's own signed device commands — the second person an escalation
//! step reaches. Pausing, resuming, cancelling, replanning and taking over stay with the owner
//! (`commands::steers`). A device session reads the delegations on every request
//! (`auth::visible_owners`), so one ended is ended at once.

use waymark_proto::*;
use waymark_store::*;

use crate::auth::Caller;
use crate::convert;
use crate::domain::core::{Tx, invalid};
use crate::domain::escalation::whose;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Most people one user may delegate to.
pub(crate) const MAX_DELEGATES: usize = 16;

/// Whether `owner_id` delegated their decisions to `user_id`.
pub(crate) async fn delegated(tx: &mut Tx, owner_id: &str, user_id: &str) -> ApiResult<bool> {
    Ok(!tx
        .delegations(Some(owner_id), Some(user_id))
        .await?
        .is_empty())
}

/// `GET /v1/delegates`.
pub(crate) async fn list(
    st: &AppState,
    caller: &Caller,
    user: Option<String>,
) -> ApiResult<Delegates> {
    let mut tx = Tx::read(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    delegates_of(&mut tx, &u).await
}

/// `PUT /v1/delegates/{name}`: lets `name` read this user's tasks and answer their decisions.
/// Putting it again changes nothing.
pub(crate) async fn add(
    st: &AppState,
    caller: &Caller,
    user: Option<String>,
    name: String,
) -> ApiResult<Delegates> {
    let mut tx = Tx::write(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    let d = named(&mut tx, &name).await?;
    if d.id == u.id {
        return Err(invalid(format!(
            "`{name}` is the owner: one does not delegate to oneself"
        )));
    }
    let given = tx.delegations(Some(&u.id), None).await?;
    if !given.iter().any(|g| g.delegate_id == d.id) {
        if given.len() >= MAX_DELEGATES {
            return Err(invalid(format!(
                "`{}` already delegates to {MAX_DELEGATES} people; remove one first",
                u.name
            )));
        }
        let now = tx.now;
        tx.put_delegation(&DelegationRow {
            owner_id: u.id.clone(),
            delegate_id: d.id.clone(),
            created_at: now,
        })
        .await?;
        note(&mut tx, caller, "delegation.add", &u, &d).await?;
    }
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

/// `DELETE /v1/delegates/{name}`: `name` no longer sees this user's tasks; their open streams
/// and sessions lose them with the next request. Escalation steps naming them skip them.
pub(crate) async fn remove(
    st: &AppState,
    caller: &Caller,
    user: Option<String>,
    name: String,
) -> ApiResult<Delegates> {
    let mut tx = Tx::write(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    let d = named(&mut tx, &name).await?;
    if !tx.delete_delegation(&u.id, &d.id).await? {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("`{}` does not delegate to `{name}`", u.name),
        ));
    }
    note(&mut tx, caller, "delegation.remove", &u, &d).await?;
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

async fn named(tx: &mut Tx, name: &str) -> ApiResult<UserRow> {
    tx.user_by_name(name)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no user `{name}`")))
}

/// A delegation given or ended is written to the audit log with who did it.
async fn note(
    tx: &mut Tx,
    caller: &Caller,
    action: &str,
    owner: &UserRow,
    to: &UserRow,
) -> ApiResult<()> {
    let now = tx.now;
    tx.insert_audit(&AuditRow {
        at: now,
        actor: caller.actor(),
        action: action.to_owned(),
        task_id: None,
        code: "ok".to_owned(),
        detail: format!("{} → {}", owner.name, to.name),
    })
    .await?;
    Ok(())
}

async fn delegates_of(tx: &mut Tx, u: &UserRow) -> ApiResult<Delegates> {
    let mut out = Delegates {
        user: u.name.clone(),
        delegates: Vec::new(),
        delegated_by: Vec::new(),
    };
    for d in tx.delegations(Some(&u.id), None).await? {
        out.delegates.push(Delegation {
            user: user_name(tx, &d.delegate_id).await?,
            since: convert::dt(d.created_at),
        });
    }
    for d in tx.delegations(None, Some(&u.id)).await? {
        out.delegated_by.push(Delegation {
            user: user_name(tx, &d.owner_id).await?,
            since: convert::dt(d.created_at),
        });
    }
    Ok(out)
}

async fn user_name(tx: &mut Tx, id: &str) -> ApiResult<String> {
    Ok(tx
        .user_by_id(id)
        .await?
        .map(|u| u.name)
        .unwrap_or_else(|| id.to_owned()))
}
