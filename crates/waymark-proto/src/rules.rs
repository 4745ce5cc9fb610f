//! Standing rules on the wire (issue 31 §2): a person's signed, scoped, expiring answer to the
//! approvals that match it — `allow` or `deny` for a runtime, machine, directory, tool and a
//! pattern over the call's input — made with `add_rule` and ended with `revoke_rule` (signed
//! commands like every steer), listed by `GET /v1/rules`.
//!
//! Also here, because every client needs the same reading: [`intent_facts`], what a rule can
//! see of an approval's intent (the tool, its command or path, the directory it runs in) in
//! each runtime's own shape. The server matches rules against these facts
//! (`waymark-server::domain::rules`); the companions pre-fill "Always allow…" from them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// How long a rule lives when its command names no expiry.
pub const RULE_DEFAULT_DAYS: u32 = 7;
/// The longest a rule may live.
pub const RULE_MAX_DAYS: u32 = 90;
/// Most live rules one user may hold.
pub const RULE_MAX_LIVE: usize = 200;

str_enum! {
    /// What a rule answers the approvals it matches.
    pub enum RuleAnswer {
        /// Approve at once: nobody is asked.
        Allow => "allow",
        /// Deny at once. A matching deny rule wins over every allow rule.
        Deny => "deny",
    }
}

str_enum! {
    /// How a rule's input pattern reads.
    pub enum PatternKind {
        /// `*` (any run of characters) and `?` (one character); `\` escapes. Over a path, `*`
        /// stays within one directory and `**` crosses them. In an `allow` rule over a
        /// command, a wildcard never matches a shell control character (`;`, `&`, `|`, `<`,
        /// `>`, `$`, a backquote, a parenthesis, a newline): `npm test *` allows
        /// `npm test --watch`, never `npm test; rm -rf ~`.
        Glob => "glob",
        /// A regular expression (Rust `regex` syntax) that must match the whole input; it
        /// matches exactly what it says, so `.` crosses `;`.
        Regex => "regex",
    }
}

/// A pattern over a call's input: its command, or its path, or (other tools) its input as
/// canonical JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct InputPattern {
    /// `glob` or `regex`.
    pub kind: PatternKind,
    /// The pattern, 1 to 500 characters.
    #[schema(min_length = 1, max_length = 500)]
    pub pattern: String,
}

/// What a rule matches. Every part given must match; a part left out matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct RuleMatch {
    /// The task's runtime (`claude-code`, `codex`, `gemini`, `openclaw`, …), any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 64)]
    pub runtime: Option<String>,
    /// The machine whose runner runs the task, by name. A task no runner started has no
    /// machine, so it never matches a rule that names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 64)]
    pub machine: Option<String>,
    /// An absolute directory (a glob: `*` within one name, `**` across them); it matches that
    /// directory and every one under it. A call whose directory is unknown, or not a plain
    /// absolute path (`.`, `..`), never matches a rule that names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    pub directory: Option<String>,
    /// The tool, as the runtime names it (`Bash`, `Write`; Codex `commandExecution`; ACP's
    /// kind such as `execute`; OpenClaw `exec`), any case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128)]
    pub tool: Option<String>,
    /// A pattern the call's input must match; a call with no input never matches one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<InputPattern>,
}

/// A rule as a device signs it: `args.rule` of `add_rule`. Its digest (`sha256:` of its
/// canonical JSON, with `expires_at` as the server set it when the command left it out) is
/// what an approval it answers records.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// What it matches.
    #[serde(rename = "match")]
    pub matches: RuleMatch,
    /// `allow` or `deny`.
    pub answer: RuleAnswer,
    /// When it stops: at most 90 days after the server receives it; absent, 7 days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Why, for people (at most 500 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 500)]
    pub note: Option<String>,
    /// An `allow` rule may answer approvals the risk policy marks risky only with this set —
    /// and then the command must name `expires_at` and repeat the rule's digest in
    /// `args.confirm_risky`: the second confirmation.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_risky: bool,
}

