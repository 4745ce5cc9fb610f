//! `RulesTx` on SQLite: a user's standing rules and their use counts.

use async_trait::async_trait;
use waymark_store::*;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl RulesTx for SqliteTx {
    async fn insert_rule(&mut self, r: &RuleRow) -> Result<()> {
        self.exec(
            sqlx::query(
                "INSERT INTO rules (id, owner_id, device_id, command_id, spec, digest, answer,
                   created_at, expires_at, revoked_at, revoked_by, uses, last_used_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(&r.id)
            .bind(&r.owner_id)
            .bind(&r.device_id)
            .bind(&r.command_id)
            .bind(json_text(&r.spec))
            .bind(&r.digest)
            .bind(r.answer.as_str())
            .bind(r.created_at)
            .bind(r.expires_at)
            .bind(r.revoked_at)
            .bind(&r.revoked_by)
            .bind(r.uses)
            .bind(r.last_used_at),
        )
        .await
        .map(drop)
    }

    async fn rule(&mut self, id: &str) -> Result<Option<RuleRow>> {
        self.one(
            sqlx::query("SELECT * FROM rules WHERE id = ?").bind(id),
            rule_row,
        )
        .await
    }

    async fn list_rules(
        &mut self,
        owner_id: &str,
        live_at: Option<i64>,
        limit: i64,
    ) -> Result<Vec<RuleRow>> {
        self.all(
            sqlx::query(
                "SELECT * FROM rules WHERE owner_id = ?1
                   AND (?2 IS NULL OR (revoked_at IS NULL AND expires_at > ?2))
                 ORDER BY created_at DESC, id DESC LIMIT ?3",
            )
            .bind(owner_id)
            .bind(live_at)
            .bind(limit),
            rule_row,
        )
        .await
    }

    async fn revoke_rule(&mut self, id: &str, at: i64, device_id: &str) -> Result<bool> {
        Ok(self
            .exec(
                sqlx::query(
                    "UPDATE rules SET revoked_at = ?, revoked_by = ? WHERE id = ? AND revoked_at IS NULL",
                )
                .bind(at)
                .bind(device_id)
                .bind(id),
            )
            .await?
            == 1)
    }

    async fn count_rule_use(&mut self, id: &str, at: i64) -> Result<()> {
        self.exec(
            sqlx::query("UPDATE rules SET uses = uses + 1, last_used_at = ? WHERE id = ?")
                .bind(at)
                .bind(id),
        )
        .await
        .map(drop)
    }
}
