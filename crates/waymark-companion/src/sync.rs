//! Sync: snapshot, then the event stream from the mirror's cursor, applied in batches with the
//! cursor in the same transaction (a 410 re-snapshots); the outbox delivered first; blobs
//! prefetched for offline review; the link's health as people see it.

use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use waymark_proto::*;

use crate::api::Api;
use crate::companion::{Companion, LinkHealth};
use crate::error::Error;
use crate::mirror::OutboxEntry;

/// What a sync did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SyncReport {
    /// Events applied.
    pub events: usize,
    /// A full snapshot was taken (first sync, or the cursor expired).
    pub snapshot: bool,
    /// Queued commands delivered, with their results.
    pub delivered: Vec<OutboxEntry>,
    /// Blobs fetched for offline review.
    pub prefetched: usize,
    /// The cursor the mirror is current to.
    pub cursor: i64,
}

/// Called with every batch of events applied while following.
pub(crate) type OnBatch<'a> = Option<&'a (dyn Fn(&[Event]) + Sync)>;

/// Cached blobs are capped at this many bytes (least recently used go first).
pub(crate) const BLOB_CACHE_BYTES: i64 = 256 << 20;

/// Most events applied to the mirror in one transaction while catching up (a live stream
/// applies what it has after 30 ms without a new event).
pub(crate) const APPLY_BATCH: usize = 2048;

/// A batch being applied to the mirror while the stream is read on; it hands the batch back.
pub(crate) type Writing = tokio::task::JoinHandle<Result<Vec<Event>, Error>>;

impl Companion {
    pub(crate) fn set_health(&self, f: impl FnOnce(&mut LinkHealth)) {
        self.health.send_modify(f);
    }

    pub(crate) async fn resnapshot(&self, api: &Api, token: &str) -> Result<i64, Error> {
        let snap: Snapshot = api.get(token, "/v1/snapshot").await?;
        let mut threads = Vec::with_capacity(snap.tasks.len());
        for t in &snap.tasks {
            threads.push(
                api.get::<TaskDetail>(token, &format!("/v1/tasks/{}", t.task.id))
                    .await?,
            );
        }
        self.mirror.replace_all(snap.cursor, &threads).await?;
        Ok(snap.cursor)
    }

    /// One sync: deliver the outbox, then bring the mirror up to the stream's head (a fresh
    /// snapshot when there is no cursor or it expired), then prefetch blobs for offline review.
    pub async fn sync_once(&self) -> Result<SyncReport, Error> {
        let r = self.sync_inner(None).await;
        self.after_sync(&r);
        r
    }

    pub(crate) fn after_sync(&self, r: &Result<SyncReport, Error>) {
        let now = Utc::now().timestamp_millis();
        match r {
            Ok(_) => self.set_health(|h| {
                h.server_reachable = true;
                h.reconnecting_since = None;
                h.last_sync_at = Some(now);
                h.last_error = None;
            }),
            Err(e) => self.set_health(|h| {
                h.connected = false;
                h.server_reachable = !matches!(e, Error::Unreachable(_));
                h.reconnecting_since.get_or_insert(now);
                h.last_error = Some(e.to_string());
            }),
        }
    }

