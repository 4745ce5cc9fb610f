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
//!
//! The tail also rings per-task [`Bell`]s: what waits on one task (a worker's control stream,
//! a decision's long-poll, a held hook call) wakes only when that task has news, not on every
//! commit of every task, and it wakes before the people's streams, so a steer reaches its
//! worker ahead of a thousand subscribers' frames.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Once, RwLock};
use std::time::Duration;

use tokio::sync::watch;
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
}

/// What the tail holds for a stream at `last`.
pub(crate) struct Slice {
    /// The stream's events after `last`, by cursor.
    pub(crate) events: Vec<Arc<TailEvent>>,
    /// Every event up to here has been handed over: the stream's next `last`.
    pub(crate) through: i64,
    /// Every event at or below this cursor has been pruned.
    pub(crate) pruned: i64,
}

pub(crate) struct Tail {
    state: RwLock<State>,
    /// Moves after the tail took in new events: streams wait on it.
    head: watch::Sender<i64>,
    /// The bells of the tasks someone waits on, by task id, each holding the newest cursor
    /// of the task announced.
    bells: Mutex<HashMap<String, watch::Sender<i64>>>,
    started: Once,
}

/// One task's wake-up: rings once a new event of the task is committed (every change a waiter
/// looks for — a command applied, an attempt ended, a decision closed — writes one). The
/// replica that wrote it rings as its commit returns (`domain::core::Tx::commit`); the tail
/// rings for every replica's events once it has read them, unless that cursor was announced
/// already; and the tail rings every bell when it skipped ahead without reading what it
/// skipped. It keeps the tail's task running while it lives.
pub(crate) struct Bell {
    tail: Arc<Tail>,
    task_id: String,
    rung: watch::Receiver<i64>,
    _head: watch::Receiver<i64>,
    stopping: watch::Receiver<bool>,
}

impl Bell {
    /// Marks every ring so far as heard: call before reading what it announces.
    pub(crate) fn heard(&mut self) {
        self.rung.borrow_and_update();
    }

    /// Waits for the next ring; `false` when the server is stopping.
    pub(crate) async fn rung(&mut self) -> bool {
        tokio::select! {
            r = self.rung.changed() => r.is_ok(),
            _ = self.stopping.wait_for(|s| *s) => false,
        }
    }
}

impl Drop for Bell {
    fn drop(&mut self) {
        let mut bells = self.tail.bells();
        // This bell's receiver is still alive here: the last one counts 1.
        if bells
            .get(&self.task_id)
            .is_some_and(|s| s.receiver_count() <= 1)
        {
            bells.remove(&self.task_id);
        }
    }
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
            bells: Mutex::new(HashMap::new()),
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

