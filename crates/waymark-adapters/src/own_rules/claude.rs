//! Claude Code's permission rules (2.1.328): `permissions.{allow, deny, ask}`,
//! `permissions.defaultMode` and `denyInsteadOfPrompting` in its settings files — managed
//! (`/etc/claude-code/managed-settings.json` and `managed-settings.d/*.json`), the user's
//! (`$CLAUDE_CONFIG_DIR` or `~/.claude/settings.json`), and each project's
//! (`.claude/settings.json`, `.claude/settings.local.json`). A project's rules hold in that
//! project's directory only. Modes that ask nobody: `bypassPermissions` and `auto` (a
//! classifier answers) run calls, `dontAsk` refuses what no rule allows.
//!
//! Rule syntax: `Tool` or `Tool(specifier)`. For `Bash` the specifier is a command, `:*` at its
//! end a prefix (`Bash(npm test:*)`) and `*` a wildcard anywhere; for the file tools a
//! gitignore-style path (`//abs`, `~/in-home`, `/from-the-settings-root`, `relative`); for
//! `WebFetch` `domain:host`. `Edit` rules cover every tool that edits files.

use std::path::{Path, PathBuf};

use serde_json::Value;
use waymark_proto::{OwnEffect, RuleMatch, RuntimeRule};

use super::{Places, glob, json_of, literal, plain_dir, rule};

const RUNTIME: &str = "claude-code";

pub(super) fn read(places: &Places, projects: &[PathBuf], out: &mut Vec<RuntimeRule>) {
    let user_dir = std::env::var_os("CLAUDE_CONFIG_DIR")
        .filter(|_| places.etc == Path::new("/etc"))
        .map(PathBuf::from)
        .unwrap_or_else(|| places.home.join(".claude"));
    let managed = places.etc.join("claude-code");
    file(places, &managed.join("managed-settings.json"), None, out);
    for f in super::files_in(&managed.join("managed-settings.d"), "json") {
        file(places, &f, None, out);
    }
    file(places, &user_dir.join("settings.json"), None, out);
    for p in projects {
        for name in ["settings.json", "settings.local.json"] {
            file(places, &p.join(".claude").join(name), Some(p), out);
        }
    }
}

/// One settings file's rules; `project`: the directory they hold in.
fn file(places: &Places, path: &Path, project: Option<&Path>, out: &mut Vec<RuntimeRule>) {
    let Some(v) = json_of(RUNTIME, path, out) else {
        return;
    };
    let Some(perms) = v.get("permissions") else {
        return;
    };
    let scope = project.and_then(plain_dir);
    let root = project.map_or_else(
        || path.parent().unwrap_or(path).to_path_buf(),
        Path::to_path_buf,
    );
    for (key, effect) in [
        ("deny", OwnEffect::Deny),
        ("ask", OwnEffect::Ask),
        ("allow", OwnEffect::Allow),
    ] {
        for r in perms
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(text) = r.as_str() else { continue };
            for m in parse(text, &places.home, &root) {
                out.push(rule(
                    RUNTIME,
                    path,
                    text,
                    effect,
                    RuleMatch {
                        directory: scope.clone(),
                        ..m
                    },
                ));
            }
        }
    }
    if let Some(mode) = perms.get("defaultMode").and_then(Value::as_str) {
        let text = format!("defaultMode: {mode}");
        let everything = RuleMatch {
            directory: scope.clone(),
            ..RuleMatch::default()
        };
        match mode {
            // Every call runs, nobody asked.
            "bypassPermissions" => {
                out.push(rule(RUNTIME, path, &text, OwnEffect::Allow, everything))
            }
            // A model classifier answers in a person's place: nobody is asked.
            "auto" => out.push(rule(RUNTIME, path, &text, OwnEffect::Allow, everything)),
            // Every call not allowed by a rule is refused, nobody asked.
            "dontAsk" => out.push(rule(RUNTIME, path, &text, OwnEffect::Deny, everything)),
            // File edits run unasked, and the commands that make, move and remove files.
            "acceptEdits" => {
                for tool in EDIT_TOOLS {
                    out.push(rule(
                        RUNTIME,
                        path,
                        &text,
                        OwnEffect::Allow,
                        RuleMatch {
                            tool: Some((*tool).into()),
                            ..everything.clone()
                        },
                    ));
                }
                for cmd in ACCEPT_EDITS_COMMANDS {
                    out.push(rule(
                        RUNTIME,
                        path,
                        &text,
                        OwnEffect::Allow,
                        RuleMatch {
                            tool: Some("Bash".into()),
                            input: glob(format!("{cmd}*")),
                            ..everything.clone()
                        },
                    ));
                }
            }
            _ => {}
        }
    }
    if perms.get("denyInsteadOfPrompting").and_then(Value::as_bool) == Some(true) {
        out.push(rule(
            RUNTIME,
            path,
            "denyInsteadOfPrompting: true",
            OwnEffect::Deny,
            RuleMatch {
                directory: scope,
                ..RuleMatch::default()
            },
        ));
    }
}

