//! Worker and admin tokens a replica has read, kept for a bounded time so a busy worker's
//! requests open no read transaction to find their credential. A module of its own so the
//! state holds it without importing the extractors that use it.

/// Worker and admin tokens already read, by the hash of their secret, so a request does not
/// open a read transaction to find its credential.
///
/// What makes this right: a row is kept for [`TOKEN_CACHE_MS`] of the server's clock at most,
/// then read again. A revocation (`waymark admin token revoke`, which may run on any replica
/// or none) is therefore seen everywhere within that time, and the revoking command waits that
/// long before it says the token is revoked. Unknown secrets are not kept: a token created
/// after a miss is found at once. Device sessions are not kept here; they are read on every
/// request.
pub(crate) struct KnownTokens {
    rows: std::sync::RwLock<std::collections::HashMap<String, (waymark_store::TokenRow, i64)>>,
}

/// Most tokens kept; past it the set starts over (a host has a handful).
const KNOWN_TOKENS: usize = 1024;

/// How long a token row read is trusted before it is read again (server clock, ms): the
/// longest a revoked token still works on a replica that had just read it.
pub const TOKEN_CACHE_MS: i64 = 2_000;

impl KnownTokens {
    pub(crate) fn new() -> Self {
        KnownTokens {
            rows: std::sync::RwLock::new(std::collections::HashMap::new()),
        }
    }

    pub(crate) fn get(&self, hash: &str, now_ms: i64) -> Option<waymark_store::TokenRow> {
        self.rows
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(hash)
            .filter(|(_, read_at)| now_ms - read_at < TOKEN_CACHE_MS)
            .map(|(row, _)| row.clone())
    }

    pub(crate) fn keep(&self, hash: &str, token: &waymark_store::TokenRow, now_ms: i64) {
        let mut rows = self.rows.write().unwrap_or_else(|p| p.into_inner());
        if rows.len() >= KNOWN_TOKENS {
            rows.clear();
        }
        rows.insert(hash.to_owned(), (token.clone(), now_ms));
    }
}
