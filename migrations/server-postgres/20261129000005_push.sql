-- Push channels of devices that are not connected (Web Push, UnifiedPush), each following the
-- event log from its own cursor; server secrets (the VAPID key).
CREATE TABLE push_channels (
    id                    TEXT COLLATE "C" PRIMARY KEY,
    device_id             TEXT COLLATE "C" NOT NULL REFERENCES devices(id),
    user_id               TEXT COLLATE "C" NOT NULL,
    kind                  TEXT NOT NULL,
    endpoint              TEXT NOT NULL,
    p256dh                TEXT,
    auth                  TEXT,
    cursor                BIGINT NOT NULL,
    attempts              BIGINT NOT NULL,
    delivered             BIGINT NOT NULL,
    failures              BIGINT NOT NULL,
    consecutive_failures  BIGINT NOT NULL,
    last_error            TEXT,
    last_attempt_at       BIGINT,
    next_attempt_at       BIGINT NOT NULL,
    created_at            BIGINT NOT NULL,
    revoked_at            BIGINT
);
CREATE INDEX push_channels_device ON push_channels(device_id);

CREATE TABLE server_secrets (
    name   TEXT COLLATE "C" PRIMARY KEY,
    value  TEXT NOT NULL
);
