//! Codex's own rules (0.169): `approval_policy` in `/etc/codex/config.toml`,
//! `$CODEX_HOME/config.toml` and `/etc/codex/managed_config.toml` (`never`: Codex asks nobody;
//! `granular`: each `false` is refused unasked), and the exec-policy rules in
//! `$CODEX_HOME/rules/*.rules` — Starlark calls `prefix_rule(pattern = [...], decision =
//! "allow" | "prompt" | "forbidden")` (`allow` by default), each element of `pattern` a word or
//! a list of alternative words; under `never` a `prompt` is refused. A project's own
//! `.codex/config.toml` and `.codex/rules/` count only when the user's config trusts it
//! (`[projects."/abs"] trust_level = "trusted"`), and hold in that project only.

use std::path::{Path, PathBuf};

use waymark_proto::{OwnEffect, RuleMatch, RuntimeRule};

use super::{Places, glob, literal, rule, text_of, toml_of, unreadable};

const RUNTIME: &str = "codex";
/// The tool name Codex's command approvals carry (`item/commandExecution/requestApproval`).
const TOOL: &str = "commandExecution";
/// Most alternatives one `prefix_rule` is spelled out into.
const MAX_SPELLED: usize = 32;

pub(super) fn read(places: &Places, projects: &[PathBuf], out: &mut Vec<RuntimeRule>) {
    let home = std::env::var_os("CODEX_HOME")
        .filter(|_| places.etc == Path::new("/etc"))
        .map(PathBuf::from)
        .unwrap_or_else(|| places.home.join(".codex"));
    let etc = places.etc.join("codex");
    config(&etc.join("config.toml"), None, out);
    let user = config(&home.join("config.toml"), None, out);
    config(&etc.join("managed_config.toml"), None, out);
    // What asks becomes what is refused where nobody may be asked.
    let never = |policy: &Option<String>| policy.as_deref() == Some("never");
    let user_never = never(&user.policy);
    for f in super::files_in(&home.join("rules"), "rules") {
        rules_file(&f, None, user_never, out);
    }
    // A project's own config and rules count only once its owner trusted it.
    for p in projects {
        let Some(dir) = super::plain_dir(p) else {
            continue;
        };
        if !user.trusted.iter().any(|t| t == &dir) {
            continue;
        }
        let own = config(&p.join(".codex/config.toml"), Some(dir.as_str()), out);
        let asks_nobody = never(&own.policy) || (own.policy.is_none() && user_never);
        for f in super::files_in(&p.join(".codex/rules"), "rules") {
            rules_file(&f, Some(dir.as_str()), asks_nobody, out);
        }
    }
}

/// What a config file says that the rules files depend on.
#[derive(Debug, Default)]
struct Config {
    policy: Option<String>,
    /// The projects it trusts (`[projects."/abs"] trust_level = "trusted"`).
    trusted: Vec<String>,
}

/// `approval_policy` of a config file (reported), and the projects it trusts.
fn config(path: &Path, scope: Option<&str>, out: &mut Vec<RuntimeRule>) -> Config {
    let Some(v) = toml_of(RUNTIME, path, out) else {
        return Config::default();
    };
    let trusted = v
        .get("projects")
        .and_then(toml::Value::as_table)
        .map(|t| {
            t.iter()
                .filter(|(_, p)| {
                    p.get("trust_level").and_then(toml::Value::as_str) == Some("trusted")
                })
                .map(|(k, _)| k.trim_end_matches('/').to_owned())
                .collect()
        })
        .unwrap_or_default();
    let everything = RuleMatch {
        directory: scope.map(str::to_owned),
        ..RuleMatch::default()
    };
    let policy = match v.get("approval_policy") {
        Some(toml::Value::String(p)) => {
            let effect = match p.as_str() {
                // Nobody is asked: what the sandbox lets run, runs.
                "never" => OwnEffect::Allow,
                _ => OwnEffect::Ask,
            };
            out.push(rule(
                RUNTIME,
                path,
                &format!("approval_policy = \"{p}\""),
                effect,
                everything,
            ));
            Some(p.clone())
        }
        Some(toml::Value::Table(t)) => {
            // `granular = {sandbox_approval, rules, …}`: each `false` is refused unasked.
            if let Some(g) = t.get("granular").and_then(toml::Value::as_table) {
                let refused: Vec<&str> = g
                    .iter()
                    .filter(|(_, v)| v.as_bool() == Some(false))
                    .map(|(k, _)| k.as_str())
                    .collect();
                let effect = if refused.is_empty() {
                    OwnEffect::Ask
                } else {
                    OwnEffect::Deny
                };
                out.push(rule(
                    RUNTIME,
                    path,
                    &format!(
                        "approval_policy = granular (refused unasked: {})",
                        if refused.is_empty() {
                            "nothing".into()
                        } else {
                            refused.join(", ")
                        }
                    ),
                    effect,
                    everything,
                ));
            }
            Some("granular".into())
        }
        _ => None,
    };
    Config { policy, trusted }
}

