//! `RulesTx`'s statements: a user's standing rules and their use counts. All of them are the same
//! on both backends.

use waymark_store::RuleRow;

use crate::{Insert, Statement, insert};

pub fn insert_rule(r: &RuleRow) -> Insert<'_> {
    insert!(
        "INSERT INTO rules (id, owner_id, device_id, command_id, spec, digest, answer,
           created_at, expires_at, revoked_at, revoked_by, uses, last_used_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
    )
    .bind(&r.id)
    .bind(&r.owner_id)
    .bind(&r.device_id)
    .bind(&r.command_id)
    .json(&r.spec)
    .bind(&r.digest)
    .bind(r.answer.as_str())
    .bind(r.created_at)
    .bind(r.expires_at)
    .bind(r.revoked_at)
    .bind(&r.revoked_by)
    .bind(r.uses)
    .bind(r.last_used_at)
}

pub fn rule(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM rules WHERE id = $1").bind(id)
}

pub fn list_rules(owner_id: &str, live_at: Option<i64>, limit: i64) -> Statement<'_> {
    Statement::new(
        "SELECT * FROM rules WHERE owner_id = $1
           AND (CAST($2 AS BIGINT) IS NULL OR (revoked_at IS NULL AND expires_at > $2))
         ORDER BY created_at DESC, id DESC LIMIT $3",
    )
    .bind(owner_id)
    .bind(live_at)
    .bind(limit)
}

pub fn revoke_rule<'a>(id: &'a str, at: i64, device_id: &'a str) -> Statement<'a> {
    Statement::new(
        "UPDATE rules SET revoked_at = $1, revoked_by = $2 WHERE id = $3 AND revoked_at IS NULL",
    )
    .bind(at)
    .bind(device_id)
    .bind(id)
}

pub fn count_rule_use(id: &str, at: i64) -> Statement<'_> {
    Statement::new("UPDATE rules SET uses = uses + 1, last_used_at = $1 WHERE id = $2")
        .bind(at)
        .bind(id)
}
