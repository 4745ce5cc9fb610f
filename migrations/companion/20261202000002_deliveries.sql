-- How far each decision has reached each device (`decision.delivered`), kept apart from the
-- decision's own row so a newer version of the decision never drops them; reads put them back
-- into the decision's `deliveries`.
CREATE TABLE deliveries (
    decision_id  TEXT NOT NULL,
    device_id    TEXT NOT NULL,
    step         TEXT NOT NULL,
    data         TEXT NOT NULL,
    PRIMARY KEY (decision_id, device_id, step)
);
