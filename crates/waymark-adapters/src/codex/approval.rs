//! Codex's approval requests (`item/commandExecution/requestApproval`,
//! `item/fileChange/requestApproval`) as connection-bound approvals: each one is held open
//! while a person decides, answered in Codex's words, and counted only once Codex says it took
//! the answer (`serverRequest/resolved`).

use std::sync::{Arc, OnceLock};

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use waymark_proto::{ApprovalDurability, DecisionStatus, DeliveryState, ErrorCode};
use waymark_worker::{Run, chosen_option};

use crate::bridge::{self, Choice};
use crate::jsonrpc::{Peer, RequestId};

/// The command-execution approval request.
pub(super) const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
/// The file-change approval request.
pub(super) const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";

/// Codex's decisions, in the order it lists them, with our option ids.
const DECISIONS: [(&str, &str); 4] = [
    ("accept", "approve"),
    ("acceptForSession", "approve_session"),
    ("decline", "deny"),
    ("cancel", "deny_cancel"),
];

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

/// What the adapter's loop keeps of an approval in flight, to wake it.
#[derive(Debug)]
pub(super) struct Handle {
    /// `threadId:turnId:itemId` of the item it guards.
    pub(super) item_key: String,
    /// Fired by `serverRequest/resolved` for its request id.
    pub(super) resolved: CancellationToken,
    /// Fired by `item/completed` of its item.
    pub(super) item_done: CancellationToken,
}

/// The choices offered for one request and the Codex decision each one sends.
#[derive(Debug, Clone)]
pub(super) struct Offer {
    pub(super) choices: Vec<(Choice, &'static str)>,
}

impl Offer {
    /// What Codex offers for `method` (`availableDecisions` when it says; all four when not).
    /// `approve` and `deny` are always offered (the control plane requires them): they send
    /// `accept` and `decline`, or the nearest decision Codex lists instead.
    pub(super) fn new(method: &str, available: Option<&Value>) -> Offer {
        let listed: Option<Vec<&str>> = available
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect());
        let offered = |d: &str| listed.as_ref().is_none_or(|l| l.contains(&d));
        let approve = ["accept", "acceptForSession"]
            .into_iter()
            .find(|d| offered(d))
            .unwrap_or("accept");
        let deny = ["decline", "cancel"]
            .into_iter()
            .find(|d| offered(d))
            .unwrap_or("decline");
        let file = method == FILE_CHANGE_APPROVAL;
        let mut choices = Vec::new();
        for (decision, option) in DECISIONS {
            let sends = match option {
                "approve" => approve,
                "deny" => deny,
                _ if offered(decision) && decision != approve && decision != deny => decision,
                _ => continue,
            };
            choices.push((describe(option, sends, file), sends));
        }
        Offer { choices }
    }

    /// The Codex decision for the option a person chose; none (expired to nothing, void)
    /// sends what `deny` sends.
    pub(super) fn decision(&self, option: Option<&str>) -> &'static str {
        let find = |id: &str| {
            self.choices
                .iter()
                .find(|(c, _)| c.id == id)
                .map(|(_, d)| *d)
        };
        option
            .and_then(find)
            .or_else(|| find("deny"))
            .unwrap_or("decline")
    }
}

/// Label and cost of one option, in Codex's terms.
fn describe(option: &str, sends: &str, file: bool) -> Choice {
    let what = if file { "the change" } else { "the command" };
    let label = match sends {
        "accept" => "Accept",
        "acceptForSession" => "Accept for this session",
        "decline" => "Decline",
        _ => "Cancel the turn",
    };
    let gives_up = match sends {
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
        "decline" => format!("{what} does not happen; Codex continues the turn without it"),
        _ => format!("{what} does not happen and Codex interrupts the whole turn"),
    };
    Choice {
        id: option.to_owned(),
        label: label.to_owned(),
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
}

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
    let opened = bridge::open_approval(
        &job.run,
        intent,
        &summary,
        ApprovalDurability::ConnectionBound,
        &choices,
        None,
    )
    .await;
    let decision = match opened {
        Ok(d) => d,
        Err(e) => {
            // Nobody can be asked: refuse rather than let Codex run unseen.
            tracing::warn!(error = %e, request = %job.request_id, "cannot open the approval; declining in Codex");
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
    let gone = if job.resolved.is_cancelled() {
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
    tracing::info!(decision = %id, sends, "answered Codex");
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

    fn ids(o: &Offer) -> Vec<(&str, &str)> {
        o.choices.iter().map(|(c, d)| (c.id.as_str(), *d)).collect()
    }

    #[test]
    fn codex_decisions_map_to_options_and_back() {
        let all = Offer::new(COMMAND_APPROVAL, None);
        assert_eq!(
            ids(&all),
            [
                ("approve", "accept"),
                ("approve_session", "acceptForSession"),
                ("deny", "decline"),
                ("deny_cancel", "cancel")
            ]
        );
        assert!(all.choices.iter().all(|(c, _)| !c.gives_up.is_empty()));
        assert_eq!(all.decision(Some("approve_session")), "acceptForSession");
        assert_eq!(all.decision(Some("deny_cancel")), "cancel");
        assert_eq!(all.decision(None), "decline");
        assert_eq!(all.decision(Some("approve_unknown")), "decline");

        let listed = json!(["accept", "decline", {"acceptWithExecpolicyAmendment": {"execpolicy_amendment": ["npm"]}}]);
        let two = Offer::new(COMMAND_APPROVAL, Some(&listed));
        assert_eq!(ids(&two), [("approve", "accept"), ("deny", "decline")]);

        let odd = json!(["acceptForSession", "cancel"]);
        let odd = Offer::new(FILE_CHANGE_APPROVAL, Some(&odd));
        assert_eq!(
            ids(&odd),
            [("approve", "acceptForSession"), ("deny", "cancel")]
        );
        assert_eq!(odd.decision(None), "cancel");
        assert!(odd.choices[1].0.gives_up.contains("the change"));
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
