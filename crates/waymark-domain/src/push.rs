//! Push to devices that are not connected (SPEC §6): each registered channel follows its
//! user's event log from its own cursor and gets a content-free push for what deserves one (a
//! decision asked, a task finished, an effect whose outcome is unknown) — Web Push (RFC 8030,
//! VAPID RFC 8292, aes128gcm RFC 8291, through the `web-push` crate) or a UnifiedPush/ntfy-style
//! HTTP endpoint. Attempts, retries and failures are recorded on the channel, so a broken
//! channel never stays silent.

use crate::Context;
use crate::caller::{Caller, CallerKind};
use crate::convert;
use crate::core::{Tx, invalid, shared_secret};
use crate::error::{ApiError, ApiResult};
use crate::{deliveries, escalation};
use std::time::Duration;
use waymark_proto::signing::b64;
use waymark_proto::*;
use waymark_store::*;

pub const VAPID_SECRET: &str = "vapid-private-key";

/// The `sub` claim of VAPID tokens: who to contact about this sender.
pub const VAPID_SUBJECT: &str = "mailto:operator@waymark.invalid";

pub const BATCH: i64 = 50;

/// The server's VAPID private key (raw P-256 scalar, base64url), created once and shared by
/// every replica through the store.
pub async fn vapid_private(st: &Context) -> ApiResult<String> {
    let key = shared_secret(&*st.store, VAPID_SECRET, || {
        let (pair, _) = ece::generate_keypair_and_auth_secret().map_err(|e| {
            ApiError::new(
                ErrorCode::Internal,
                format!("generating the VAPID key: {e}"),
            )
        })?;
        let raw = pair.raw_components().map_err(|e| {
            ApiError::new(ErrorCode::Internal, format!("exporting the VAPID key: {e}"))
        })?;
        vapid_scalar(&b64(raw.private_key()))
    })
    .await?;
    vapid_scalar(&key)
}

/// A P-256 scalar as the VAPID signer wants it: exactly 32 bytes. The key generator drops
/// leading zero bytes (one key in 256 comes out 31 bytes long, which the signer refuses), so
/// the scalar is padded back on every read, also for keys stored before this was known.
pub fn vapid_scalar(stored: &str) -> ApiResult<String> {
    let bad =
        |why: String| ApiError::new(ErrorCode::Internal, format!("the stored VAPID key {why}"));
    let raw = waymark_proto::signing::unb64(stored, "VAPID key").map_err(|e| bad(e.to_string()))?;
    if raw.is_empty() || raw.len() > 32 {
        return Err(bad(format!("is {} bytes, not a P-256 scalar", raw.len())));
    }
    let mut scalar = [0u8; 32];
    scalar[32 - raw.len()..].copy_from_slice(&raw);
    Ok(b64(&scalar))
}

pub async fn vapid(st: &Context) -> ApiResult<VapidKey> {
    let private = vapid_private(st).await?;
    let builder = web_push::VapidSignatureBuilder::from_base64_no_sub(&private)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("the VAPID key: {e}")))?;
    Ok(VapidKey {
        public_key: b64(&builder.get_public_key()),
    })
}

pub fn own_device(caller: &Caller, device: &str) -> ApiResult<()> {
    let ok = caller.kind == CallerKind::Admin
        || (caller.kind == CallerKind::Device && caller.name == device);
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "a device manages its own push channels (with its read session)",
        ))
    }
}

