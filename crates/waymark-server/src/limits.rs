//! The rate of the routes open to callers not yet known (pairing, opening a session, signed
//! commands), by client address: [`AddressLimited`] refuses before the body is read, so
//! nothing an outsider sends is looked up or written beyond that rate. (The caps on open
//! streams are `streams`.)

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;

use crate::error::HttpError;
use crate::state::AppState;

/// An extractor that charges the request to its client address's bucket (`429` beyond it).
/// A request with no peer address (a router driven in-process) is not charged.
pub(crate) struct AddressLimited;

impl FromRequestParts<AppState> for AddressLimited {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, st: &AppState) -> Result<Self, HttpError> {
        if let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
            st.rate_limit_address(peer.ip())?;
        }
        Ok(AddressLimited)
    }
}
