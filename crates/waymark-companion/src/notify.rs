//! The notification policy, shared by the app, the tray and the terminal: what deserves a
//! notification and what it carries — the decision with its intent, evidence and options, or
//! a finished task with its outputs and verification. Never a bare "task finished".

use serde::{Deserialize, Serialize};
use waymark_proto::*;

use crate::companion::Companion;
use crate::error::Error;
use crate::mirror::{StageStatus, ThreadDetail};
use crate::steer::Seen;

/// An action a notification offers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    /// `open`, `approve`, `deny`, or an option id.
    pub id: String,
    /// For people.
    pub label: String,
    /// Needs a second confirmation (risky approvals).
    pub confirm: bool,
}

/// What to show.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// Shown once per key.
    pub key: String,
    /// `decision`, `finished`, `budget`, `recovery`, `unknown_effect`.
    pub kind: String,
    /// Title with content.
    pub title: String,
    /// Body with content: intent, diff stat, receipts, options.
    pub body: String,
    /// Lock-screen variant: no content; details are fetched when opened.
    pub lock_screen: String,
    /// The task.
    pub task_id: String,
    /// The decision, when one is asked.
    pub decision_id: Option<String>,
    /// What the notification showed of the decision (its task's plan revision, the intent
    /// digest): an action answers with exactly this, so a plan that moved on since the
    /// notification appeared is a conflict, not an answer to something else.
    pub seen: Option<Seen>,
    /// Actions.
    pub actions: Vec<Action>,
}

fn receipts_line(receipts: &[TestReceipt]) -> String {
    match receipts.last() {
        None => "no test receipts".into(),
        Some(r) => {
            let state = if r.passed { "passed" } else { "FAILED" };
            format!(
                "tests {state}: {} passed, {} failed, {} skipped (`{}`{})",
                r.totals.passed,
                r.totals.failures + r.totals.errors,
                r.totals.skipped,
                r.command,
                r.commit
                    .as_deref()
                    .map(|c| format!(" at {}", &c[..c.len().min(10)]))
                    .unwrap_or_default()
            )
        }
    }
}

/// What a unified diff changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffStat {
    /// Files touched.
    pub files: usize,
    /// Lines added.
    pub added: usize,
    /// Lines removed.
    pub removed: usize,
}

/// Counts a unified diff (`git diff` output).
pub fn diff_stat(diff: &str) -> DiffStat {
    let mut s = DiffStat::default();
    for line in diff.lines() {
        if line.starts_with("+++ ") {
            s.files += 1;
        } else if line.starts_with("--- ") {
        } else if line.starts_with('+') {
            s.added += 1;
        } else if line.starts_with('-') {
            s.removed += 1;
        }
    }
    s
}

fn outputs_line(artifacts: &[Artifact], stats: &[(String, DiffStat)]) -> String {
    let names: Vec<String> = artifacts
        .iter()
        .filter(|a| !a.name.starts_with("junit-"))
        .map(|a| match stats.iter().find(|(sha, _)| *sha == a.sha256) {
            Some((_, d)) => format!(
                "{} ({} file(s), +{} −{})",
                a.name, d.files, d.added, d.removed
            ),
            None => a.name.clone(),
        })
        .collect();
    if names.is_empty() {
        "no artifacts".into()
    } else {
        format!("outputs: {}", names.join(", "))
    }
}

/// How many fields of an intent a notification shows, and how long each may be.
const SHOWN_FIELDS: usize = 4;
const SHOWN_VALUE: usize = 200;

/// The intent in a line, and whether that line is all of it. An agent chooses its intent's
/// shape: a dangerous part below harmless keys, in a nested object or cut off at the end
/// would not be seen on a notification, so only an intent shown whole can be approved from one.
fn intent_line(d: &Decision) -> (Option<String>, bool) {
    let Some(intent) = d.intent.as_ref().filter(|i| !i.is_null()) else {
        return (None, true);
    };
    let Some(obj) = intent.as_object() else {
        return (
            Some("intent: not a list of fields — open to see it".into()),
            false,
        );
    };
    let plain = |v: &serde_json::Value| {
        v.as_str()
            .map(|s| s.chars().count() <= SHOWN_VALUE)
            .unwrap_or_else(|| v.is_number() || v.is_boolean())
    };
    let whole = obj.len() <= SHOWN_FIELDS && obj.values().all(plain);
    let parts: Vec<String> = obj
        .iter()
        .filter(|(_, v)| plain(v))
        .take(SHOWN_FIELDS)
        .map(|(k, v)| {
            format!(
                "{k}={}",
                v.as_str()
                    .map(str::to_owned)
                    .unwrap_or_else(|| v.to_string())
            )
        })
        .collect();
    let digest = d
        .intent_digest
        .as_deref()
        .map(|s| s.trim_start_matches("sha256:"))
        .map(|s| &s[..s.len().min(12)])
        .unwrap_or("");
    let more = if whole {
        String::new()
    } else {
        format!(
            " — and more than a notification shows ({} field(s) in all): open to see it whole",
            obj.len()
        )
    };
    (
        Some(format!(
            "intent: {} (digest {digest}…){more}",
            parts.join(" ")
        )),
        whole,
    )
}

