-- Follow-ups and their runs, de-duplicated by (follow-up, nominal time).
CREATE TABLE followups (
    id           TEXT COLLATE "C" PRIMARY KEY,
    task_id      TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    schedule     JSONB NOT NULL,
    time_zone    TEXT NOT NULL,
    catch_up     TEXT NOT NULL,
    message      TEXT NOT NULL,
    state        TEXT NOT NULL,
    next_run_at  BIGINT,
    last_run_at  BIGINT,
    runs         BIGINT NOT NULL,
    missed       BIGINT NOT NULL,
    created_at   BIGINT NOT NULL
);
CREATE INDEX followups_due ON followups(next_run_at) WHERE state = 'active';

CREATE TABLE followup_runs (
    followup_id  TEXT COLLATE "C" NOT NULL REFERENCES followups(id),
    nominal_at   BIGINT NOT NULL,
    ran_at       BIGINT NOT NULL,
    missed       BIGINT NOT NULL,
    PRIMARY KEY (followup_id, nominal_at)
);
