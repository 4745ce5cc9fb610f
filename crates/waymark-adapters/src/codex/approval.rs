//! Codex's approval requests (`item/commandExecution/requestApproval`,
//! `item/fileChange/requestApproval`) as connection-bound approvals: each one is held open
//! while a person decides, answered in Codex's words, and counted only once Codex says it took
//! the answer (`serverRequest/resolved`).

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use waymark_proto::{
    ApprovalDurability, Decision, DecisionKind, DecisionStatus, DeliveryState, ErrorCode,
};
use waymark_worker::{Run, chosen_option};

use crate::bridge::{self, Choice};
use crate::jsonrpc::{Peer, RequestId};

/// The command-execution approval request.
pub(super) const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
/// The file-change approval request.
pub(super) const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";

/// The end of one app-server connection, with why it ended.
#[derive(Debug, Clone, Default)]
pub(super) struct Closed {
    token: CancellationToken,
    reason: Arc<OnceLock<String>>,
}

impl Closed {
    /// Ends it (the first reason given stays).
    pub(super) fn close(&self, reason: &str) {
        let _ = self.reason.set(reason.to_owned());
        self.token.cancel();
    }

    pub(super) fn is_closed(&self) -> bool {
        self.token.is_cancelled()
    }

    pub(super) async fn wait(&self) {
        self.token.cancelled().await;
    }

    pub(super) fn reason(&self) -> String {
        self.reason
            .get()
            .cloned()
            .unwrap_or_else(|| "the Codex app-server connection closed".into())
    }
}

/// The decision the adapter sent Codex for one approval request, once it went out (set just
/// before it is written, so a crash while writing counts as sent).
#[derive(Debug, Clone, Default)]
pub(super) struct Sent(Arc<OnceLock<Value>>);

impl Sent {
    fn set(&self, decision: &Value) {
        let _ = self.0.set(decision.clone());
    }

    /// Whether what went out (if anything) lets the item run: an accept of any kind. Nothing
    /// sent, `decline` and `cancel` do not.
    fn lets_it_run(&self) -> bool {
        self.0
            .get()
            .is_some_and(|d| !matches!(decision_name(d), Some("decline" | "cancel")))
    }
}

/// An approval request Codex made for an item, kept until the item ends: whether the item can
/// have run when its turn or its connection ends without Codex saying.
#[derive(Debug, Clone)]
pub(super) struct Asked {
    pub(super) sent: Sent,
    /// `serverRequest/resolved` came for it.
    pub(super) resolved: CancellationToken,
}

impl Asked {
    /// Whether the item certainly did not run, its request still unanswered (or refused)
    /// when the turn or the connection ended: Codex runs a command or applies a change only
    /// on an accept, and none went out from here nor, as far as Codex said, from anywhere
    /// else (a request Codex resolved before any answer from here may have been accepted in
    /// another client).
    pub(super) fn certainly_not_run(&self) -> bool {
        match self.sent.0.get() {
            Some(_) => !self.sent.lets_it_run(),
            None => !self.resolved.is_cancelled(),
        }
    }
}

/// What the adapter's loop keeps of an approval in flight, to wake it.
#[derive(Debug)]
pub(super) struct Handle {
    /// `threadId:turnId:itemId` of the item it guards.
    pub(super) item_key: String,
    /// Fired by `serverRequest/resolved` for its request id.
    pub(super) resolved: CancellationToken,
    /// Fired by `item/completed` of its item.
    pub(super) item_done: CancellationToken,
    /// Closed, with why, when the adapter itself ends the turn under it (a pause).
    pub(super) withdrawn: Closed,
}

/// A decision as `availableDecisions` lists it: a bare name (`"accept"`), or an object whose
/// one key is the name and whose value its parameters
/// (`{"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch", "f"]}}`).
fn decision_name(d: &Value) -> Option<&str> {
    match d {
        Value::String(s) => Some(s),
        Value::Object(m) if m.len() == 1 => m.keys().next().map(String::as_str),
        _ => None,
    }
}