/// A standing rule, as people read it (`GET /v1/rules`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Rule {
    /// `rul_…`.
    #[schema(pattern = r"^rul_[0-9a-f]{32}$")]
    pub id: String,
    /// `sha256:` of the rule as signed (`RuleSpec`, expiry included).
    #[schema(pattern = r"^sha256:[0-9a-f]{64}$")]
    pub digest: String,
    /// The user it answers for: the owner of the device that signed it.
    pub owner: String,
    /// The device that signed it.
    pub device_id: String,
    /// That device's name (`alice's phone`).
    pub device_name: String,
    /// What it matches.
    #[serde(rename = "match")]
    pub matches: RuleMatch,
    /// `allow` or `deny`.
    pub answer: RuleAnswer,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Whether it may allow approvals marked risky (confirmed twice when it was made).
    pub allow_risky: bool,
    /// The `add_rule` command that made it.
    pub command_id: String,
    /// Made at.
    pub created_at: DateTime<Utc>,
    /// When it stops answering.
    pub expires_at: DateTime<Utc>,
    /// When it was revoked, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
    /// The device that revoked it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_by: Option<String>,
    /// How many approvals it has answered.
    pub uses: i64,
    /// When it last answered one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    /// Neither revoked nor expired, by the server's clock.
    pub live: bool,
}

/// `GET /v1/rules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RuleList {
    /// Newest first: live ones and, for their record, revoked and expired ones (the newest
    /// 200 in all).
    pub rules: Vec<Rule>,
    /// The runtimes' own rules on the user's machines, as each runner last read them, with
    /// the conflicts between them and `rules`.
    #[serde(default)]
    pub runtime_rules: Vec<ListedRuntimeRule>,
}

/// Most runtime rules one runner reports.
pub const RUNTIME_RULES_MAX: usize = 500;

str_enum! {
    /// What a runtime's own rule does with the calls it covers, before Waymark is asked.
    pub enum OwnEffect {
        /// The runtime runs them without asking anyone: no approval reaches Waymark, so no
        /// Waymark rule (and no person) is asked about them.
        Allow => "allow",
        /// The runtime refuses them without asking.
        Deny => "deny",
        /// The runtime asks — through Waymark, where it is wired to it.
        Ask => "ask",
    }
}

/// A rule a runtime keeps itself (Claude Code's `permissions.allow`, a Codex `prefix_rule`,
/// OpenClaw's exec allowlist, Hermes' approval mode, …), as the runner of the machine read it
/// from the runtime's own files (issue 31 §2). Shown beside Waymark's rules; never applied
/// by Waymark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(deny_unknown_fields)]
pub struct RuntimeRule {
    /// `claude-code`, `codex`, `gemini`, `hermes`, `openclaw`.
    #[schema(min_length = 1, max_length = 64)]
    pub runtime: String,
    /// The file it was read from.
    #[schema(min_length = 1, max_length = 500)]
    pub source: String,
    /// The rule as the file writes it (`Bash(npm test:*)`, `approval_policy = "never"`).
    #[schema(min_length = 1, max_length = 500)]
    pub text: String,
    /// What it does with the calls it covers.
    pub effect: OwnEffect,
    /// The calls it covers, in the terms of a Waymark rule (its runtime always named; no
    /// input pattern: all of that tool's calls). A runtime's syntax that Waymark's cannot say
    /// exactly is widened, never narrowed.
    #[serde(rename = "match")]
    pub matches: RuleMatch,
}

/// A runtime's own rule as people read it (`GET /v1/rules`): where it was found and which of
/// the user's live rules it works against.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct ListedRuntimeRule {
    /// The machine whose runner read it, by name.
    pub machine: String,
    /// When that runner last reported its rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<DateTime<Utc>>,
    /// The rule.
    pub rule: RuntimeRule,
    /// The user's live rules that it works against: a deny rule for calls this runtime runs
    /// without asking, or an allow rule for calls it refuses.
    pub conflicts: Vec<RuleConflict>,
}

/// A Waymark rule and a runtime's own rule that cover the same calls with different answers.
/// Named, never resolved: the runtime acts first, so what it decides is what happens.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RuleConflict {
    /// The Waymark rule (`rul_…`).
    pub rule_id: String,
    /// What happens, for people: "Claude Code runs these without asking, so this deny rule
    /// never sees them".
    pub says: String,
}

/// The rule that answered an approval (`DecisionOutcome::rule`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RuleRef {
    /// `rul_…`.
    pub id: String,
    /// Its digest when it answered.
    pub digest: String,
    /// `allow` or `deny`.
    pub answer: RuleAnswer,
}

/// What a call asks to run on, as a rule sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(tag = "kind", content = "text", rename_all = "snake_case")]
pub enum CallInput {
    /// A shell command, unwrapped from `bash -lc '…'` when that is all it is.
    Command(String),
    /// A file the call reads or writes.
    Path(String),
    /// Any other input, as canonical JSON (or the runtime's one line for it).
    Other(String),
}

impl CallInput {
    /// The text a pattern reads.
    pub fn text(&self) -> &str {
        match self {
            CallInput::Command(s) | CallInput::Path(s) | CallInput::Other(s) => s,
        }
    }
}

