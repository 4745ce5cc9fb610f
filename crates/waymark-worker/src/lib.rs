//! The worker SDK: what an agent uses to run under a Waymark control plane. It keeps the lease
//! alive, writes the checkpoint chain, runs external effects so that a crash never makes a
//! worker guess (declare, mark in progress, record the receipt; after a crash, query the
//! provider before retrying), waits for people's decisions, reports spend and follows the
//! budget choice it opens, and bounds retries of failing steps (past the bound: a person
//! decides, or the task is delivered partially with what was and was not verified). Also
//! here: the reference write gateway ([`deploy_service`]) and the demo agent ([`demo`]) built
//! on the SDK.

mod client;
pub mod demo;
pub mod deploy_service;
mod effect;
mod error;
mod retry;
mod run;
pub mod tree;

pub use client::{Client, ClientBuilder};
pub use effect::{
    EffectCall, EffectCtx, EffectDone, ProviderError, ProviderStatus, Reconciler, Resolution,
};
pub use error::{Error, Result};
pub use retry::{DELIVER_PARTIAL, Exhausted, PartialDelivery, RETRY_AGAIN, Retried};
pub use run::{ApprovalOptions, AttemptOptions, ControlState, Run, approved_intent, chosen_option};
pub use tokio_util::sync::CancellationToken;
pub use waymark_tls_pin::SERVER_FP_ENV;