/// Whether a decision notifies `device_id` now: always without an escalation policy; with one,
/// once a step has reached the device (quiet hours holding a step reach nobody).
pub fn reaches(d: &Decision, device_id: &str) -> bool {
    d.escalation
        .as_ref()
        .is_none_or(|e| e.notified.iter().any(|n| n.device_id == device_id))
}

/// Whether a decision of another user's task (delegated to this device's user) notifies
/// `device_id`: only once a step of that user's escalation named it, as the server pushes it.
pub fn reaches_delegate(d: &Decision, device_id: &str) -> bool {
    d.escalation
        .as_ref()
        .is_some_and(|e| e.notified.iter().any(|n| n.device_id == device_id))
}

/// The newest reminder (`EscalationPolicy::reminders`) of a decision that reached `device_id`:
/// each one is notified again (its own notification key), as the server pushes it again.
pub fn reminder_for(d: &Decision, device_id: &str) -> Option<u32> {
    d.escalation
        .as_ref()?
        .notified
        .iter()
        .filter(|n| n.device_id == device_id)
        .filter_map(|n| n.reminder)
        .max()
}

/// The notification a pending decision deserves.
pub fn for_decision(d: &Decision, thread: &ThreadDetail) -> Notification {
    decision_with(d, thread, &[])
}

fn decision_with(
    d: &Decision,
    thread: &ThreadDetail,
    stats: &[(String, DiffStat)],
) -> Notification {
    let mut lines = Vec::new();
    let (intent, shown_whole) = intent_line(d);
    if let Some(i) = intent {
        lines.push(i);
    }
    lines.push(outputs_line(&thread.artifacts, stats));
    lines.push(receipts_line(&thread.receipts));
    let mut actions = vec![Action {
        id: "open".into(),
        label: "Open".into(),
        confirm: false,
    }];
    let (kind, title) = match d.kind {
        DecisionKind::Approval => {
            // Approved from a notification only when it shows what is approved, all of it;
            // denying hides nothing.
            if shown_whole {
                actions.push(Action {
                    id: "approve".into(),
                    label: "Approve".into(),
                    confirm: d.risky,
                });
            }
            actions.push(Action {
                id: "deny".into(),
                label: "Deny".into(),
                confirm: false,
            });
            ("decision", format!("Approve? {}", d.question))
        }
        DecisionKind::Budget => {
            for o in &d.options {
                lines.push(format!(
                    "• {} — gives up {}{}",
                    o.label,
                    o.gives_up,
                    o.cost
                        .as_deref()
                        .map(|c| format!(" ({c})"))
                        .unwrap_or_default()
                ));
                actions.push(Action {
                    id: o.id.clone(),
                    label: o.label.clone(),
                    confirm: false,
                });
            }
            ("budget", format!("Budget: {}", d.question))
        }
        DecisionKind::Recovery => ("recovery", format!("Recovery needs you: {}", d.question)),
        DecisionKind::Question => ("decision", format!("Question: {}", d.question)),
    };
    if d.status == DecisionStatus::Pending {
        lines.push(d.closing().describe_at());
        if let Some(e) = &d.escalation {
            lines.push(e.describe());
        }
    }
    Notification {
        key: format!("decision:{}", d.id),
        kind: kind.into(),
        title: format!("{title} — {}", thread.task.title),
        body: lines.join("\n"),
        lock_screen: "Waymark: a decision is waiting".into(),
        task_id: thread.task.id.clone(),
        decision_id: Some(d.id.clone()),
        seen: Some(Seen {
            plan_revision: thread.task.plan_revision,
            intent_digest: d.intent_digest.clone(),
        }),
        actions,
    }
}

