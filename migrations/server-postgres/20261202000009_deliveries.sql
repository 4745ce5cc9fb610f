-- Proof of delivery: each step a decision reached on a device (pushed, fetched, shown, opened,
-- answered), recorded once, when first seen; and when each device was last heard from.
CREATE TABLE deliveries (
    decision_id TEXT NOT NULL,
    device_id   TEXT NOT NULL,
    step        TEXT NOT NULL,
    at          BIGINT NOT NULL,
    detail      TEXT,
    PRIMARY KEY (decision_id, device_id, step)
);
ALTER TABLE devices ADD COLUMN last_seen_at BIGINT;
