-- Push channels of devices that are not connected (Web Push, UnifiedPush), each following the
-- event log from its own cursor; server secrets (the VAPID key).
CREATE TABLE push_channels (
    id                    TEXT PRIMARY KEY,
    device_id             TEXT NOT NULL REFERENCES devices(id),
    user_id               TEXT NOT NULL,
    kind                  TEXT NOT NULL,
    endpoint              TEXT NOT NULL,
    p256dh                TEXT,
    auth                  TEXT,
    cursor                INTEGER NOT NULL,
    attempts              INTEGER NOT NULL,
    delivered             INTEGER NOT NULL,
    failures              INTEGER NOT NULL,
    consecutive_failures  INTEGER NOT NULL,
    last_error            TEXT,
    last_attempt_at       INTEGER,
    next_attempt_at       INTEGER NOT NULL,
    created_at            INTEGER NOT NULL,
    revoked_at            INTEGER
);
CREATE INDEX push_channels_device ON push_channels(device_id);

CREATE TABLE server_secrets (
    name   TEXT PRIMARY KEY,
    value  TEXT NOT NULL
);
