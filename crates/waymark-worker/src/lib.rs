//! The worker SDK: what an agent uses to run under a Waymark control plane. It keeps the lease
//! alive, writes the checkpoint chain, runs external effects so that a crash never makes a
//! worker guess (declare, mark in progress, record the receipt; after a crash, query the
//! provider before retrying), and waits for people's decisions. Also here: the reference
//! write gateway ([`deploy_service`]) and the demo agent ([`demo`]) built on the SDK.

mod client;
pub mod demo;
pub mod deploy_service;
mod effect;
mod error;
mod run;

pub use client::Client;
pub use effect::{
    EffectCall, EffectCtx, EffectDone, ProviderError, ProviderStatus, Reconciler, Resolution,
};
pub use error::{Error, Result};
pub use run::{ApprovalOptions, AttemptOptions, ControlState, Run, chosen_option};
pub use tokio_util::sync::CancellationToken;
