-- The companion's mirror: what a person may see, readable offline. Objects are kept as the
-- wire JSON the server sent; a few columns are lifted out for the queries the UI runs.

CREATE TABLE meta (
    key    TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);

CREATE TABLE tasks (
    id             TEXT PRIMARY KEY,
    data           TEXT NOT NULL,
    state          TEXT NOT NULL,
    plan_revision  INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    pinned         INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE attempts (
    id       TEXT PRIMARY KEY,
    task_id  TEXT NOT NULL,
    fence    INTEGER NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX attempts_task ON attempts(task_id, fence);

CREATE TABLE checkpoints (
    task_id   TEXT NOT NULL,
    sequence  INTEGER NOT NULL,
    data      TEXT NOT NULL,
    PRIMARY KEY (task_id, sequence)
) WITHOUT ROWID;

CREATE TABLE effects (
    id       TEXT PRIMARY KEY,
    task_id  TEXT NOT NULL,
    status   TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX effects_task ON effects(task_id);

CREATE TABLE decisions (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    status      TEXT NOT NULL,
    kind        TEXT NOT NULL,
    expires_at  INTEGER NOT NULL,
    data        TEXT NOT NULL
);
CREATE INDEX decisions_pending ON decisions(expires_at) WHERE status = 'pending';
CREATE INDEX decisions_task ON decisions(task_id);

CREATE TABLE artifacts (
    id       TEXT PRIMARY KEY,
    task_id  TEXT NOT NULL,
    sha256   TEXT NOT NULL,
    size     INTEGER NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX artifacts_task ON artifacts(task_id);

CREATE TABLE receipts (
    id       TEXT PRIMARY KEY,
    task_id  TEXT NOT NULL,
    data     TEXT NOT NULL
);
CREATE INDEX receipts_task ON receipts(task_id);

CREATE TABLE messages (
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    task_id     TEXT NOT NULL,
    data        TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

-- Commands signed on this device, in the order the person made them.
CREATE TABLE outbox (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    command_id         TEXT NOT NULL UNIQUE,
    task_id            TEXT NOT NULL,
    operation          TEXT NOT NULL,
    based_on_revision  INTEGER,
    envelope           TEXT NOT NULL,
    status             TEXT NOT NULL,
    result             TEXT,
    created_at         INTEGER NOT NULL,
    delivered_at       INTEGER,
    acknowledged_at    INTEGER
);

-- Content-addressed blob cache with LRU eviction.
CREATE TABLE blobs (
    sha256       TEXT PRIMARY KEY,
    size         INTEGER NOT NULL,
    data         BLOB NOT NULL,
    last_access  INTEGER NOT NULL
) WITHOUT ROWID;

-- Notifications already shown (dedup keys).
CREATE TABLE notified (
    key  TEXT PRIMARY KEY,
    at   INTEGER NOT NULL
) WITHOUT ROWID;
