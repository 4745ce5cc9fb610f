//! An ACP permission request's options as inbox choices, and back: each agent option gets one
//! of our ids (`approve`, `deny`, `approve_…`, `deny_…`), and the map remembers which
//! `optionId` of the agent's an answer selects.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use crate::bridge::Choice;

/// What an inbox answer sends back to the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `{"outcome":{"outcome":"selected","optionId":…}}` with the agent's own id.
    Select(String),
    /// `{"outcome":{"outcome":"cancelled"}}`: the agent offered nothing that fits.
    Cancel,
}

/// The inbox choices of one permission request and what each sends back.
#[derive(Debug, Clone)]
pub(crate) struct Mapped {
    /// In the agent's order.
    pub(crate) choices: Vec<Choice>,
    /// Our option id → the answer to the agent.
    pub(crate) answers: HashMap<String, Answer>,
}

/// Hermes names its options by what they mean; its `allow_session` carries ACP kind
/// `allow_always` for want of a session kind (`acp_adapter/permissions.py`), so Hermes is mapped
/// by option id first.
const HERMES: &[(&str, &str)] = &[
    ("allow_once", "approve"),
    ("allow_session", "approve_session"),
    ("allow_always", "approve_always"),
    ("deny", "deny"),
    ("deny_always", "deny_always"),
];

/// ACP's option kinds.
fn by_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "allow_once" => Some("approve"),
        "allow_always" => Some("approve_always"),
        "reject_once" => Some("deny"),
        "reject_always" => Some("deny_always"),
        _ => None,
    }
}

/// What choosing an option costs, for people.
fn gives_up(base: &str) -> &'static str {
    match base {
        "approve_session" => "the agent stops asking about such calls for the rest of this session",
        "approve_always" => "the agent stops asking about such calls, for good",
        "deny" => "the tool call does not run",
        "deny_always" => "the agent refuses such calls from now on without asking",
        _ => "",
    }
}

