//! The shared tail of the event log: the newest events, read from the database once per
//! commit by one task and served to every SSE stream from memory, already encoded. A stream
//! whose cursor is older than the tail (it connected far behind, or fell behind while the tail
//! moved on) reads the database as before and joins the tail once it has caught up, so no
//! stream sees a gap or a duplicate.
//!
//! The tail holds *every* committed event with `from < cursor <= head` (cursors commit in
//! order on both backends, so nothing below `head` can still appear). It keeps at most
//! [`CAPACITY`] events; when more arrive at once it skips ahead instead of reading them all,
//! and the streams behind it read the database. The task starts with the first stream and
//! rests (no reads) while no stream listens.

use std::collections::VecDeque;
use std::sync::{Arc, Once, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use waymark_proto::{ACCESS_OWNER, EventKind};
use waymark_store::{Store, StoreError};

use crate::convert;

/// Most events kept in memory.
pub(crate) const CAPACITY: usize = 4096;
/// Events read per query.
const PAGE: i64 = 500;

/// One event, encoded once for every stream.
pub(crate) struct TailEvent {
    pub(crate) cursor: i64,
    owner_id: String,
    pub(crate) kind: &'static str,
    /// The wire `Event` as JSON (the SSE `data:`).
    pub(crate) data: String,
    /// An access signal's users (`access.changed`, never sent): their streams re-read what
    /// they may see. Empty for every other event.
    users: Vec<String>,
}

impl TailEvent {
    fn of(row: waymark_store::EventRow) -> Result<TailEvent, StoreError> {
        let mut row = row;
        let data = std::mem::take(&mut row.data);
        let users = access_users(&row.kind, &data);
        let mut ev = convert::event(&row);
        ev.data = data;
        Ok(TailEvent {
            cursor: ev.cursor,
            owner_id: row.owner_id,
            kind: ev.kind.as_str(),
            data: serde_json::to_string(&ev).unwrap_or_default(),
            users,
        })
    }
}

/// The users an `access.changed` event names; none for any other kind.
pub(crate) fn access_users(kind: &EventKind, data: &serde_json::Value) -> Vec<String> {
    if *kind != EventKind::AccessChanged {
        return Vec::new();
    }
    data.get("users")
        .and_then(|u| u.as_array())
        .map(|us| {
            us.iter()
                .filter_map(|u| u.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// What the tail holds for a stream at `last`.
pub(crate) struct Slice {
    /// The stream's events after `last`, by cursor.
    pub(crate) events: Vec<Arc<TailEvent>>,
    /// Every event up to here has been handed over: the stream's next `last`.
    pub(crate) through: i64,
    /// Every event at or below this cursor has been pruned.
    pub(crate) pruned: i64,
    /// The newest access signal among these events that names the stream's user: its access
    /// changed, to be read again before any of them is sent.
    pub(crate) access_at: Option<i64>,
}

pub(crate) struct Tail {
    state: RwLock<State>,
    /// Moves after the tail took in new events: streams wait on it.
    head: watch::Sender<i64>,
    started: Once,
}

struct State {
    /// `false` until the task has read where the log stands.
    ready: bool,
    from: i64,
    head: i64,
    pruned: i64,
    events: VecDeque<Arc<TailEvent>>,
}

impl Tail {
    pub(crate) fn new() -> Self {
        Tail {
            state: RwLock::new(State {
                ready: false,
                from: 0,
                head: 0,
                pruned: 0,
                events: VecDeque::new(),
            }),
            head: watch::channel(0).0,
            started: Once::new(),
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A stream's wake-up: changes whenever the tail moved. Starts the tail's task with the
    /// first stream.
    pub(crate) fn subscribe(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        stopping: watch::Receiver<bool>,
    ) -> watch::Receiver<i64> {
        let rx = self.head.subscribe();
        self.started.call_once(|| {
            tokio::spawn(run(self.clone(), store.clone(), stopping));
        });
        rx
    }

    /// The events after `last` (only the given owners' when given; never an access signal),
    /// when the tail covers them; `None` when the stream must read the database. `user` is the
    /// stream's user, whose access signals the slice reports.
    pub(crate) fn after(&self, last: i64, owners: Option<&[String]>, user: &str) -> Option<Slice> {
        let s = self.read();
        if !s.ready || last < s.from {
            return None;
        }
        let start = s.events.partition_point(|e| e.cursor <= last);
        let mut access_at = None;
        let events = s
            .events
            .range(start..)
            .filter(|e| {
                if !e.users.is_empty() || e.owner_id == ACCESS_OWNER {
                    if e.users.iter().any(|u| u == user) {
                        access_at = Some(e.cursor);
                    }
                    return false;
                }
                owners.is_none_or(|os| os.iter().any(|o| *o == e.owner_id))
            })
            .cloned()
            .collect();
        Some(Slice {
            events,
            through: last.max(s.head),
            pruned: s.pruned,
            access_at,
        })
    }

    /// Forgets every event and covers nothing after `cursor`: every event at or below it is
    /// committed, and streams at or past it wait for the next.
    fn reset(&self, cursor: i64, pruned: i64) {
        let mut s = self.write();
        s.events.clear();
        s.from = cursor;
        s.head = cursor;
        s.pruned = pruned;
        s.ready = true;
        drop(s);
        self.head.send_replace(cursor);
    }

    /// Reads what was committed since the head, once, for every stream.
    async fn refresh(&self, store: &dyn Store) -> Result<(), StoreError> {
        let mut tx = store.read().await?;
        let pruned = tx.pruned_through().await?;
        let (ready, mut head) = {
            let s = self.read();
            (s.ready, s.head)
        };
        let max = tx.max_cursor().await?;
        if !ready || max - head > CAPACITY as i64 {
            // Starting, or more arrived than the tail keeps: skip ahead; streams behind read
            // the database.
            head = max;
            self.reset(max, pruned);
        }
        let mut new = Vec::new();
        loop {
            let rows = tx.events_after(head, PAGE, None).await?;
            let full = rows.len() as i64 == PAGE;
            for row in rows {
                head = row.cursor;
                let cursor = row.cursor;
                match TailEvent::of(row) {
                    Ok(ev) => new.push(Arc::new(ev)),
                    Err(e) => {
                        tracing::error!(cursor, error = %e, "skipping an undecodable event");
                    }
                }
            }
            if !full {
                break;
            }
        }
        drop(tx);
        let mut s = self.write();
        s.pruned = pruned;
        if head <= s.head {
            return Ok(());
        }
        s.events.extend(new);
        s.head = head;
        while s.events.len() > CAPACITY {
            if let Some(e) = s.events.pop_front() {
                s.from = e.cursor;
            }
        }
        drop(s);
        self.head.send_replace(head);
        Ok(())
    }
}

/// The tail's task: one read per change of the store's cursor, while streams listen.
async fn run(tail: Arc<Tail>, store: Arc<dyn Store>, mut stopping: watch::Receiver<bool>) {
    let mut cursor = store.cursor_watch();
    loop {
        let newest = *cursor.borrow_and_update();
        if tail.head.receiver_count() == 0 {
            // Nobody listens: rest, and start over from the newest cursor when someone does.
            let pruned = tail.read().pruned;
            tail.reset(newest, pruned);
        } else if let Err(e) = tail.refresh(&*store).await {
            tracing::warn!(error = %e, "reading the event tail failed; retrying");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(100)) => continue,
                _ = stopping.wait_for(|s| *s) => break,
            }
        }
        tokio::select! {
            r = cursor.changed() => if r.is_err() { break },
            _ = stopping.wait_for(|s| *s) => break,
        }
    }
}
