-- Delegations: an owner lets another user read their tasks and answer their decisions (the
-- second person an escalation step can reach). Pausing, cancelling, replanning and taking over
-- stay with the owner.
CREATE TABLE delegations (
    owner_id     TEXT NOT NULL REFERENCES users(id),
    delegate_id  TEXT NOT NULL REFERENCES users(id),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (owner_id, delegate_id),
    CHECK (owner_id <> delegate_id)
);
CREATE INDEX delegations_delegate ON delegations(delegate_id);
