-- Follow-ups and their runs, de-duplicated by (follow-up, nominal time).
CREATE TABLE followups (
    id           TEXT PRIMARY KEY,
    task_id      TEXT NOT NULL REFERENCES tasks(id),
    schedule     TEXT NOT NULL,
    time_zone    TEXT NOT NULL,
    catch_up     TEXT NOT NULL,
    message      TEXT NOT NULL,
    state        TEXT NOT NULL,
    next_run_at  INTEGER,
    last_run_at  INTEGER,
    runs         INTEGER NOT NULL,
    missed       INTEGER NOT NULL,
    created_at   INTEGER NOT NULL
);
CREATE INDEX followups_due ON followups(next_run_at) WHERE state = 'active';

CREATE TABLE followup_runs (
    followup_id  TEXT NOT NULL REFERENCES followups(id),
    nominal_at   INTEGER NOT NULL,
    ran_at       INTEGER NOT NULL,
    missed       INTEGER NOT NULL,
    PRIMARY KEY (followup_id, nominal_at)
) WITHOUT ROWID;
