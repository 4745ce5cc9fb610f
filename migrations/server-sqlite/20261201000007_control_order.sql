-- Control commands in the order they applied: a per-task sequence, assigned on insert, so a
-- worker can tell a newer command from an older one however they reach it (stream or
-- heartbeat reply). `applied_at` is milliseconds, and two commands can share one.
ALTER TABLE control_commands ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
UPDATE control_commands SET seq = (
    SELECT COUNT(*) FROM control_commands c
    WHERE c.task_id = control_commands.task_id
      AND (c.applied_at < control_commands.applied_at
           OR (c.applied_at = control_commands.applied_at AND c.rowid <= control_commands.rowid))
);
CREATE UNIQUE INDEX control_commands_seq ON control_commands(task_id, seq);