/// Everything a rule can match of one approval.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct CallFacts {
    /// The task's runtime.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// The name of the machine whose runner runs the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The directory the call runs in: as the runtime reported it, else the task's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<String>,
    /// The tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// Its command, path or other input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<CallInput>,
}

/// What a rule can see of an approval's intent, in each runtime's shape: Claude Code's hooks
/// (`{tool, input}`), Codex's app-server requests (`{method, params, item}`), an ACP agent's
/// `session/request_permission` (`{toolCall, …}`: Gemini CLI, OpenCode, Copilot, Hermes),
/// OpenClaw's exec approvals (`{runtime: "openclaw", approval: "exec", request}`) and its tool
/// calls (`{runtime, tool, args}`), and the worker SDK's plain intents (`{tool | kind, command |
/// path, cwd}`). The runtime and the machine are the task's, filled in by the caller.
pub fn intent_facts(intent: &Value) -> CallFacts {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let mut f = CallFacts::default();
    if let Some(method) = s(intent, "method") {
        // Codex: `item/commandExecution/requestApproval`, `item/fileChange/requestApproval`.
        let params = intent.get("params").unwrap_or(&Value::Null);
        f.tool = Some(match method.split('/').collect::<Vec<_>>().as_slice() {
            ["item", kind, _] => (*kind).to_owned(),
            _ => method.clone(),
        });
        f.directory = s(params, "cwd");
        f.input = match params.get("command") {
            Some(Value::String(c)) => Some(CallInput::Command(unwrap_shell(c))),
            Some(Value::Array(a)) => Some(CallInput::Command(unwrap_shell(&argv_line(a)))),
            _ => changed_paths(intent.get("item").unwrap_or(&Value::Null)),
        };
        return f;
    }
    if let Some(call) = intent.get("toolCall") {
        // ACP `session/request_permission`.
        f.tool = s(call, "kind");
        let raw = call.get("rawInput").unwrap_or(&Value::Null);
        let location = call
            .get("locations")
            .and_then(Value::as_array)
            .filter(|l| l.len() == 1)
            .and_then(|l| s(&l[0], "path"));
        f.input = if let Some(c) = s(raw, "command") {
            Some(CallInput::Command(unwrap_shell(&c)))
        } else if let Some(p) = location.or_else(|| path_of(raw)) {
            Some(CallInput::Path(p))
        } else if f.tool.as_deref() == Some("execute") {
            // Gemini CLI sends no raw input: its title is the command.
            s(call, "title").map(|c| CallInput::Command(unwrap_shell(&c)))
        } else {
            s(call, "title").map(CallInput::Other)
        };
        f.directory = s(raw, "cwd").or_else(|| stated_cwd(call));
        return f;
    }
    if intent.get("approval").and_then(Value::as_str) == Some("exec") {
        // OpenClaw's exec approval.
        let req = intent.get("request").unwrap_or(&Value::Null);
        f.tool = Some("exec".into());
        f.directory = s(req, "cwd");
        f.input = s(req, "command")
            .or_else(|| req.get("systemRunPlan").and_then(|p| s(p, "commandText")))
            .map(|c| CallInput::Command(unwrap_shell(&c)));
        return f;
    }
    // Claude Code `{tool, input}`, OpenClaw `{tool, args}`, plain SDK intents.
    f.tool = s(intent, "tool").or_else(|| s(intent, "kind"));
    let input = intent
        .get("input")
        .or_else(|| intent.get("args"))
        .filter(|v| v.is_object())
        .unwrap_or(intent);
    f.directory = s(input, "cwd").or_else(|| s(intent, "cwd"));
    f.input = if let Some(c) = s(input, "command") {
        Some(CallInput::Command(unwrap_shell(&c)))
    } else if let Some(p) = path_of(input) {
        Some(CallInput::Path(p))
    } else if let Some(u) = s(input, "url") {
        Some(CallInput::Other(u))
    } else if std::ptr::eq(input, intent) {
        None
    } else {
        crate::digest::canonical_json(input)
            .map(|b| CallInput::Other(String::from_utf8_lossy(&b).into_owned()))
    };
    f
}

/// The file a tool input names (`file_path`, `notebook_path`, `path`).
fn path_of(input: &Value) -> Option<String> {
    ["file_path", "notebook_path", "path"]
        .iter()
        .find_map(|k| input.get(*k).and_then(Value::as_str))
        .map(str::to_owned)
}

