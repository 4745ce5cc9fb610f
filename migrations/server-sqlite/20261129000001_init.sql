-- Waymark control plane, SQLite. Times are unix milliseconds; JSON columns hold text.

CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
);

CREATE TABLE tokens (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('admin', 'worker')),
    name         TEXT NOT NULL,
    user_id      TEXT NOT NULL REFERENCES users(id),
    secret_hash  TEXT NOT NULL UNIQUE,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER
);

CREATE TABLE tasks (
    id               TEXT PRIMARY KEY,
    owner_id         TEXT NOT NULL REFERENCES users(id),
    title            TEXT NOT NULL,
    goal             TEXT NOT NULL,
    runtime          TEXT,
    state            TEXT NOT NULL,
    plan             TEXT NOT NULL,
    plan_revision    INTEGER NOT NULL,
    budget           TEXT NOT NULL,
    usage            TEXT NOT NULL,
    materials        TEXT NOT NULL,
    session_id       TEXT NOT NULL,
    fence            INTEGER NOT NULL,
    outcome_summary  TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX tasks_owner ON tasks(owner_id, created_at);

CREATE TABLE sessions (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL,
    parent_id   TEXT,
    created_at  INTEGER NOT NULL
);

CREATE TABLE attempts (
    id               TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    worker           TEXT NOT NULL,
    fence            INTEGER NOT NULL,
    expires_at       INTEGER NOT NULL,
    state            TEXT NOT NULL,
    manifest_digest  TEXT,
    started_at       INTEGER NOT NULL,
    ended_at         INTEGER,
    outcome          TEXT,
    UNIQUE (task_id, fence)
);

CREATE TABLE checkpoints (
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    sequence     INTEGER NOT NULL,
    attempt_id   TEXT NOT NULL,
    fence        INTEGER NOT NULL,
    body         TEXT NOT NULL,
    prev_digest  TEXT,
    digest       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (task_id, sequence)
) WITHOUT ROWID;

CREATE TABLE effects (
    id               TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    idempotency_key  TEXT NOT NULL,
    body_digest      TEXT NOT NULL,
    kind             TEXT NOT NULL,
    step             TEXT,
    resource_id      TEXT,
    intent           TEXT NOT NULL,
    intent_digest    TEXT NOT NULL,
    status           TEXT NOT NULL,
    receipt          TEXT,
    attempt_id       TEXT NOT NULL,
    fence            INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    UNIQUE (task_id, idempotency_key)
);

CREATE TABLE decisions (
    id              TEXT PRIMARY KEY,
    task_id         TEXT NOT NULL REFERENCES tasks(id),
    kind            TEXT NOT NULL,
    status          TEXT NOT NULL,
    step            TEXT,
    question        TEXT NOT NULL,
    options         TEXT NOT NULL,
    default_option  TEXT,
    intent          TEXT,
    intent_digest   TEXT,
    effect_id       TEXT,
    plan_revision   INTEGER NOT NULL,
    risky           INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    outcome         TEXT
);
CREATE INDEX decisions_task ON decisions(task_id, created_at);
CREATE INDEX decisions_pending ON decisions(expires_at) WHERE status = 'pending';

CREATE TABLE blobs (
    sha256  TEXT PRIMARY KEY,
    size    INTEGER NOT NULL,
    data    BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE artifacts (
    id          TEXT PRIMARY KEY,
    task_id     TEXT NOT NULL REFERENCES tasks(id),
    sha256      TEXT NOT NULL REFERENCES blobs(sha256),
    name        TEXT NOT NULL,
    media_type  TEXT NOT NULL,
    size        INTEGER NOT NULL,
    step        TEXT,
    created_at  INTEGER NOT NULL
);
CREATE INDEX artifacts_task ON artifacts(task_id, created_at);
CREATE INDEX artifacts_sha ON artifacts(sha256);

CREATE TABLE test_receipts (
    id                TEXT PRIMARY KEY,
    task_id           TEXT NOT NULL REFERENCES tasks(id),
    step              TEXT,
    command           TEXT NOT NULL,
    exit_code         INTEGER NOT NULL,
    commit_id         TEXT,
    totals            TEXT NOT NULL,
    failures          TEXT NOT NULL,
    duration_seconds  REAL NOT NULL,
    passed            INTEGER NOT NULL,
    junit_sha256      TEXT NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX receipts_task ON test_receipts(task_id, created_at);

CREATE TABLE messages (
    session_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    task_id     TEXT NOT NULL,
    role        TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE events (
    cursor    INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id   TEXT NOT NULL,
    owner_id  TEXT NOT NULL,
    kind      TEXT NOT NULL,
    data      TEXT NOT NULL,
    at        INTEGER NOT NULL
);
CREATE INDEX events_owner ON events(owner_id, cursor);

-- One row: every event at or below `pruned_through` has been deleted.
CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    pruned_through  INTEGER NOT NULL
);
INSERT INTO event_retention (id, pruned_through) VALUES (1, 0);

CREATE TABLE audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    task_id  TEXT,
    code     TEXT NOT NULL,
    detail   TEXT NOT NULL
);
CREATE INDEX audit_task ON audit(task_id, id);
