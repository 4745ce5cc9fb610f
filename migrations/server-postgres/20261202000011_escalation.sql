-- Escalation and quiet hours: each user's policy (JSON `EscalationPolicy`: who is notified of a
-- new decision, in what order, and when to hold what can wait), and on each decision where it
-- stands (JSON `Escalation`) and when it moves next.
CREATE TABLE escalation_policies (
    user_id     TEXT COLLATE "C" PRIMARY KEY REFERENCES users(id),
    policy      JSONB NOT NULL,
    updated_at  BIGINT NOT NULL
);
ALTER TABLE decisions ADD COLUMN escalation JSONB;
ALTER TABLE decisions ADD COLUMN escalate_at BIGINT;
CREATE INDEX decisions_escalate_at ON decisions(escalate_at) WHERE status = 'pending' AND escalate_at IS NOT NULL;
