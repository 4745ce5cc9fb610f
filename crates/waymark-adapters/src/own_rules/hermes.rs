//! Hermes Agent's own rules (0.19), from `$HERMES_HOME/config.yaml` (default
//! `~/.hermes/config.yaml`; there is no project file): `approvals.mode` (`manual`, `smart` —
//! the default, an auxiliary model approves what it finds low-risk — or `off`: nobody asked),
//! `approvals.deny` (globs refused even when nobody is asked) and `command_allowlist` (commands
//! or globs run unasked). Built in: Hermes asks only about commands that match its dangerous
//! patterns (`tools/approval.py`) and runs every other command unasked — reported as a rule,
//! since a Waymark deny rule never sees those calls.
//!
//! A list written as a string (`hermes config set command_allowlist '["npm test"]'` does that)
//! is read by Hermes as a set of characters, `*` among them: every command allowed (or, under
//! `deny`, refused). Reported as exactly that.

use std::path::{Path, PathBuf};

use serde_json::Value;
use waymark_proto::{OwnEffect, RuleMatch, RuntimeRule};

use super::{Places, glob, rule};

const RUNTIME: &str = "hermes";

pub(super) fn read(places: &Places, out: &mut Vec<RuntimeRule>) {
    let home = std::env::var_os("HERMES_HOME")
        .filter(|_| places.etc == Path::new("/etc"))
        .map(PathBuf::from)
        .unwrap_or_else(|| places.home.join(".hermes"));
    let path = home.join("config.yaml");
    let yaml = |t: &str| yaml_serde::from_str::<Value>(t).map_err(|e| e.to_string());
    if let Some(v) = super::parsed(RUNTIME, &path, "YAML", yaml, out) {
        config(&path, &v, out);
    }
}

fn config(path: &Path, v: &Value, out: &mut Vec<RuntimeRule>) {
    let approvals = v.get("approvals").cloned().unwrap_or(Value::Null);
    // YAML 1.1 reads a bare `off` as false; Hermes takes that as "off", and anything it does
    // not know as "manual".
    let mode = match approvals.get("mode") {
        None | Some(Value::Null) => "smart".to_owned(),
        Some(Value::Bool(false)) => "off".to_owned(),
        Some(Value::String(m)) if ["manual", "smart", "off"].contains(&m.as_str()) => m.clone(),
        Some(_) => "manual".to_owned(),
    };
    for (key, list, effect) in [
        ("approvals.deny", approvals.get("deny"), OwnEffect::Deny),
        (
            "command_allowlist",
            v.get("command_allowlist"),
            OwnEffect::Allow,
        ),
    ] {
        match list {
            Some(Value::Array(items)) => {
                for item in items.iter().filter_map(Value::as_str) {
                    out.push(rule(
                        RUNTIME,
                        path,
                        &format!("{key}: {item}"),
                        effect,
                        RuleMatch {
                            input: glob(fnmatch(item)),
                            ..RuleMatch::default()
                        },
                    ));
                }
            }
            Some(Value::String(s)) if !s.is_empty() => out.push(rule(
                RUNTIME,
                path,
                &format!("{key}: {s:?} (a string: Hermes reads each of its characters as an entry, `*` among them — every command)"),
                effect,
                RuleMatch::default(),
            )),
            _ => {}
        }
    }
    let (effect, says) = match mode.as_str() {
        "off" => (OwnEffect::Allow, "nobody is asked"),
        "smart" => (
            OwnEffect::Ask,
            "an auxiliary model approves what it finds low-risk, a person is asked about the rest",
        ),
        _ => (OwnEffect::Ask, "a person is asked"),
    };
    out.push(rule(
        RUNTIME,
        path,
        &format!("approvals.mode: {mode} ({says})"),
        effect,
        RuleMatch::default(),
    ));
    if mode != "off" {
        out.push(rule(
            RUNTIME,
            path,
            "(built in) only commands that match Hermes' dangerous patterns are asked about; every other command runs unasked",
            OwnEffect::Allow,
            RuleMatch::default(),
        ));
    }
}

/// An fnmatch glob in Waymark's syntax: `*` and `?` as they are, a `[…]` class widened to `?`.
fn fnmatch(p: &str) -> String {
    let mut out = String::new();
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                for d in chars.by_ref() {
                    if d == ']' {
                        break;
                    }
                }
                out.push('?');
            }
            '\\' | ']' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_text(text: &str) -> Vec<RuntimeRule> {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join(".hermes")).unwrap();
        std::fs::write(d.path().join(".hermes/config.yaml"), text).unwrap();
        let mut out = Vec::new();
        read(
            &Places {
                home: d.path().into(),
                allowed: vec![],
                etc: d.path().join("etc"),
            },
            &mut out,
        );
        out
    }

    #[test]
    fn a_config_gives_its_mode_its_deny_globs_and_its_allowlist() {
        // As Hermes 0.19 reads it (each line checked against `hermes` itself).
        let out = read_text(
            "approvals:\n  mode: manual\n  timeout: 60\n  cron_mode: deny\n  deny:\n    - \"git push --force*\"\ncommand_allowlist:\n  - npm test\n  - \"podman *\"\n",
        );
        let seen: Vec<(OwnEffect, Option<String>)> = out
            .iter()
            .map(|r| (r.effect, r.matches.input.clone().map(|i| i.pattern)))
            .collect();
        let s = |x: &str| Some(x.to_owned());
        assert_eq!(
            seen,
            vec![
                (OwnEffect::Deny, s("git push --force*")),
                (OwnEffect::Allow, s("npm test")),
                (OwnEffect::Allow, s("podman *")),
                (OwnEffect::Ask, None),
                (OwnEffect::Allow, None),
            ]
        );
        assert_eq!(out[3].text, "approvals.mode: manual (a person is asked)");
        assert!(out[4].text.starts_with("(built in)"));
    }

    #[test]
    fn lists_written_as_strings_allow_or_refuse_everything_and_off_asks_nobody() {
        // What `hermes config set approvals.mode off` and `… command_allowlist '[…]'` wrote.
        let out = read_text(
            "approvals:\n  mode: 'off'\n  deny: '[\"git push --force*\"]'\ncommand_allowlist: '[\"npm test\", \"podman *\"]'\n",
        );
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0].effect, OwnEffect::Deny);
        assert!(out[0].text.contains("a string"), "{}", out[0].text);
        assert_eq!(out[0].matches.input, None);
        assert_eq!(out[1].effect, OwnEffect::Allow);
        assert!(out[1].text.contains("every command"), "{}", out[1].text);
        assert_eq!(
            (out[2].effect, out[2].text.as_str()),
            (OwnEffect::Allow, "approvals.mode: off (nobody is asked)")
        );
        // A bare `off` (YAML 1.1 false) reads the same; no mode is Hermes' default, smart.
        assert!(
            read_text("approvals:\n  mode: off\n")
                .iter()
                .any(|r| r.text.starts_with("approvals.mode: off"))
        );
        assert!(
            read_text("model: x\n")
                .iter()
                .any(|r| r.text.starts_with("approvals.mode: smart"))
        );
        assert!(
            read_text(": : :\n  - [")
                .iter()
                .all(|r| r.text.starts_with("(not read: not YAML"))
        );
    }

    #[test]
    fn an_fnmatch_class_widens_to_one_character() {
        assert_eq!(fnmatch("rm -[rf]* /"), "rm -?* /");
    }
}
