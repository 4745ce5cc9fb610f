-- Standing rules (issue 31 §2): a user's signed answer (`allow` or `deny`) to the approvals
-- that match it, until it expires or is revoked. `spec` is the rule as signed (JSON
-- `RuleSpec`), `digest` its sha256; `uses` counts the approvals it answered.
CREATE TABLE rules (
    id            TEXT COLLATE "C" PRIMARY KEY,
    owner_id      TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    device_id     TEXT COLLATE "C" NOT NULL REFERENCES devices(id),
    command_id    TEXT COLLATE "C" NOT NULL,
    spec          JSONB NOT NULL,
    digest        TEXT NOT NULL,
    answer        TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    revoked_at    BIGINT,
    revoked_by    TEXT COLLATE "C",
    uses          BIGINT NOT NULL DEFAULT 0,
    last_used_at  BIGINT
);
CREATE INDEX rules_owner ON rules(owner_id, created_at);
