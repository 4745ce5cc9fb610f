//! Steering from this device: a command is signed once, when the person makes it, with exactly
//! the plan revision (and, for an approval, the intent digest) they were shown — never one read
//! from the mirror afterwards, which a background sync may have moved — then queued and
//! delivered until the server answers.

use chrono::Utc;
use serde::{Deserialize, Serialize};
use waymark_proto::*;

use crate::companion::{COMMAND_LIFETIME, Companion};
use crate::error::Error;
use crate::keystore::Keystore;
use crate::mirror::{OutboxEntry, OutboxStatus};
use crate::pairing::Identity;

/// A run to start on a machine: what the person signs (`start_run`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartRun {
    /// The machine's name (or id).
    pub machine: String,
    /// `claude-code`, …
    pub runtime: String,
    /// An absolute directory the machine allows.
    pub directory: String,
    /// The first prompt.
    pub prompt: String,
    /// The task's title (default: the prompt's first line).
    pub title: Option<String>,
    /// Tools whose calls need an approval (a regex of tool names).
    pub gate: Option<String>,
    /// Plan first: start in the runtime's plan mode (Claude Code, Codex).
    pub plan: bool,
}

/// What the person was shown when they decided. The command is signed with exactly this: if
/// the plan moved on since, the server answers `conflict` and the person decides again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// The task's plan revision on the screen they acted from.
    pub plan_revision: i64,
    /// For an approval: the intent digest on its card.
    pub intent_digest: Option<String>,
}

impl Seen {
    /// A steer command from a screen showing `plan_revision`.
    pub fn revision(plan_revision: i64) -> Seen {
        Seen {
            plan_revision,
            intent_digest: None,
        }
    }
}

impl Companion {
    pub(crate) fn sign(
        &self,
        keystore: &Keystore,
        id: &Identity,
        cmd: &SteerCommand,
    ) -> Result<SignedEnvelope, Error> {
        let key = keystore.load(&id.device_id)?;
        signing::sign(cmd, &key).map_err(|e| Error::Invalid(e.to_string()))
    }

    /// Delivers queued commands in the order they were made. Each is sent until the server
    /// answers; a crash between sending and recording resends it, and the server's ledger
    /// answers `duplicate` with the first result — applied once.
    pub async fn deliver_outbox(&self) -> Result<Vec<OutboxEntry>, Error> {
        let queued = self.mirror.queued().await?;
        if queued.is_empty() {
            return Ok(Vec::new());
        }
        let (_, api) = self.require_identity().await?;
        let mut done = Vec::new();
        for (command_id, env) in queued {
            let res = api.submit(&env).await?;
            let effective = match (&res.status, &res.original) {
                (CommandStatus::Duplicate, Some(o)) => o.as_ref().clone(),
                _ => res.clone(),
            };
            let status = match effective.status {
                CommandStatus::Applied | CommandStatus::Duplicate => OutboxStatus::Delivered,
                CommandStatus::Conflict => OutboxStatus::Conflict,
                CommandStatus::Rejected if effective.reason == Some(RejectReason::Expired) => {
                    OutboxStatus::Expired
                }
                CommandStatus::Rejected => OutboxStatus::Rejected,
            };
            self.mirror
                .record_result(&command_id, status, &effective)
                .await?;
            if let Some(e) = self
                .mirror
                .outbox(None)
                .await?
                .into_iter()
                .find(|e| e.command_id == command_id)
            {
                done.push(e);
            }
        }
        Ok(done)
    }

