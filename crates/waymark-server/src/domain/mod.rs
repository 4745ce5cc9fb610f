//! The control plane's rules, as plain functions over a store transaction and the server's
//! state — no HTTP in them. The axum handlers parse, authorise, call one of these and answer;
//! the Claude Code hook and the background work call the same functions. Grouped by what they
//! decide; `core` is what every group uses. No module here imports another in a circle.

pub(crate) mod budget;
pub(crate) mod caller;
pub(crate) mod checkpoints;
pub(crate) mod commands;
pub(crate) mod controls;
pub(crate) mod core;
pub(crate) mod decisions;
pub(crate) mod delegations;
pub(crate) mod deliveries;
pub(crate) mod devices;
pub(crate) mod effects;
pub(crate) mod error;
pub(crate) mod escalation;
pub(crate) mod evidence;
pub(crate) mod fences;
#[cfg(test)]
pub(crate) mod fixtures;
pub(crate) mod followups;
pub(crate) mod leases;
pub(crate) mod machines;
pub(crate) mod push;
pub(crate) mod reads;
pub(crate) mod recovery;
pub(crate) mod retention;
pub(crate) mod rules;
pub(crate) mod tasks;
