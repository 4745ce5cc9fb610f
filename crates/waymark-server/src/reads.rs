//! The read side: snapshot, thread detail (with chain verification), decision long-polls, the
//! SSE event stream with resumable cursors, blobs, and the admin's audit and retention routes.

use std::convert::Infallible;
use std::time::Duration;

use axum::Json as Out;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Deserialize;
use waymark_proto::digest::is_sha256_hex;
use waymark_proto::*;

use crate::auth::{Caller, CallerKind};
use crate::convert;
use crate::domain::core::{Tx, task_for};
use crate::domain::decisions::expire_overdue;
use crate::domain::deliveries;
use crate::domain::reads::{self, AuditEntry};
use crate::domain::retention::{self, Pruned};
use crate::error::{ApiError, ApiResult, HttpError};
use crate::extract::Query;
use crate::state::AppState;

#[utoipa::path(get, path = "/healthz", tag = "ops", security(()), responses((status = 200, body = Health)))]
pub(crate) async fn healthz(State(st): State<AppState>) -> ApiResult<Out<Health>> {
    let cursor = Tx::read(&st).await?.max_cursor().await?;
    Ok(Out(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        cursor,
    }))
}

pub(crate) async fn not_found(uri: Uri) -> HttpError {
    HttpError(ApiError::new(
        ErrorCode::NotFound,
        format!("no route `{}`; see `/v1/openapi.json`", uri.path()),
    ))
}

pub(crate) async fn method_not_allowed(uri: Uri) -> HttpError {
    HttpError(ApiError::new(
        ErrorCode::MethodNotAllowed,
        format!("`{}` does not take this method", uri.path()),
    ))
}

#[utoipa::path(get, path = "/v1/snapshot", tag = "read", responses((status = 200, body = Snapshot)))]
pub(crate) async fn snapshot(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Snapshot>> {
    Ok(Out(reads::snapshot(&st, &caller).await?))
}

#[utoipa::path(get, path = "/v1/tasks/{task}", tag = "read", params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$")),
    responses((status = 200, body = TaskDetail), (status = 404, body = Problem)))]
pub(crate) async fn task_detail(
    State(st): State<AppState>,
    caller: Caller,
    Path(task_id): Path<String>,
) -> ApiResult<Out<TaskDetail>> {
    Ok(Out(reads::task_detail(&st, &caller, task_id).await?))
}

/// `?wait=30s`: how long to hold the request open for an outcome.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct WaitQuery {
    /// A duration (`30s`, `2m`) or seconds; at most the server's bound (60 s).
    wait: Option<String>,
}

fn parse_wait(st: &AppState, q: &WaitQuery) -> ApiResult<Duration> {
    let Some(w) = q.wait.as_deref() else {
        return Ok(Duration::ZERO);
    };
    let d = w
        .parse::<u64>()
        .map(Duration::from_secs)
        .or_else(|_| humantime::parse_duration(w))
        .map_err(|_| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!("`wait={w}` is not a duration like `30s`"),
            )
        })?;
    Ok(d.min(st.config.max_wait))
}

#[utoipa::path(get, path = "/v1/tasks/{task}/decisions/{decision}", tag = "worker",
    params(("task" = String, Path, pattern = r"^task_[0-9a-f]{32}$"), ("decision" = String, Path, pattern = r"^dec_[0-9a-f]{32}$"), WaitQuery),
    responses((status = 200, body = Decision)))]
