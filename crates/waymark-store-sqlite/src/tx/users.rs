//! `UsersTx` on SQLite: users, and the credentials people and machines call with.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl UsersTx for SqliteTx {
    async fn insert_user(&mut self, u: &UserRow) -> Result<()> {
        self.insert(sql::users::insert_user(u))
    }

    async fn user_by_name(&mut self, name: &str) -> Result<Option<UserRow>> {
        self.one(sql::users::user_by_name(name), user_row)
    }

    async fn user_by_id(&mut self, id: &str) -> Result<Option<UserRow>> {
        self.one(sql::users::user_by_id(id), user_row)
    }

    async fn list_users(&mut self) -> Result<Vec<UserRow>> {
        self.all(sql::users::list_users(), user_row)
    }

    async fn insert_token(&mut self, t: &TokenRow) -> Result<()> {
        self.insert(sql::users::insert_token(t))
    }

    async fn token_by_hash(&mut self, hash: &str) -> Result<Option<TokenRow>> {
        self.one(sql::users::token_by_hash(hash), token_row)
    }

    async fn list_tokens(&mut self, kind: TokenKind) -> Result<Vec<TokenRow>> {
        self.all(sql::users::list_tokens(kind), token_row)
    }

    async fn revoke_token(&mut self, id: &str, at: i64) -> Result<bool> {
        let n = self.exec(sql::users::revoke_token(id, at))?;
        Ok(n == 1)
    }
}
