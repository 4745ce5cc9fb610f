//! `SecretsTx`'s statements: server secrets. Job claims are each backend's own (always granted on
//! SQLite, an advisory lock on PostgreSQL).

use crate::Statement;

pub fn server_secret(name: &str) -> Statement<'_> {
    Statement::new("SELECT value FROM server_secrets WHERE name = $1").bind(name)
}

pub fn insert_server_secret<'a>(name: &'a str, value: &'a str) -> Statement<'a> {
    Statement::new("INSERT INTO server_secrets (name, value) VALUES ($1, $2)")
        .bind(name)
        .bind(value)
}
