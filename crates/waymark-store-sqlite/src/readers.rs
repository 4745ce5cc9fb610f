//! The read-only connections, and opening the store's connections. A read transaction takes an
//! idle reader (or opens one, up to [`MAX_READERS`]) and runs its statements on the caller's
//! thread: a read of a local file costs microseconds, and handing each statement to another
//! thread cost more than that (see `group` for the writer's side).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use waymark_store::{Result, StoreError};

use crate::rows::backend;

/// Most read transactions open at once; the next one waits for a reader.
pub(crate) const MAX_READERS: usize = 8;
/// How long a read waits for a reader before it answers `Busy`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a statement waits on a lock held by another connection before it answers `Busy`.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Prepared statements each connection keeps (the store has about a hundred distinct ones).
const STATEMENT_CACHE: usize = 256;

/// Opens the writer connection: `synchronous=FULL` (an acknowledged write survives power
/// loss), foreign keys enforced, in the WAL mode the file was migrated into.
pub(crate) fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let db = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.pragma_update(None, "foreign_keys", "ON")?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(db)
}

/// Opens a read-only connection.
pub(crate) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let db = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    db.busy_timeout(BUSY_TIMEOUT)?;
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(db)
}

/// The readers: idle connections, and a permit per transaction open on one.
pub(crate) struct Readers {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

impl Readers {
    pub(crate) fn new(path: &Path) -> Arc<Self> {
        Arc::new(Readers {
            path: path.to_owned(),
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(MAX_READERS)),
        })
    }

    /// Begins a read transaction (deferred: its snapshot is taken at its first statement).
    pub(crate) async fn begin(self: &Arc<Self>) -> Result<ReadTx> {
        let permit = tokio::time::timeout(ACQUIRE_TIMEOUT, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| StoreError::Busy("timed out waiting for a database reader".into()))?
            .map_err(|_| StoreError::Backend("the store's readers are closed".into()))?;
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let db = match idle {
            Some(db) => db,
            None => open_reader(&self.path).map_err(backend)?,
        };
        db.execute_batch("BEGIN").map_err(backend)?;
        Ok(ReadTx {
            db: Some(db),
            readers: self.clone(),
            _permit: permit,
        })
    }
}

/// A read transaction on one reader, which goes back to the idle ones when it ends.
pub(crate) struct ReadTx {
    db: Option<Connection>,
    readers: Arc<Readers>,
    _permit: OwnedSemaphorePermit,
}

impl ReadTx {
    pub(crate) fn db(&self) -> &Connection {
        self.db
            .as_ref()
            .expect("a live read transaction holds its reader")
    }

    pub(crate) fn commit(self) -> Result<()> {
        self.db().execute_batch("COMMIT").map_err(backend)
    }
}

impl Drop for ReadTx {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else {
            return;
        };
        // A reader whose transaction cannot be ended is closed rather than reused.
        if !db.is_autocommit() && db.execute_batch("ROLLBACK").is_err() {
            return;
        }
        self.readers
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(db);
    }
}
