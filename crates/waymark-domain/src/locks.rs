//! Locks by key, made on first use: work on one key (a Claude Code session) takes turns while
//! other keys go on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Past this many keys, the locks nobody holds are dropped when the next one is made.
const KEPT: usize = 10_000;

/// One async lock per key.
#[derive(Default)]
pub struct KeyedLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl KeyedLocks {
    /// The lock of `key` (the same one while anybody holds or waits for it).
    pub fn lock_of(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if locks.len() > KEPT {
            locks.retain(|_, l| Arc::strong_count(l) > 1);
        }
        locks.entry(key.to_owned()).or_default().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_has_one_lock_while_it_is_held_and_the_map_stays_bounded() {
        let locks = KeyedLocks::default();
        let held = locks.lock_of("a");
        assert!(Arc::ptr_eq(&held, &locks.lock_of("a")));
        assert!(!Arc::ptr_eq(&held, &locks.lock_of("b")));
        let mut most = 0;
        for i in 0..3 * KEPT {
            drop(locks.lock_of(&format!("k{i}")));
            most = most.max(locks.0.lock().unwrap().len());
        }
        assert!(most <= KEPT + 1, "unheld locks are dropped: {most} kept");
        assert!(Arc::ptr_eq(&held, &locks.lock_of("a")), "a held lock stays");
    }
}