/// The shell commands `acceptEdits` runs unasked (2.1.328).
const ACCEPT_EDITS_COMMANDS: &[&str] = &["mkdir", "touch", "rm", "rmdir", "mv", "cp", "sed"];

/// The tools an `Edit` rule (and `acceptEdits`) covers.
const EDIT_TOOLS: &[&str] = &["Edit", "Write", "MultiEdit", "NotebookEdit"];

/// One rule's matches: usually one, one per tool for `Edit(…)`.
fn parse(text: &str, home: &Path, root: &Path) -> Vec<RuleMatch> {
    let text = text.trim();
    let (tool, spec) = match text.split_once('(') {
        Some((t, rest)) if rest.ends_with(')') => (t.trim(), Some(&rest[..rest.len() - 1])),
        _ => (text, None),
    };
    if tool.is_empty() {
        return Vec::new();
    }
    let spec = spec.map(str::trim).filter(|s| !s.is_empty() && *s != "*");
    let input = spec.and_then(|s| match tool {
        "Bash" => glob(command(s)),
        "Read" | "Edit" | "Write" | "MultiEdit" | "NotebookEdit" | "Glob" | "Grep" => {
            glob(path(s, home, root))
        }
        "WebFetch" => s
            .strip_prefix("domain:")
            .and_then(|d| glob(format!("*{}*", literal(d)))),
        // Another tool's specifier Waymark cannot read: all its calls (widened).
        _ => None,
    });
    let tools: Vec<&str> = if tool == "Edit" {
        EDIT_TOOLS.to_vec()
    } else {
        vec![tool]
    };
    tools
        .into_iter()
        .map(|t| RuleMatch {
            tool: Some(t.into()),
            input: input.clone(),
            ..RuleMatch::default()
        })
        .collect()
}

/// A `Bash` specifier as a glob: `:*` at the end is a prefix, `*` a wildcard, the rest itself.
fn command(spec: &str) -> String {
    let (body, prefix) = match spec.strip_suffix(":*") {
        Some(b) => (b, true),
        None => (spec, false),
    };
    let mut out: String = body.split('*').map(literal).collect::<Vec<_>>().join("*");
    if prefix {
        out.push('*');
    }
    out
}

