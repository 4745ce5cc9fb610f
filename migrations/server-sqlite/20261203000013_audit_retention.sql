-- The audit log's retention deletes by age (domain::retention): an index on when each entry
-- was recorded keeps that a range delete instead of a scan.
CREATE INDEX audit_at ON audit(at);