/// A Codex file change's path, when it changes one file.
fn changed_paths(item: &Value) -> Option<CallInput> {
    let changes = item.get("changes")?.as_array()?;
    match changes.as_slice() {
        [one] => one
            .get("path")
            .and_then(Value::as_str)
            .map(|p| CallInput::Path(p.to_owned())),
        many => {
            let paths: Vec<&str> = many
                .iter()
                .filter_map(|c| c.get("path").and_then(Value::as_str))
                .collect();
            (!paths.is_empty()).then(|| CallInput::Other(paths.join("\n")))
        }
    }
}

/// Gemini CLI states the directory in the call's content: `[current working directory …]`.
fn stated_cwd(call: &Value) -> Option<String> {
    for c in call.get("content")?.as_array()? {
        let text = c.pointer("/content/text").and_then(Value::as_str)?;
        if let Some(rest) = text.split("[current working directory ").nth(1)
            && let Some(end) = rest.find(']')
        {
            return Some(rest[..end].to_owned());
        }
    }
    None
}

/// An argv as one line (Codex may send the command as a list).
fn argv_line(a: &[Value]) -> String {
    a.iter()
        .filter_map(Value::as_str)
        .map(|w| {
            if !w.is_empty()
                && w.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@%+,".contains(&b))
            {
                w.to_owned()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `bash -lc 'npm test'` → `npm test`: runtimes wrap a command in a shell, and a rule is
/// written for the command. Unwrapped only when the whole line is one such call with one
/// single-quoted argument that holds no quote of its own; anything else stays as it is.
pub fn unwrap_shell(line: &str) -> String {
    let t = line.trim();
    for shell in [
        "/bin/bash",
        "/usr/bin/bash",
        "bash",
        "/bin/sh",
        "sh",
        "/bin/zsh",
        "zsh",
    ] {
        for flag in ["-lc", "-c"] {
            if let Some(rest) = t
                .strip_prefix(shell)
                .and_then(|r| r.strip_prefix(' '))
                .and_then(|r| r.strip_prefix(flag))
                .and_then(|r| r.strip_prefix(' '))
                && let Some(inner) = rest.strip_prefix('\'').and_then(|r| r.strip_suffix('\''))
                && !inner.contains('\'')
            {
                return inner.to_owned();
            }
        }
    }
    t.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_shell_wrapper_is_unwrapped_only_when_it_is_all_there_is() {
        assert_eq!(unwrap_shell("/bin/bash -lc 'npm test'"), "npm test");
        assert_eq!(unwrap_shell("sh -c 'touch /tmp/x'"), "touch /tmp/x");
        assert_eq!(unwrap_shell("npm test"), "npm test");
        assert_eq!(
            unwrap_shell("bash -lc 'echo '\\''x'\\'''"),
            "bash -lc 'echo '\\''x'\\'''"
        );
        assert_eq!(
            unwrap_shell("bash -lc 'a' && rm -rf ~"),
            "bash -lc 'a' && rm -rf ~"
        );
    }

    /// The fixture the UI's twin (`ui/src/rules.ts`, `intentFacts`) is tested with too.
    #[test]
    fn each_runtimes_intent_reads_as_the_shared_fixture_says() {
        let text = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../ui/src/web/fixtures/intent-facts.json"
        ));
        let fixture: Value = serde_json::from_str(text).unwrap();
        for case in fixture["cases"].as_array().unwrap() {
            assert_eq!(
                serde_json::to_value(intent_facts(&case["intent"])).unwrap(),
                case["facts"],
                "{}",
                case["name"]
            );
        }
    }

    #[test]
    fn a_plain_intent_has_its_tool_and_command() {
        let f = intent_facts(&json!({"tool": "deploy", "command": "make deploy", "cwd": "/srv"}));
        assert_eq!(f.tool.as_deref(), Some("deploy"));
        assert_eq!(f.input, Some(CallInput::Command("make deploy".into())));
        assert_eq!(f.directory.as_deref(), Some("/srv"));
        let f = intent_facts(&json!({"target": "prod"}));
        assert_eq!(f, CallFacts::default());
    }

    #[test]
    fn a_spec_reads_and_writes_match_and_leaves_out_what_is_absent() {
        let spec: RuleSpec = serde_json::from_value(json!({
            "match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "npm test"}},
            "answer": "allow"
        }))
        .unwrap();
        assert_eq!(spec.matches.tool.as_deref(), Some("Bash"));
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            json!({"match": {"tool": "Bash", "input": {"kind": "glob", "pattern": "npm test"}}, "answer": "allow"})
        );
        assert!(
            serde_json::from_value::<RuleSpec>(json!({"match": {}, "answer": "allow", "x": 1}))
                .is_err()
        );
    }
}
