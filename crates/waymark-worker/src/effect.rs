//! Effects: changes in the outside world, recorded so that a crash never makes a worker guess.
//! The intent is declared, marked `in_progress` before the provider is called, and closed with
//! the provider's receipt; after a crash the next attempt asks the provider (a [`Reconciler`])
//! before it retries, and leaves the effect `unknown` when nobody can say.

use std::future::Future;
use std::time::Duration;

use serde_json::{Value, json};
use waymark_proto::{DeclareEffect, Effect, EffectDeclared, EffectStatus, UpdateEffect};

use crate::client::{Payload, Resend};
use crate::error::{Error, Result};
use crate::run::Run;

/// What the call to the provider passes downstream, so the provider can dedup and fence.
#[derive(Debug, Clone, PartialEq)]
pub struct EffectCtx {
    /// Unique per task; the provider dedups on it.
    pub idempotency_key: String,
    /// The attempt's fence; a write gateway refuses one older than it has seen.
    pub fence: i64,
    /// The writing attempt.
    pub attempt_id: String,
    /// The task.
    pub task_id: String,
    /// The effect (`eff_…`).
    pub effect_id: String,
}

/// What the provider says about an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderStatus {
    /// It never saw the key: safe to run.
    NotStarted,
    /// It did it; this is its receipt.
    Confirmed(Value),
    /// It is still doing it.
    InProgress,
    /// It tried and failed.
    Failed {
        /// Whether something was left behind that needs compensating.
        compensable: bool,
        /// Its reason.
        reason: String,
    },
    /// It cannot say (or the question itself failed).
    Unknown {
        /// Why not.
        reason: String,
    },
}

/// How a provider call ended when it did not succeed.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// The provider refused or failed; nothing is left to wait for.
    Failed {
        /// Whether something was left behind that needs compensating.
        compensable: bool,
        /// Its reason.
        reason: String,
    },
    /// Whether the provider acted cannot be known (e.g. the connection broke mid-call).
    Unknown {
        /// Why not.
        reason: String,
    },
}

/// Asks a provider what became of an idempotency key. One per provider, written by the
/// agent author; it never performs the effect itself.
pub trait Reconciler: Send + Sync {
    /// What the provider knows of `ctx.idempotency_key`. A failing query answers
    /// [`ProviderStatus::Unknown`].
    fn query(&self, ctx: &EffectCtx) -> impl Future<Output = ProviderStatus> + Send;
}

/// How an effect came to be confirmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// This call ran it.
    Ran,
    /// It was already recorded `confirmed`; nothing ran.
    AlreadyConfirmed,
    /// The provider said it was done; recorded `confirmed` without running it again.
    Reconciled,
}

/// A confirmed effect.
#[derive(Debug, Clone)]
pub struct EffectDone {
    /// The effect as recorded.
    pub effect: Effect,
    /// The provider's receipt.
    pub receipt: Value,
    /// How it was reached.
    pub resolution: Resolution,
}

/// An effect about to be run; see [`Run::effect`].
#[derive(Debug)]
pub struct EffectCall<'r> {
    run: &'r Run,
    idempotency_key: String,
    kind: String,
    intent: Value,
    step: Option<String>,
    resource_id: Option<String>,
    poll_every: Duration,
    poll_bound: Duration,
}

impl Run {
    /// Prepares an effect: `kind` (e.g. `deploy`) with its full `intent` (target, parameters,
    /// digests; no secrets) under `idempotency_key`, which must stay the same across attempts
    /// for the same change. Finish with [`EffectCall::run`].
    pub fn effect(
        &self,
        idempotency_key: impl Into<String>,
        kind: impl Into<String>,
        intent: Value,
    ) -> EffectCall<'_> {
        EffectCall {
            run: self,
            idempotency_key: idempotency_key.into(),
            kind: kind.into(),
            intent,
            step: None,
            resource_id: None,
            poll_every: Duration::from_secs(1),
            poll_bound: Duration::from_secs(30),
        }
    }
}