/// A file rule's path as an absolute glob: `//x` is `/x`, `~/x` under the home, `/x` under the
/// settings' root, anything else anywhere (`**/x`). Its `*` and `**` keep their meaning.
fn path(spec: &str, home: &Path, root: &Path) -> String {
    let join = |base: &Path, rest: &str| {
        let b = base.to_string_lossy();
        format!("{}/{}", literal(b.trim_end_matches('/')), rest)
    };
    if let Some(rest) = spec.strip_prefix("//") {
        format!("/{rest}")
    } else if let Some(rest) = spec.strip_prefix("~/") {
        join(home, rest)
    } else if let Some(rest) = spec.strip_prefix('/') {
        join(root, rest)
    } else {
        format!("**/{}", spec.trim_start_matches("./"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use waymark_proto::{InputPattern, PatternKind};

    fn g(p: &str) -> Option<InputPattern> {
        Some(InputPattern {
            kind: PatternKind::Glob,
            pattern: p.into(),
        })
    }

    #[test]
    fn bash_rules_read_as_globs_over_the_command() {
        let h = Path::new("/home/a");
        let m = parse("Bash(npm test:*)", h, h);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].tool.as_deref(), Some("Bash"));
        assert_eq!(m[0].input, g("npm test*"));
        assert_eq!(parse("Bash(git * main)", h, h)[0].input, g("git * main"));
        assert_eq!(
            parse("Bash(echo [x]?)", h, h)[0].input,
            g("echo \\[x\\]\\?")
        );
        assert_eq!(parse("Bash", h, h)[0].input, None);
        assert_eq!(parse("Bash(*)", h, h)[0].input, None);
        assert_eq!(
            parse("mcp__github__create_issue", h, h)[0].tool.as_deref(),
            Some("mcp__github__create_issue")
        );
    }

    #[test]
    fn file_rules_read_as_absolute_globs_and_edit_covers_every_editing_tool() {
        let home = Path::new("/home/a");
        let root = Path::new("/home/a/src/shop");
        assert_eq!(parse("Read(//etc/**)", home, root)[0].input, g("/etc/**"));
        assert_eq!(
            parse("Read(~/.ssh/**)", home, root)[0].input,
            g("/home/a/.ssh/**")
        );
        assert_eq!(
            parse("Read(/secrets/*)", home, root)[0].input,
            g("/home/a/src/shop/secrets/*")
        );
        assert_eq!(parse("Read(./.env)", home, root)[0].input, g("**/.env"));
        let edit = parse("Edit(src/**)", home, root);
        let tools: Vec<_> = edit.iter().map(|m| m.tool.clone().unwrap()).collect();
        assert_eq!(tools, ["Edit", "Write", "MultiEdit", "NotebookEdit"]);
        assert!(edit.iter().all(|m| m.input == g("**/src/**")));
        assert_eq!(
            parse("WebFetch(domain:example.com)", home, root)[0].input,
            g("*example.com*")
        );
    }

    #[test]
    fn settings_files_give_their_rules_with_their_scope_and_mode() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        let shop = d.path().join("src/shop");
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::create_dir_all(shop.join(".claude")).unwrap();
        std::fs::write(
            home.join(".claude/settings.json"),
            r#"{"permissions": {"allow": ["Bash(npm test:*)"], "deny": ["Read(~/.ssh/**)"]}, "model": "opus"}"#,
        )
        .unwrap();
        std::fs::write(
            shop.join(".claude/settings.local.json"),
            r#"{"permissions": {"defaultMode": "bypassPermissions", "ask": ["Bash(git push:*)"]}}"#,
        )
        .unwrap();
        std::fs::write(shop.join(".claude/settings.json"), "{ not json").unwrap();
        let places = Places {
            home: home.clone(),
            allowed: vec![d.path().join("src")],
            etc: d.path().join("etc"),
        };
        let mut out = Vec::new();
        read(&places, &places.projects(), &mut out);
        let seen: Vec<(String, OwnEffect, Option<String>)> = out
            .iter()
            .map(|r| (r.text.clone(), r.effect, r.matches.directory.clone()))
            .collect();
        let shop_dir = Some(shop.to_string_lossy().into_owned());
        assert_eq!(
            seen,
            vec![
                ("Read(~/.ssh/**)".into(), OwnEffect::Deny, None),
                ("Bash(npm test:*)".into(), OwnEffect::Allow, None),
                (out[2].text.clone(), OwnEffect::Ask, None),
                ("Bash(git push:*)".into(), OwnEffect::Ask, shop_dir.clone()),
                (
                    "defaultMode: bypassPermissions".into(),
                    OwnEffect::Allow,
                    shop_dir
                ),
            ]
        );
        assert!(
            out[2].text.starts_with("(not read: not JSON"),
            "{}",
            out[2].text
        );
        assert!(
            out.iter()
                .all(|r| r.matches.runtime.as_deref() == Some("claude-code"))
        );
        assert_eq!(
            out[0].matches.input,
            g(&format!("{}/.ssh/**", home.display()))
        );
    }
}