pub(crate) async fn get_decision(
    State(st): State<AppState>,
    caller: Caller,
    Path((task_id, decision_id)): Path<(String, String)>,
    Query(q): Query<WaitQuery>,
) -> ApiResult<Out<Decision>> {
    let deadline = tokio::time::Instant::now() + parse_wait(&st, &q)?;
    let mut watch = st.cursor_watch();
    // Counted in `waymark_decision_waits` from its first wait until it answers; by then the
    // watch above is subscribed, so any answer committed later wakes it.
    let mut waiting = None;
    loop {
        watch.borrow_and_update();
        let mut tx = Tx::read(&st).await?;
        let task = task_for(&mut tx, &caller, &task_id).await?;
        let d = tx
            .decision(&decision_id)
            .await?
            .filter(|d| d.task_id == task.id)
            .ok_or_else(|| ApiError::not_found("decision", &decision_id))?;
        drop(tx);
        let pending = d.status == DecisionStatus::Pending;
        let now = st.now_ms();
        if pending && d.expires_at <= now {
            expire_overdue(&st, &d.id).await?;
            continue;
        }
        if !pending || tokio::time::Instant::now() >= deadline {
            let mut wire = [convert::decision(&d)?];
            deliveries::attach(&mut Tx::read(&st).await?, &mut wire).await?;
            let [wire] = wire;
            return Ok(Out(wire));
        }
        let until_expiry = Duration::from_millis((d.expires_at - now).max(0) as u64);
        let wake = deadline.min(tokio::time::Instant::now() + until_expiry);
        waiting.get_or_insert_with(|| st.metrics.decision_wait());
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            r = watch.changed() => { if r.is_err() { return Ok(Out(convert::decision(&d)?)); } }
        }
    }
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
                    match convert::event(&row) {
                        Ok(mut ev) => {
                            ev.data = data;
                            let data = serde_json::to_string(&ev).unwrap_or_default();
                            yield Ok(SseEvent::default().id(ev.cursor.to_string()).event(ev.kind.as_str()).data(data));
                        }
                        Err(e) => tracing::error!(cursor = row.cursor, error = %e, "skipping an undecodable event"),
                    }
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

#[utoipa::path(get, path = "/v1/blobs/{sha256}", tag = "read", params(("sha256" = String, Path, pattern = r"^[0-9a-f]{64}$", description = "64 lower-case hex digits")),
    responses((status = 200, content_type = "application/octet-stream", body = Vec<u8>), (status = 400, body = Problem, description = "not a sha256 hex digest"), (status = 404, body = Problem)))]
pub(crate) async fn blob(
    State(st): State<AppState>,
    caller: Caller,
    Path(sha): Path<String>,
) -> ApiResult<Response> {
    caller.not_a_runner("blobs")?;
    if !is_sha256_hex(&sha) {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "a blob is named by 64 lower-case hex digits (sha256)",
        )
        .into());
    }
    let mut tx = Tx::read(&st).await?;
    if !tx.blob_visible(&sha, caller.owner_filter()).await? {
        return Err(ApiError::not_found("blob", &sha).into());
    }
    let data = tx
        .blob(&sha)
        .await?
        .ok_or_else(|| ApiError::not_found("blob", &sha))?;
    let mut res = (StatusCode::OK, data).into_response();
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    if let Ok(v) = HeaderValue::from_str(&format!("\"{sha}\"")) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=31536000, immutable"),
    );
    Ok(res)
}

pub(crate) fn admin_only(caller: &Caller) -> Result<(), ApiError> {
    if caller.kind == CallerKind::Admin {
        Ok(())
    } else {
        Err(ApiError::new(
            ErrorCode::Forbidden,
            "this route needs the admin token",
        ))
    }
}

#[utoipa::path(post, path = "/v1/admin/events/prune", tag = "admin", responses((status = 200, body = Pruned)))]
pub(crate) async fn admin_prune(
    State(st): State<AppState>,
    caller: Caller,
) -> ApiResult<Out<Pruned>> {
    admin_only(&caller)?;
    Ok(Out(retention::prune(&st).await?))
}

/// `?task=…&limit=…`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct AuditQuery {
    /// Only this task's entries.
    task: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<i64>,
}

#[utoipa::path(get, path = "/v1/admin/audit", tag = "admin", params(AuditQuery),
    responses((status = 200, body = Vec<AuditEntry>)))]
pub(crate) async fn admin_audit(
    State(st): State<AppState>,
    caller: Caller,
    Query(q): Query<AuditQuery>,
) -> ApiResult<Out<Vec<AuditEntry>>> {
    admin_only(&caller)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    Ok(Out(reads::audit(&st, q.task.as_deref(), limit).await?))
}
