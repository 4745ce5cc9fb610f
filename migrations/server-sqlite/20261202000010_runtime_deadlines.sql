-- The deadline the runtime holding an approval enforces itself, and what it does then (JSON
-- `RuntimeDeadline`: Hermes denies after its fixed wait, a Claude Code hook asks in its own
-- prompt, OpenClaw's approval expires); NULL where the runtime sets none.
ALTER TABLE decisions ADD COLUMN runtime_deadline TEXT;
