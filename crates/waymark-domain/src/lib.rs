//! The control plane's rules, as plain functions over a store transaction and their
//! [`Context`] (store, configuration, clock, metrics, hand-offs) — a crate of its own so the
//! compiler keeps HTTP out of them: its `Cargo.toml` names no web framework. The server's axum
//! handlers parse, authorise, call one of these and answer; the Claude Code hook and the
//! background work call the same functions. Grouped by what they decide; `core` is what every
//! group uses. No module here imports another in a circle.

mod config;
pub mod context;

pub use config::{Config, TlsFiles};
pub use context::Context;

pub mod claude_code;
pub mod clock;
pub mod convert;
pub mod handoff;
pub mod junit;
pub mod locks;
pub mod metrics;
pub mod outbound;
pub mod redact;
pub mod risk;
pub mod schedule;
pub mod text;
pub mod zone;

pub mod budget;
pub mod caller;
pub mod checkpoints;
pub mod commands;
pub mod controls;
pub mod core;
pub mod decisions;
pub mod delegations;
pub mod deliveries;
pub mod devices;
pub mod effects;
pub mod error;
pub mod escalation;
pub mod evidence;
pub mod fences;
#[cfg(test)]
pub mod fixtures;
pub mod followups;
pub mod leases;
pub mod machines;
pub mod push;
pub mod reads;
pub mod recovery;
pub mod retention;
pub mod rules;
pub mod tasks;
