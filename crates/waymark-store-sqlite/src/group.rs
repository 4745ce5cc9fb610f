//! Group commit: concurrent write transactions share one SQLite transaction and one fsync.
//!
//! The one writer connection runs an outer `BEGIN IMMEDIATE`, opened by the first write
//! transaction of a batch; each later one is a `SAVEPOINT` inside it. They take the connection
//! in turn, so each sees the state its predecessors left. A transaction's commit either issues
//! the real `COMMIT` itself — when no other writer is waiting for the connection, or its batch
//! already holds [`MAX_BATCH`] transactions or is [`MAX_BATCH_AGE`] old — or leaves its work
//! in the open transaction and waits for a later writer to commit the batch (a `COMMIT` also
//! commits every savepoint still open, so finishing costs no statement). Everybody in a batch
//! gets that `COMMIT`'s answer together, and the cursor watch moves only after it: nothing is
//! acknowledged or announced before it is durable. A transaction dropped without commit rolls
//! back to its savepoint (`ROLLBACK TO` the newest `w`, then `RELEASE` it), or rolls the outer
//! transaction back when it opened it, so only its own changes vanish.
//!
//! Statements run on the calling thread (rusqlite), between the transaction's own `.await`s:
//! each costs what SQLite costs, with no hand-off to a connection thread, and no caller can be
//! dropped half-way through one. Only what may wait on the disk or on another process leaves
//! the runtime's threads: a batch's `COMMIT` (its fsync) runs on a blocking thread, which also
//! finishes it when the caller that carried it is dropped (a client that went away), so the
//! others of its batch get their answer; and a `BEGIN IMMEDIATE` that finds the file's write
//! lock held by another process waits for it there.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use tokio::sync::{Mutex, OwnedMutexGuard, watch};
use waymark_store::{Result, StoreError};

use crate::readers::BUSY_TIMEOUT;
use crate::rows::backend;

/// Most transactions one `COMMIT` acknowledges.
pub(crate) const MAX_BATCH: usize = 64;
/// How long the first finished transaction of a batch may wait for later ones while writers
/// keep coming.
pub(crate) const MAX_BATCH_AGE: Duration = Duration::from_millis(1);
/// A batch still open this long after its first transaction finished is committed by a timer
/// (the writer that was to carry it on went away before it got the connection).
const FLUSH_AFTER: Duration = Duration::from_millis(5);
/// How long a write waits for the connection before it answers `Busy`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// What a batch's `COMMIT` answered; `None` until it ran.
type Outcome = Option<std::result::Result<(), Arc<StoreError>>>;

/// The writer connection and the writers queued for it.
pub(crate) struct Writer {
    conn: Arc<Mutex<Conn>>,
    /// Writers waiting for the connection: while there are some, a finishing transaction
    /// leaves the `COMMIT` to them.
    waiting: AtomicUsize,
    cursor: watch::Sender<i64>,
}

/// The connection and the batch open on it.
pub(crate) struct Conn {
    db: Connection,
    /// The outer transaction, when one is open.
    batch: Option<Batch>,
    next_id: u64,
    /// Successful `COMMIT`s, for the tests that check transactions do share them.
    #[cfg(test)]
    commits: u64,
}

struct Batch {
    id: u64,
    /// Finished transactions waiting for the `COMMIT`.
    members: usize,
    /// When the first of them finished.
    since: Option<Instant>,
    /// The newest event cursor the batch appended.
    cursor: Option<i64>,
    done: watch::Sender<Outcome>,
}

/// One write transaction, holding the connection until it ends.
pub(crate) struct Member {
    guard: Option<OwnedMutexGuard<Conn>>,
    writer: Arc<Writer>,
    /// It runs in a savepoint (else it opened the outer transaction).
    savepoint: bool,
}

/// Counts a writer as waiting for as long as it lives (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::AcqRel);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The same error again, for every transaction of a failed batch.
fn copy(e: &StoreError) -> StoreError {
    match e {
        StoreError::Busy(m) => StoreError::Busy(m.clone()),
        StoreError::Conflict(m) => StoreError::Conflict(m.clone()),
        StoreError::Corrupt(m) => StoreError::Corrupt(m.clone()),
        StoreError::Full(m) => StoreError::Full(m.clone()),
        StoreError::Io(m) => StoreError::Io(m.clone()),
        other => StoreError::Backend(other.to_string()),
    }
}

/// A write's own task panicked or was cancelled (the runtime is shutting down).
fn task_failed(e: tokio::task::JoinError) -> StoreError {
    StoreError::Backend(format!("the write transaction's task ended early: {e}"))
}

fn advance(cursor: &watch::Sender<i64>, to: i64) {
    cursor.send_if_modified(|c| {
        let newer = to > *c;
        if newer {
            *c = to;
        }
        newer
    });
}

