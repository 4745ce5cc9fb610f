-- Devices, pairing codes, device read sessions, the command ledger and the control queue.

CREATE TABLE devices (
    id          TEXT COLLATE "C" PRIMARY KEY,
    user_id     TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    name        TEXT NOT NULL,
    public_key  TEXT COLLATE "C" NOT NULL UNIQUE,
    scopes      JSONB NOT NULL,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);

CREATE TABLE pairing_codes (
    code_hash   TEXT COLLATE "C" PRIMARY KEY,
    user_id     TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    scopes      JSONB NOT NULL,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT,
    device_id   TEXT COLLATE "C"
);

CREATE TABLE device_sessions (
    token_hash  TEXT COLLATE "C" PRIMARY KEY,
    device_id   TEXT COLLATE "C" NOT NULL REFERENCES devices(id),
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL
);

-- Every command that passed signature verification, with the result it got.
CREATE TABLE commands (
    command_id   TEXT COLLATE "C" PRIMARY KEY,
    task_id      TEXT COLLATE "C",
    device_id    TEXT COLLATE "C" NOT NULL,
    body_digest  TEXT NOT NULL,
    operation    TEXT NOT NULL,
    envelope     JSONB NOT NULL,
    status       TEXT NOT NULL,
    result       JSONB NOT NULL,
    created_at   BIGINT NOT NULL
);
CREATE INDEX commands_task ON commands(task_id, created_at);

-- Commands a worker must see (pause, resume, cancel, replan, take-over), until acknowledged.
CREATE TABLE control_commands (
    command_id       TEXT COLLATE "C" PRIMARY KEY,
    task_id          TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    operation        TEXT NOT NULL,
    args             JSONB NOT NULL,
    plan_revision    BIGINT NOT NULL,
    applied_at       BIGINT NOT NULL,
    acknowledged_at  BIGINT,
    acknowledged_by  TEXT
);
CREATE INDEX control_pending ON control_commands(task_id, applied_at) WHERE acknowledged_at IS NULL;

-- Why an effect needs reconciliation or lost its capability (cancel, replan).
ALTER TABLE effects ADD COLUMN flag TEXT;
