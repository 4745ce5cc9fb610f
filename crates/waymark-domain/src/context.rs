//! What the rules read besides a transaction: the store, the configuration (and its clock),
//! the metrics, this replica's command hand-offs, the push client and the per-credential rate
//! limits. The server's `AppState` holds one and adds what only HTTP needs (streams, the shared
//! event tail, address limits).

use std::sync::Arc;

use waymark_store::Store;

use crate::config::Config;
use crate::error::ApiError;
use crate::handoff::Handoffs;
use crate::locks::KeyedLocks;
use crate::metrics::Metrics;
use crate::outbound::Allowed;

/// The rules' context: cheap to clone (every part is shared).
#[derive(Clone)]
pub struct Context {
    /// Storage.
    pub store: Arc<dyn Store>,
    /// Limits and timings.
    pub config: Arc<Config>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Control commands applied here, handed to this replica's control streams.
    pub handoffs: Arc<Handoffs>,
    /// Held by a round of push delivery, which runs beside the background passes, never inside
    /// one.
    pub pushing: Arc<tokio::sync::Mutex<()>>,
    /// The client for push endpoints: public addresses (and `push_allow`) only.
    pub push_http: reqwest::Client,
    /// What `push_allow` allows.
    pub push_allowed: Arc<Allowed>,
    /// One lock per Claude Code session: its hooks take turns.
    pub claude_sessions: Arc<KeyedLocks>,
    /// Per-credential request rate limits.
    limiter: Arc<governor::DefaultKeyedRateLimiter<String>>,
}

/// A rate of `per_second` with bursts up to `burst` (each at least 1).
pub fn quota(per_second: u32, burst: u32) -> governor::Quota {
    let n = |v: u32| std::num::NonZeroU32::new(v.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    governor::Quota::per_second(n(per_second)).allow_burst(n(burst))
}

impl Context {
    /// The rules' context over a store.
    pub fn new(store: Arc<dyn Store>, config: Config) -> Self {
        let credentials = quota(config.rate_per_second, config.rate_burst);
        let push_allowed = Arc::new(Allowed(config.push_allow.clone()));
        Context {
            store,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            handoffs: Arc::new(Handoffs::default()),
            pushing: Arc::new(tokio::sync::Mutex::new(())),
            push_http: crate::outbound::client(push_allowed.clone()),
            push_allowed,
            claude_sessions: Arc::new(KeyedLocks::default()),
            limiter: Arc::new(governor::RateLimiter::keyed(credentials)),
        }
    }

    /// The newest committed event cursor, as it moves.
    pub fn cursor_watch(&self) -> tokio::sync::watch::Receiver<i64> {
        self.store.cursor_watch()
    }

    /// Server time in unix milliseconds, from the configured clock.
    pub fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// Server time, from the configured clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.config.clock.now()
    }

    /// Refuses a request beyond the credential's rate with 429 and when to retry.
    pub fn rate_limit(&self, key: &str) -> Result<(), ApiError> {
        self.refuse_over(self.limiter.check_key(&key.to_owned()), "this credential")
    }

    /// Forgets the rate limits of credentials not heard from lately (a background pass's).
    pub fn forget_idle_limits(&self) {
        self.limiter.retain_recent();
    }

    /// `checked`, or a 429 naming `whose` rate it exceeded and when to retry.
    pub fn refuse_over(
        &self,
        checked: Result<(), governor::NotUntil<governor::clock::QuantaInstant>>,
        whose: &str,
    ) -> Result<(), ApiError> {
        match checked {
            Ok(()) => Ok(()),
            Err(not_until) => {
                use governor::clock::Clock;
                let wait = not_until.wait_time_from(governor::clock::DefaultClock::default().now());
                self.metrics.refusal_code("rate_limited");
                Err(ApiError::new(
                    waymark_proto::ErrorCode::RateLimited,
                    format!(
                        "too many requests from {whose}; retry in {} ms",
                        wait.as_millis().max(1)
                    ),
                )
                .with("retry_after_ms", wait.as_millis().max(1) as u64))
            }
        }
    }
}