    fn bells(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Sender<i64>>> {
        self.bells.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A wake-up for news of one task (see [`Bell`]). Starts the tail's task like
    /// [`Tail::subscribe`].
    pub(crate) fn bell(
        self: &Arc<Self>,
        store: &Arc<dyn Store>,
        stopping: watch::Receiver<bool>,
        task_id: &str,
    ) -> Bell {
        let rung = self
            .bells()
            .entry(task_id.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        let head = self.subscribe(store, stopping.clone());
        Bell {
            tail: self.clone(),
            task_id: task_id.to_owned(),
            rung,
            _head: head,
            stopping,
        }
    }

    /// Rings the bell of each task with a committed event newer than its bell announced.
    pub(crate) fn ring<'a>(&self, news: impl IntoIterator<Item = (&'a str, i64)>) {
        let bells = self.bells();
        if bells.is_empty() {
            return;
        }
        for (task, cursor) in news {
            if let Some(b) = bells.get(task) {
                b.send_if_modified(|c| {
                    let newer = cursor > *c;
                    if newer {
                        *c = cursor;
                    }
                    newer
                });
            }
        }
    }

    /// Rings every bell: the tail skipped events without reading them.
    fn ring_all(&self) {
        self.bells().values().for_each(|b| b.send_modify(|_| {}));
    }

    /// The events after `last` (only the given owners' when given), when the tail covers
    /// them; `None` when the stream must read the database.
    pub(crate) fn after(&self, last: i64, owners: Option<&[String]>) -> Option<Slice> {
        let s = self.read();
        if !s.ready || last < s.from {
            return None;
        }
        let start = s.events.partition_point(|e| e.cursor <= last);
        let events = s
            .events
            .range(start..)
            .filter(|e| owners.is_none_or(|os| os.iter().any(|o| *o == e.owner_id)))
            .cloned()
            .collect();
        Some(Slice {
            events,
            through: last.max(s.head),
            pruned: s.pruned,
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
        // What was skipped is not read: every waiter looks for itself.
        self.ring_all();
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
        let mut tasks = Vec::new();
        loop {
            let rows = tx.events_after(head, PAGE, None).await?;
            let full = rows.len() as i64 == PAGE;
            for mut row in rows {
                head = row.cursor;
                let data = std::mem::take(&mut row.data);
                tasks.push((row.task_id.clone(), row.cursor));
                match convert::event(&row) {
                    Ok(mut ev) => {
                        ev.data = data;
                        new.push(Arc::new(TailEvent {
                            cursor: ev.cursor,
                            owner_id: row.owner_id,
                            kind: ev.kind.as_str(),
                            data: serde_json::to_string(&ev).unwrap_or_default(),
                        }));
                    }
                    Err(e) => {
                        tracing::error!(cursor = row.cursor, error = %e, "skipping an undecodable event");
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
        // The tasks' waiters first, then the people's streams: a woken task joins the
        // runtime's queue in the order it was woken.
        self.ring(tasks.iter().map(|(t, c)| (t.as_str(), *c)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_proto::EventKind;
    use waymark_store::NewEvent;

    async fn append(store: &dyn Store, task_id: &str) -> i64 {
        let mut tx = store.write().await.unwrap();
        let cursor = tx
            .append_event(&NewEvent {
                task_id: task_id.into(),
                owner_id: "user_1".into(),
                kind: EventKind::TaskUpdated,
                data: serde_json::json!({}),
                at: 0,
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        cursor
    }

    #[tokio::test]
    async fn a_bell_rings_for_news_of_its_own_task_only() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(
            waymark_store_sqlite::SqliteStore::open(&dir.path().join("t.db"))
                .await
                .unwrap(),
        );
        let stopping = watch::channel(false);
        let tail = Arc::new(Tail::new());
        let mut a = tail.bell(&store, stopping.1.clone(), "task_a");
        let mut b = tail.bell(&store, stopping.1.clone(), "task_b");
        let mut head = tail.subscribe(&store, stopping.1.clone());
        // The tail's task reads where the log stands (and rings every bell as it starts).
        head.wait_for(|_| tail.read().ready).await.unwrap();
        a.heard();
        b.heard();
        head.borrow_and_update();

        let cursor = append(&*store, "task_b").await;
        head.wait_for(|h| *h >= cursor).await.unwrap();
        // By the time the streams see the event, its task's bell has rung; the other's has not.
        assert!(b.rung.has_changed().unwrap(), "task_b's bell did not ring");
        assert!(
            !a.rung.has_changed().unwrap(),
            "task_a's bell rang for task_b"
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(5), b.rung())
                .await
                .unwrap()
        );

        // The writer rings as it commits, and the tail's read of the same event rings no more.
        let c = head.borrow().to_owned() + 100;
        a.heard();
        tail.ring([("task_a", c)]);
        assert!(a.rung.has_changed().unwrap());
        a.heard();
        tail.ring([("task_a", c), ("task_a", c - 1), ("task_c", c + 1)]);
        assert!(
            !a.rung.has_changed().unwrap(),
            "an announced cursor rang again"
        );
        tail.ring([("task_a", c + 1)]);
        assert!(a.rung.has_changed().unwrap());

        // A bell's entry goes with its last waiter.
        let b2 = tail.bell(&store, stopping.1.clone(), "task_b");
        drop(b);
        assert!(tail.bells().contains_key("task_b"));
        drop(b2);
        assert!(!tail.bells().contains_key("task_b"));
        assert!(tail.bells().contains_key("task_a"));

        // Stopping ends every wait.
        a.heard();
        stopping.0.send_replace(true);
        assert!(!a.rung().await);
    }
}