/// The execpolicy amendment decision: accept, and let Codex allow commands with this prefix
/// from now on (it writes a `prefix_rule` to `$CODEX_HOME/rules/default.rules`).
const ACCEPT_WITH_RULE: &str = "acceptWithExecpolicyAmendment";

/// The choices offered for one request and the Codex decision each one sends.
#[derive(Debug, Clone)]
pub(super) struct Offer {
    pub(super) choices: Vec<(Choice, Value)>,
}

impl Offer {
    /// What to offer for `method`, from `availableDecisions` (all of Codex's plain decisions
    /// when it lists none). `approve` is always offered (the control plane requires it): it
    /// sends `accept`, or `acceptForSession` when only that is listed. Both denials are always
    /// offered, listed or not: `deny` sends `decline` (the command or change does not happen
    /// and the turn goes on) and `deny_cancel` sends `cancel` (the turn is interrupted).
    /// Codex 0.169 lists `["accept", {"acceptWithExecpolicyAmendment": …}, "cancel"]` for a
    /// command and takes `decline` all the same (the item ends `declined`, the turn goes on).
    pub(super) fn new(method: &str, available: Option<&Value>) -> Offer {
        let listed: Option<&Vec<Value>> = available.and_then(Value::as_array);
        let find = |name: &str| -> Option<Value> {
            match listed {
                None => Some(Value::String(name.to_owned())),
                Some(l) => l.iter().find(|d| decision_name(d) == Some(name)).cloned(),
            }
        };
        let file = method == FILE_CHANGE_APPROVAL;
        let session = find("acceptForSession");
        let approve = match (find("accept"), &session) {
            (Some(a), _) => a,
            (None, Some(s)) => s.clone(),
            (None, None) => json!("accept"),
        };
        let mut choices = vec![(describe("approve", &approve, file), approve.clone())];
        if let Some(s) = session.filter(|s| *s != approve) {
            choices.push((describe("approve_session", &s, file), s));
        }
        // Only as Codex listed it: the amendment names the prefix it would allow.
        if let Some(rule) = listed.and_then(|l| {
            l.iter()
                .find(|d| d.is_object() && decision_name(d) == Some(ACCEPT_WITH_RULE))
        }) {
            choices.push((describe("approve_rule", rule, file), rule.clone()));
        }
        for (option, sends) in [("deny", "decline"), ("deny_cancel", "cancel")] {
            let sends = json!(sends);
            choices.push((describe(option, &sends, file), sends));
        }
        Offer { choices }
    }

    /// The Codex decision for the option a person chose; none (expired to nothing, void)
    /// sends `decline`.
    pub(super) fn decision(&self, option: Option<&str>) -> Value {
        option
            .and_then(|id| self.choices.iter().find(|(c, _)| c.id == id))
            .map(|(_, d)| d.clone())
            .unwrap_or_else(|| json!("decline"))
    }
}