/// One rules file's `prefix_rule`s.
fn rules_file(path: &Path, scope: Option<&str>, asks_nobody: bool, out: &mut Vec<RuntimeRule>) {
    let Some(text) = text_of(RUNTIME, path, out) else {
        return;
    };
    match prefix_rules(&text) {
        Ok(rules) => {
            for r in rules {
                let effect = match r.decision.as_str() {
                    "forbidden" => OwnEffect::Deny,
                    "prompt" if asks_nobody => OwnEffect::Deny,
                    "prompt" => OwnEffect::Ask,
                    _ => OwnEffect::Allow,
                };
                for words in spelled(&r.pattern) {
                    let mut pattern = words
                        .iter()
                        .map(|w| literal(w))
                        .collect::<Vec<_>>()
                        .join(" ");
                    pattern.push('*');
                    out.push(rule(
                        RUNTIME,
                        path,
                        &r.text,
                        effect,
                        RuleMatch {
                            tool: Some(TOOL.into()),
                            input: glob(pattern),
                            directory: scope.map(str::to_owned),
                            ..RuleMatch::default()
                        },
                    ));
                }
            }
        }
        Err(e) => out.push(unreadable(RUNTIME, path, &e)),
    }
}

/// A `prefix_rule` call as written.
#[derive(Debug, PartialEq)]
struct PrefixRule {
    /// Each position's alternatives.
    pattern: Vec<Vec<String>>,
    decision: String,
    /// The call's source text, in one line.
    text: String,
}

/// Every word sequence a pattern's alternatives spell, at most [`MAX_SPELLED`] (then the
/// positions after the one that overflowed are dropped: the prefix is shorter, so wider).
fn spelled(pattern: &[Vec<String>]) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> = vec![Vec::new()];
    for alts in pattern {
        if out.len() * alts.len() > MAX_SPELLED {
            break;
        }
        out = out
            .iter()
            .flat_map(|pre| {
                alts.iter().map(move |a| {
                    let mut p = pre.clone();
                    p.push(a.clone());
                    p
                })
            })
            .collect();
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Punct(char),
}

/// The Starlark of a rules file, as far as rules need: identifiers, strings, `( ) [ ] , =`,
/// `#` comments; numbers and other expressions are skipped as words.
fn tokens(text: &str) -> Result<Vec<(Tok, usize)>, String> {
    let b: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '"' || c == '\'' {
            let start = i;
            let triple = b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c);
            i += if triple { 3 } else { 1 };
            let mut s = String::new();
            loop {
                let Some(&d) = b.get(i) else {
                    return Err(format!("a string that never ends (at {start})"));
                };
                if triple && d == c && b.get(i + 1) == Some(&c) && b.get(i + 2) == Some(&c) {
                    i += 3;
                    break;
                }
                if !triple && d == c {
                    i += 1;
                    break;
                }
                if d == '\\' {
                    let e = b.get(i + 1).copied().unwrap_or('\\');
                    s.push(match e {
                        'n' => '\n',
                        't' => '\t',
                        other => other,
                    });
                    i += 2;
                } else {
                    s.push(d);
                    i += 1;
                }
            }
            out.push((Tok::Str(s), start));
        } else if c.is_alphanumeric() || c == '_' || c == '.' || c == '-' {
            let start = i;
            while i < b.len() && (b[i].is_alphanumeric() || "_.-".contains(b[i])) {
                i += 1;
            }
            out.push((Tok::Ident(b[start..i].iter().collect()), start));
        } else {
            out.push((Tok::Punct(c), i));
            i += 1;
        }
    }
    Ok(out)
}

