//! What every handler and rule shares: the limits and timings of a control plane
//! (`Config`), the state over its store (`AppState`: store, metrics, stream and rate limits,
//! the shared event tail), and the server's clock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use waymark_store::Store;

use crate::clock::Clock;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::redact::Redaction;
use crate::tls::TlsFiles;
use crate::{handoff, streams, tail};

/// Limits and timings of a control plane.
#[derive(Debug, Clone)]
pub struct Config {
    /// Lease length when the worker asks for none.
    pub lease_default: Duration,
    /// Shortest lease granted (tests use short ones).
    pub lease_min: Duration,
    /// Longest lease granted.
    pub lease_max: Duration,
    /// Largest JSON body.
    pub max_json_bytes: usize,
    /// Largest artifact.
    pub max_blob_bytes: usize,
    /// How many events the log keeps; older cursors get 410 `cursor_expired`.
    pub event_retention: i64,
    /// SSE keep-alive interval.
    pub keep_alive: Duration,
    /// How often background work (expiry, retention) runs.
    pub tick: Duration,
    /// Decision expiry when the requester gives none.
    pub decision_expiry_default: Duration,
    /// Longest decision expiry accepted.
    pub decision_expiry_max: Duration,
    /// Longest long-poll wait.
    pub max_wait: Duration,
    /// First retry delay of a failed push (doubling, at most 15 minutes).
    pub push_retry_base: Duration,
    /// Networks push endpoints may be in besides the public internet (a self-hosted ntfy on a
    /// LAN); everything else that is not public is refused when connecting.
    pub push_allow: Vec<ipnet::IpNet>,
    /// Live push channels one device may have; registering one more replaces its oldest.
    pub max_push_channels_per_device: usize,
    /// Channels delivered to at the same time, off the shared background pass.
    pub push_concurrency: usize,
    /// Secret patterns redacted from messages and checkpoints before they are stored.
    pub redaction: Redaction,
    /// What makes an approval risky whatever its worker says.
    pub risk: crate::risk::RiskPolicy,
    /// Requests per second each worker token, device session or signing device may make…
    pub rate_per_second: u32,
    /// …with bursts up to this many.
    pub rate_burst: u32,
    /// Requests per second one client address may make to the routes that answer callers not
    /// yet known (pairing, opening a session, signed commands) — checked before anything is
    /// read or written, so an outsider cannot fill the audit log…
    pub address_rate_per_second: u32,
    /// …with bursts up to this many.
    pub address_rate_burst: u32,
    /// Audit entries older than this are pruned…
    pub audit_retention: Duration,
    /// …and at most this many of the newest are kept.
    pub audit_max_entries: i64,
    /// Serve HTTPS with this certificate and key; plain HTTP when `None`.
    pub tls: Option<TlsFiles>,
    /// How long a client may take over the TLS handshake and over each request's headers (so
    /// also how long an idle keep-alive connection stays open).
    pub header_timeout: Duration,
    /// How long a client may take to send a request body.
    pub body_timeout: Duration,
    /// Open event and control streams per credential (the admin's excepted)…
    pub max_streams_per_credential: usize,
    /// …and in all.
    pub max_streams: usize,
    /// Open client connections at most; beyond, new ones are refused (`503` over plain HTTP,
    /// closed over TLS) while the open ones are served. Keep it above `max_streams` (each
    /// stream holds a connection) and below the process's open-file limit.
    pub max_connections: usize,
    /// A device not heard from for this long is shown stale (never connected).
    pub device_stale_after: Duration,
    /// What "now" is for every rule: the system clock, or a driven one in tests.
    pub clock: Clock,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease_default: Duration::from_secs(30),
            lease_min: Duration::from_secs(1),
            lease_max: Duration::from_secs(3600),
            max_json_bytes: 8 << 20,
            max_blob_bytes: 32 << 20,
            event_retention: 1_000_000,
            keep_alive: Duration::from_secs(15),
            tick: Duration::from_millis(500),
            decision_expiry_default: Duration::from_secs(3600),
            decision_expiry_max: Duration::from_secs(30 * 24 * 3600),
            max_wait: Duration::from_secs(60),
            push_retry_base: Duration::from_secs(2),
            push_allow: Vec::new(),
            max_push_channels_per_device: 10,
            push_concurrency: 16,
            redaction: Redaction::default(),
            risk: crate::risk::RiskPolicy::default(),
            rate_per_second: 1000,
            rate_burst: 2000,
            address_rate_per_second: 50,
            address_rate_burst: 250,
            audit_retention: Duration::from_secs(90 * 24 * 3600),
            audit_max_entries: 200_000,
            tls: None,
            header_timeout: Duration::from_secs(20),
            body_timeout: Duration::from_secs(120),
            max_streams_per_credential: 32,
            max_streams: 1024,
            max_connections: 4096,
            device_stale_after: Duration::from_secs(24 * 3600),
            clock: Clock::system(),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// Storage.
    pub store: Arc<dyn Store>,
    /// Limits and timings.
    pub config: Arc<Config>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Flips to `true` when the server shuts down, so streams end and background work stops.
    pub(crate) stopping: Arc<watch::Sender<bool>>,
    /// Per-credential request rate limits.
    pub(crate) limiter: Arc<governor::DefaultKeyedRateLimiter<String>>,
    /// Per-client-address rate limits of the routes open to unknown callers.
    pub(crate) address_limiter: Arc<governor::DefaultKeyedRateLimiter<std::net::IpAddr>>,
    /// Open SSE streams, per credential and in all.
    pub(crate) streams: Arc<streams::Streams>,
    /// The newest events, read once per commit and shared by every event stream.
    pub(crate) tail: Arc<tail::Tail>,
    /// Control commands applied here, handed to this replica's control streams.
    pub(crate) handoffs: Arc<handoff::Handoffs>,
    /// Held by a background pass, so passes never overlap.
    pub(crate) background: Arc<tokio::sync::Mutex<()>>,
    /// Held by a round of push delivery, which runs beside the passes, never inside one.
    pub(crate) pushing: Arc<tokio::sync::Mutex<()>>,
    /// The client for push endpoints: public addresses (and `push_allow`) only.
    pub(crate) push_http: reqwest::Client,
    /// What `push_allow` allows.
    pub(crate) push_allowed: Arc<crate::outbound::Allowed>,
    /// Worker and admin tokens already read (their rows never change).
    pub(crate) tokens: Arc<crate::known_tokens::KnownTokens>,
}

