-- Escalation and quiet hours: each user's policy (JSON `EscalationPolicy`: who is notified of a
-- new decision, in what order, and when to hold what can wait), and on each decision where it
-- stands (JSON `Escalation`) and when it moves next.
CREATE TABLE escalation_policies (
    user_id     TEXT PRIMARY KEY REFERENCES users(id),
    policy      TEXT NOT NULL,
    updated_at  INTEGER NOT NULL
);
ALTER TABLE decisions ADD COLUMN escalation TEXT;
ALTER TABLE decisions ADD COLUMN escalate_at INTEGER;
CREATE INDEX decisions_escalate_at ON decisions(escalate_at) WHERE status = 'pending' AND escalate_at IS NOT NULL;
