//! What every handler shares: the rules' context (store, configuration, clock, metrics,
//! hand-offs: `waymark_domain::Context`) and what only HTTP needs beside it (`AppState`: stream
//! and address limits, the shared event tail, known tokens, background locks).

use std::sync::Arc;

use tokio::sync::watch;
use waymark_domain::context::quota;
use waymark_store::Store;

use crate::error::ApiError;
use crate::{streams, tail};

pub(crate) use waymark_domain::{Config, Context};

/// What every handler shares: the rules' context, which it dereferences to, and the rest.
#[derive(Clone)]
pub struct AppState {
    /// What the rules read.
    pub rules: Context,
    /// Flips to `true` when the server shuts down, so streams end and background work stops.
    pub(crate) stopping: Arc<watch::Sender<bool>>,
    /// Per-client-address rate limits of the routes open to unknown callers.
    pub(crate) address_limiter: Arc<governor::DefaultKeyedRateLimiter<std::net::IpAddr>>,
    /// Open SSE streams, per credential and in all.
    pub(crate) streams: Arc<streams::Streams>,
    /// The newest events, read once per commit and shared by every event stream.
    pub(crate) tail: Arc<tail::Tail>,
    /// Held by a background pass, so passes never overlap.
    pub(crate) background: Arc<tokio::sync::Mutex<()>>,
    /// Worker and admin tokens already read (their rows never change).
    pub(crate) tokens: Arc<crate::known_tokens::KnownTokens>,
}

impl std::ops::Deref for AppState {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.rules
    }
}

impl AppState {
    /// State over a store.
    pub fn new(store: Arc<dyn Store>, config: Config) -> Self {
        let addresses = quota(config.address_rate_per_second, config.address_rate_burst);
        let streams = streams::Streams::new(config.max_streams, config.max_streams_per_credential);
        AppState {
            rules: Context::new(store, config),
            stopping: Arc::new(watch::channel(false).0),
            address_limiter: Arc::new(governor::RateLimiter::keyed(addresses)),
            streams: Arc::new(streams),
            tail: Arc::new(tail::Tail::new()),
            background: Arc::new(tokio::sync::Mutex::new(())),
            tokens: Arc::new(crate::known_tokens::KnownTokens::new()),
        }
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
}
