//! Desktop notifications through `notify-rust` (the freedesktop D-Bus protocol on Linux),
//! with the content `waymark_companion::notify` decides — the intent and its digest, outputs,
//! test receipts, options — and its actions. Open brings the window to the thread or the
//! decision; Approve answers with a signed command, unless the approval is risky: then the
//! window opens on the card to confirm there, because a risky approval is never one click
//! away from a pop-up. Deny and budget options answer directly.

use std::sync::Arc;

use tauri::AppHandle;
use waymark_companion::Seen;
use waymark_companion::notify::Notification;

use crate::state::Shared;

/// What a notification action asks of the app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// Bring the window to this route.
    Open(String),
    /// Bring the window to the decision and ask to confirm this action there.
    Confirm { decision: String, action: String },
    /// Answer the decision now, with what the notification showed.
    Answer {
        decision: String,
        action: String,
        seen: Seen,
    },
    /// Nothing (closed, dismissed).
    Nothing,
}

/// Maps a notification action id to what the app does.
pub fn act(n: &Notification, action: &str) -> Act {
    let open = || match &n.decision_id {
        Some(d) => format!("/inbox/{d}"),
        None => format!("/threads/{}", n.task_id),
    };
    match (action, &n.decision_id) {
        ("open" | "default", _) => Act::Open(open()),
        ("__closed", _) => Act::Nothing,
        (a, Some(d)) => match n.actions.iter().find(|x| x.id == a) {
            Some(x) if x.confirm => Act::Confirm {
                decision: d.clone(),
                action: a.to_owned(),
            },
            Some(_) => match &n.seen {
                Some(seen) => Act::Answer {
                    decision: d.clone(),
                    action: a.to_owned(),
                    seen: seen.clone(),
                },
                // Nothing says what it showed: answer from the card instead.
                None => Act::Open(open()),
            },
            None => Act::Nothing,
        },
        _ => Act::Nothing,
    }
}

/// Shows `n` and handles its actions on a thread of its own (the D-Bus wait blocks).
pub fn show(app: AppHandle, shared: Arc<Shared>, n: Notification) {
    #[cfg(all(unix, not(any(target_os = "android", target_os = "ios"))))]
    std::thread::spawn(move || {
        let mut note = notify_rust::Notification::new();
        note.appname("Waymark")
            .summary(&n.title)
            .body(&n.body)
            .icon("dialog-question");
        for a in &n.actions {
            note.action(&a.id, &a.label);
        }
        match note.show() {
            Ok(handle) => {
                // Proof of delivery: the desktop showed it.
                if let Some(d) = n.decision_id.clone() {
                    shared.shown.remember(d.clone(), handle.id());
                    let shared = shared.clone();
                    tauri::async_runtime::spawn(async move {
                        receipt(&shared, d, waymark_proto::DeliveryStep::Shown).await
                    });
                }
                handle.wait_for_action(|action| {
                    if let Some(d) = n.decision_id.clone()
                        && action != "__closed"
                    {
                        let shared = shared.clone();
                        tauri::async_runtime::spawn(async move {
                            receipt(&shared, d, waymark_proto::DeliveryStep::Opened).await
                        });
                    }
                    let what = act(&n, action);
                    let app = app.clone();
                    let shared = shared.clone();
                    tauri::async_runtime::spawn(async move { perform(app, shared, what).await });
                })
            }
            Err(e) => tracing::warn!(error = %e, "cannot show a desktop notification"),
        }
    });
    #[cfg(not(all(unix, not(any(target_os = "android", target_os = "ios")))))]
    {
        let _ = (app, shared, n);
    }
}

/// Withdraws the notification of a decision that closed (answered in the window or on
/// another device, by a rule, its default or the runtime): the notification server is asked
/// to replace it by a quiet one without actions and to close that — what the freedesktop
/// protocol offers for a notification shown by another connection (`replaces_id`, then
/// `CloseNotification`). The tray count follows from the mirror.
pub fn withdraw(decision: String, notification: u32) {
    #[cfg(all(unix, not(any(target_os = "android", target_os = "ios"))))]
    std::thread::spawn(move || {
        let replaced = notify_rust::Notification::new()
            .appname("Waymark")
            .id(notification)
            .summary("Answered")
            .body("Nothing to do here any more.")
            .icon("dialog-information")
            .show();
        match replaced {
            Ok(handle) => {
                handle.close();
                tracing::debug!(%decision, notification, "withdrew the closed decision's notification");
            }
            Err(e) => {
                tracing::info!(%decision, error = %e, "cannot withdraw a desktop notification")
            }
        }
    });
    #[cfg(not(all(unix, not(any(target_os = "android", target_os = "ios")))))]
    {
        let _ = (decision, notification);
    }
}