/// The notification a finished task deserves: what it delivered and how it was verified.
pub fn for_finished(thread: &ThreadDetail) -> Option<Notification> {
    finished_with(thread, &[])
}

fn finished_with(thread: &ThreadDetail, stats: &[(String, DiffStat)]) -> Option<Notification> {
    let t = &thread.task;
    if !t.state.is_terminal() {
        return None;
    }
    let verb = match t.state {
        TaskState::Completed => "Completed",
        TaskState::PartiallyDelivered => "Partially delivered",
        TaskState::Cancelled => "Cancelled",
        _ => "Failed",
    };
    let done = thread
        .stages
        .iter()
        .filter(|s| s.status == StageStatus::Done)
        .count();
    let verified = thread.stages.iter().filter(|s| s.verified).count();
    let mut lines = vec![
        format!(
            "stages: {done}/{} done, {verified} verified",
            thread.stages.len()
        ),
        outputs_line(&thread.artifacts, stats),
        receipts_line(&thread.receipts),
    ];
    if let Some(s) = &t.outcome_summary {
        lines.insert(0, s.clone());
    }
    let unknown = thread
        .effects
        .iter()
        .filter(|e| e.status == EffectStatus::Unknown)
        .count();
    if unknown > 0 {
        lines.push(format!("{unknown} effect(s) with an unknown outcome"));
    }
    Some(Notification {
        key: format!("finished:{}:{}", t.id, t.state.as_str()),
        kind: "finished".into(),
        title: format!("{verb}: {}", t.title),
        body: lines.join("\n"),
        lock_screen: "Waymark: a task finished".into(),
        task_id: t.id.clone(),
        decision_id: None,
        seen: None,
        actions: vec![Action {
            id: "open".into(),
            label: "Open".into(),
            confirm: false,
        }],
    })
}

/// Everything a thread deserves now: open decisions, its end, unknown effects.
pub fn for_thread(thread: &ThreadDetail) -> Vec<Notification> {
    for_thread_with(thread, &[])
}

/// [`for_thread`], with the diff stats of artifacts (by sha256) the caller has at hand.
pub fn for_thread_with(thread: &ThreadDetail, stats: &[(String, DiffStat)]) -> Vec<Notification> {
    let mut out: Vec<Notification> = thread
        .decisions
        .iter()
        .filter(|d| d.status == DecisionStatus::Pending)
        .map(|d| decision_with(d, thread, stats))
        .collect();
    out.extend(finished_with(thread, stats));
    for e in thread
        .effects
        .iter()
        .filter(|e| e.status == EffectStatus::Unknown)
    {
        out.push(Notification {
            key: format!("unknown:{}", e.id),
            kind: "unknown_effect".into(),
            title: format!("Outcome unknown: {} — {}", e.kind, thread.task.title),
            body: format!("the {} with key `{}` may or may not have happened; it is frozen until it is reconciled", e.kind, e.idempotency_key),
            lock_screen: "Waymark: an outcome needs checking".into(),
            task_id: thread.task.id.clone(),
            decision_id: None,
            seen: None,
            actions: vec![Action { id: "open".into(), label: "Open".into(), confirm: false }],
        });
    }
    out
}