    /// Signs a command now, with the plan revision the person was shown (`seen`), queues it,
    /// and tries to deliver the queue. Offline, it stays queued (`Error::Unreachable` says so)
    /// and is delivered on the next sync; it is never re-signed against a newer revision.
    pub async fn command(
        &self,
        task_id: &str,
        op: Operation,
        args: serde_json::Value,
        scope: Vec<String>,
        seen: i64,
    ) -> Result<OutboxEntry, Error> {
        let (id, _) = self.require_identity().await?;
        let task = self.mirror.task(task_id).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "no task `{task_id}` in the mirror — run `waymark sync`"
            ))
        })?;
        if seen < 1 {
            return Err(Error::Invalid(format!(
                "plan revision {seen} was never shown: revisions start at 1"
            )));
        }
        let keystore = self.keystore()?;
        let now = Utc::now();
        let cmd = SteerCommand {
            command_id: ids::command(),
            task_id: Some(task.id.clone()),
            expected_plan_revision: Some(seen),
            operation: op,
            scope,
            args,
            issued_by: format!("user:{}", id.user),
            device_id: id.device_id.clone(),
            issued_at: now,
            expires_at: now + COMMAND_LIFETIME,
        };
        let env = self.sign(&keystore, &id, &cmd)?;
        self.mirror
            .enqueue(&task.id, op, Some(seen), &cmd.command_id, &env)
            .await?;
        let delivered = self.deliver_outbox().await;
        let entry = self
            .mirror
            .outbox(Some(&task.id))
            .await?
            .into_iter()
            .find(|e| e.command_id == cmd.command_id)
            .ok_or_else(|| Error::Mirror("the queued command vanished".into()))?;
        match delivered {
            Ok(_) => Ok(entry),
            Err(Error::Unreachable(why)) => Err(Error::Unreachable(format!(
                "{why}; the command is queued and will be delivered on the next sync"
            ))),
            Err(e) => Err(e),
        }
    }

    /// Starts a run on one of the user's machines: a signed `start_run` whose new task id is
    /// chosen here, so a resend (from the outbox, after a drop) is the same command, applied
    /// once. Queued offline like any command. Returns the new task's id and the outbox entry —
    /// still `queued` when the server could not be reached (it goes on the next sync).
    pub async fn start_run(&self, run: &StartRun) -> Result<(String, OutboxEntry), Error> {
        let (id, _) = self.require_identity().await?;
        let keystore = self.keystore()?;
        let now = Utc::now();
        let task_id = ids::task();
        let mut args = serde_json::json!({
            "machine": run.machine,
            "runtime": run.runtime,
            "directory": run.directory,
            "prompt": run.prompt,
        });
        if let Some(t) = &run.title {
            args["title"] = t.clone().into();
        }
        if let Some(g) = &run.gate {
            args["gate"] = g.clone().into();
        }
        if run.plan {
            args["plan"] = true.into();
        }
        let cmd = SteerCommand {
            command_id: ids::command(),
            task_id: Some(task_id.clone()),
            expected_plan_revision: None,
            operation: Operation::StartRun,
            scope: Vec::new(),
            args,
            issued_by: format!("user:{}", id.user),
            device_id: id.device_id.clone(),
            issued_at: now,
            expires_at: now + COMMAND_LIFETIME,
        };
        let env = self.sign(&keystore, &id, &cmd)?;
        self.mirror
            .enqueue(&task_id, Operation::StartRun, None, &cmd.command_id, &env)
            .await?;
        let delivered = self.deliver_outbox().await;
        let entry = self
            .mirror
            .outbox(Some(&task_id))
            .await?
            .into_iter()
            .find(|e| e.command_id == cmd.command_id)
            .ok_or_else(|| Error::Mirror("the queued command vanished".into()))?;
        match delivered {
            Ok(_) | Err(Error::Unreachable(_)) => Ok((task_id, entry)),
            Err(e) => Err(e),
        }
    }

    /// Answers a decision: approve/deny bind the intent digest the person was shown; other
    /// kinds choose an option or answer with text. All bind the plan revision shown.
    pub async fn answer(
        &self,
        decision_id: &str,
        op: Operation,
        option: Option<&str>,
        text: Option<&str>,
        seen: &Seen,
    ) -> Result<OutboxEntry, Error> {
        let d = self.mirror.decision(decision_id).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "no decision `{decision_id}` in the mirror — run `waymark sync`"
            ))
        })?;
        // A question in parts: `text` carries its answers as JSON (`{QID: {chosen, text}}`),
        // which is how the app's card sends them through this one command.
        if op == Operation::AnswerQuestion && d.form.is_some() {
            let answers = serde_json::from_str(text.unwrap_or_default()).map_err(|e| {
                Error::Invalid(format!(
                    "the answers to a question in parts are JSON `{{QID: {{chosen, text}}}}`: {e}"
                ))
            })?;
            return self.answer_form(decision_id, answers, seen).await;
        }
        let mut args = serde_json::json!({"decision_id": d.id});
        // A runtime's own choice on an approval (`approve_session`, `deny_always`) is an
        // approve or a deny carrying that option, so it stays bound to the intent digest.
        let op = match (op, option) {
            (Operation::ChooseOption, Some(o)) if d.kind == DecisionKind::Approval => {
                if waymark_proto::option_grants(o) == Some(false) {
                    Operation::Deny
                } else {
                    Operation::Approve
                }
            }
            _ => op,
        };
        let check_option = |o: &str| {
            if d.options.iter().any(|x| x.id == o) {
                return Ok(());
            }
            let ids: Vec<&str> = d.options.iter().map(|x| x.id.as_str()).collect();
            Err(Error::Invalid(format!(
                "`{o}` is not an option of `{}`: choose one of {}",
                d.id,
                ids.join(", ")
            )))
        };
        match op {
            Operation::Approve | Operation::Deny => {
                if d.kind != DecisionKind::Approval {
                    return Err(Error::Invalid(format!(
                        "`{}` is a {} decision: use `waymark choose` or `waymark answer`",
                        d.id, d.kind
                    )));
                }
                let Some(digest) = &seen.intent_digest else {
                    return Err(Error::Invalid(format!(
                        "`{}` is an approval: say which intent digest you were shown",
                        d.id
                    )));
                };
                args["intent_digest"] = serde_json::json!(digest);
                if let Some(o) = option {
                    check_option(o)?;
                    args["option"] = serde_json::json!(o);
                }
            }
            // Asking the runtime to wait for the answer: bound to the intent shown, and only
            // where the runtime can (`runtime_deadline.can_wait`).
            Operation::Defer => {
                if !d.runtime_deadline.as_ref().is_some_and(|r| r.can_wait) {
                    return Err(Error::Invalid(format!(
                        "`{}`'s runtime cannot wait for the answer across its exit: approve or deny it",
                        d.id
                    )));
                }
                let Some(digest) = &seen.intent_digest else {
                    return Err(Error::Invalid(format!(
                        "`{}` is an approval: say which intent digest you were shown",
                        d.id
                    )));
                };
                args["intent_digest"] = serde_json::json!(digest);
            }
            Operation::ChooseOption => {
                let o = option.ok_or_else(|| Error::Invalid("name an option".into()))?;
                check_option(o)?;
                args["option"] = serde_json::json!(o);
            }
            _ => {
                args["text"] = serde_json::json!(text.unwrap_or_default());
                if let Some(o) = option {
                    args["option"] = serde_json::json!(o);
                }
            }
        }
        if let Some(t) = text {
            args["text"] = serde_json::json!(t);
        }
        self.command(&d.task_id, op, args, vec![], seen.plan_revision)
            .await
    }

    /// Answers a question in parts (`Decision::form`): checked against the form as mirrored —
    /// what the person was shown — and bound to its digest, so a form changed since is refused.
    pub async fn answer_form(
        &self,
        decision_id: &str,
        answers: std::collections::BTreeMap<String, waymark_proto::FormAnswer>,
        seen: &Seen,
    ) -> Result<OutboxEntry, Error> {
        let d = self.mirror.decision(decision_id).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "no decision `{decision_id}` in the mirror — run `waymark sync`"
            ))
        })?;
        let (Some(form), Some(digest)) = (&d.form, &d.intent_digest) else {
            return Err(Error::Invalid(format!(
                "`{}` is not a question in parts: answer it with words or an option",
                d.id
            )));
        };
        form.check_answers(&answers).map_err(Error::Invalid)?;
        let args = serde_json::json!({
            "decision_id": d.id,
            "intent_digest": digest,
            "answers": answers,
        });
        self.command(
            &d.task_id,
            Operation::AnswerQuestion,
            args,
            vec![],
            seen.plan_revision,
        )
        .await
    }

    /// Approves an approval with its editable part (`Decision::editable`) changed to `part`:
    /// the command carries the edited intent and its digest beside the digest of the intent
    /// the person was shown, so the server runs only what they read and changed.
    pub async fn approve_edited(
        &self,
        decision_id: &str,
        part: serde_json::Value,
        text: Option<&str>,
        seen: &Seen,
    ) -> Result<OutboxEntry, Error> {
        let d = self.mirror.decision(decision_id).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "no decision `{decision_id}` in the mirror — run `waymark sync`"
            ))
        })?;
        let edited = edited_intent(&d, part)?;
        let digest = waymark_proto::digest::json_digest(&edited)
            .map_err(|e| Error::Invalid(format!("the edited intent: {e}")))?;
        let Some(shown) = &seen.intent_digest else {
            return Err(Error::Invalid(format!(
                "`{}` is an approval: say which intent digest you were shown",
                d.id
            )));
        };
        let mut args = serde_json::json!({
            "decision_id": d.id,
            "intent_digest": shown,
            "edited_intent": edited,
            "edited_intent_digest": digest,
        });
        if let Some(t) = text {
            args["text"] = serde_json::json!(t);
        }
        self.command(
            &d.task_id,
            Operation::Approve,
            args,
            vec![],
            seen.plan_revision,
        )
        .await
    }
}