pub async fn register(
    st: &Context,
    caller: &Caller,
    device_id: String,
    req: RegisterPush,
) -> ApiResult<PushChannel> {
    own_device(caller, &device_id)?;
    let kind: PushKind = req.kind.parse().map_err(|_| {
        invalid(format!(
            "unknown push kind `{}`: use `web_push` or `unified_push`",
            crate::core::clip(&req.kind, 40)
        ))
    })?;
    crate::outbound::check_endpoint(&req.endpoint, kind == PushKind::WebPush, &st.push_allowed)
        .map_err(|e| invalid(e.to_string()))?;
    let url = req.endpoint.clone();
    let (p256dh, auth) = match (kind, &req.keys) {
        (PushKind::WebPush, Some(k)) => {
            let pk = waymark_proto::signing::unb64(&k.p256dh, "p256dh")
                .map_err(|e| invalid(e.to_string()))?;
            let au = waymark_proto::signing::unb64(&k.auth, "auth")
                .map_err(|e| invalid(e.to_string()))?;
            if pk.len() != 65 || au.len() != 16 {
                return Err(invalid(
                    "`keys.p256dh` is a 65-byte P-256 point and `keys.auth` 16 bytes, base64url",
                ));
            }
            (Some(k.p256dh.clone()), Some(k.auth.clone()))
        }
        (PushKind::WebPush, None) => {
            return Err(invalid("a `web_push` channel needs `keys` (p256dh, auth)"));
        }
        (PushKind::UnifiedPush, _) => (None, None),
    };
    let mut tx = Tx::write(st).await?;
    let device = tx
        .device(&device_id)
        .await?
        .ok_or_else(|| ApiError::not_found("device", &device_id))?;
    let now = tx.now;
    let mut live: Vec<PushChannelRow> = tx
        .push_channels(Some(&device.id))
        .await?
        .into_iter()
        .filter(|c| c.revoked_at.is_none())
        .collect();
    // The same subscription registered again (a page turning notifications on once more) is
    // the channel it already has.
    if let Some(same) = live
        .iter()
        .find(|c| c.kind == kind && c.endpoint == url && c.p256dh == p256dh && c.auth == auth)
    {
        return Ok(convert::push_channel(same));
    }
    // At most `max_push_channels_per_device` live: the oldest make room for the newest, so a
    // device that re-subscribes keeps working and one that floods stays bounded.
    live.sort_by_key(|c| c.created_at);
    let cap = st.config.max_push_channels_per_device.max(1);
    let over = (live.len() + 1).saturating_sub(cap);
    for mut old in live.into_iter().take(over) {
        old.revoked_at = Some(now);
        old.last_error = Some("replaced by a newer channel of this device".into());
        tx.update_push_channel(&old).await?;
    }
    let row = PushChannelRow {
        id: ids::push(),
        device_id: device.id.clone(),
        user_id: device.user_id.clone(),
        kind,
        endpoint: url,
        p256dh,
        auth,
        // From now on: no backlog of old events.
        cursor: tx.max_cursor().await?,
        attempts: 0,
        delivered: 0,
        failures: 0,
        consecutive_failures: 0,
        last_error: None,
        last_attempt_at: None,
        next_attempt_at: now,
        created_at: now,
        revoked_at: None,
    };
    tx.insert_push_channel(&row).await?;
    tx.commit().await?;
    Ok(convert::push_channel(&row))
}

pub async fn list(st: &Context, caller: &Caller, device_id: String) -> ApiResult<Vec<PushChannel>> {
    own_device(caller, &device_id)?;
    let rows = st
        .store
        .read()
        .await?
        .push_channels(Some(&device_id))
        .await?;
    Ok(rows.iter().map(convert::push_channel).collect())
}

/// Whether an event deserves a push to `device_id`. A decision whose user has an escalation
/// policy reaches only the devices a step notified, when it notified them. Of another
/// user's tasks (`own` false: delegated to this device's user) only what a step of that
/// user's escalation sent to this device.
pub fn worth_a_push(e: &EventRow, device_id: &str, own: bool) -> bool {
    if !own {
        return matches!(
            e.kind,
            EventKind::DecisionRequested | EventKind::DecisionEscalated
        ) && escalation::pushes_to(&e.data, e.at, device_id) == Some(true);
    }
    match e.kind {
        EventKind::DecisionRequested => {
            escalation::pushes_to(&e.data, e.at, device_id).unwrap_or(true)
        }
        EventKind::DecisionEscalated => {
            escalation::pushes_to(&e.data, e.at, device_id).unwrap_or(false)
        }
        EventKind::TaskUpdated => e
            .data
            .get("state")
            .and_then(|s| s.as_str())
            .and_then(|s| s.parse::<TaskState>().ok())
            .is_some_and(|s| s.is_terminal() || s == TaskState::NeedsHuman),
        EventKind::EffectUpdated => {
            e.data.get("status").and_then(|s| s.as_str()) == Some("unknown")
        }
        _ => false,
    }
}

/// The decision a decision event is about.
fn decision_of(e: &EventRow) -> Option<&str> {
    e.data.get("id").and_then(|v| v.as_str())
}

