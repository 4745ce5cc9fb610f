-- Runtime adapters: a task per runtime session (found again by the runtime's own id), and
-- approvals that say how long the runtime holds them and whether it took the answer.
ALTER TABLE tasks ADD COLUMN external_key TEXT;
CREATE UNIQUE INDEX tasks_external_key ON tasks(owner_id, runtime, external_key)
    WHERE external_key IS NOT NULL;
ALTER TABLE decisions ADD COLUMN durability TEXT;
ALTER TABLE decisions ADD COLUMN delivery JSONB;