impl Writer {
    pub(crate) fn new(db: Connection, cursor: watch::Sender<i64>) -> Arc<Self> {
        Arc::new(Writer {
            conn: Arc::new(Mutex::new(Conn {
                db,
                batch: None,
                next_id: 0,
                #[cfg(test)]
                commits: 0,
            })),
            waiting: AtomicUsize::new(0),
            cursor,
        })
    }

    /// How many writers wait for the connection now.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// How many `COMMIT`s succeeded so far.
    #[cfg(test)]
    pub(crate) async fn commits(&self) -> u64 {
        self.conn.lock().await.commits
    }

    pub(crate) fn cursor_watch(&self) -> watch::Receiver<i64> {
        self.cursor.subscribe()
    }

    /// Raises the cursor watch to a commit made elsewhere (another process on the same file).
    pub(crate) fn advance_to(&self, to: i64) {
        advance(&self.cursor, to);
    }

    /// Waits for the connection and opens a savepoint in the open batch, or the outer
    /// transaction of a new one.
    pub(crate) async fn begin(self: &Arc<Self>) -> Result<Member> {
        let mut g = self.lock().await?;
        if g.batch.is_some() {
            if let Err(e) = g.db.execute_batch("SAVEPOINT w") {
                let e = backend(e);
                g.fail(&e);
                return Err(e);
            }
            return Ok(self.member(g, true));
        }
        if !g.db.is_autocommit() {
            // A transaction nobody owns: a `ROLLBACK` that failed, or a `BEGIN` whose caller
            // was dropped while it waited for another process. Nothing in it was acknowledged.
            let _ = g.db.execute_batch("ROLLBACK");
        }
        let g = begin_immediate(g).await?;
        Ok(self.member(g, false))
    }

    async fn lock(&self) -> Result<OwnedMutexGuard<Conn>> {
        let _waiting = Waiting::new(&self.waiting);
        tokio::time::timeout(ACQUIRE_TIMEOUT, self.conn.clone().lock_owned())
            .await
            .map_err(|_| StoreError::Busy("timed out waiting for the writer connection".into()))
    }

    /// A new batch's first transaction, or one more in the open batch.
    fn member(self: &Arc<Self>, mut g: OwnedMutexGuard<Conn>, savepoint: bool) -> Member {
        if !savepoint {
            let (done, _) = watch::channel(None);
            g.batch = Some(Batch {
                id: g.next_id,
                members: 0,
                since: None,
                cursor: None,
                done,
            });
            g.next_id += 1;
        }
        Member {
            guard: Some(g),
            writer: self.clone(),
            savepoint,
        }
    }

    /// Waits for the `COMMIT` of the batch a finished transaction joined.
    async fn wait(mut done: watch::Receiver<Outcome>) -> Result<()> {
        match done.wait_for(Option::is_some).await {
            Ok(outcome) => match outcome.as_ref() {
                Some(Err(e)) => Err(copy(e)),
                _ => Ok(()),
            },
            Err(_) => Err(StoreError::Backend(
                "the store closed before the transaction was committed".into(),
            )),
        }
    }

    /// Commits batch `id` after [`FLUSH_AFTER`] if it is still open then: the writer that was
    /// to carry it on may have gone away (its request dropped) before it got the connection.
    fn flush_later(self: Arc<Self>, id: u64) {
        tokio::spawn(async move {
            tokio::time::sleep(FLUSH_AFTER).await;
            let g = self.conn.clone().lock_owned().await;
            if g.batch.as_ref().is_some_and(|b| b.id == id) {
                // The answer reaches the batch's transactions through `done`.
                let _ = self.commit_off_thread(g).await;
            }
        });
    }

    /// The batch's `COMMIT` on a blocking thread: it waits for the disk, and it runs to its
    /// end whoever stops waiting for it. (In place through `block_in_place` measured the same.)
    async fn commit_off_thread(self: Arc<Self>, mut g: OwnedMutexGuard<Conn>) -> Result<()> {
        tokio::task::spawn_blocking(move || g.commit(&self.cursor))
            .await
            .map_err(task_failed)?
    }

    /// Whether a transaction that just finished should commit its batch now.
    fn commit_now(&self, batch: &Batch, now: Instant) -> bool {
        batch.members + 1 >= MAX_BATCH
            || batch
                .since
                .is_some_and(|s| now.duration_since(s) >= MAX_BATCH_AGE)
            || self.waiting.load(Ordering::Acquire) == 0
    }
}