/// `base`, or `base_2`, `base_3`… when two agent options map to the same id.
fn unique(base: &str, used: &HashSet<String>) -> String {
    if !used.contains(base) {
        return base.to_owned();
    }
    (2..)
        .map(|n| format!("{base}_{n}"))
        .find(|c| !used.contains(c))
        .expect("an unused suffix exists")
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// Maps `options` (`[{optionId, name, kind}]`) of a `session/request_permission` for
/// `runtime`. The result always holds `approve` and `deny`, as the control plane requires: when
/// the agent offers no once-option, its first granting (refusing) option takes the plain id;
/// when it offers no refusing option at all, `deny` answers `cancelled`.
pub(crate) fn map(options: &Value, runtime: &str) -> Mapped {
    let mut used = HashSet::new();
    let mut choices = Vec::new();
    let mut answers = HashMap::new();
    for o in options.as_array().map(Vec::as_slice).unwrap_or_default() {
        let Some(option_id) = o.get("optionId").and_then(Value::as_str) else {
            tracing::warn!(option = %o, "a permission option without `optionId`; left out");
            continue;
        };
        let kind = o.get("kind").and_then(Value::as_str).unwrap_or("");
        let named = (runtime == "hermes")
            .then(|| {
                HERMES
                    .iter()
                    .find(|(id, _)| *id == option_id)
                    .map(|(_, ours)| *ours)
            })
            .flatten();
        let Some(base) = named.or_else(|| by_kind(kind)) else {
            tracing::warn!(
                option_id,
                kind,
                "a permission option of unknown kind; left out"
            );
            continue;
        };
        let id = unique(base, &used);
        used.insert(id.clone());
        let label = o
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
            .unwrap_or(option_id);
        choices.push(Choice {
            id: id.clone(),
            label: clip(label, 500),
            gives_up: gives_up(base).to_owned(),
        });
        answers.insert(id, Answer::Select(option_id.to_owned()));
    }
    for (plain, prefix) in [("approve", "approve_"), ("deny", "deny_")] {
        if used.contains(plain) {
            continue;
        }
        if let Some(c) = choices.iter_mut().find(|c| c.id.starts_with(prefix)) {
            let answer = answers.remove(&c.id).expect("every choice has an answer");
            used.remove(&c.id);
            c.id = plain.to_owned();
            answers.insert(c.id.clone(), answer);
        } else {
            let label = if plain == "deny" {
                "Deny (the request is answered as cancelled)"
            } else {
                "Approve (the agent offered no allow option; answered as cancelled)"
            };
            choices.push(Choice::new(plain, label));
            answers.insert(plain.to_owned(), Answer::Cancel);
        }
        used.insert(plain.to_owned());
    }
    Mapped { choices, answers }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn ids(m: &Mapped) -> Vec<&str> {
        m.choices.iter().map(|c| c.id.as_str()).collect()
    }

    fn sel(m: &Mapped, id: &str) -> Answer {
        m.answers[id].clone()
    }

    #[test]
    fn acp_kinds_map_to_our_ids() {
        let m = map(
            &json!([
                {"optionId": "a1", "name": "Allow", "kind": "allow_once"},
                {"optionId": "a2", "name": "Always", "kind": "allow_always"},
                {"optionId": "r1", "name": "Reject", "kind": "reject_once"},
                {"optionId": "r2", "name": "Never", "kind": "reject_always"},
            ]),
            "acp",
        );
        assert_eq!(
            ids(&m),
            ["approve", "approve_always", "deny", "deny_always"]
        );
        assert_eq!(sel(&m, "approve_always"), Answer::Select("a2".into()));
        assert_eq!(sel(&m, "deny_always"), Answer::Select("r2".into()));
        assert_eq!(m.choices[1].label, "Always");
    }

    #[test]
    fn two_options_of_one_kind_keep_distinct_ids() {
        let m = map(
            &json!([
                {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "allow_session", "name": "Allow for session", "kind": "allow_always"},
                {"optionId": "allow_always", "name": "Allow always", "kind": "allow_always"},
                {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
            ]),
            "acp",
        );
        assert_eq!(
            ids(&m),
            ["approve", "approve_always", "approve_always_2", "deny"]
        );
        assert_eq!(
            sel(&m, "approve_always_2"),
            Answer::Select("allow_always".into())
        );
    }

    #[test]
    fn hermes_options_are_mapped_by_their_ids() {
        let m = map(
            &json!([
                {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "allow_session", "name": "Allow for session", "kind": "allow_always"},
                {"optionId": "allow_always", "name": "Allow always", "kind": "allow_always"},
                {"optionId": "deny", "name": "Deny", "kind": "reject_once"},
                {"optionId": "deny_always", "name": "Deny always", "kind": "reject_always"},
            ]),
            "hermes",
        );
        assert_eq!(
            ids(&m),
            [
                "approve",
                "approve_session",
                "approve_always",
                "deny",
                "deny_always"
            ]
        );
        assert_eq!(
            sel(&m, "approve_session"),
            Answer::Select("allow_session".into())
        );
    }

    #[test]
    fn missing_plain_options_are_supplied() {
        // Only "always" options: they take the plain ids.
        let m = map(
            &json!([
                {"optionId": "yes", "name": "Always", "kind": "allow_always"},
                {"optionId": "no", "name": "Never", "kind": "reject_always"},
            ]),
            "acp",
        );
        assert_eq!(ids(&m), ["approve", "deny"]);
        assert_eq!(sel(&m, "approve"), Answer::Select("yes".into()));
        assert_eq!(sel(&m, "deny"), Answer::Select("no".into()));

        // No refusing option at all: `deny` cancels the request.
        let m = map(
            &json!([{"optionId": "ok", "name": "OK", "kind": "allow_once"},
                    {"optionId": "??", "name": "Odd", "kind": "shrug"}]),
            "acp",
        );
        assert_eq!(ids(&m), ["approve", "deny"]);
        assert_eq!(sel(&m, "deny"), Answer::Cancel);
    }
}
