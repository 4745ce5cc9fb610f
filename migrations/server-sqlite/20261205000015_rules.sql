-- Standing rules (issue 31 §2): a user's signed answer (`allow` or `deny`) to the approvals
-- that match it, until it expires or is revoked. `spec` is the rule as signed (JSON
-- `RuleSpec`), `digest` its sha256; `uses` counts the approvals it answered.
CREATE TABLE rules (
    id            TEXT PRIMARY KEY,
    owner_id      TEXT NOT NULL REFERENCES users(id),
    device_id     TEXT NOT NULL REFERENCES devices(id),
    command_id    TEXT NOT NULL,
    spec          TEXT NOT NULL,
    digest        TEXT NOT NULL,
    answer        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL,
    revoked_at    INTEGER,
    revoked_by    TEXT,
    uses          INTEGER NOT NULL DEFAULT 0,
    last_used_at  INTEGER
);
CREATE INDEX rules_owner ON rules(owner_id, created_at);
