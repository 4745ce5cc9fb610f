//! `UsersTx` on PostgreSQL: users, and the credentials people and machines call with.

use async_trait::async_trait;
use waymark_store::*;

use super::PgTx;
use crate::rows::*;

#[async_trait]
impl UsersTx for PgTx {
    async fn insert_user(&mut self, u: &UserRow) -> Result<()> {
        self.insert(
            "users",
            sqlx::query(
                "INSERT INTO users (id, name, created_at) VALUES ($1, $2, $3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(&u.id)
            .bind(&u.name)
            .bind(u.created_at),
        )
        .await
    }

    async fn user_by_name(&mut self, name: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE name = $1").bind(name),
            user_row,
        )
        .await
    }

    async fn user_by_id(&mut self, id: &str) -> Result<Option<UserRow>> {
        self.one(
            sqlx::query("SELECT * FROM users WHERE id = $1").bind(id),
            user_row,
        )
        .await
    }

    async fn list_users(&mut self) -> Result<Vec<UserRow>> {
        self.all(sqlx::query("SELECT * FROM users ORDER BY name"), user_row)
            .await
    }

    async fn insert_token(&mut self, t: &TokenRow) -> Result<()> {
        self.insert(
            "tokens",
            sqlx::query(
                "INSERT INTO tokens (id, kind, name, user_id, secret_hash, created_at, revoked_at,
                   machine_id)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            )
            .bind(&t.id)
            .bind(t.kind.as_str())
            .bind(&t.name)
            .bind(&t.user_id)
            .bind(&t.secret_hash)
            .bind(t.created_at)
            .bind(t.revoked_at)
            .bind(&t.machine_id),
        )
        .await
    }

    async fn token_by_hash(&mut self, hash: &str) -> Result<Option<TokenRow>> {
        self.one(
            sqlx::query("SELECT * FROM tokens WHERE secret_hash = $1").bind(hash),
            token_row,
        )
        .await
    }

    async fn list_tokens(&mut self, kind: TokenKind) -> Result<Vec<TokenRow>> {
        self.all(
            sqlx::query("SELECT * FROM tokens WHERE kind = $1 ORDER BY created_at, id")
                .bind(kind.as_str()),
            token_row,
        )
        .await
    }

    async fn revoke_token(&mut self, id: &str, at: i64) -> Result<bool> {
        let n = self
            .exec(
                sqlx::query(
                    "UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
                )
                .bind(at)
                .bind(id),
            )
            .await?;
        Ok(n == 1)
    }
}
