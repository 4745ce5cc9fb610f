//! Gemini CLI's own rules (0.61): `tools.allowed` (run without asking), `tools.exclude`
//! (refused) and `tools.confirmationRequired` (asks) in its settings — the system's
//! (`/etc/gemini-cli/settings.json`) and the user's (`$GEMINI_CLI_HOME` or `~/.gemini`) — and
//! the `[[rule]]`s of its policy files (`/etc/gemini-cli/policies/*.toml`,
//! `~/.gemini/policies/*.toml`, where "Always allow" saves): `toolName`, `commandPrefix` or
//! `commandRegex`, `decision` `allow` | `deny` | `ask_user`. A workspace's own settings count only
//! in a trusted folder and its policy files not at all in this version; neither is read here.
//!
//! Over ACP a call carries its kind, not its tool's name, so a rule's tool is named by kind
//! (`run_shell_command` is `execute`); a tool of unknown kind covers every kind (widened).

use std::path::{Path, PathBuf};

use serde_json::Value;
use waymark_proto::{InputPattern, OwnEffect, PatternKind, RuleMatch, RuntimeRule};

use super::{Places, glob, json_of, literal, rule, toml_of};

const RUNTIME: &str = "gemini";

pub(super) fn read(places: &Places, _projects: &[PathBuf], out: &mut Vec<RuntimeRule>) {
    let home = std::env::var_os("GEMINI_CLI_HOME")
        .filter(|_| places.etc == Path::new("/etc"))
        .map(PathBuf::from)
        .unwrap_or_else(|| places.home.clone())
        .join(".gemini");
    let etc = places.etc.join("gemini-cli");
    settings(&etc.join("settings.json"), out);
    settings(&home.join("settings.json"), out);
    for dir in [etc.join("policies"), home.join("policies")] {
        for f in super::files_in(&dir, "toml") {
            policy(&f, out);
        }
    }
}

/// The ACP kind a Gemini CLI tool's calls carry; `None` when unknown.
fn kind(tool: &str) -> Option<&'static str> {
    Some(match tool {
        "run_shell_command" | "ShellTool" => "execute",
        "write_file" | "replace" | "WriteFileTool" | "EditTool" => "edit",
        "read_file" | "read_many_files" | "ReadFileTool" => "read",
        "glob" | "search_file_content" | "list_directory" | "grep" => "search",
        "web_fetch" | "WebFetchTool" => "fetch",
        _ => return None,
    })
}

/// A tool entry of the settings (`run_shell_command(npm test)`, `write_file`) as a match.
fn entry(text: &str) -> RuleMatch {
    let (tool, arg) = match text.split_once('(') {
        Some((t, rest)) if rest.ends_with(')') => (t.trim(), Some(&rest[..rest.len() - 1])),
        _ => (text.trim(), None),
    };
    let kind = kind(tool);
    RuleMatch {
        tool: kind.map(str::to_owned),
        // A shell entry's argument is a command prefix.
        input: arg
            .filter(|a| kind == Some("execute") && !a.trim().is_empty())
            .and_then(|a| glob(format!("{}*", literal(a.trim())))),
        ..RuleMatch::default()
    }
}

fn settings(path: &Path, out: &mut Vec<RuntimeRule>) {
    let Some(v) = json_of(RUNTIME, path, out) else {
        return;
    };
    let Some(tools) = v.get("tools") else {
        return;
    };
    for (key, effect) in [
        ("exclude", OwnEffect::Deny),
        ("confirmationRequired", OwnEffect::Ask),
        ("allowed", OwnEffect::Allow),
    ] {
        for t in tools
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(t) = t.as_str() {
                out.push(rule(
                    RUNTIME,
                    path,
                    &format!("tools.{key}: {t}"),
                    effect,
                    entry(t),
                ));
            }
        }
    }
}

