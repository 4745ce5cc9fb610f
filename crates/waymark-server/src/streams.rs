//! Caps on open SSE streams (`/v1/events`, `/v1/attempts/{a}/control`), per credential and in
//! all. A stream holds a [`StreamSlot`] for as long as its response body lives; dropping it
//! (the client went away, or the server is stopping) frees the slot. Apart from the address
//! limits (`limits`) so the state holds the caps without importing an extractor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use waymark_proto::ErrorCode;

use crate::error::ApiError;

pub(crate) struct Streams {
    max: usize,
    per_credential: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_credential: HashMap<String, usize>,
}

/// One open stream; frees its slot when dropped.
pub(crate) struct StreamSlot {
    streams: Arc<Streams>,
    credential: Option<String>,
}

impl Streams {
    pub(crate) fn new(max: usize, per_credential: usize) -> Self {
        Streams {
            max,
            per_credential,
            open: Mutex::new(Open::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a slot for `credential` (`None`: counted only in the total), or refuses: 429
    /// `too_many_streams` when the credential has its share open, 503 `unavailable` when
    /// the server has.
    pub(crate) fn open(self: &Arc<Self>, credential: Option<&str>) -> Result<StreamSlot, ApiError> {
        let mut open = self.lock();
        if let Some(c) = credential {
            let mine = open.by_credential.get(c).copied().unwrap_or(0);
            if mine >= self.per_credential {
                return Err(ApiError::new(
                    ErrorCode::TooManyStreams,
                    format!(
                        "this credential already has {mine} open streams, its limit; close one (or raise `serve --max-streams-per-credential`)"
                    ),
                )
                .with("limit", self.per_credential));
            }
        }
        if open.total >= self.max {
            return Err(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "the server has {} open streams, its limit; retry shortly",
                    open.total
                ),
            )
            .with("limit", self.max)
            .with("retry_after_ms", 5000));
        }
        open.total += 1;
        if let Some(c) = credential {
            *open.by_credential.entry(c.to_owned()).or_default() += 1;
        }
        Ok(StreamSlot {
            streams: self.clone(),
            credential: credential.map(str::to_owned),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.streams.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(c) = &self.credential
            && let Some(n) = open.by_credential.get_mut(c)
        {
            *n -= 1;
            if *n == 0 {
                open.by_credential.remove(c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_per_credential_and_in_all_and_freed_on_drop() {
        let s = Arc::new(Streams::new(3, 2));
        let a1 = s.open(Some("alice")).unwrap();
        let _a2 = s.open(Some("alice")).unwrap();
        let e = s.open(Some("alice")).err().unwrap();
        assert_eq!(e.code(), ErrorCode::TooManyStreams);
        let _b1 = s.open(Some("bob")).unwrap();
        let e = s.open(None).err().unwrap();
        assert_eq!(e.code(), ErrorCode::Unavailable);
        drop(a1);
        let _a3 = s.open(Some("alice")).unwrap();
        assert_eq!(s.lock().total, 3);
        drop(_b1);
        assert!(!s.lock().by_credential.contains_key("bob"));
    }
}