/// Tells the server how far a decision reached this device; a failure is only logged.
async fn receipt(shared: &Shared, decision: String, step: waymark_proto::DeliveryStep) {
    if let Err(e) = shared.companion.report_receipts(&[decision], step).await {
        tracing::info!(error = %e, %step, "could not report the notification's receipt");
    }
}

async fn perform(app: AppHandle, shared: Arc<Shared>, what: Act) {
    use waymark_proto::Operation;
    match what {
        Act::Nothing => {}
        Act::Open(route) => crate::events::navigate(&app, &route, None),
        Act::Confirm { decision, action } => {
            crate::events::navigate(&app, &format!("/inbox/{decision}"), Some(action))
        }
        Act::Answer {
            decision,
            action,
            seen,
        } => {
            let (op, option) = match action.as_str() {
                "approve" => (Operation::Approve, None),
                "deny" => (Operation::Deny, None),
                other => (Operation::ChooseOption, Some(other.to_owned())),
            };
            let r = shared
                .companion
                .answer(&decision, op, option.as_deref(), None, &seen)
                .await;
            if let Err(e) = &r {
                tracing::warn!(error = %e, "answering from a notification failed");
                // Let the person see why, where they can act on it.
                crate::events::navigate(&app, &format!("/inbox/{decision}"), None);
            }
            crate::events::nudge(&app);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_companion::notify::Action;

    fn seen() -> Seen {
        Seen {
            plan_revision: 3,
            intent_digest: Some("sha256:abc".into()),
        }
    }

    fn note(risky: bool) -> Notification {
        Notification {
            key: "decision:dec_1".into(),
            kind: "decision".into(),
            title: "Approve? deploy".into(),
            body: String::new(),
            lock_screen: String::new(),
            task_id: "task_1".into(),
            decision_id: Some("dec_1".into()),
            seen: Some(seen()),
            actions: vec![
                Action {
                    id: "open".into(),
                    label: "Open".into(),
                    confirm: false,
                },
                Action {
                    id: "approve".into(),
                    label: "Approve".into(),
                    confirm: risky,
                },
                Action {
                    id: "deny".into(),
                    label: "Deny".into(),
                    confirm: false,
                },
            ],
        }
    }

    #[test]
    fn risky_approval_from_a_notification_asks_to_confirm_in_the_window() {
        assert_eq!(
            act(&note(true), "approve"),
            Act::Confirm {
                decision: "dec_1".into(),
                action: "approve".into()
            }
        );
        assert_eq!(
            act(&note(false), "approve"),
            Act::Answer {
                decision: "dec_1".into(),
                action: "approve".into(),
                seen: seen(),
            },
            "an action answers with the revision and digest the notification showed"
        );
        let mut unsaid = note(false);
        unsaid.seen = None;
        assert_eq!(
            act(&unsaid, "approve"),
            Act::Open("/inbox/dec_1".into()),
            "without what it showed, the card answers instead"
        );
    }

    #[test]
    fn only_a_shown_decision_that_closed_is_withdrawn_and_only_once() {
        let shown = crate::state::Shown::default();
        shown.remember("dec_1".into(), 7);
        shown.remember("dec_2".into(), 8);
        // dec_1 still open, dec_2 closed, dec_3 closed but never shown here.
        let closed = shown.take_closed([("dec_1", true), ("dec_2", false), ("dec_3", false)]);
        assert_eq!(closed, [("dec_2".to_owned(), 8)]);
        assert!(shown.take_closed([("dec_2", false)]).is_empty(), "once");
        assert_eq!(
            shown.take_closed([("dec_1", false)]),
            [("dec_1".to_owned(), 7)]
        );
    }

    #[test]
    fn open_goes_to_the_decision_and_unknown_actions_do_nothing() {
        assert_eq!(act(&note(false), "open"), Act::Open("/inbox/dec_1".into()));
        assert_eq!(
            act(&note(false), "default"),
            Act::Open("/inbox/dec_1".into())
        );
        assert_eq!(act(&note(false), "__closed"), Act::Nothing);
        assert_eq!(act(&note(false), "rm -rf"), Act::Nothing);
        let mut finished = note(false);
        finished.decision_id = None;
        assert_eq!(act(&finished, "open"), Act::Open("/threads/task_1".into()));
        assert_eq!(act(&finished, "approve"), Act::Nothing);
    }
}