/// One policy file's `[[rule]]`s.
fn policy(path: &Path, out: &mut Vec<RuntimeRule>) {
    let Some(v) = toml_of(RUNTIME, path, out) else {
        return;
    };
    let strings = |v: Option<&toml::Value>| -> Vec<String> {
        match v {
            Some(toml::Value::String(s)) => vec![s.clone()],
            Some(toml::Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        }
    };
    for r in v
        .get("rule")
        .and_then(toml::Value::as_array)
        .into_iter()
        .flatten()
    {
        let effect = match r.get("decision").and_then(toml::Value::as_str) {
            Some("allow") => OwnEffect::Allow,
            Some("deny") => OwnEffect::Deny,
            Some("ask_user") => OwnEffect::Ask,
            _ => continue,
        };
        let tools = strings(r.get("toolName"));
        let prefixes = strings(r.get("commandPrefix"));
        let regex = r.get("commandRegex").and_then(toml::Value::as_str);
        let text = describe(&tools, &prefixes, regex, effect);
        let inputs: Vec<Option<InputPattern>> = if let Some(re) = regex {
            vec![Some(InputPattern {
                kind: PatternKind::Regex,
                pattern: re.chars().take(500).collect(),
            })]
        } else if prefixes.is_empty() {
            vec![None]
        } else {
            prefixes
                .iter()
                .map(|p| glob(format!("{}*", literal(p))))
                .collect()
        };
        let kinds: Vec<Option<String>> =
            if tools.is_empty() || tools.iter().any(|t| t.contains('*')) {
                vec![None]
            } else {
                let mut k: Vec<Option<String>> =
                    tools.iter().map(|t| kind(t).map(str::to_owned)).collect();
                if k.contains(&None) {
                    k = vec![None];
                }
                k.dedup();
                k
            };
        for tool in &kinds {
            for input in &inputs {
                out.push(rule(
                    RUNTIME,
                    path,
                    &text,
                    effect,
                    RuleMatch {
                        tool: tool.clone(),
                        input: input.clone(),
                        ..RuleMatch::default()
                    },
                ));
            }
        }
    }
}

fn describe(
    tools: &[String],
    prefixes: &[String],
    regex: Option<&str>,
    effect: OwnEffect,
) -> String {
    let mut parts = vec![format!("toolName = {:?}", tools.join(", "))];
    if !prefixes.is_empty() {
        parts.push(format!("commandPrefix = {:?}", prefixes.join(", ")));
    }
    if let Some(re) = regex {
        parts.push(format!("commandRegex = {re:?}"));
    }
    let decision = match effect {
        OwnEffect::Allow => "allow",
        OwnEffect::Deny => "deny",
        OwnEffect::Ask => "ask_user",
    };
    parts.push(format!("decision = \"{decision}\""));
    format!("[[rule]] {}", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_and_policy_files_read_by_the_kind_a_call_carries() {
        let d = tempfile::tempdir().unwrap();
        let g = d.path().join(".gemini");
        std::fs::create_dir_all(g.join("policies")).unwrap();
        std::fs::write(
            g.join("settings.json"),
            r#"{"tools": {"allowed": ["run_shell_command(npm test)", "read_file"], "exclude": ["web_fetch"]}}"#,
        )
        .unwrap();
        std::fs::write(
            g.join("policies/auto-saved.toml"),
            r#"
[[rule]]
toolName = "run_shell_command"
commandPrefix = ["git status", "git diff"]
decision = "allow"
priority = 100

[[rule]]
toolName = "run_shell_command"
commandRegex = "rm -rf .*"
decision = "deny"
priority = 900

[[rule]]
toolName = "mcp_github_*"
decision = "ask_user"
priority = 10
"#,
        )
        .unwrap();
        let places = Places {
            home: d.path().into(),
            allowed: vec![],
            etc: d.path().join("etc"),
        };
        let mut out = Vec::new();
        read(&places, &[], &mut out);
        let seen: Vec<(OwnEffect, Option<String>, Option<String>)> = out
            .iter()
            .map(|r| {
                (
                    r.effect,
                    r.matches.tool.clone(),
                    r.matches.input.clone().map(|i| i.pattern),
                )
            })
            .collect();
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(
            seen,
            vec![
                (OwnEffect::Deny, s("fetch"), None),
                (OwnEffect::Allow, s("execute"), s("npm test*")),
                (OwnEffect::Allow, s("read"), None),
                (OwnEffect::Allow, s("execute"), s("git status*")),
                (OwnEffect::Allow, s("execute"), s("git diff*")),
                (OwnEffect::Deny, s("execute"), s("rm -rf .*")),
                (OwnEffect::Ask, None, None),
            ]
        );
        assert_eq!(out[0].text, "tools.exclude: web_fetch");
        assert!(
            out[3]
                .text
                .starts_with("[[rule]] toolName = \"run_shell_command\""),
            "{}",
            out[3].text
        );
        assert!(out.iter().all(|r| r.runtime == "gemini"));
    }
}