/// Label and cost of one option, in Codex's terms and saying what happens to the turn.
fn describe(option: &str, sends: &Value, file: bool) -> Choice {
    let what = if file { "the change" } else { "the command" };
    let name = decision_name(sends).unwrap_or("accept");
    let prefix = sends
        .get(ACCEPT_WITH_RULE)
        .and_then(|a| a.get("execpolicy_amendment"))
        .and_then(Value::as_array)
        .map(|words| {
            words
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let label = match name {
        "accept" => "Approve".to_owned(),
        "acceptForSession" => "Approve for this session".to_owned(),
        ACCEPT_WITH_RULE => format!("Approve and always allow `{prefix}`"),
        "decline" => "Deny, let the turn go on".to_owned(),
        _ => "Deny and stop the turn".to_owned(),
    };
    let gives_up = match name {
        "accept" if file => {
            "the change is applied as Codex proposed it; this answer cannot edit it".to_owned()
        }
        "accept" => "the command runs as Codex proposed it; this answer cannot edit it".to_owned(),
        "acceptForSession" if file => {
            "Codex will not ask again before changing these files for the rest of its session"
                .to_owned()
        }
        "acceptForSession" => {
            "Codex will not ask again for this command for the rest of its session".to_owned()
        }
        ACCEPT_WITH_RULE => format!(
            "the command runs, and Codex adds a rule to its home so that it never asks again \
             for commands starting with `{prefix}` (in any thread, until the rule is removed)"
        ),
        "decline" => format!(
            "{what} does not happen; Codex is told it was refused and continues the turn without it"
        ),
        _ => format!("{what} does not happen and Codex interrupts the whole turn"),
    };
    Choice {
        id: option.to_owned(),
        label,
        gives_up,
    }
}

/// One line for the inbox.
pub(super) fn summary(method: &str, params: &Value, item: Option<&Value>) -> String {
    let reason = params
        .get("reason")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty());
    let mut text = if method == FILE_CHANGE_APPROVAL {
        let paths: Vec<&str> = item
            .and_then(|i| i.get("changes"))
            .and_then(Value::as_array)
            .map(|c| {
                c.iter()
                    .filter_map(|x| x.get("path").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default();
        match paths.len() {
            0 => "Codex wants to change files".to_owned(),
            n => format!(
                "Codex wants to change {n} file{}: {}",
                if n == 1 { "" } else { "s" },
                paths.join(", ")
            ),
        }
    } else if let Some(host) = params
        .get("networkApprovalContext")
        .and_then(|n| n.get("host"))
        .and_then(Value::as_str)
    {
        format!("Codex wants network access to {host}")
    } else {
        let command = params
            .get("command")
            .and_then(Value::as_str)
            .or_else(|| item.and_then(|i| i.get("command")).and_then(Value::as_str))
            .unwrap_or("a command");
        match params.get("cwd").and_then(Value::as_str) {
            Some(cwd) => format!("Codex wants to run `{command}` in {cwd}"),
            None => format!("Codex wants to run `{command}`"),
        }
    };
    if let Some(r) = reason {
        text.push_str(" — ");
        text.push_str(r);
    }
    super::clip(&text, 1900)
}

/// An approval request to carry through.
pub(super) struct Job {
    pub(super) run: Arc<Run>,
    pub(super) peer: Peer,
    pub(super) request_id: RequestId,
    pub(super) method: String,
    pub(super) params: Value,
    /// The item as `item/started` showed it, when it did.
    pub(super) item: Option<Value>,
    pub(super) closed: Closed,
    pub(super) resolved: CancellationToken,
    pub(super) item_done: CancellationToken,
    pub(super) withdrawn: Closed,
    pub(super) sent: Sent,
    /// The item's effect, once declared (the approval is tied to it).
    pub(super) effect: Option<watch::Receiver<Option<String>>>,
    /// A runner's run: a request an earlier connection asked and a person may have answered
    /// since is answered from that decision (see [`earlier_decision`]).
    pub(super) adopt: bool,
}

/// How long an approval waits for its item's effect to be declared, to be tied to it.
const EFFECT_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The decision an earlier connection of this run opened for the same command in the same
/// directory, still the person's to answer or answered and not yet delivered: Codex holds an
/// approval only while its connection lives, so a run revived after its adapter died asks
/// again — and the card the person already has (perhaps answered from the phone meanwhile)
/// answers it, instead of a second card. Command approvals only: a file change is asked anew.
async fn earlier_decision(job: &Job) -> Option<Decision> {
    if job.method != COMMAND_APPROVAL {
        return None;
    }
    let detail = job.run.client().task(job.run.task_id()).await.ok()?;
    let started = job.run.attempt().started_at;
    let (command, cwd) = (job.params.get("command"), job.params.get("cwd"));
    command?;
    detail.decisions.into_iter().rev().find(|d| {
        let intent = d.intent.as_ref();
        d.kind == DecisionKind::Approval
            && d.durability == Some(ApprovalDurability::ConnectionBound)
            && d.created_at < started
            && (d.status == DecisionStatus::Pending
                || (d.status == DecisionStatus::Resolved
                    && d.delivery
                        .as_ref()
                        .is_some_and(|x| x.state == DeliveryState::Pending)))
            && intent.is_some_and(|i| {
                i["method"] == COMMAND_APPROVAL
                    && i["params"].get("command") == command
                    && i["params"].get("cwd") == cwd
            })
    })
}

/// After a turn of a runner's run: what an earlier connection asked and Codex did not ask for
/// again is expired (never approved) — nobody is left to take its answer.
pub(super) async fn expire_unasked(run: &Run) {
    let Ok(detail) = run.client().task(run.task_id()).await else {
        return;
    };
    let started = run.attempt().started_at;
    for d in detail.decisions.iter().filter(|d| {
        d.kind == DecisionKind::Approval
            && d.status == DecisionStatus::Pending
            && d.durability == Some(ApprovalDurability::ConnectionBound)
            && d.created_at < started
    }) {
        match run.expire_decision(&d.id, UNASKED).await {
            Ok(_) => {
                tracing::info!(decision = %d.id, "expired an approval Codex did not ask for again")
            }
            Err(e) => tracing::debug!(decision = %d.id, error = %e, "not expired"),
        }
    }
}

/// Why an approval an earlier connection held expires once a turn ends without it.
const UNASKED: &str =
    "the connection that asked is gone, and the revived run did not ask for this call again";

/// Opens the approval, waits for a person (or the end of the connection, or Codex resolving
/// it elsewhere), answers Codex, and reports whether Codex took the answer.
pub(super) async fn carry(job: Job) {
    let offer = Offer::new(&job.method, job.params.get("availableDecisions"));
    let choices: Vec<Choice> = offer.choices.iter().map(|(c, _)| c.clone()).collect();
    let mut intent = json!({"method": job.method, "params": job.params});
    if let Some(item) = &job.item {
        intent["item"] = item.clone();
    }
    let summary = summary(&job.method, &job.params, job.item.as_ref());
    let earlier = if job.adopt {
        earlier_decision(&job).await
    } else {
        None
    };
    let opened = match earlier {
        Some(d) => {
            tracing::info!(decision = %d.id, request = %job.request_id, "Codex asks again for a call an earlier connection asked: answered from the same decision");
            Ok(d)
        }
        None => {
            let effect_id = match job.effect.clone() {
                Some(mut rx) => tokio::time::timeout(EFFECT_WAIT, rx.wait_for(Option::is_some))
                    .await
                    .ok()
                    .and_then(|r| r.ok().and_then(|v| (*v).clone())),
                None => None,
            };
            let options = waymark_worker::ApprovalOptions {
                effect_id,
                // Codex keeps it open as long as the connection lives: no deadline of its own.
                ..bridge::approval_options(
                    ApprovalDurability::ConnectionBound,
                    &choices,
                    None,
                    None,
                )
            };
            job.run.open_approval(intent, &summary, options).await
        }
    };
    let decision = match opened {
        Ok(d) => d,
        Err(e) => {
            // Nobody can be asked: refuse rather than let Codex run unseen.
            tracing::warn!(error = %e, request = %job.request_id, "cannot open the approval; declining in Codex");
            job.sent.set(&offer.decision(None));
            let _ = job
                .peer
                .respond(&job.request_id, json!({"decision": offer.decision(None)}))
                .await;
            return;
        }
    };
    let id = decision.id.clone();
    tracing::info!(decision = %id, request = %job.request_id, "approval open");
    // Codex's own messages come first: the connection is closed only after every message it
    // sent before closing was handled.
    let answered = tokio::select! {
        biased;
        _ = job.withdrawn.wait() => {
            settle_unanswered(&job.run, &id, &job.withdrawn.reason()).await;
            return;
        }
        _ = job.resolved.cancelled() => {
            settle_unanswered(&job.run, &id, "Codex resolved the request itself (serverRequest/resolved) before an answer came from here, e.g. in its own terminal").await;
            return;
        }
        _ = job.item_done.cancelled() => {
            settle_unanswered(&job.run, &id, "Codex finished the item before an answer came from here").await;
            return;
        }
        _ = job.closed.wait() => {
            settle_unanswered(&job.run, &id, &job.closed.reason()).await;
            return;
        }
        d = job.run.await_decision(&id) => d,
    };
    let (sends, delivered) = match &answered {
        Ok(d) => (
            offer.decision(chosen_option(d)),
            d.status == DecisionStatus::Resolved,
        ),
        Err(e) => {
            tracing::info!(decision = %id, error = %e, "no answer will come (the run stopped); declining in Codex");
            (offer.decision(None), false)
        }
    };
    // Codex stopped waiting meanwhile: nothing to send, and a person's answer never arrived.
    let gone = if job.withdrawn.is_closed() {
        Some(job.withdrawn.reason())
    } else if job.resolved.is_cancelled() {
        Some("Codex resolved the request itself before this answer reached it".to_owned())
    } else if job.item_done.is_cancelled() {
        Some("Codex finished the item before this answer reached it".to_owned())
    } else if job.closed.is_closed() {
        Some(job.closed.reason())
    } else {
        None
    };
    if let Some(why) = gone {
        if delivered {
            report_lost(&job.run, &id, &why).await;
        }
        return;
    }
    job.sent.set(&sends);
    if let Err(e) = job
        .peer
        .respond(&job.request_id, json!({"decision": sends}))
        .await
    {
        if delivered {
            report_lost(
                &job.run,
                &id,
                &format!("the answer could not be sent to Codex: {e}"),
            )
            .await;
        }
        return;
    }
    tracing::info!(decision = %id, %sends, "answered Codex");
    if !delivered {
        return;
    }
    let acknowledged = tokio::select! {
        biased;
        _ = job.resolved.cancelled() => bridge::acknowledge(&job.run, &id, "serverRequest/resolved").await,
        _ = job.item_done.cancelled() => bridge::acknowledge(&job.run, &id, "item/completed (the app-server sent no serverRequest/resolved)").await,
        _ = job.closed.wait() => bridge::lost(&job.run, &id, &format!("{} (before Codex confirmed the answer)", job.closed.reason())).await,
    };
    if let Err(e) = acknowledged {
        tracing::warn!(decision = %id, error = %e, "cannot report the delivery of the answer");
    }
}

/// Closes an approval Codex dropped before an answer went out: expired, no option applied.
/// A person who answered at the same moment gets their answer reported lost.
async fn settle_unanswered(run: &Run, decision_id: &str, reason: &str) {
    match run.expire_decision(decision_id, reason).await {
        Ok(_) => tracing::info!(decision = %decision_id, reason, "approval expired"),
        Err(e) if e.code() == Some(ErrorCode::DecisionClosed) => {
            let resolved = run
                .client()
                .decision(run.task_id(), decision_id, std::time::Duration::ZERO)
                .await
                .ok()
                .and_then(|d| d.delivery)
                .is_some_and(|d| d.state == DeliveryState::Pending);
            if resolved {
                report_lost(run, decision_id, reason).await;
            }
        }
        Err(e) => tracing::warn!(decision = %decision_id, error = %e, "cannot expire the approval"),
    }
}

async fn report_lost(run: &Run, decision_id: &str, detail: &str) {
    if let Err(e) = bridge::lost(run, decision_id, detail).await {
        tracing::warn!(decision = %decision_id, error = %e, "cannot report the answer lost");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(o: &Offer) -> Vec<(&str, Value)> {
        o.choices
            .iter()
            .map(|(c, d)| (c.id.as_str(), d.clone()))
            .collect()
    }

    #[test]
    fn codex_decisions_map_to_options_and_back() {
        let all = Offer::new(COMMAND_APPROVAL, None);
        assert_eq!(
            ids(&all),
            [
                ("approve", json!("accept")),
                ("approve_session", json!("acceptForSession")),
                ("deny", json!("decline")),
                ("deny_cancel", json!("cancel"))
            ]
        );
        assert!(all.choices.iter().all(|(c, _)| !c.gives_up.is_empty()));
        assert_eq!(all.decision(Some("approve_session")), "acceptForSession");
        assert_eq!(all.decision(Some("deny_cancel")), "cancel");
        assert_eq!(all.decision(None), "decline");
        assert_eq!(all.decision(Some("approve_unknown")), "decline");

        let odd = json!(["acceptForSession", "cancel"]);
        let odd = Offer::new(FILE_CHANGE_APPROVAL, Some(&odd));
        assert_eq!(
            ids(&odd),
            [
                ("approve", json!("acceptForSession")),
                ("deny", json!("decline")),
                ("deny_cancel", json!("cancel"))
            ]
        );
        assert_eq!(odd.decision(None), "decline");
        assert!(odd.choices[2].0.gives_up.contains("the change"));
    }

    /// What Codex 0.169 lists for an escalated command (fixtures/codex/real/approve.jsonl):
    /// strings and an object mixed, no `decline`. Both denials are offered all the same, each
    /// saying what happens to the turn, and the amendment is sent back exactly as listed.
    #[test]
    fn codex_0_169_mixed_decisions_offer_both_denials_and_the_rule() {
        let rule =
            json!({"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch", "/tmp/x"]}});
        let listed = json!(["accept", rule, "cancel"]);
        let offer = Offer::new(COMMAND_APPROVAL, Some(&listed));
        assert_eq!(
            ids(&offer),
            [
                ("approve", json!("accept")),
                ("approve_rule", rule.clone()),
                ("deny", json!("decline")),
                ("deny_cancel", json!("cancel"))
            ]
        );
        assert_eq!(offer.decision(Some("approve_rule")), rule);
        let labels: Vec<&str> = offer
            .choices
            .iter()
            .map(|(c, _)| c.label.as_str())
            .collect();
        assert_eq!(
            labels,
            [
                "Approve",
                "Approve and always allow `touch /tmp/x`",
                "Deny, let the turn go on",
                "Deny and stop the turn"
            ]
        );
        assert!(offer.choices[2].0.gives_up.contains("continues the turn"));
        assert!(
            offer.choices[3]
                .0
                .gives_up
                .contains("interrupts the whole turn")
        );
    }

    /// An item whose turn or connection ended without Codex saying how it ended is closed as
    /// not run only when no accept went out for it and Codex did not resolve its request
    /// elsewhere; otherwise it may have run, and stays unknown.
    #[test]
    fn an_item_is_certainly_not_run_only_when_no_accept_went_out() {
        let asked = || Asked {
            sent: Sent::default(),
            resolved: CancellationToken::new(),
        };
        let unanswered = asked();
        assert!(unanswered.certainly_not_run());
        let elsewhere = asked();
        elsewhere.resolved.cancel();
        assert!(!elsewhere.certainly_not_run(), "maybe accepted elsewhere");
        for (sent, not_run) in [
            (json!("decline"), true),
            (json!("cancel"), true),
            (json!("accept"), false),
            (json!("acceptForSession"), false),
            (
                json!({"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["touch"]}}),
                false,
            ),
        ] {
            let a = asked();
            a.sent.set(&sent);
            a.resolved.cancel();
            assert_eq!(a.certainly_not_run(), not_run, "{sent}");
        }
    }

    #[test]
    fn codex_approval_summaries_say_what_would_happen() {
        let p = json!({"command": "npm install", "cwd": "/repo", "reason": "needs network"});
        assert_eq!(
            summary(COMMAND_APPROVAL, &p, None),
            "Codex wants to run `npm install` in /repo — needs network"
        );
        let item = json!({"changes": [{"path": "a.rs"}, {"path": "b.rs"}]});
        assert_eq!(
            summary(FILE_CHANGE_APPROVAL, &json!({"reason": null}), Some(&item)),
            "Codex wants to change 2 files: a.rs, b.rs"
        );
    }
}
