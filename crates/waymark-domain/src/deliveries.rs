//! Proof of delivery (issue 19): how far each decision has reached each device — pushed (the
//! push service took it), fetched, shown in a notification, opened, answered — each step
//! recorded once, as an event on the decision's task, so a person (and the agent) can tell
//! "the phone was notified 2 minutes ago and has not opened it" from "it never arrived". And
//! which devices are stale: not heard from for longer than `device_stale_after`, never shown
//! as connected.

use std::collections::HashMap;

use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::{Caller, CallerKind};
use crate::convert;
use crate::core::{Tx, emit, invalid};
use crate::error::{ApiError, ApiResult};
use crate::{delegations, escalation};

/// Receipts one request may carry.
pub const MAX_RECEIPTS: usize = 200;

/// Records that `decision` reached `step` on `device`, once: the first time stands, and only
/// that one writes a `decision.delivered` event (and times the stage for `/metrics`). Returns
/// the event's cursor when it was new.
pub async fn record(
    tx: &mut Tx,
    task: &TaskRow,
    decision: &DecisionRow,
    device: &DeviceRow,
    step: DeliveryStep,
    detail: Option<String>,
) -> ApiResult<Option<i64>> {
    let decision_id = decision.id.as_str();
    let row = DeliveryRow {
        decision_id: decision_id.to_owned(),
        device_id: device.id.clone(),
        step,
        at: tx.now,
        detail,
    };
    if !tx.insert_delivery(&row).await? {
        return Ok(None);
    }
    tx.stage(step.as_str(), decision.created_at);
    let wire = convert::delivery(&row, &device.name);
    let cursor = emit(tx, task, EventKind::DecisionDelivered, &wire).await?;
    // Opened or answered somewhere: nobody further in line is notified.
    if matches!(step, DeliveryStep::Opened | DeliveryStep::Answered)
        && let Some(c) = escalation::seen(tx, task, decision_id, device, step).await?
    {
        return Ok(Some(c));
    }
    Ok(Some(cursor))
}

/// `POST /v1/devices/{device}/receipts`: a device says how far decisions have reached it
/// (`fetched`, `shown`, `opened`). All are checked before any is written: the decisions must
/// be its user's; a repeat is fine and counts nothing. The device is heard from now.
pub async fn post_receipts(
    st: &Context,
    caller: &Caller,
    device_id: String,
    req: PostReceipts,
) -> ApiResult<ReceiptsRecorded> {
    if caller.kind != CallerKind::Device || caller.name != device_id {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "a device posts its own receipts, with its read session",
        ));
    }
    if req.receipts.len() > MAX_RECEIPTS {
        return Err(invalid(format!(
            "at most {MAX_RECEIPTS} receipts at once, not {}",
            req.receipts.len()
        )));
    }
    if let Some(r) = req.receipts.iter().find(|r| {
        !matches!(
            r.step,
            DeliveryStep::Fetched | DeliveryStep::Shown | DeliveryStep::Opened
        )
    }) {
        return Err(invalid(format!(
            "`{}` is recorded by the server itself; a device reports `fetched`, `shown` or `opened`",
            r.step
        )));
    }
    let mut tx = Tx::write(st).await?;
    let mut device = tx
        .device(&device_id)
        .await?
        .ok_or_else(|| ApiError::not_found("device", &device_id))?;
    if device.revoked_at.is_some() {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            "the device was revoked",
        ));
    }
    let mut checked = Vec::with_capacity(req.receipts.len());
    for r in &req.receipts {
        let decision = tx.decision(&r.decision_id).await?;
        let task = match &decision {
            Some(d) => tx.task(&d.task_id).await?,
            None => None,
        };
        let visible = match &task {
            Some(t) => {
                t.owner_id == device.user_id
                    || delegations::delegated(&mut tx, &t.owner_id, &device.user_id).await?
            }
            None => false,
        };
        match (task, decision) {
            (Some(t), Some(d)) if visible => checked.push((t, d, r)),
            // Another user's decision reads as missing, as their tasks do (unless delegated).
            _ => return Err(ApiError::not_found("decision", &r.decision_id)),
        }
    }
    let mut recorded = 0;
    let mut cursor = None;
    for (task, d, r) in &checked {
        if let Some(c) = record(&mut tx, task, d, &device, r.step, None).await? {
            recorded += 1;
            cursor = Some(c);
        }
    }
    device.last_seen_at = Some(tx.now);
    tx.update_device(&device).await?;
    let cursor = match cursor {
        Some(c) => c,
        None => tx.max_cursor().await?,
    };
    tx.commit().await?;
    Ok(ReceiptsRecorded { recorded, cursor })
}

/// Fills each decision's `deliveries` from the store, with the devices' names.
pub async fn attach(tx: &mut Tx, decisions: &mut [Decision]) -> ApiResult<()> {
    let ids: Vec<String> = decisions.iter().map(|d| d.id.clone()).collect();
    let rows = tx.deliveries(&ids).await?;
    if rows.is_empty() {
        return Ok(());
    }
    let mut names: HashMap<String, String> = HashMap::new();
    for r in &rows {
        if !names.contains_key(&r.device_id) {
            let name = tx
                .device(&r.device_id)
                .await?
                .map_or_else(|| r.device_id.clone(), |d| d.name);
            names.insert(r.device_id.clone(), name);
        }
    }
    for d in decisions.iter_mut() {
        d.deliveries = rows
            .iter()
            .filter(|r| r.decision_id == d.id)
            .map(|r| convert::delivery(r, &names[&r.device_id]))
            .collect();
    }
    Ok(())
}

/// A device as its user sees it: `stale` when not heard from for `device_stale_after`.
pub fn device_wire(st: &Context, d: &DeviceRow, user: &str) -> ApiResult<Device> {
    let mut wire = convert::device(d, user);
    let stale_after = st.config.device_stale_after.as_millis() as i64;
    wire.stale = d.revoked_at.is_none()
        && d.last_seen_at.unwrap_or(d.created_at) + stale_after <= st.now_ms();
    Ok(wire)
}

/// `GET /v1/devices`: the caller's user's devices (a device's read session), or every device
/// (the admin), oldest first, each with when it was last heard from and whether it is stale.
pub async fn list_devices(st: &Context, caller: &Caller) -> ApiResult<Vec<Device>> {
    let mut tx = Tx::read(st).await?;
    let filter = match caller.kind {
        CallerKind::Admin => None,
        CallerKind::Device => Some(caller.user_id.as_str()),
        _ => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "devices are listed with a device's read session (or the admin token)",
            ));
        }
    };
    let mut out = Vec::new();
    let mut users: HashMap<String, String> = HashMap::new();
    for d in tx.list_devices(filter).await? {
        if !users.contains_key(&d.user_id) {
            let name = tx
                .user_by_id(&d.user_id)
                .await?
                .map(|u| u.name)
                .unwrap_or_default();
            users.insert(d.user_id.clone(), name);
        }
        out.push(device_wire(st, &d, &users[&d.user_id])?);
    }
    Ok(out)
}