impl Companion {
    /// The notifications a thread deserves now, from the mirror alone: decisions with their
    /// intent, outputs (with the diff stat of cached diffs) and verification; a finished task
    /// with what it delivered. With `dedup`, each is returned once per device.
    pub async fn notifications(
        &self,
        task_id: &str,
        dedup: bool,
    ) -> Result<Vec<Notification>, Error> {
        let Some(thread) = self.mirror.thread(task_id).await? else {
            return Ok(Vec::new());
        };
        let mut stats = Vec::new();
        for a in &thread.artifacts {
            let is_diff = a.media_type.contains("diff")
                || a.name.ends_with(".diff")
                || a.name.ends_with(".patch");
            if is_diff && let Some(bytes) = self.mirror.blob(&a.sha256).await? {
                stats.push((
                    a.sha256.clone(),
                    diff_stat(&String::from_utf8_lossy(&bytes)),
                ));
            }
        }
        // Under the user's escalation policy a decision notifies only the devices its steps
        // reached so far; a later step reaching this one raises it then. Another user's task
        // (they delegated their decisions to this one) notifies only the decisions a step of
        // theirs sent here, and says whose it is.
        let identity = self.identity().await?;
        let me = identity.as_ref().map(|i| i.device_id.as_str());
        let foreign = identity
            .as_ref()
            .is_some_and(|i| !thread.task.owner.is_empty() && thread.task.owner != i.user);
        let mut out = Vec::new();
        for mut n in for_thread_with(&thread, &stats) {
            let decision = n
                .decision_id
                .as_deref()
                .and_then(|id| thread.decisions.iter().find(|d| d.id == id));
            let reaches = match (decision, me) {
                (Some(d), Some(me)) if foreign => reaches_delegate(d, me),
                (Some(d), Some(me)) => reaches(d, me),
                (None, _) => !foreign,
                (Some(_), None) => true,
            };
            if !reaches {
                continue;
            }
            if foreign {
                n.title = format!("For {}: {}", thread.task.owner, n.title);
            }
            // A reminder is shown again, once per reminder.
            if let (Some(d), Some(me)) = (decision, me)
                && let Some(r) = reminder_for(d, me)
            {
                n.key = format!("{}:reminder:{r}", n.key);
                n.title = format!("Reminder: {}", n.title);
            }
            if !dedup || self.mirror.first_notification(&n.key).await? {
                out.push(n);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn approval(intent: serde_json::Value) -> Decision {
        serde_json::from_value(serde_json::json!({
            "id": "dec_1", "task_id": "task_1", "kind": "approval", "status": "pending",
            "step": null, "question": "run it?", "options": [], "default_option": "deny",
            "intent": intent, "intent_digest": "sha256:0123456789abcdef", "effect_id": null,
            "plan_revision": 1, "risky": false, "expires_at": "2026-12-02T12:10:00Z",
            "created_at": "2026-12-02T12:00:00Z", "outcome": null,
        }))
        .unwrap()
    }

    #[test]
    fn each_reminder_that_reached_this_device_is_its_own_notification() {
        let mut d = approval(serde_json::json!({"x": 1}));
        assert_eq!(
            reminder_for(&d, "dev_a"),
            None,
            "no escalation, no reminder"
        );
        d.escalation = Some(
            serde_json::from_value(serde_json::json!({"notified": [
                {"device_id": "dev_a", "device_name": "laptop", "step": 0, "at": "2026-12-02T12:00:00Z"},
                {"device_id": "dev_b", "device_name": "phone", "step": 1, "at": "2026-12-02T12:10:00Z"},
                {"device_id": "dev_a", "device_name": "laptop", "step": 1, "reminder": 1, "at": "2026-12-02T12:40:00Z"},
                {"device_id": "dev_a", "device_name": "laptop", "step": 1, "reminder": 2, "at": "2026-12-02T13:10:00Z"}
            ], "reminded": 2}))
            .unwrap(),
        );
        assert_eq!(reminder_for(&d, "dev_a"), Some(2));
        assert_eq!(
            reminder_for(&d, "dev_b"),
            None,
            "a device a reminder did not reach"
        );
    }

    #[test]
    fn only_an_intent_a_notification_shows_whole_can_be_approved_from_it() {
        let (line, whole) = intent_line(&approval(
            serde_json::json!({"tool": "Bash", "command": "npm test", "timeout": 60}),
        ));
        assert!(whole);
        assert!(
            line.unwrap().contains("command=npm test"),
            "what is approved is shown"
        );
        // The dangerous part below harmless keys, nested, or past what is shown.
        for crafted in [
            serde_json::json!({"a": "1", "b": "2", "c": "3", "d": "4", "command": "rm -rf ~"}),
            serde_json::json!({"tool": "Bash", "input": {"command": "rm -rf ~"}}),
            serde_json::json!({"command": format!("echo hi{}; rm -rf ~", " ".repeat(300))}),
            serde_json::json!(["rm -rf ~"]),
        ] {
            let (line, whole) = intent_line(&approval(crafted.clone()));
            assert!(!whole, "{crafted}");
            assert!(line.unwrap().contains("open to see"), "{crafted}");
        }
        assert_eq!(
            intent_line(&approval(serde_json::Value::Null)),
            (None, true)
        );
    }

    #[test]
    fn a_diff_is_counted_by_files_and_lines() {
        let d = "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-old\n+new\n ctx\n+more\n";
        assert_eq!(
            diff_stat(d),
            DiffStat {
                files: 1,
                added: 2,
                removed: 1
            }
        );
    }
}