/// Starts a round of delivery beside the caller unless one is under way (the next pass
/// starts the next).
pub fn spawn_round(st: &Context) {
    let Ok(one_at_a_time) = st.pushing.clone().try_lock_owned() else {
        return;
    };
    let st = st.clone();
    tokio::spawn(async move {
        let _one_at_a_time = one_at_a_time;
        if let Err(e) = tick(&st).await {
            tracing::warn!(error = %e.problem, "push delivery failed");
        }
    });
}

/// A round of delivery, after any under way; returns when it is done.
pub async fn round(st: &Context) {
    let _one_at_a_time = st.pushing.lock().await;
    if let Err(e) = tick(st).await {
        tracing::warn!(error = %e.problem, "push delivery failed");
    }
}

/// Delivers what each channel has not had yet, `push_concurrency` channels at a time (a
/// silent endpoint holds one slot for at most its timeouts). One replica at a time.
async fn tick(st: &Context) -> ApiResult<usize> {
    let now = st.now_ms();
    let channels: Vec<PushChannelRow> = st
        .store
        .read()
        .await?
        .push_channels(None)
        .await?
        .into_iter()
        .filter(|c| c.next_attempt_at <= now)
        .collect();
    if channels.is_empty() {
        return Ok(0);
    }
    let mut claim = Tx::read(st).await?;
    if !claim.try_claim("push").await? {
        return Ok(0);
    }
    use futures::StreamExt;
    let results: Vec<ApiResult<usize>> = futures::stream::iter(channels)
        .map(|c| deliver(st, c))
        .buffer_unordered(st.config.push_concurrency.max(1))
        .collect()
        .await;
    drop(claim);
    let mut sent = 0;
    for r in results {
        match r {
            Ok(n) => sent += n,
            Err(e) => tracing::warn!(error = %e.problem, "delivering to a push channel failed"),
        }
    }
    Ok(sent)
}

pub async fn deliver(st: &Context, mut c: PushChannelRow) -> ApiResult<usize> {
    let events = {
        let mut tx = Tx::read(st).await?;
        // Revoked since the pass listed it (its device was revoked meanwhile): nothing more.
        let now_revoked = tx
            .push_channels(Some(&c.device_id))
            .await?
            .iter()
            .any(|x| x.id == c.id && x.revoked_at.is_some());
        if now_revoked {
            return Ok(0);
        }
        if c.cursor < tx.pruned_through().await? {
            c.cursor = tx.pruned_through().await?;
        }
        // Its user's tasks and those delegated to them (pushed only where a step names them).
        let owners = crate::caller::visible_owners(&mut *tx, &c.user_id).await?;
        let events = tx.events_after(c.cursor, BATCH, Some(&owners)).await?;
        // Of the decisions that closed, those this device was pushed before: its notification
        // for each is withdrawn.
        let closed: Vec<String> = events
            .iter()
            .filter(|e| e.kind == EventKind::DecisionClosed)
            .filter_map(|e| decision_of(e).map(str::to_owned))
            .collect();
        let shown: std::collections::HashSet<String> = if closed.is_empty() {
            Default::default()
        } else {
            tx.deliveries(&closed)
                .await?
                .into_iter()
                .filter(|d| d.device_id == c.device_id && d.step == DeliveryStep::Pushed)
                .map(|d| d.decision_id)
                .collect()
        };
        (events, shown)
    };
    let (events, mut shown) = events;
    let mut sent = 0;
    // Decisions the push service took a push about: proof of delivery's first step.
    let mut pushed: Vec<(String, String)> = Vec::new();
    for e in events {
        let withdraw = e.kind == EventKind::DecisionClosed
            && decision_of(&e).is_some_and(|id| shown.contains(id));
        if withdraw || worth_a_push(&e, &c.device_id, e.owner_id == c.user_id) {
            let payload = PushPayload {
                v: 1,
                kind: e.kind.as_str().to_owned(),
                task_id: e.task_id.clone(),
                cursor: e.cursor,
                decision_id: withdraw.then(|| decision_of(&e).unwrap_or_default().to_owned()),
            };
            c.attempts += 1;
            c.last_attempt_at = Some(st.now_ms());
            match send(st, &c, &payload).await {
                Ok(()) => {
                    c.delivered += 1;
                    c.consecutive_failures = 0;
                    sent += 1;
                    if matches!(
                        e.kind,
                        EventKind::DecisionRequested | EventKind::DecisionEscalated
                    ) && let Some(id) = e.data.get("id").and_then(|v| v.as_str())
                    {
                        pushed.push((e.task_id.clone(), id.to_owned()));
                        // Closed later in this batch: withdrawn the same way.
                        shown.insert(id.to_owned());
                    }
                }
                Err(Failure::Gone(why)) => {
                    c.failures += 1;
                    c.last_error = Some(why);
                    c.revoked_at = Some(st.now_ms());
                    break;
                }
                Err(Failure::Retry(why)) => {
                    c.failures += 1;
                    c.consecutive_failures += 1;
                    c.last_error = Some(why);
                    let wait = retry_delay(st.config.push_retry_base, c.consecutive_failures);
                    c.next_attempt_at = st.now_ms() + wait.as_millis() as i64;
                    break;
                }
            }
        }
        c.cursor = e.cursor;
    }
    let mut tx = Tx::write(st).await?;
    // Revoked while this round was sending (the device's cap replaced it, the device was
    // revoked): it stays revoked — writing back the copy this round read would bring it back.
    if c.revoked_at.is_none()
        && let Some(now) = tx
            .push_channels(Some(&c.device_id))
            .await?
            .into_iter()
            .find(|x| x.id == c.id && x.revoked_at.is_some())
    {
        c.revoked_at = now.revoked_at;
        c.last_error = now.last_error;
    }
    tx.update_push_channel(&c).await?;
    if !pushed.is_empty()
        && let Some(device) = tx.device(&c.device_id).await?
    {
        let detail = format!("{} accepted the push", push_service(&c.endpoint));
        for (task_id, decision_id) in pushed {
            if let (Some(task), Some(d)) =
                (tx.task(&task_id).await?, tx.decision(&decision_id).await?)
            {
                deliveries::record(
                    &mut tx,
                    &task,
                    &d,
                    &device,
                    DeliveryStep::Pushed,
                    Some(detail.clone()),
                )
                .await?;
            }
        }
    }
    tx.commit().await?;
    Ok(sent)
}

