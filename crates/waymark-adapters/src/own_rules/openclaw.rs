//! OpenClaw's exec approvals (2026.9): no longer `~/.openclaw/exec-approvals.json` but the
//! same document in its state database — `$OPENCLAW_STATE_DIR` (or `~/.openclaw`)
//! `/state/openclaw.sqlite`, table `exec_approvals_config`, row `current`, column `raw_json` —
//! as `openclaw approvals allowlist add` writes it: `defaults` and `agents.<id>` with
//! `security` (`deny` | `allowlist` | `full`, `full` when unset), `ask` (`off` | `on-miss` |
//! `always`, `off` when unset) and an `allowlist` of executable path globs. An empty store
//! runs every command unasked. A legacy JSON file is read as the same document.
//!
//! An allowlist entry names the executable (`~/Projects/**/bin/rg`, `/usr/bin/uname`) while an
//! approval carries the command line, so the rule covers command lines that start with its
//! file name, or its whole path (widened).

use std::path::{Path, PathBuf};

use serde_json::Value;
use waymark_proto::{OwnEffect, RuleMatch, RuntimeRule};

use super::{Places, glob, literal, rule, unreadable};

const RUNTIME: &str = "openclaw";
/// The tool OpenClaw's exec approvals carry.
const TOOL: &str = "exec";

pub(super) fn read(places: &Places, out: &mut Vec<RuntimeRule>) {
    let state = std::env::var_os("OPENCLAW_STATE_DIR")
        .filter(|_| places.etc == Path::new("/etc"))
        .map(PathBuf::from)
        .unwrap_or_else(|| places.home.join(".openclaw"));
    let db = state.join("state/openclaw.sqlite");
    if db.is_file() {
        match stored(&db) {
            Ok(Some(doc)) => document(&db, &doc, &places.home, out),
            // The gateway has never written one: its defaults (every command, unasked).
            Ok(None) => document(&db, &Value::Null, &places.home, out),
            Err(e) => out.push(unreadable(RUNTIME, &db, &e)),
        }
        return;
    }
    let legacy = state.join("exec-approvals.json");
    if let Some(doc) = super::json_of(RUNTIME, &legacy, out) {
        document(&legacy, &doc, &places.home, out);
    }
}

/// The stored document, read-only (the gateway may be writing it).
fn stored(db: &Path) -> Result<Option<Value>, String> {
    let db = db.to_path_buf();
    let read = async move {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .read_only(true)
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let row: Option<(String,)> = sqlx::query_as(
            "SELECT raw_json FROM exec_approvals_config WHERE config_key = 'current'",
        )
        .fetch_optional(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
        row.map(|(j,)| serde_json::from_str(&j).map_err(|e| format!("not JSON: {e}")))
            .transpose()
    };
    // Called from a blocking thread of the runner (or a test without a runtime).
    match tokio::runtime::Handle::try_current() {
        Ok(h) => h.block_on(read),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?
            .block_on(read),
    }
}

/// The document's policies and allowlists.
fn document(source: &Path, doc: &Value, home: &Path, out: &mut Vec<RuntimeRule>) {
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
    let defaults = doc.get("defaults").cloned().unwrap_or(Value::Null);
    let mut agents: Vec<(String, Value)> = doc
        .get("agents")
        .and_then(Value::as_object)
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    agents.sort_by(|a, b| a.0.cmp(&b.0));
    // The defaults, and each agent that sets its own policy.
    let mut policies = vec![("defaults".to_owned(), defaults.clone())];
    policies.extend(
        agents
            .iter()
            .filter(|(_, a)| a.get("security").is_some() || a.get("ask").is_some())
            .map(|(id, a)| (format!("agents.{id}"), a.clone())),
    );
    for (who, p) in policies {
        let security = s(&p, "security")
            .or_else(|| s(&defaults, "security"))
            .unwrap_or_else(|| "full".into());
        let ask = s(&p, "ask")
            .or_else(|| s(&defaults, "ask"))
            .unwrap_or_else(|| "off".into());
        let effect = match (security.as_str(), ask.as_str()) {
            ("deny", _) => OwnEffect::Deny,
            (_, "always") => OwnEffect::Ask,
            ("full", "off") => OwnEffect::Allow,
            // `allowlist`: what is listed runs (below), the rest follows `ask`.
            ("allowlist", "off") => OwnEffect::Deny,
            _ => OwnEffect::Ask,
        };
        out.push(rule(
            RUNTIME,
            source,
            &format!("{who}: security {security}, ask {ask}"),
            effect,
            RuleMatch {
                tool: Some(TOOL.into()),
                ..RuleMatch::default()
            },
        ));
    }
    for (id, a) in &agents {
        for e in a
            .get("allowlist")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(pattern) = e.as_str().map(str::to_owned).or_else(|| s(e, "pattern")) else {
                continue;
            };
            for input in commands_of(&pattern, home) {
                out.push(rule(
                    RUNTIME,
                    source,
                    &format!("agents.{id}.allowlist: {pattern}"),
                    OwnEffect::Allow,
                    RuleMatch {
                        tool: Some(TOOL.into()),
                        input: glob(input),
                        ..RuleMatch::default()
                    },
                ));
            }
        }
    }
}