    /// Streams events until the stream has been idle for `idle`, or forever with `None`
    /// passed as `follow` (then `on_batch` sees every applied batch).
    pub(crate) async fn sync_inner(&self, follow: OnBatch<'_>) -> Result<SyncReport, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        let mut report = SyncReport {
            delivered: self.deliver_outbox().await?,
            ..Default::default()
        };
        let mut cursor = match self.mirror.cursor().await? {
            Some(c) => c,
            None => {
                report.snapshot = true;
                self.resnapshot(&api, &token).await?
            }
        };
        // Where the log stands now: once the stream has passed it, a short pause means caught
        // up (otherwise, e.g. when the newest events are another user's, the longer one does).
        let head = match follow {
            Some(_) => None,
            None => api
                .get::<Health>(&token, "/healthz")
                .await
                .ok()
                .map(|h| h.cursor),
        };
        loop {
            match self
                .stream(&api, &token, cursor, head, follow, &mut report)
                .await
            {
                Err(Error::CursorExpired) => {
                    report.snapshot = true;
                    cursor = self.resnapshot(&api, &token).await?;
                }
                other => {
                    other?;
                    break;
                }
            }
        }
        self.fetched_receipts(&api, &token).await;
        report.prefetched = self.prefetch(&api, &token).await?;
        report.cursor = self.mirror.cursor().await?.unwrap_or(cursor);
        // Commands the stream showed acknowledged are reflected in the outbox entries.
        let ids: Vec<String> = report
            .delivered
            .iter()
            .map(|e| e.command_id.clone())
            .collect();
        report.delivered = self
            .mirror
            .outbox(None)
            .await?
            .into_iter()
            .filter(|e| ids.contains(&e.command_id))
            .collect();
        Ok(report)
    }

    pub(crate) async fn stream(
        &self,
        api: &Api,
        token: &str,
        after: i64,
        head: Option<i64>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let mut events = Box::pin(api.events(token, after).await?);
        self.set_health(|h| {
            h.connected = true;
            h.server_reachable = true;
            h.reconnecting_since = None;
        });
        let idle = if follow.is_some() {
            Duration::from_secs(3600 * 24 * 365)
        } else {
            Duration::from_millis(400)
        };
        let mut batch: Vec<Event> = Vec::new();
        // The previous batch, written to the mirror while the next one is read.
        let mut writing: Option<Writing> = None;
        let mut seen = after;
        loop {
            let pending = !batch.is_empty() || writing.is_some();
            let wait = if pending || head.is_some_and(|h| seen >= h) {
                Duration::from_millis(30)
            } else {
                idle
            };
            match tokio::time::timeout(wait, events.next()).await {
                Ok(Some(Ok(ev))) => {
                    seen = seen.max(ev.cursor);
                    batch.push(ev);
                    if batch.len() < APPLY_BATCH {
                        continue;
                    }
                    // A full batch while catching up: write it while the stream is read on,
                    // one batch in flight at a time so they apply in order.
                    self.written(&mut writing, follow, report).await?;
                    let batch = std::mem::take(&mut batch);
                    let mirror = self.mirror.clone();
                    writing = Some(tokio::spawn(async move {
                        mirror.apply(&batch).await.map(|()| batch)
                    }));
                }
                Ok(Some(Err(e))) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    return Err(e);
                }
                Ok(None) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    return Err(Error::Unreachable(
                        "the server closed the event stream".into(),
                    ));
                }
                // The stream paused: apply what came, say which new decisions this device now
                // has, and after a whole quiet wait, stop.
                Err(_) => {
                    self.written(&mut writing, follow, report).await?;
                    self.flush(&mut batch, follow, report).await?;
                    if !pending {
                        return Ok(());
                    }
                    self.fetched_receipts(api, token).await;
                }
            }
        }
    }

    /// Waits for the batch being written, then reports it.
    pub(crate) async fn written(
        &self,
        writing: &mut Option<Writing>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        let Some(w) = writing.take() else {
            return Ok(());
        };
        let batch = w
            .await
            .map_err(|e| Error::Mirror(format!("writing to the mirror stopped: {e}")))??;
        self.applied(&batch, follow, report);
        Ok(())
    }

    pub(crate) async fn flush(
        &self,
        batch: &mut Vec<Event>,
        follow: OnBatch<'_>,
        report: &mut SyncReport,
    ) -> Result<(), Error> {
        if batch.is_empty() {
            return Ok(());
        }
        self.mirror.apply(batch).await?;
        self.applied(batch, follow, report);
        batch.clear();
        Ok(())
    }

    /// Proof of delivery never stops a sync: a failed report is logged and made again after
    /// the next batch.
    async fn fetched_receipts(&self, api: &Api, token: &str) {
        if let Err(e) = self.report_fetched(api, token).await {
            tracing::info!(error = %e, "could not report the decisions fetched");
        }
    }

    pub(crate) fn applied(&self, batch: &[Event], follow: OnBatch<'_>, report: &mut SyncReport) {
        report.events += batch.len();
        let last = batch.last().map(|e| e.at.timestamp_millis());
        self.set_health(|h| h.last_event_at = last);
        if let Some(f) = follow {
            f(batch);
        }
    }

    pub(crate) async fn prefetch(&self, api: &Api, token: &str) -> Result<usize, Error> {
        let mut n = 0;
        for (sha, _) in self.mirror.blobs_to_prefetch().await? {
            let data = api.blob(token, &sha).await?;
            self.mirror.put_blob(&sha, &data, BLOB_CACHE_BYTES).await?;
            n += 1;
        }
        Ok(n)
    }

    /// Follows the server: streams events into the mirror until `stop` fires, reconnecting
    /// with jittered exponential backoff; a dropped connection is never a cancel.
    pub async fn follow(
        &self,
        stop: watch::Receiver<bool>,
        on_batch: &(dyn Fn(&[Event]) + Sync),
    ) -> Result<(), Error> {
        let mut stop = stop;
        let mut delays = reconnect_delays();
        loop {
            let run = self.sync_inner(Some(on_batch));
            let r = tokio::select! {
                r = run => r,
                _ = stop.wait_for(|s| *s) => return Ok(()),
            };
            self.after_sync(&r);
            match r {
                Err(Error::NotPaired) => return Err(Error::NotPaired),
                Err(e @ (Error::NoKeychain(_) | Error::NoDeviceKey(_) | Error::Mirror(_))) => {
                    return Err(e);
                }
                Err(Error::Refused { code, detail })
                    if code == "device_revoked" || code == "unknown_device" =>
                {
                    return Err(Error::Refused { code, detail });
                }
                Ok(_) => delays = reconnect_delays(),
                Err(e) => tracing::info!(error = %e, "sync interrupted; reconnecting"),
            }
            *self.session.lock().await = None;
            let wait = delays.next().unwrap_or(RECONNECT_MAX);
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return Ok(()),
            }
        }
    }
}

/// The longest pause between two reconnects (before jitter).
const RECONNECT_MAX: Duration = Duration::from_secs(30);

/// Pauses between reconnects: from 250 ms, doubling up to 30 s, each with jitter (backon).
fn reconnect_delays() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(250))
        .with_max_delay(RECONNECT_MAX)
        .with_jitter()
        .without_max_times()
        .build()
}

impl Companion {
    /// A blob from the cache, else from the server (then cached).
    pub async fn blob(&self, sha256: &str) -> Result<Vec<u8>, Error> {
        if let Some(b) = self.mirror.blob(sha256).await? {
            return Ok(b);
        }
        let (id, api) = self.require_identity().await?;
        let fetched = async {
            let token = self.token(&id, &api).await?;
            api.blob(&token, sha256).await
        }
        .await;
        match fetched {
            Ok(data) => {
                self.mirror
                    .put_blob(sha256, &data, BLOB_CACHE_BYTES)
                    .await?;
                Ok(data)
            }
            Err(Error::Unreachable(_)) => Err(Error::BlobMissing(sha256.to_owned())),
            Err(e) => Err(e),
        }
    }
}
