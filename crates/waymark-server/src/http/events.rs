//! The read side's streams over HTTP: the snapshot a device starts from and the SSE event
//! stream with resumable cursors, which follows a device's access as it changes.

use std::convert::Infallible;

use axum::Json as Out;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue};
use axum::response::IntoResponse;
use axum::response::Response;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Deserialize;
use waymark_proto::*;

use crate::auth::{Caller, CallerKind};
use crate::convert;
use crate::domain::core::Tx;
use crate::domain::reads;
use crate::error::{ApiError, ApiResult};
use crate::extract::Query;
use crate::state::AppState;

#[utoipa::path(get, path = "/v1/snapshot", tag = "read", responses((status = 200, body = Snapshot)))]
pub(crate) async fn snapshot(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Snapshot>> {
    Ok(Out(reads::snapshot(&st, &caller).await?))
}

/// `?after=CURSOR`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct EventsQuery {
    /// Stream events after this cursor (default 0). `Last-Event-ID` takes precedence.
    #[param(minimum = 0)]
    after: Option<i64>,
}

const PAGE: i64 = 500;

#[utoipa::path(get, path = "/v1/events", tag = "read", params(EventsQuery),
    responses((status = 200, content_type = "text/event-stream", description = "SSE: `id:` is the cursor, `event:` the kind, `data:` the Event"),
              (status = 410, body = Problem, description = "`cursor_expired`: re-snapshot")))]
pub(crate) async fn events(
    State(st): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    Query(q): Query<EventsQuery>,
) -> ApiResult<Response> {
    caller.not_a_runner("the event stream")?;
    let from_header = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| {
                    ApiError::new(
                        ErrorCode::BadRequest,
                        "`Last-Event-ID` must be a cursor number",
                    )
                })?,
        ),
        None => None,
    };
    let after = from_header.or(q.after).unwrap_or(0);
    if after < 0 {
        return Err(ApiError::new(ErrorCode::BadRequest, "a cursor is never negative").into());
    }
    let pruned = Tx::read(&st).await?.pruned_through().await?;
    if after < pruned {
        return Err(cursor_expired(after, pruned).into());
    }
    let slot = st.open_stream(caller.stream_credential())?;
    let stream = event_stream(st.clone(), caller, after, slot);
    let mut res = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(st.config.keep_alive))
        .into_response();
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(res)
}

fn cursor_expired(after: i64, pruned: i64) -> ApiError {
    ApiError::new(
        ErrorCode::CursorExpired,
        format!("cursor {after} is older than the retained events (pruned through {pruned}); take a new snapshot"),
    )
    .with("pruned_through", pruned)
}