/// The `prefix_rule(...)` calls of a rules file.
fn prefix_rules(text: &str) -> Result<Vec<PrefixRule>, String> {
    let toks = tokens(text)?;
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let is_call = toks[i].0 == Tok::Ident("prefix_rule".into())
            && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('('));
        if !is_call {
            i += 1;
            continue;
        }
        let start = toks[i].1;
        i += 2;
        let mut pattern = None;
        let mut decision = "allow".to_owned();
        let mut depth = 0usize;
        let end;
        loop {
            let Some((t, at)) = toks.get(i) else {
                return Err("a `prefix_rule(` that never closes".into());
            };
            match t {
                Tok::Punct(')') if depth == 0 => {
                    end = *at;
                    i += 1;
                    break;
                }
                Tok::Punct('(' | '[') => depth += 1,
                Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
                Tok::Ident(name)
                    if depth == 0 && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Punct('=')) =>
                {
                    match name.as_str() {
                        "pattern" => {
                            let (p, next) = list(&toks, i + 2)?;
                            pattern = Some(p);
                            i = next;
                            continue;
                        }
                        "decision" => {
                            if let Some((Tok::Str(d), _)) = toks.get(i + 2) {
                                decision = d.clone();
                            }
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
            i += 1;
        }
        let pattern = pattern.ok_or("a `prefix_rule` without `pattern`")?;
        if pattern.is_empty() || pattern.iter().any(Vec::is_empty) {
            return Err("a `prefix_rule` whose `pattern` is empty".into());
        }
        let source: String = chars[start..=end].iter().collect();
        out.push(PrefixRule {
            pattern,
            decision,
            text: source.split_whitespace().collect::<Vec<_>>().join(" "),
        });
    }
    Ok(out)
}

/// A pattern list at `i` (`[` …): each element a string or a list of strings. Returns the
/// list and the index after its `]`.
fn list(toks: &[(Tok, usize)], mut i: usize) -> Result<(Vec<Vec<String>>, usize), String> {
    if toks.get(i).map(|t| &t.0) != Some(&Tok::Punct('[')) {
        return Err("`pattern` is not a list".into());
    }
    i += 1;
    let mut out = Vec::new();
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Punct(']')) => return Ok((out, i + 1)),
            Some(Tok::Punct(',')) => i += 1,
            Some(Tok::Str(s)) => {
                out.push(vec![s.clone()]);
                i += 1;
            }
            Some(Tok::Punct('[')) => {
                let mut alts = Vec::new();
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.0) {
                        Some(Tok::Punct(']')) => break,
                        Some(Tok::Punct(',')) => {}
                        Some(Tok::Str(s)) => alts.push(s.clone()),
                        _ => return Err("a `pattern` alternative that is not a string".into()),
                    }
                    i += 1;
                }
                out.push(alts);
                i += 1;
            }
            _ => {
                return Err("a `pattern` element that is not a string or a list of strings".into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_rules_are_read_with_their_alternatives_and_decisions() {
        let text = r#"
# made by Codex when a person chose "always"
prefix_rule(pattern = ["npm", "test"], decision = "allow")
prefix_rule(
    pattern = ["git", ["push", "reset"]],
    decision = "forbidden",
    justification = "never rewrite (the remote)",
    match = [["git", "push", "origin"]],
)
prefix_rule(pattern=['rm'], decision="prompt")
"#;
        let r = prefix_rules(text).unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(
            r[0].pattern,
            vec![vec!["npm".to_owned()], vec!["test".into()]]
        );
        assert_eq!(
            r[0].text,
            r#"prefix_rule(pattern = ["npm", "test"], decision = "allow")"#
        );
        assert_eq!(r[1].decision, "forbidden");
        assert_eq!(r[1].pattern[1], vec!["push".to_owned(), "reset".into()]);
        assert_eq!(spelled(&r[1].pattern).len(), 2);
        assert_eq!(r[2].decision, "prompt");
        assert!(prefix_rules("prefix_rule(pattern = [").is_err());
        assert!(prefix_rules("prefix_rule(decision = \"allow\")").is_err());
        assert!(prefix_rules("prefix_rule(pattern = [], decision = \"allow\")").is_err());
    }

    #[test]
    fn a_codex_home_gives_its_policy_and_its_rules() {
        let d = tempfile::tempdir().unwrap();
        let codex = d.path().join(".codex");
        std::fs::create_dir_all(codex.join("rules")).unwrap();
        std::fs::write(
            codex.join("config.toml"),
            "model = \"gpt-5\"\napproval_policy = \"never\"\n",
        )
        .unwrap();
        std::fs::write(
            codex.join("rules/default.rules"),
            "prefix_rule(pattern = [\"git\", [\"push\", \"reset\"]], decision = \"forbidden\")\n",
        )
        .unwrap();
        std::fs::write(codex.join("rules/notes.txt"), "not a rules file").unwrap();
        let places = Places {
            home: d.path().into(),
            allowed: vec![],
            etc: d.path().join("etc"),
        };
        let mut out = Vec::new();
        read(&places, &[], &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0].text, "approval_policy = \"never\"");
        assert_eq!(out[0].effect, OwnEffect::Allow);
        assert_eq!(out[0].matches.tool, None);
        let pats: Vec<_> = out[1..]
            .iter()
            .map(|r| r.matches.input.clone().unwrap().pattern)
            .collect();
        assert_eq!(pats, ["git push*", "git reset*"]);
        assert!(
            out[1..]
                .iter()
                .all(|r| r.effect == OwnEffect::Deny && r.matches.tool.as_deref() == Some(TOOL))
        );
    }

    #[test]
    fn a_trusted_projects_rules_hold_in_it_and_never_turns_prompt_into_refused() {
        let d = tempfile::tempdir().unwrap();
        let shop = d.path().join("src/shop");
        let blog = d.path().join("src/blog");
        for p in [&shop, &blog] {
            std::fs::create_dir_all(p.join(".codex/rules")).unwrap();
            std::fs::write(
                p.join(".codex/rules/project.rules"),
                "prefix_rule(pattern = [\"make\", \"deploy\"], decision = \"prompt\")\n",
            )
            .unwrap();
        }
        std::fs::write(
            shop.join(".codex/config.toml"),
            "approval_policy = \"never\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join(".codex")).unwrap();
        std::fs::write(
            d.path().join(".codex/config.toml"),
            format!(
                "[projects.\"{}\"]\ntrust_level = \"trusted\"\n",
                shop.display()
            ),
        )
        .unwrap();
        let places = Places {
            home: d.path().into(),
            allowed: vec![d.path().join("src")],
            etc: d.path().join("etc"),
        };
        let mut out = Vec::new();
        read(&places, &places.projects(), &mut out);
        let shop_dir = Some(shop.to_string_lossy().into_owned());
        // Only the trusted project: its policy, and its prompt rule refused under `never`.
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            (out[0].effect, &out[0].matches.directory),
            (OwnEffect::Allow, &shop_dir)
        );
        assert_eq!(
            (out[1].effect, &out[1].matches.directory),
            (OwnEffect::Deny, &shop_dir)
        );
        assert_eq!(
            out[1].matches.input.as_ref().unwrap().pattern,
            "make deploy*"
        );
    }
}
