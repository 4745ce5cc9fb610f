//! `UsersTx`'s statements: users, and the credentials people and machines call with. All of them
//! are the same on both backends.

use waymark_store::{TokenKind, TokenRow, UserRow};

use crate::{Insert, Statement, insert};

pub fn insert_user(u: &UserRow) -> Insert<'_> {
    insert!("INSERT INTO users (id, name, created_at) VALUES ($1, $2, $3)")
        .bind(&u.id)
        .bind(&u.name)
        .bind(u.created_at)
}

pub fn user_by_name(name: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM users WHERE name = $1").bind(name)
}

pub fn user_by_id(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM users WHERE id = $1").bind(id)
}

pub fn list_users() -> Statement<'static> {
    Statement::new("SELECT * FROM users ORDER BY name")
}

pub fn insert_token(t: &TokenRow) -> Insert<'_> {
    insert!(
        "INSERT INTO tokens (id, kind, name, user_id, secret_hash, created_at, revoked_at,
           machine_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
    )
    .bind(&t.id)
    .bind(t.kind.as_str())
    .bind(&t.name)
    .bind(&t.user_id)
    .bind(&t.secret_hash)
    .bind(t.created_at)
    .bind(t.revoked_at)
    .bind(&t.machine_id)
}

pub fn token_by_hash(hash: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM tokens WHERE secret_hash = $1").bind(hash)
}

pub fn list_tokens(kind: TokenKind) -> Statement<'static> {
    Statement::new("SELECT * FROM tokens WHERE kind = $1 ORDER BY created_at, id")
        .bind(kind.as_str())
}

pub fn revoke_token(id: &str, at: i64) -> Statement<'_> {
    Statement::new("UPDATE tokens SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
        .bind(at)
        .bind(id)
}