/// The command lines an executable glob covers: its file name first, or the whole path.
fn commands_of(pattern: &str, home: &Path) -> Vec<String> {
    let path = match pattern.strip_prefix("~/") {
        Some(rest) => format!("{}/{rest}", literal(&home.to_string_lossy())),
        None => pattern.to_owned(),
    };
    let name = path.rsplit('/').next().unwrap_or(&path).to_owned();
    let mut out = vec![format!("{name}*")];
    if path.contains('/') {
        // A path glob's `**` reads as one `*` over a command line.
        out.push(format!("{}*", path.replace("**", "*")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The document `openclaw approvals allowlist add --agent main "~/Projects/**/bin/rg"`
    /// and `openclaw approvals allowlist add "/usr/bin/uname"` left in the state database
    /// (2026.9.6; ids and times shortened).
    const RECORDED: &str = r#"{"version":1,"socket":{"path":"/home/a/.openclaw/exec-approvals.sock","token":"t"},"defaults":{},
      "agents":{"main":{"allowlist":[{"pattern":"~/Projects/**/bin/rg","id":"1","lastUsedAt":1}]},
                "*":{"allowlist":[{"pattern":"/usr/bin/uname","lastUsedAt":1,"id":"2"}]}}}"#;

    #[test]
    fn the_stored_document_gives_its_policy_and_its_allowlist() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path().join(".openclaw/state");
        std::fs::create_dir_all(&state).unwrap();
        let db = state.join("openclaw.sqlite");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            use sqlx::ConnectOptions;
            let mut c = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(&db)
                .create_if_missing(true)
                .connect()
                .await
                .unwrap();
            sqlx::query("CREATE TABLE exec_approvals_config (config_key TEXT PRIMARY KEY, raw_json TEXT NOT NULL)")
                .execute(&mut c)
                .await
                .unwrap();
            sqlx::query("INSERT INTO exec_approvals_config VALUES ('current', ?)")
                .bind(RECORDED)
                .execute(&mut c)
                .await
                .unwrap();
        });
        drop(rt);
        let places = Places {
            home: d.path().into(),
            allowed: vec![],
            etc: d.path().join("etc"),
        };
        let mut out = Vec::new();
        // As the runner reads it: on a thread of its own (no runtime of the caller's).
        std::thread::scope(|s| {
            s.spawn(|| read(&places, &mut out));
        });
        let seen: Vec<(String, OwnEffect, Option<String>)> = out
            .iter()
            .map(|r| {
                (
                    r.text.clone(),
                    r.effect,
                    r.matches.input.clone().map(|i| i.pattern),
                )
            })
            .collect();
        let home = d.path().display().to_string();
        assert_eq!(
            seen,
            vec![
                (
                    "defaults: security full, ask off".into(),
                    OwnEffect::Allow,
                    None
                ),
                (
                    "agents.*.allowlist: /usr/bin/uname".into(),
                    OwnEffect::Allow,
                    Some("uname*".into())
                ),
                (
                    "agents.*.allowlist: /usr/bin/uname".into(),
                    OwnEffect::Allow,
                    Some("/usr/bin/uname*".into())
                ),
                (
                    "agents.main.allowlist: ~/Projects/**/bin/rg".into(),
                    OwnEffect::Allow,
                    Some("rg*".into())
                ),
                (
                    "agents.main.allowlist: ~/Projects/**/bin/rg".into(),
                    OwnEffect::Allow,
                    Some(format!("{home}/Projects/*/bin/rg*"))
                ),
            ]
        );
    }

    #[test]
    fn a_policy_that_refuses_or_always_asks_reads_so() {
        let mut out = Vec::new();
        let doc: Value = serde_json::from_str(
            r#"{"defaults": {"security": "allowlist", "ask": "on-miss"}, "agents": {"ops": {"security": "deny"}}}"#,
        )
        .unwrap();
        document(Path::new("/x"), &doc, Path::new("/home/a"), &mut out);
        let effects: Vec<_> = out.iter().map(|r| (r.text.as_str(), r.effect)).collect();
        assert_eq!(
            effects,
            vec![
                ("defaults: security allowlist, ask on-miss", OwnEffect::Ask),
                ("agents.ops: security deny, ask on-miss", OwnEffect::Deny),
            ]
        );
    }
}