/// The wait before the next try after `failures` consecutive failures: from `base`, doubling,
/// at most 15 minutes (backon's exponential schedule; the count is stored, so the schedule is
/// replayed to it).
fn retry_delay(base: Duration, failures: i64) -> Duration {
    use backon::BackoffBuilder;
    const MAX: Duration = Duration::from_secs(15 * 60);
    backon::ExponentialBuilder::default()
        .with_min_delay(base)
        .with_max_delay(MAX)
        .without_max_times()
        .build()
        .nth(usize::try_from(failures.saturating_sub(1)).unwrap_or(0))
        .unwrap_or(MAX)
}

enum Failure {
    /// Try again later.
    Retry(String),
    /// The push service says the subscription is gone (404/410).
    Gone(String),
}

/// The push service, for people: the endpoint's host.
fn push_service(endpoint: &str) -> String {
    url::Url::parse(endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .unwrap_or_else(|| "the push service".into())
}

async fn send(st: &Context, c: &PushChannelRow, payload: &PushPayload) -> Result<(), Failure> {
    let body = serde_json::to_vec(payload).unwrap_or_default();
    // A name is checked by the client's resolver as it connects; an address literal here
    // (the allow-list may have changed since the channel was registered).
    let endpoint = url::Url::parse(&c.endpoint)
        .map_err(|_| Failure::Retry("the endpoint is not a URL".into()))?;
    if let Some(ip) = crate::outbound::literal_ip(&endpoint)
        && !st.push_allowed.reaches(ip)
    {
        return Err(Failure::Retry(
            "the push service's address is not public (the operator can allow it: `serve --push-allow`)".into(),
        ));
    }
    let http = &st.push_http;
    let req = match c.kind {
        PushKind::WebPush => {
            let private = vapid_private(st)
                .await
                .map_err(|e| Failure::Retry(e.problem.detail.clone()))?;
            let info = web_push::SubscriptionInfo::new(
                c.endpoint.clone(),
                c.p256dh.clone().unwrap_or_default(),
                c.auth.clone().unwrap_or_default(),
            );
            let mut sig = web_push::VapidSignatureBuilder::from_base64(&private, &info)
                .map_err(|e| Failure::Retry(format!("VAPID: {e}")))?;
            sig.add_claim("sub", VAPID_SUBJECT);
            // RFC 8292: `aud` is the endpoint's origin, port included (the crate drops it).
            let origin = url::Url::parse(&c.endpoint)
                .map(|u| u.origin().ascii_serialization())
                .map_err(|e| Failure::Retry(format!("bad endpoint: {e}")))?;
            sig.add_claim("aud", origin.as_str());
            let sig = sig
                .build()
                .map_err(|e| Failure::Retry(format!("VAPID: {e}")))?;
            let mut b = web_push::WebPushMessageBuilder::new(&info);
            b.set_payload(web_push::ContentEncoding::Aes128Gcm, &body);
            b.set_vapid_signature(sig);
            b.set_ttl(24 * 3600);
            let msg = b
                .build()
                .map_err(|e| Failure::Retry(format!("encrypting the push: {e}")))?;
            // The request RFC 8030 describes, as `web_push::request_builder` builds it.
            let mut r = http
                .post(msg.endpoint.to_string())
                .header("TTL", msg.ttl.to_string());
            if let Some(u) = msg.urgency {
                r = r.header("Urgency", u.to_string());
            }
            if let Some(p) = msg.payload {
                r = r
                    .header("Content-Encoding", p.content_encoding.to_str())
                    .header("Content-Type", "application/octet-stream");
                for (k, v) in p.crypto_headers {
                    r = r.header(k, v);
                }
                r = r.body(p.content);
            }
            r.build()
                .map_err(|e| Failure::Retry(format!("building the push request: {e}")))?
        }
        PushKind::UnifiedPush => http
            .post(&c.endpoint)
            .header("content-type", "application/json")
            .header("title", "Waymark")
            .body(body)
            .build()
            .map_err(|e| Failure::Retry(e.to_string()))?,
    };
    // What the device is told is a class, never the network's own words: an endpoint is
    // chosen by the device, and exact answers would make the server a scanner.
    match http.execute(req).await {
        Ok(res) if res.status().is_success() => Ok(()),
        Ok(res) if matches!(res.status().as_u16(), 404 | 410) => Err(Failure::Gone(
            "the push service says the subscription is gone".into(),
        )),
        Ok(res) => {
            tracing::debug!(channel = %c.id, status = %res.status(), "push refused");
            Err(Failure::Retry(
                crate::outbound::status_class(res.status()).into(),
            ))
        }
        Err(e) => {
            tracing::debug!(channel = %c.id, error = %e, "push not delivered");
            Err(Failure::Retry(crate::outbound::failure_class(&e).into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scalar_that_came_out_short_is_padded_so_the_signer_takes_it() {
        // One generated key in 256 starts with a zero byte, which the generator drops.
        let short = b64(&[7u8; 31]);
        let key = vapid_scalar(&short).unwrap();
        let raw = waymark_proto::signing::unb64(&key, "key").unwrap();
        assert_eq!(raw.len(), 32);
        assert_eq!((raw[0], raw[1], raw[31]), (0, 7, 7));
        web_push::VapidSignatureBuilder::from_base64_no_sub(&key)
            .expect("the signer takes a 32-byte scalar");
        // A full-length key is kept as it is.
        let full = b64(&[9u8; 32]);
        assert_eq!(vapid_scalar(&full).unwrap(), full);
        // Nothing else is a scalar.
        assert!(vapid_scalar(&b64(&[1u8; 33])).is_err());
        assert!(vapid_scalar("").is_err());
        assert!(vapid_scalar("not base64!").is_err());
    }

    #[test]
    fn a_failing_channel_waits_twice_as_long_each_time_up_to_a_quarter_hour() {
        let base = Duration::from_secs(2);
        let waits: Vec<u64> = (1..=4).map(|n| retry_delay(base, n).as_secs()).collect();
        assert_eq!(waits, [2, 4, 8, 16]);
        assert_eq!(retry_delay(base, 40), Duration::from_secs(15 * 60));
        assert_eq!(
            retry_delay(base, 0),
            base,
            "no failure yet counts as the first"
        );
    }
}
