-- Recovery: compensation tasks name the task they compensate; attempts record the temporary
-- resources their worker reported released.
ALTER TABLE tasks ADD COLUMN parent_id TEXT COLLATE "C";
ALTER TABLE attempts ADD COLUMN released JSONB;
CREATE INDEX attempts_live ON attempts(expires_at) WHERE state = 'active';
