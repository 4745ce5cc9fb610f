-- Control commands in the order they applied: a per-task sequence, assigned on insert, so a
-- worker can tell a newer command from an older one however they reach it (stream or
-- heartbeat reply). `applied_at` is milliseconds, and two commands can share one.
ALTER TABLE control_commands ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
UPDATE control_commands c SET seq = r.n
FROM (SELECT command_id,
             ROW_NUMBER() OVER (PARTITION BY task_id ORDER BY applied_at, command_id) AS n
      FROM control_commands) r
WHERE c.command_id = r.command_id;
CREATE UNIQUE INDEX control_commands_seq ON control_commands(task_id, seq);
