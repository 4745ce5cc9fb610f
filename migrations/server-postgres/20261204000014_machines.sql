-- Machines: each runs a `waymark runner` that starts, revives and resumes the runtimes there.
-- `info` is what its runner last reported (runtimes, directories, version); a runner's token
-- names its machine and reaches only that machine's tasks; a work item is what the control
-- plane asks of a runner (start, resume, stop), and what became of it.
CREATE TABLE machines (
    id             TEXT COLLATE "C" PRIMARY KEY,
    owner_id       TEXT COLLATE "C" NOT NULL REFERENCES users(id),
    name           TEXT NOT NULL,
    info           JSONB NOT NULL,
    registered_at  BIGINT,
    last_seen_at   BIGINT,
    created_at     BIGINT NOT NULL,
    UNIQUE (owner_id, name)
);
ALTER TABLE tokens ADD COLUMN machine_id TEXT COLLATE "C" REFERENCES machines(id);
ALTER TABLE tasks ADD COLUMN machine_id TEXT COLLATE "C" REFERENCES machines(id);
CREATE INDEX tasks_machine ON tasks(machine_id) WHERE machine_id IS NOT NULL;
CREATE TABLE machine_work (
    id          TEXT COLLATE "C" PRIMARY KEY,
    machine_id  TEXT COLLATE "C" NOT NULL REFERENCES machines(id),
    task_id     TEXT COLLATE "C" NOT NULL REFERENCES tasks(id),
    kind        TEXT NOT NULL,
    args        JSONB NOT NULL,
    state       TEXT NOT NULL,
    detail      TEXT,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX machine_work_open ON machine_work(machine_id, state);
CREATE INDEX machine_work_task ON machine_work(task_id);
