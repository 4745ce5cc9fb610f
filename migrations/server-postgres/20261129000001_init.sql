-- Waymark control plane, PostgreSQL. The same tables and columns as migrations/server-sqlite,
-- in PostgreSQL types: times are unix milliseconds (BIGINT), structured columns are JSONB,
-- blobs are BYTEA, event cursors and audit ids come from sequences (BIGSERIAL).
--
-- Keys and sorted names are `COLLATE "C"` so every ORDER BY sorts bytewise, as SQLite does,
-- whatever the database's locale: the two backends list rows in the same order.

CREATE TABLE users (
    id          TEXT COLLATE "C" PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE tokens (
    id           TEXT COLLATE "C" PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('admin', 'worker')),
    name         TEXT NOT NULL,
    user_id      TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    secret_hash  TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT
);

CREATE TABLE tasks (
    id               TEXT COLLATE "C" PRIMARY KEY,
    owner_id         TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    title            TEXT NOT NULL,
    goal             TEXT NOT NULL,
    runtime          TEXT,
    state            TEXT NOT NULL,
    plan             JSONB NOT NULL,
    plan_revision    BIGINT NOT NULL,
    budget           JSONB NOT NULL,
    usage            JSONB NOT NULL,
    materials        JSONB NOT NULL,
    session_id       TEXT COLLATE "C" NOT NULL,
    fence            BIGINT NOT NULL,
    outcome_summary  TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
CREATE INDEX tasks_owner ON tasks(owner_id, created_at);

CREATE TABLE sessions (
    id          TEXT COLLATE "C" PRIMARY KEY,
    task_id     TEXT COLLATE "C" NOT NULL,
    parent_id   TEXT COLLATE "C",
    created_at  BIGINT NOT NULL
);

CREATE TABLE attempts (
    id               TEXT COLLATE "C" PRIMARY KEY,
    task_id          TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    worker           TEXT NOT NULL,
    fence            BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL,
    state            TEXT NOT NULL,
    manifest_digest  TEXT,
    started_at       BIGINT NOT NULL,
    ended_at         BIGINT,
    outcome          TEXT,
    UNIQUE (task_id, fence)
);

CREATE TABLE checkpoints (
    task_id      TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    sequence     BIGINT NOT NULL,
    attempt_id   TEXT COLLATE "C" NOT NULL,
    fence        BIGINT NOT NULL,
    body         JSONB NOT NULL,
    prev_digest  TEXT,
    digest       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (task_id, sequence)
);

CREATE TABLE effects (
    id               TEXT COLLATE "C" PRIMARY KEY,
    task_id          TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    idempotency_key  TEXT COLLATE "C" NOT NULL,
    body_digest      TEXT NOT NULL,
    kind             TEXT NOT NULL,
    step             TEXT,
    resource_id      TEXT,
    intent           JSONB NOT NULL,
    intent_digest    TEXT NOT NULL,
    status           TEXT NOT NULL,
    receipt          JSONB,
    attempt_id       TEXT COLLATE "C" NOT NULL,
    fence            BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    UNIQUE (task_id, idempotency_key)
);

CREATE TABLE decisions (
    id              TEXT COLLATE "C" PRIMARY KEY,
    task_id         TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    kind            TEXT NOT NULL,
    status          TEXT NOT NULL,
    step            TEXT,
    question        TEXT NOT NULL,
    options         JSONB NOT NULL,
    default_option  TEXT,
    intent          JSONB,
    intent_digest   TEXT,
    effect_id       TEXT COLLATE "C",
    plan_revision   BIGINT NOT NULL,
    risky           BOOLEAN NOT NULL,
    expires_at      BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    outcome         JSONB
);
CREATE INDEX decisions_task ON decisions(task_id, created_at);
CREATE INDEX decisions_pending ON decisions(expires_at) WHERE status = 'pending';

CREATE TABLE blobs (
    sha256  TEXT COLLATE "C" PRIMARY KEY,
    size    BIGINT NOT NULL,
    data    BYTEA NOT NULL
);

CREATE TABLE artifacts (
    id          TEXT COLLATE "C" PRIMARY KEY,
    task_id     TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    sha256      TEXT COLLATE "C" NOT NULL REFERENCES blobs(sha256),
    name        TEXT NOT NULL,
    media_type  TEXT NOT NULL,
    size        BIGINT NOT NULL,
    step        TEXT,
    created_at  BIGINT NOT NULL
);
CREATE INDEX artifacts_task ON artifacts(task_id, created_at);
CREATE INDEX artifacts_sha ON artifacts(sha256);

CREATE TABLE test_receipts (
    id                TEXT COLLATE "C" PRIMARY KEY,
    task_id           TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    step              TEXT,
    command           TEXT NOT NULL,
    exit_code         BIGINT NOT NULL,
    commit_id         TEXT,
    totals            JSONB NOT NULL,
    failures          JSONB NOT NULL,
    duration_seconds  DOUBLE PRECISION NOT NULL,
    passed            BOOLEAN NOT NULL,
    junit_sha256      TEXT NOT NULL,
    created_at        BIGINT NOT NULL
);
CREATE INDEX receipts_task ON test_receipts(task_id, created_at);

CREATE TABLE messages (
    session_id  TEXT COLLATE "C" NOT NULL,
    seq         BIGINT NOT NULL,
    task_id     TEXT COLLATE "C" NOT NULL,
    role        TEXT NOT NULL,
    text        TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (session_id, seq)
);

-- Cursors come from the sequence, never reused (a rolled-back transaction leaves a gap).
-- `append_event` takes a transaction-scoped advisory lock before `nextval`, so events become
-- visible in cursor order (see the crate docs of waymark-store-postgres).
CREATE TABLE events (
    cursor    BIGSERIAL PRIMARY KEY,
    task_id   TEXT COLLATE "C" NOT NULL,
    owner_id  TEXT COLLATE "C" NOT NULL,
    kind      TEXT NOT NULL,
    data      JSONB NOT NULL,
    at        BIGINT NOT NULL
);
CREATE INDEX events_owner ON events(owner_id, cursor);

-- One row: every event at or below `pruned_through` has been deleted.
CREATE TABLE event_retention (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    pruned_through  BIGINT NOT NULL
);
INSERT INTO event_retention (id, pruned_through) VALUES (1, 0);

CREATE TABLE audit (
    id       BIGSERIAL PRIMARY KEY,
    at       BIGINT NOT NULL,
    actor    TEXT NOT NULL,
    action   TEXT NOT NULL,
    task_id  TEXT COLLATE "C",
    code     TEXT NOT NULL,
    detail   TEXT NOT NULL
);
CREATE INDEX audit_task ON audit(task_id, id);
