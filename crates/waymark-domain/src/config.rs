//! The limits and timings of a control plane (`Config`), read by the rules and by the server
//! that serves them.

use std::path::PathBuf;
use std::time::Duration;

use crate::clock::Clock;
use crate::redact::Redaction;

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

/// Where the certificate chain and its private key are (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The leaf certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}
