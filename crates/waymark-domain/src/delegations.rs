//! Delegation (issue 19): an owner lets another user read their tasks and answer their
//! decisions with that user's own signed device commands — the second person an escalation
//! step reaches. Pausing, resuming, cancelling, replanning and taking over stay with the owner
//! (`commands::steers`). A device session reads the delegations on every request
//! (`auth::visible_owners`), so one ended is ended at once.
//!
//! Consent (issue 32): what the owner puts is an offer. It gives the delegate nothing — no
//! task, no answer, no escalation step — until the delegate accepts it (`accept`); the
//! delegate may decline it, or later leave one accepted (`decline`: the row goes, as when the
//! owner removes it). What must hold: every check of access goes through `delegated` or
//! `auth::visible_owners`, and both count accepted delegations only.

use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::whose;
use crate::core::{Tx, access_changed, invalid};
use crate::error::{ApiError, ApiResult};

/// Most people one user may delegate to.
pub const MAX_DELEGATES: usize = 16;

/// Whether `owner_id` delegated their decisions to `user_id` and `user_id` accepted.
pub async fn delegated(tx: &mut Tx, owner_id: &str, user_id: &str) -> ApiResult<bool> {
    Ok(between(tx, owner_id, user_id)
        .await?
        .is_some_and(|d| d.accepted()))
}

/// Whether `owner_id` offered `user_id` their decisions, accepted or not: enough to name them
/// in an escalation step, which skips them until they accept.
pub async fn offered(tx: &mut Tx, owner_id: &str, user_id: &str) -> ApiResult<bool> {
    Ok(between(tx, owner_id, user_id).await?.is_some())
}

async fn between(tx: &mut Tx, owner_id: &str, user_id: &str) -> ApiResult<Option<DelegationRow>> {
    Ok(tx.delegations(Some(owner_id), Some(user_id)).await?.pop())
}

/// `GET /v1/delegates`.
pub async fn list(st: &Context, caller: &Caller, user: Option<String>) -> ApiResult<Delegates> {
    let mut tx = Tx::read(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    delegates_of(&mut tx, &u).await
}

/// `PUT /v1/delegates/{name}`: offers `name` to read this user's tasks and answer their
/// decisions, once they accept. Putting it again changes nothing (an accepted one stays so).
pub async fn add(
    st: &Context,
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
            accepted_at: None,
        })
        .await?;
        note(&mut tx, caller, "delegation.add", &u, &d, "").await?;
    }
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

/// `DELETE /v1/delegates/{name}`: `name` no longer sees this user's tasks (or an offer not yet
/// answered is taken back); their open streams lose them at once, their sessions with the next request.
/// Escalation steps naming them skip them.
pub async fn remove(
    st: &Context,
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
    note(&mut tx, caller, "delegation.remove", &u, &d, "").await?;
    let now = tx.now;
    access_changed(&mut *tx, &[&d.id], now).await?;
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

/// `POST /v1/delegations/{owner}/accept`: this user (the delegate) accepts `owner`'s offer, and
/// from now reads their tasks and answers their decisions. Accepting again changes nothing.
pub async fn accept(
    st: &Context,
    caller: &Caller,
    user: Option<String>,
    owner: String,
) -> ApiResult<Delegates> {
    let mut tx = Tx::write(st).await?;
    let (u, o, offer) = offer_to(&mut tx, caller, user.as_deref(), &owner).await?;
    if !offer.accepted() {
        let now = tx.now;
        tx.accept_delegation(&o.id, &u.id, now).await?;
        note(&mut tx, caller, "delegation.accept", &o, &u, "").await?;
        access_changed(&mut *tx, &[&u.id], now).await?;
    }
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

/// `POST /v1/delegations/{owner}/decline`: this user (the delegate) declines `owner`'s offer, or
/// leaves a delegation they accepted. Either way it is gone, as if the owner had removed it: the
/// owner's list no longer shows them (the audit log says who ended it), and the owner may offer
/// again.
pub async fn decline(
    st: &Context,
    caller: &Caller,
    user: Option<String>,
    owner: String,
) -> ApiResult<Delegates> {
    let mut tx = Tx::write(st).await?;
    let (u, o, offer) = offer_to(&mut tx, caller, user.as_deref(), &owner).await?;
    tx.delete_delegation(&o.id, &u.id).await?;
    let was = if offer.accepted() {
        ", accepted before"
    } else {
        ""
    };
    note(&mut tx, caller, "delegation.decline", &o, &u, was).await?;
    let now = tx.now;
    access_changed(&mut *tx, &[&u.id], now).await?;
    let out = delegates_of(&mut tx, &u).await?;
    tx.commit().await?;
    Ok(out)
}

/// This user (the delegate `caller` acts for, or `user` for the admin), `owner`, and the offer
/// `owner` made them — or `404` naming both.
async fn offer_to(
    tx: &mut Tx,
    caller: &Caller,
    user: Option<&str>,
    owner: &str,
) -> ApiResult<(UserRow, UserRow, DelegationRow)> {
    let u = whose(tx, caller, user).await?;
    let o = named(tx, owner).await?;
    let offer = between(tx, &o.id, &u.id)
        .await?
        .ok_or_else(|| no_offer(&o, &u))?;
    Ok((u, o, offer))
}

fn no_offer(owner: &UserRow, delegate: &UserRow) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "no offer from `{}` to `{}` (none was made, or it was taken back or declined): `{}` offers one with `waymark delegates --add {}`",
            owner.name, delegate.name, owner.name, delegate.name
        ),
    )
}

/// How many offers wait for their delegate, told at start: delegations made before consent
/// became offers (`migrations/*/20261206000016_delegation_consent.sql`), and a deployment that
/// relied on one learns here why its second person no longer hears of anything.
pub async fn tell_waiting(st: &Context) {
    let waiting = async {
        let mut tx = Tx::read(st).await?;
        let all = tx.delegations(None, None).await?;
        ApiResult::Ok(all.iter().filter(|d| !d.accepted()).count())
    };
    match waiting.await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            waiting = n,
            "delegations wait for their delegate to accept them; until then the delegate sees nothing of the owner's and escalation steps skip them (`waymark delegates --accept OWNER` on the delegate's device)"
        ),
        Err(e) => {
            tracing::warn!(error = %e.problem, "could not count the delegations waiting for consent")
        }
    }
}

async fn named(tx: &mut Tx, name: &str) -> ApiResult<UserRow> {
    tx.user_by_name(name)
        .await?
        .ok_or_else(|| ApiError::new(ErrorCode::NotFound, format!("no user `{name}`")))
}

/// A delegation offered, accepted, declined or ended is written to the audit log with who did
/// it.
async fn note(
    tx: &mut Tx,
    caller: &Caller,
    action: &str,
    owner: &UserRow,
    to: &UserRow,
    more: &str,
) -> ApiResult<()> {
    let now = tx.now;
    tx.insert_audit(&AuditRow {
        at: now,
        actor: caller.actor(),
        action: action.to_owned(),
        task_id: None,
        code: "ok".to_owned(),
        detail: format!("{} → {}{more}", owner.name, to.name),
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
        let user = user_name(tx, &d.delegate_id).await?;
        out.delegates.push(convert::delegation(user, &d));
    }
    for d in tx.delegations(None, Some(&u.id)).await? {
        let user = user_name(tx, &d.owner_id).await?;
        out.delegated_by.push(convert::delegation(user, &d));
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