fn event_stream(
    st: AppState,
    caller: Caller,
    after: i64,
    slot: crate::streams::StreamSlot,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let mut owners = caller.owner_filter().map(<[String]>::to_vec);
    async_stream::stream! {
        let _slot = slot;
        let _gauge = st.metrics.sse_subscriber();
        // Woken when the shared tail moved (it reads each commit once for every stream).
        let mut watch = st.tail.subscribe(&st.store, st.stopping.subscribe());
        let mut stopping = st.stopping.subscribe();
        // A device's stream ends with its read session: the device opens a new session (a
        // signed `open_session`) and a new stream, checked afresh.
        let clock = st.config.clock.clone();
        let session_ends = caller.session_expires_at;
        let ended = async move {
            match session_ends {
                Some(at) => clock.sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(ended);
        let mut last = after;
        // Set by an access signal naming this stream's user; `signalled` is the newest such
        // signal taken in (the access read after it is at least as new).
        let mut recheck = false;
        let mut signalled = 0_i64;
        loop {
            watch.borrow_and_update();
            // Ended as any stream may end (no event a client must know): it reconnects, finds
            // its session expired, and opens a new one.
            if session_ends.is_some_and(|at| st.now_ms() >= at) {
                break;
            }
            // A device's access can end while it listens (revoked; a delegation ended or
            // began): the change comes down the log as an access signal naming its user, on
            // every replica, and the stream reads its access again before it sends more.
            if recheck && caller.kind == CallerKind::Device {
                recheck = false;
                match device_access(&st, &caller).await {
                    Ok(Some(now_visible)) => owners = Some(now_visible),
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!(error = %e, "could not re-check a device stream's access; ending it");
                        break;
                    }
                }
            }
            // Near the head: from the shared tail, already encoded.
            if let Some(slice) = st.tail.after(last, owners.as_deref(), &caller.user_id) {
                if let Some(at) = slice.access_at.filter(|at| *at > signalled)
                    && caller.kind == CallerKind::Device
                {
                    // Nothing of this slice goes out before the access is read again.
                    signalled = at;
                    recheck = true;
                    continue;
                }
                if last < slice.pruned {
                    let p = cursor_expired(last, slice.pruned).problem;
                    yield Ok(SseEvent::default().event("cursor_expired").data(serde_json::to_string(&p).unwrap_or_default()));
                    break;
                }
                for ev in slice.events {
                    yield Ok(SseEvent::default().id(ev.cursor.to_string()).event(ev.kind).data(&ev.data));
                }
                last = slice.through;
            } else {
                // Behind the tail: a page from the database.
                let page = async {
                    let mut tx = Tx::read(&st).await?;
                    let pruned = tx.pruned_through().await?;
                    // A device's stream also reads the access signals (never sent).
                    let with_signals = owners.as_ref().map(|os| {
                        let mut os = os.clone();
                        os.push(ACCESS_OWNER.to_owned());
                        os
                    });
                    let rows = tx.events_after(last, PAGE, with_signals.as_deref()).await?;
                    Ok::<_, waymark_store::StoreError>((pruned, rows))
                }.await;
                let (pruned, rows) = match page {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(error = %e, "event stream read failed; ending the stream");
                        break;
                    }
                };
                if last < pruned {
                    // The reader fell behind retention: say so, and let it re-snapshot.
                    let p = cursor_expired(last, pruned).problem;
                    yield Ok(SseEvent::default().event("cursor_expired").data(serde_json::to_string(&p).unwrap_or_default()));
                    break;
                }
                let full = rows.len() as i64 == PAGE;
                let signal = rows
                    .iter()
                    .filter(|r| r.cursor > signalled)
                    .filter(|r| crate::tail::access_users(&r.kind, &r.data).contains(&caller.user_id))
                    .map(|r| r.cursor)
                    .max();
                if let Some(at) = signal
                    && caller.kind == CallerKind::Device
                {
                    // Read the access again, then this page afresh with what it allows.
                    signalled = at;
                    recheck = true;
                    continue;
                }
                for mut row in rows {
                    if row.kind == EventKind::AccessChanged {
                        last = row.cursor;
                        continue;
                    }
                    last = row.cursor;
                    // The row is ours: its data moves into the event instead of being copied.
                    let data = std::mem::take(&mut row.data);
                    let mut ev = convert::event(&row);
                    ev.data = data;
                    let data = serde_json::to_string(&ev).unwrap_or_default();
                    yield Ok(SseEvent::default().id(ev.cursor.to_string()).event(ev.kind.as_str()).data(data));
                }
                if full {
                    continue;
                }
            }
            tokio::select! {
                r = watch.changed() => if r.is_err() { break },
                _ = stopping.wait_for(|s| *s) => break,
                _ = &mut ended => {}
            }
        }
    }
}

/// The owners a device's stream sees now; `None` when the device was revoked.
async fn device_access(
    st: &AppState,
    caller: &Caller,
) -> Result<Option<Vec<String>>, waymark_store::StoreError> {
    let mut tx = st.store.read().await?;
    match tx.device(&caller.name).await? {
        Some(d) if d.revoked_at.is_none() => Ok(Some(
            crate::auth::visible_owners(&mut *tx, &caller.user_id).await?,
        )),
        _ => Ok(None),
    }
}
