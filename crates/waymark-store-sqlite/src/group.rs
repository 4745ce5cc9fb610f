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
//! A writer alone runs the statements it always ran (`BEGIN IMMEDIATE` … `COMMIT`) and pays
//! no wait: with nobody queued it commits at once.
//!
//! Opening a transaction and a batch's `COMMIT` run in tasks of their own, so a caller dropped
//! mid-way (a client that went away) never cuts a `COMMIT` that others of its batch wait for,
//! nor leaves the connection between the statements of a rollback. A transaction that leaves
//! the `COMMIT` to a later writer runs no statement, and hands the connection on without a
//! task switch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::SqliteConnection;
use tokio::sync::{Mutex, OwnedMutexGuard, watch};
use waymark_store::{Result, StoreError};

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
    db: SqliteConnection,
    /// The outer transaction, when one is open.
    batch: Option<Batch>,
    /// A transaction was dropped and is not rolled back yet.
    undo: Option<Undo>,
    next_id: u64,
    /// Successful `COMMIT`s, for the tests that check transactions do share them.
    #[cfg(test)]
    commits: u64,
}

/// How to roll back a dropped transaction.
#[derive(Clone, Copy)]
enum Undo {
    /// `ROLLBACK TO w; RELEASE w`: it was a savepoint.
    Savepoint,
    /// `ROLLBACK`: it opened the outer transaction (so nothing else is in it).
    Outer,
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

/// Runs one statement. The boxed future keeps the spawned tasks' futures `Send` (rustc cannot
/// prove it through sqlx's `Executor` for every lifetime when they are nested `async fn`s).
fn exec<'c>(
    db: &'c mut SqliteConnection,
    sql: &'static str,
) -> Pin<Box<dyn Future<Output = std::result::Result<(), sqlx::Error>> + Send + 'c>> {
    Box::pin(async move { sqlx::query(sql).execute(db).await.map(drop) })
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
    pub(crate) fn new(db: SqliteConnection, cursor: watch::Sender<i64>) -> Arc<Self> {
        Arc::new(Writer {
            conn: Arc::new(Mutex::new(Conn {
                db,
                batch: None,
                undo: None,
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

    /// Waits for the connection and opens a savepoint (and the outer transaction when none
    /// is open). A caller dropped half-way (its client went away) must not leave the
    /// connection in a state nobody knows:
    ///
    /// * a writer that finds no batch open and nothing to roll back opens the outer
    ///   transaction itself, marked to be rolled back ([`Undo::Outer`]) until `BEGIN` has
    ///   answered — dropped in between, the next writer's `ROLLBACK` ends whatever it began,
    ///   and nobody else is in it (the common case of a writer alone: no task switch);
    /// * otherwise (a savepoint to open in a batch others wait on, or a dropped transaction to
    ///   roll back first) the work runs in a task of its own, like a batch's `COMMIT`
    ///   ([`Member::commit`]), which no caller can stop between statements.
    pub(crate) async fn begin(self: &Arc<Self>) -> Result<Member> {
        let mut g = self.lock().await?;
        if g.batch.is_some() || g.undo.is_some() {
            let writer = self.clone();
            return tokio::spawn(async move { writer.open(g).await })
                .await
                .map_err(task_failed)?;
        }
        g.undo = Some(Undo::Outer);
        let begun = exec(&mut g.db, "BEGIN IMMEDIATE").await;
        g.undo = None;
        if begun.is_err() {
            // A transaction left open by a failed `ROLLBACK`: see `open`.
            let writer = self.clone();
            return tokio::spawn(async move { writer.open(g).await })
                .await
                .map_err(task_failed)?;
        }
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

    async fn open(self: Arc<Self>, mut g: OwnedMutexGuard<Conn>) -> Result<Member> {
        g.settle().await;
        let savepoint = g.batch.is_some();
        if savepoint {
            if let Err(e) = exec(&mut g.db, "SAVEPOINT w").await {
                let e = backend(e);
                g.fail(&e).await;
                return Err(e);
            }
        } else if exec(&mut g.db, "BEGIN IMMEDIATE").await.is_err() {
            // A transaction left open by a failed `ROLLBACK` (or by a writer dropped while its
            // `BEGIN` ran) would refuse the `BEGIN`: end it (nothing in it was acknowledged)
            // and try once more.
            let _ = exec(&mut g.db, "ROLLBACK").await;
            exec(&mut g.db, "BEGIN IMMEDIATE").await.map_err(backend)?;
        }
        Ok(self.member(g, savepoint))
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
            let mut g = self.conn.clone().lock_owned().await;
            g.settle().await;
            if g.batch.as_ref().is_some_and(|b| b.id == id) {
                // The answer reaches the batch's transactions through `done`.
                let _ = g.commit(&self.cursor).await;
            }
        });
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

impl Conn {
    /// Rolls back a transaction that was dropped.
    async fn settle(&mut self) {
        let rolled_back = match self.undo.take() {
            None => return,
            Some(Undo::Savepoint) => match exec(&mut self.db, "ROLLBACK TO w").await {
                Ok(()) => exec(&mut self.db, "RELEASE w").await,
                Err(e) => Err(e),
            },
            Some(Undo::Outer) => {
                // It opened the batch and never finished, so the batch holds nothing else.
                let _ = exec(&mut self.db, "ROLLBACK").await;
                self.batch = None;
                return;
            }
        };
        if let Err(e) = rolled_back {
            // The outer transaction is gone (SQLite rolls it back on I/O errors and the like):
            // so are the finished transactions waiting in it.
            let e = backend(e);
            tracing::warn!(error = %e, "rolling back a dropped write transaction failed");
            self.fail(&e).await;
        }
    }

    /// The real `COMMIT` of the open batch; its answer goes to every transaction in it.
    async fn commit(&mut self, cursor: &watch::Sender<i64>) -> Result<()> {
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        match exec(&mut self.db, "COMMIT").await {
            Ok(_) => {
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
                let _ = exec(&mut self.db, "ROLLBACK").await;
                batch.done.send_replace(Some(Err(Arc::new(copy(&e)))));
                Err(e)
            }
        }
    }

    /// Rolls the whole outer transaction back and tells its waiting transactions why.
    async fn fail(&mut self, e: &StoreError) {
        let _ = exec(&mut self.db, "ROLLBACK").await;
        self.undo = None;
        if let Some(batch) = self.batch.take() {
            batch.done.send_replace(Some(Err(Arc::new(copy(e)))));
        }
    }

    /// After a transaction rolled back to its savepoint: ends the outer transaction when no
    /// writer follows to carry it on.
    async fn after_rollback(&mut self, writer: &Writer) {
        let Some(batch) = &self.batch else {
            return;
        };
        if !writer.commit_now(batch, Instant::now()) {
            return;
        }
        if batch.members == 0 {
            // Nothing to keep: end the outer transaction.
            let _ = exec(&mut self.db, "ROLLBACK").await;
            self.batch = None;
        } else {
            let _ = self.commit(&writer.cursor).await;
        }
    }
}

impl Member {
    /// The connection, inside this transaction's savepoint.
    pub(crate) fn db(&mut self) -> &mut SqliteConnection {
        &mut self
            .guard
            .as_mut()
            .expect("a live write transaction holds the connection")
            .db
    }

    /// Finishes the transaction; returns once it is durable (or failed), with the batch it
    /// joined. `appended` is the newest event cursor it wrote.
    ///
    /// A transaction that leaves the `COMMIT` to a later writer runs no statement: it joins
    /// the batch and hands the connection on at once, before its first `.await`, so the next
    /// writer does not wait for a task switch. A `COMMIT` runs in a task of its own, so that
    /// it ends the same way when the caller is dropped (axum drops a handler whose client
    /// went away): it also answers the others of its batch, and must neither be cut off nor
    /// leave them without an answer.
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
            return tokio::spawn(async move { g.commit(&writer.cursor).await })
                .await
                .map_err(task_failed)?;
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
    fn drop(&mut self) {
        let Some(mut g) = self.guard.take() else {
            return;
        };
        // Whoever takes the connection next rolls it back, unless the task below does it first
        // (it holds the connection, so it runs before anyone else writes).
        g.undo = Some(if self.savepoint {
            Undo::Savepoint
        } else {
            Undo::Outer
        });
        let writer = self.writer.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                g.settle().await;
                g.after_rollback(&writer).await;
            });
        }
    }
}