/// `d`'s intent with its editable part replaced by `part`; refused where the runtime takes no
/// changed intent, or where the part would change its JSON type.
pub fn edited_intent(d: &Decision, part: serde_json::Value) -> Result<serde_json::Value, Error> {
    let (Some(pointer), Some(intent)) = (d.editable.as_deref(), d.intent.as_ref()) else {
        return Err(Error::Invalid(format!(
            "`{}` cannot be edited: its runtime runs the intent only as asked",
            d.id
        )));
    };
    let mut edited = intent.clone();
    let slot = edited
        .pointer_mut(pointer)
        .ok_or_else(|| Error::Invalid(format!("`{}` has nothing at `{pointer}` to edit", d.id)))?;
    if std::mem::discriminant(slot) != std::mem::discriminant(&part) {
        return Err(Error::Invalid(format!(
            "the edit of `{pointer}` must keep its JSON type (it is {})",
            match slot {
                serde_json::Value::Object(_) => "an object",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Number(_) => "a number",
                serde_json::Value::Bool(_) => "a boolean",
                serde_json::Value::Null => "null",
            }
        )));
    }
    *slot = part;
    Ok(edited)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(editable: Option<&str>) -> Decision {
        serde_json::from_value(json!({
            "id": "dec_1", "task_id": "task_1", "kind": "approval", "status": "pending",
            "step": null, "question": "q", "options": [], "default_option": "deny",
            "intent": {"tool": "Bash", "input": {"command": "rm -rf node_modules"}},
            "intent_digest": null, "effect_id": null, "plan_revision": 1, "risky": false,
            "expires_at": "2026-12-02T00:00:00Z", "created_at": "2026-12-02T00:00:00Z",
            "outcome": null, "editable": editable,
        }))
        .unwrap()
    }

    #[test]
    fn an_edit_replaces_the_editable_part_and_has_the_digest_the_web_companion_computes() {
        let edited = edited_intent(
            &asked(Some("/input")),
            json!({"command": "rm -ri node_modules"}),
        )
        .unwrap();
        assert_eq!(
            edited,
            json!({"tool": "Bash", "input": {"command": "rm -ri node_modules"}})
        );
        // The same value and digest `ui/src/web/sign.test.ts` asserts.
        assert_eq!(
            waymark_proto::digest::json_digest(&edited).unwrap(),
            "sha256:08d4c0d1f5d6421984ae74107d184cef9dd474add66b0b0000d79ef78e1028c1"
        );
    }

    #[test]
    fn an_edit_is_refused_where_the_runtime_takes_none_or_the_type_would_change() {
        let e = edited_intent(&asked(None), json!({})).unwrap_err();
        assert!(e.to_string().contains("only as asked"), "{e}");
        let e = edited_intent(&asked(Some("/input")), json!("rm -ri x")).unwrap_err();
        assert!(e.to_string().contains("an object"), "{e}");
        let e = edited_intent(&asked(Some("/nothing")), json!({})).unwrap_err();
        assert!(e.to_string().contains("nothing at `/nothing`"), "{e}");
    }
}
