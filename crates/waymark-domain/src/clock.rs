//! The server's clock. Every rule that compares against "now" — leases, decision expiries,
//! follow-ups, push retries, signed commands' lifetimes, device sessions — reads this one
//! clock, so a test moves time forward instead of waiting for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};

/// The system clock, or one a test drives: real time plus however far it was advanced.
#[derive(Clone, Default)]
pub struct Clock {
    driven: Option<Arc<Driven>>,
}

struct Driven {
    ahead_ms: AtomicI64,
    /// Woken at every advance, so a [`Clock::sleep_until`] sees a deadline it was moved past.
    moved: tokio::sync::Notify,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock::default()
    }

    /// A clock a test moves with [`Clock::advance`]. It runs with real time between
    /// advances, so timeouts of the transport (HTTP, streams) behave as in production.
    pub fn driven() -> Self {
        Clock {
            driven: Some(Arc::new(Driven {
                ahead_ms: AtomicI64::new(0),
                moved: tokio::sync::Notify::new(),
            })),
        }
    }

    /// Now, in unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        let ahead = self
            .driven
            .as_ref()
            .map_or(0, |d| d.ahead_ms.load(Ordering::SeqCst));
        Utc::now().timestamp_millis() + ahead
    }

    /// Now.
    pub fn now(&self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.now_ms())
            .single()
            .unwrap_or_default()
    }

    /// Moves a driven clock forward. The system clock cannot be moved: that is a mistake in
    /// the caller, reported rather than ignored.
    pub fn advance(&self, by: Duration) -> Result<(), NotDriven> {
        let d = self.driven.as_ref().ok_or(NotDriven)?;
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        d.ahead_ms.fetch_add(ms, Ordering::SeqCst);
        d.moved.notify_waiters();
        Ok(())
    }

    /// Returns once this clock reads `at_ms` or later: real time passing, or a driven clock
    /// moved past it.
    pub async fn sleep_until(&self, at_ms: i64) {
        loop {
            let moved = self.driven.as_ref().map(|d| d.moved.notified());
            let now = self.now_ms();
            if now >= at_ms {
                return;
            }
            let wait = tokio::time::sleep(Duration::from_millis((at_ms - now) as u64));
            match moved {
                Some(moved) => {
                    tokio::select! {
                        _ = wait => {}
                        _ = moved => {}
                    }
                }
                None => wait.await,
            }
        }
    }

    /// How far a driven clock was moved ahead of real time (zero for the system clock).
    pub fn ahead(&self) -> Duration {
        self.driven.as_ref().map_or(Duration::ZERO, |d| {
            Duration::from_millis(d.ahead_ms.load(Ordering::SeqCst).max(0) as u64)
        })
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.driven {
            None => f.write_str("Clock::system"),
            Some(_) => write!(f, "Clock::driven(+{:?})", self.ahead()),
        }
    }
}

/// [`Clock::advance`] on the system clock.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the system clock cannot be advanced; start the server with Clock::driven()")]
pub struct NotDriven;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driven_clock_moves_by_what_it_is_advanced_and_the_system_clock_refuses() {
        let c = Clock::driven();
        let before = c.now_ms();
        c.advance(Duration::from_secs(3600)).unwrap();
        let after = c.now_ms();
        assert!(after - before >= 3_600_000, "{before} → {after}");
        assert!(after - before < 3_600_000 + 60_000, "{before} → {after}");
        assert_eq!(c.ahead(), Duration::from_secs(3600));
        assert!(Clock::system().advance(Duration::from_secs(1)).is_err());
    }
}
