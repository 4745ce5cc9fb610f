//! Standing rules from this device (issue 31 §2): listed live from the server, made and
//! revoked by signed commands (`add_rule`, `revoke_rule`). Unlike an answer to a decision, a
//! rule command is not queued in the outbox (which holds one task's commands): it is signed
//! once and sent at once, and when the server cannot be reached nothing is made — the person
//! signs it again when they are back online. The rule's id is chosen here, so the result names
//! it even when a resend of the same command is answered `duplicate`.

use chrono::Utc;
use serde_json::json;
use waymark_proto::*;

use crate::companion::{COMMAND_LIFETIME, Companion};
use crate::error::Error;

/// A rule to make: what the person was shown, signed as `args.rule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRule {
    /// The rule.
    pub spec: RuleSpec,
    /// The person confirmed a second time that it allows risky calls (`spec.allow_risky`):
    /// the command then repeats the rule's digest (`args.confirm_risky`).
    pub confirmed_risky: bool,
}

impl Companion {
    /// This user's rules, newest first (live from the server).
    pub async fn rules(&self) -> Result<RuleList, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        api.get(&token, "/v1/rules").await
    }

    /// Signs and sends `add_rule`; the new rule's id and the server's answer. A refusal
    /// (`rejected`) is the answer, not an error: its `detail` says what to change.
    pub async fn add_rule(&self, rule: &NewRule) -> Result<(String, CommandResult), Error> {
        let spec = serde_json::to_value(&rule.spec)
            .map_err(|e| Error::Invalid(format!("the rule: {e}")))?;
        let rule_id = ids::rule();
        let mut args = json!({"rule": spec, "rule_id": rule_id});
        if rule.spec.allow_risky {
            if !rule.confirmed_risky {
                return Err(Error::Invalid(
                    "a rule that allows risky calls must be confirmed a second time".into(),
                ));
            }
            if rule.spec.expires_at.is_none() {
                return Err(Error::Invalid(
                    "a rule that allows risky calls names its expiry".into(),
                ));
            }
            let digest = digest::json_digest(&args["rule"])
                .map_err(|e| Error::Invalid(format!("the rule: {e}")))?;
            args["confirm_risky"] = json!(digest);
        }
        let res = self.rule_command(Operation::AddRule, args).await?;
        Ok((rule_id, res))
    }

    /// Signs and sends `revoke_rule`.
    pub async fn revoke_rule(&self, rule_id: &str) -> Result<CommandResult, Error> {
        self.rule_command(Operation::RevokeRule, json!({"rule_id": rule_id}))
            .await
    }

    async fn rule_command(
        &self,
        op: Operation,
        args: serde_json::Value,
    ) -> Result<CommandResult, Error> {
        let (id, api) = self.require_identity().await?;
        let keystore = self.keystore()?;
        let now = Utc::now();
        let cmd = SteerCommand {
            command_id: ids::command(),
            task_id: None,
            expected_plan_revision: None,
            operation: op,
            scope: Vec::new(),
            args,
            issued_by: format!("user:{}", id.user),
            device_id: id.device_id.clone(),
            issued_at: now,
            expires_at: now + COMMAND_LIFETIME,
        };
        let env = self.sign(&keystore, &id, &cmd)?;
        let res = api.submit(&env).await.map_err(|e| match e {
            Error::Unreachable(why) => Error::Unreachable(format!(
                "{why}; no rule was changed — sign it again once the server can be reached"
            )),
            e => e,
        })?;
        Ok(match (&res.status, &res.original) {
            (CommandStatus::Duplicate, Some(o)) => o.as_ref().clone(),
            _ => res,
        })
    }
}