impl EffectCall<'_> {
    /// The plan step it belongs to.
    pub fn step(mut self, step: impl Into<String>) -> Self {
        self.step = Some(step.into());
        self
    }

    /// The provider's resource, when known up front.
    pub fn resource_id(mut self, id: impl Into<String>) -> Self {
        self.resource_id = Some(id.into());
        self
    }

    /// How often, and how long, to poll a provider that says the effect is still in progress
    /// before recording it `unknown` (default every 1 s for 30 s).
    pub fn poll(mut self, every: Duration, bound: Duration) -> Self {
        self.poll_every = every;
        self.poll_bound = bound;
        self
    }

    /// Declares the effect and brings it to a recorded end:
    ///
    /// * new or `intended`: marks it `in_progress`, calls `call` with the [`EffectCtx`] and
    ///   records the receipt (`confirmed`), the failure (`failed` / `failed_compensable`) or
    ///   `unknown`;
    /// * already `confirmed`: returns the receipt without calling;
    /// * `in_progress` or `unknown` (an earlier attempt was interrupted): asks `reconciler`
    ///   first, and calls only when the provider never saw the key.
    pub async fn run<R, F, Fut>(self, reconciler: &R, call: F) -> Result<EffectDone>
    where
        R: Reconciler + ?Sized,
        F: FnOnce(EffectCtx) -> Fut,
        Fut: Future<Output = Result<Value, ProviderError>>,
    {
        let run = self.run;
        let declared: EffectDeclared = run
            .post(
                &format!("/v1/tasks/{}/effects", run.task_id()),
                &DeclareEffect {
                    attempt_id: run.attempt().id.clone(),
                    fence: run.fence(),
                    idempotency_key: self.idempotency_key.clone(),
                    kind: self.kind.clone(),
                    step: self.step.clone(),
                    resource_id: self.resource_id.clone(),
                    intent: self.intent.clone(),
                },
                Resend::Always,
            )
            .await?;
        let effect = declared.effect;
        let ctx = EffectCtx {
            idempotency_key: effect.idempotency_key.clone(),
            fence: run.fence(),
            attempt_id: run.attempt().id.clone(),
            task_id: run.task_id().to_owned(),
            effect_id: effect.id.clone(),
        };
        match effect.status {
            EffectStatus::Confirmed => Ok(EffectDone {
                receipt: effect.receipt.clone().unwrap_or(Value::Null),
                effect,
                resolution: Resolution::AlreadyConfirmed,
            }),
            EffectStatus::Failed | EffectStatus::FailedCompensable | EffectStatus::Compensated => {
                Err(Error::EffectFailed {
                    compensable: effect.status == EffectStatus::FailedCompensable,
                    reason: format!(
                        "it was already recorded {}; declare a new key for a new try",
                        effect.status
                    ),
                    effect_id: effect.id,
                    idempotency_key: effect.idempotency_key,
                })
            }
            EffectStatus::Intended => self.execute(&ctx, call).await,
            EffectStatus::InProgress | EffectStatus::Unknown => {
                self.reconcile(effect, &ctx, reconciler, call).await
            }
        }
    }

    async fn reconcile<R, F, Fut>(
        &self,
        effect: Effect,
        ctx: &EffectCtx,
        reconciler: &R,
        call: F,
    ) -> Result<EffectDone>
    where
        R: Reconciler + ?Sized,
        F: FnOnce(EffectCtx) -> Fut,
        Fut: Future<Output = Result<Value, ProviderError>>,
    {
        let deadline = tokio::time::Instant::now() + self.poll_bound;
        let mut status = effect.status;
        let cancel = self.run.cancelled();
        loop {
            let answer = tokio::select! {
                _ = cancel.cancelled() => return Err(self.run.shared.check_live().err().unwrap_or(Error::Cancelled)),
                a = reconciler.query(ctx) => a,
            };
            tracing::info!(key = %ctx.idempotency_key, ?answer, "reconciled with the provider");
            match answer {
                ProviderStatus::NotStarted => return self.execute(ctx, call).await,
                ProviderStatus::Confirmed(receipt) => {
                    let effect = self
                        .update(ctx, EffectStatus::Confirmed, Some(receipt.clone()))
                        .await?;
                    return Ok(EffectDone {
                        effect,
                        receipt,
                        resolution: Resolution::Reconciled,
                    });
                }
                ProviderStatus::Failed {
                    compensable,
                    reason,
                } => return Err(self.failed(ctx, compensable, reason).await),
                ProviderStatus::InProgress if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(self.poll_every).await;
                }
                ProviderStatus::InProgress => {
                    let reason = format!(
                        "the provider still reports it in progress after {:?}",
                        self.poll_bound
                    );
                    return Err(self.unknown(ctx, status, reason).await);
                }
                ProviderStatus::Unknown { reason } => {
                    return Err(self.unknown(ctx, status, reason).await);
                }
            }
            status = EffectStatus::InProgress;
        }
    }

    async fn execute<F, Fut>(&self, ctx: &EffectCtx, call: F) -> Result<EffectDone>
    where
        F: FnOnce(EffectCtx) -> Fut,
        Fut: Future<Output = Result<Value, ProviderError>>,
    {
        // Recorded before the provider is called: a crash from here on is reconciled.
        self.update(ctx, EffectStatus::InProgress, None).await?;
        match call(ctx.clone()).await {
            Ok(receipt) => {
                let effect = self
                    .update(ctx, EffectStatus::Confirmed, Some(receipt.clone()))
                    .await?;
                Ok(EffectDone {
                    effect,
                    receipt,
                    resolution: Resolution::Ran,
                })
            }
            Err(ProviderError::Failed {
                compensable,
                reason,
            }) => Err(self.failed(ctx, compensable, reason).await),
            Err(ProviderError::Unknown { reason }) => {
                Err(self.unknown(ctx, EffectStatus::InProgress, reason).await)
            }
        }
    }

    async fn update(
        &self,
        ctx: &EffectCtx,
        status: EffectStatus,
        receipt: Option<Value>,
    ) -> Result<Effect> {
        let req = UpdateEffect {
            attempt_id: ctx.attempt_id.clone(),
            fence: ctx.fence,
            status,
            receipt,
            resource_id: None,
        };
        let payload = Payload::json(&req)?;
        self.run
            .fenced(self.run.client().call(
                reqwest::Method::PATCH,
                &format!("/v1/effects/{}", ctx.effect_id),
                &[],
                payload,
                Resend::Always,
                None,
            ))
            .await
    }

    /// Records a failure; returns the error to hand the caller (the recording's own error
    /// when it could not be recorded).
    async fn failed(&self, ctx: &EffectCtx, compensable: bool, reason: String) -> Error {
        let status = if compensable {
            EffectStatus::FailedCompensable
        } else {
            EffectStatus::Failed
        };
        match self
            .update(ctx, status, Some(json!({ "error": reason })))
            .await
        {
            Ok(_) => Error::EffectFailed {
                effect_id: ctx.effect_id.clone(),
                idempotency_key: ctx.idempotency_key.clone(),
                compensable,
                reason,
            },
            Err(e) => e,
        }
    }

    /// Records `unknown` (unless it already is) and returns [`Error::EffectUnknown`].
    async fn unknown(&self, ctx: &EffectCtx, current: EffectStatus, reason: String) -> Error {
        if current != EffectStatus::Unknown
            && let Err(e) = self.update(ctx, EffectStatus::Unknown, None).await
        {
            return e;
        }
        Error::EffectUnknown {
            effect_id: ctx.effect_id.clone(),
            idempotency_key: ctx.idempotency_key.clone(),
            reason,
        }
    }
}
