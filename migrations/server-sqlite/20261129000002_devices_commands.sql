-- Devices, pairing codes, device read sessions, the command ledger and the control queue.

CREATE TABLE devices (
    id          TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users(id),
    name        TEXT NOT NULL,
    public_key  TEXT NOT NULL UNIQUE,
    scopes      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

CREATE TABLE pairing_codes (
    code_hash   TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users(id),
    scopes      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    used_at     INTEGER,
    device_id   TEXT
);

CREATE TABLE device_sessions (
    token_hash  TEXT PRIMARY KEY,
    device_id   TEXT NOT NULL REFERENCES devices(id),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);

-- Every command that passed signature verification, with the result it got.
CREATE TABLE commands (
    command_id   TEXT PRIMARY KEY,
    task_id      TEXT,
    device_id    TEXT NOT NULL,
    body_digest  TEXT NOT NULL,
    operation    TEXT NOT NULL,
    envelope     TEXT NOT NULL,
    status       TEXT NOT NULL,
    result       TEXT NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE INDEX commands_task ON commands(task_id, created_at);

-- Commands a worker must see (pause, resume, cancel, replan, take-over), until acknowledged.
CREATE TABLE control_commands (
    command_id       TEXT PRIMARY KEY,
    task_id          TEXT NOT NULL REFERENCES tasks(id),
    operation        TEXT NOT NULL,
    args             TEXT NOT NULL,
    plan_revision    INTEGER NOT NULL,
    applied_at       INTEGER NOT NULL,
    acknowledged_at  INTEGER,
    acknowledged_by  TEXT
);
CREATE INDEX control_pending ON control_commands(task_id, applied_at) WHERE acknowledged_at IS NULL;

-- Why an effect needs reconciliation or lost its capability (cancel, replan).
ALTER TABLE effects ADD COLUMN flag TEXT;