fn quota(per_second: u32, burst: u32) -> governor::Quota {
    let n = |v: u32| std::num::NonZeroU32::new(v.max(1)).unwrap_or(std::num::NonZeroU32::MIN);
    governor::Quota::per_second(n(per_second)).allow_burst(n(burst))
}

impl AppState {
    /// State over a store.
    pub fn new(store: Arc<dyn Store>, config: Config) -> Self {
        let credentials = quota(config.rate_per_second, config.rate_burst);
        let addresses = quota(config.address_rate_per_second, config.address_rate_burst);
        let streams = streams::Streams::new(config.max_streams, config.max_streams_per_credential);
        let push_allowed = Arc::new(crate::outbound::Allowed(config.push_allow.clone()));
        AppState {
            store,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::default()),
            stopping: Arc::new(watch::channel(false).0),
            limiter: Arc::new(governor::RateLimiter::keyed(credentials)),
            address_limiter: Arc::new(governor::RateLimiter::keyed(addresses)),
            streams: Arc::new(streams),
            tail: Arc::new(tail::Tail::new()),
            handoffs: Arc::new(handoff::Handoffs::default()),
            background: Arc::new(tokio::sync::Mutex::new(())),
            pushing: Arc::new(tokio::sync::Mutex::new(())),
            push_http: crate::outbound::client(push_allowed.clone()),
            push_allowed,
            tokens: Arc::new(crate::known_tokens::KnownTokens::new()),
        }
    }

    pub(crate) fn cursor_watch(&self) -> watch::Receiver<i64> {
        self.store.cursor_watch()
    }

    /// A slot for one more SSE stream of `credential` (`None`: the admin, counted only in
    /// the total), or the refusal.
    pub(crate) fn open_stream(
        &self,
        credential: Option<&str>,
    ) -> Result<streams::StreamSlot, ApiError> {
        self.streams.open(credential).inspect_err(|e| {
            self.metrics.refusal_code(e.code().as_str());
        })
    }

    /// Refuses a request beyond the credential's rate with 429 and when to retry.
    pub(crate) fn rate_limit(&self, key: &str) -> Result<(), ApiError> {
        self.refuse_over(self.limiter.check_key(&key.to_owned()), "this credential")
    }

    /// Refuses a request beyond its client address's rate with 429 and when to retry. An IPv6
    /// address counts by its /64, which one client usually holds whole.
    pub(crate) fn rate_limit_address(&self, ip: std::net::IpAddr) -> Result<(), ApiError> {
        let key = match ip {
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => std::net::IpAddr::V4(v4),
                None => {
                    let bits = u128::from(v6) & !((1u128 << 64) - 1);
                    std::net::IpAddr::V6(bits.into())
                }
            },
            v4 => v4,
        };
        self.refuse_over(self.address_limiter.check_key(&key), "this address")
    }

    fn refuse_over(
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

impl AppState {
    /// Server time in unix milliseconds, from the configured clock.
    pub fn now_ms(&self) -> i64 {
        self.config.clock.now_ms()
    }

    /// Server time, from the configured clock.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.config.clock.now()
    }
}