/// `BEGIN IMMEDIATE`, on the calling thread when the file's write lock is free, as it is
/// unless another process (`waymark admin`) writes; then the wait for that process, up to the
/// busy timeout, runs on a blocking thread rather than a runtime's.
async fn begin_immediate(g: OwnedMutexGuard<Conn>) -> Result<OwnedMutexGuard<Conn>> {
    g.db.busy_timeout(Duration::ZERO).map_err(backend)?;
    let first = g.db.execute_batch("BEGIN IMMEDIATE");
    g.db.busy_timeout(BUSY_TIMEOUT).map_err(backend)?;
    match first {
        Ok(()) => Ok(g),
        Err(e) if e.sqlite_error_code() == Some(ErrorCode::DatabaseBusy) => {
            tokio::task::spawn_blocking(move || {
                g.db.execute_batch("BEGIN IMMEDIATE").map_err(backend)?;
                Ok(g)
            })
            .await
            .map_err(task_failed)?
        }
        Err(e) => Err(backend(e)),
    }
}

impl Conn {
    /// The real `COMMIT` of the open batch; its answer goes to every transaction in it.
    fn commit(&mut self, cursor: &watch::Sender<i64>) -> Result<()> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        match self.db.execute_batch("COMMIT") {
            Ok(()) => {
                #[cfg(test)]
                {
                    self.commits += 1;
                }
                if let Some(c) = batch.cursor {
                    advance(cursor, c);
                }
                batch.done.send_replace(Some(Ok(())));
                Ok(())
            }
            Err(e) => {
                let e = backend(e);
                // A `COMMIT` that failed may leave the transaction open.
                if !self.db.is_autocommit() {
                    let _ = self.db.execute_batch("ROLLBACK");
                }
                batch.done.send_replace(Some(Err(Arc::new(copy(&e)))));
                Err(e)
            }
        }
    }

    /// Rolls the whole outer transaction back and tells its waiting transactions why.
    fn fail(&mut self, e: &StoreError) {
        if !self.db.is_autocommit() {
            let _ = self.db.execute_batch("ROLLBACK");
        }
        if let Some(batch) = self.batch.take() {
            batch.done.send_replace(Some(Err(Arc::new(copy(e)))));
        }
    }
}

impl Member {
    /// The connection, inside this transaction's savepoint.
    pub(crate) fn db(&self) -> &Connection {
        &self
            .guard
            .as_ref()
            .expect("a live write transaction holds the connection")
            .db
    }

    /// Finishes the transaction; returns once it is durable (or failed), with the batch it
    /// joined. `appended` is the newest event cursor it wrote.
    ///
    /// A transaction that leaves the `COMMIT` to a later writer runs no statement: it joins
    /// the batch and hands the connection on at once, before its first `.await`, so the next
    /// writer does not wait for a task switch.
    pub(crate) async fn commit(mut self, appended: Option<i64>) -> Result<()> {
        let mut g = self
            .guard
            .take()
            .expect("a live write transaction holds the connection");
        let writer = self.writer.clone();
        let now = Instant::now();
        let Some(batch) = g.batch.as_mut() else {
            return Err(StoreError::Backend(
                "the write transaction was lost before its commit".into(),
            ));
        };
        if let Some(c) = appended {
            batch.cursor = Some(batch.cursor.map_or(c, |b| b.max(c)));
        }
        if writer.commit_now(batch, now) {
            // `COMMIT` also commits this transaction's open savepoint.
            return writer.commit_off_thread(g).await;
        }
        // Nothing to run: the batch's `COMMIT` commits this transaction's work (its savepoint,
        // if it has one, stays open until then).
        batch.members += 1;
        let first = batch.since.is_none();
        batch.since.get_or_insert(now);
        let (id, done) = (batch.id, batch.done.subscribe());
        drop(g);
        if first {
            writer.flush_later(id);
        }
        Writer::wait(done).await
    }
}

impl Drop for Member {
    /// Rolls this transaction back (its statements are quick and wait for no disk), and ends
    /// the batch when no writer follows to carry it on.
    fn drop(&mut self) {
        let Some(mut g) = self.guard.take() else {
            return;
        };
        if !self.savepoint {
            // It opened the batch and never finished, so the batch holds nothing else.
            let _ = g.db.execute_batch("ROLLBACK");
            g.batch = None;
            return;
        }
        if let Err(e) = g.db.execute_batch("ROLLBACK TO w; RELEASE w") {
            // The outer transaction is gone (SQLite rolls it back on I/O errors and the like):
            // so are the finished transactions waiting in it.
            let e = backend(e);
            tracing::warn!(error = %e, "rolling back a dropped write transaction failed");
            g.fail(&e);
            return;
        }
        let Some(batch) = &g.batch else {
            return;
        };
        if !self.writer.commit_now(batch, Instant::now()) {
            return;
        }
        if batch.members == 0 {
            // Nothing to keep: end the outer transaction.
            let _ = g.db.execute_batch("ROLLBACK");
            g.batch = None;
            return;
        }
        let writer = self.writer.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(writer.commit_off_thread(g))),
            Err(_) => drop(g.commit(&writer.cursor)),
        }
    }
}
