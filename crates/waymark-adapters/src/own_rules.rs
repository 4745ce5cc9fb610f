//! The runtimes' own rules, read from their files on this machine (issue 31 §2): what Claude
//! Code, Codex, Gemini CLI, OpenClaw and Hermes answer by themselves before any approval
//! reaches Waymark. A runner reports them so the Rules screen shows them beside Waymark's and
//! names a conflict; Waymark never applies them — the runtime does, first.
//!
//! Each reader turns a runtime's syntax into a [`RuleMatch`]; where Waymark's terms cannot say
//! it exactly the match is widened (a conflict shown too often is a question, one hidden is a
//! surprise at 3 a.m.). A file that cannot be read or parsed is reported as one rule naming the
//! problem, never skipped in silence.

mod claude;
mod codex;
mod gemini;
mod hermes;
mod openclaw;

use std::path::{Path, PathBuf};

use waymark_proto::{InputPattern, OwnEffect, PatternKind, RuleMatch, RuntimeRule};

/// The longest text a rule carries (the control plane's limit).
const MAX_TEXT: usize = 500;
/// Most project directories looked into (an allowed directory and the ones right under it).
const MAX_PROJECTS: usize = 400;

/// Where to look: the home directory the runtimes read their user files from, and the
/// directories runs may use (each, and each directory right under it, may hold a project's
/// own settings).
#[derive(Debug, Clone)]
pub struct Places {
    pub home: PathBuf,
    pub allowed: Vec<PathBuf>,
    /// Where the system-wide files live (`/etc` outside tests).
    pub etc: PathBuf,
}

impl Places {
    /// The current user's home and the real `/etc`.
    pub fn of_this_user(allowed: Vec<PathBuf>) -> Option<Places> {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .map(PathBuf::from)?;
        Some(Places {
            home,
            allowed,
            etc: PathBuf::from("/etc"),
        })
    }

    /// Each allowed directory and the directories right under it (hidden ones left out),
    /// at most [`MAX_PROJECTS`].
    fn projects(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for dir in &self.allowed {
            out.push(dir.clone());
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            let mut under: Vec<PathBuf> = entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .map(|e| e.path())
                .collect();
            under.sort();
            out.extend(under);
        }
        out.truncate(MAX_PROJECTS);
        out
    }
}

/// Every runtime's own rules found in `places`, in a stable order.
pub fn read(places: &Places) -> Vec<RuntimeRule> {
    let mut out = Vec::new();
    let projects = places.projects();
    claude::read(places, &projects, &mut out);
    codex::read(places, &projects, &mut out);
    gemini::read(places, &projects, &mut out);
    openclaw::read(places, &mut out);
    hermes::read(places, &mut out);
    out.truncate(waymark_proto::RUNTIME_RULES_MAX);
    out
}

/// A rule, its texts clipped to what the control plane takes.
fn rule(
    runtime: &str,
    source: &Path,
    text: &str,
    effect: OwnEffect,
    matches: RuleMatch,
) -> RuntimeRule {
    RuntimeRule {
        runtime: runtime.into(),
        source: clip(&source.to_string_lossy()),
        text: clip(text),
        effect,
        matches: RuleMatch {
            runtime: Some(runtime.into()),
            ..matches
        },
    }
}

/// A file that is there but cannot be read as the runtime reads it: reported as an `ask`
/// rule naming the problem, so the screen shows it and no conflict is made up from it.
fn unreadable(runtime: &str, source: &Path, why: &str) -> RuntimeRule {
    rule(
        runtime,
        source,
        &format!("(not read: {why})"),
        OwnEffect::Ask,
        RuleMatch::default(),
    )
}

/// The file's text, `None` when there is none; a file that exists but cannot be read is
/// reported.
fn text_of(runtime: &str, path: &Path, out: &mut Vec<RuntimeRule>) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Some(t),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            out.push(unreadable(runtime, path, &e.to_string()));
            None
        }
    }
}

/// The file as `format` (`JSON`, `TOML`, `YAML`), `None` when there is none; a file that is
/// there but cannot be read or parsed is reported.
fn parsed<T>(
    runtime: &str,
    path: &Path,
    format: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
    out: &mut Vec<RuntimeRule>,
) -> Option<T> {
    let text = text_of(runtime, path, out)?;
    match parse(&text) {
        Ok(v) => Some(v),
        Err(e) => {
            out.push(unreadable(runtime, path, &format!("not {format}: {e}")));
            None
        }
    }
}

/// A JSON file (see [`parsed`]).
fn json_of(runtime: &str, path: &Path, out: &mut Vec<RuntimeRule>) -> Option<serde_json::Value> {
    parsed(
        runtime,
        path,
        "JSON",
        |t| serde_json::from_str(t).map_err(|e| e.to_string()),
        out,
    )
}

/// A TOML file (see [`parsed`]).
fn toml_of(runtime: &str, path: &Path, out: &mut Vec<RuntimeRule>) -> Option<toml::Table> {
    parsed(
        runtime,
        path,
        "TOML",
        |t| t.parse::<toml::Table>().map_err(|e| e.message().to_owned()),
        out,
    )
}

/// The files of `dir` whose name ends `.{ext}`, sorted (none when it is not a directory).
fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

/// A glob over a command or path, Waymark's syntax: `*` and `?` wildcards, `\` escapes.
fn glob(pattern: String) -> Option<InputPattern> {
    (!pattern.is_empty()).then_some(InputPattern {
        kind: PatternKind::Glob,
        pattern: pattern.chars().take(MAX_TEXT).collect(),
    })
}

/// `text` with Waymark's glob characters escaped: it matches itself only.
fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '\\' | '[' | ']' | '{' | '}') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn clip(s: &str) -> String {
    if s.chars().count() <= MAX_TEXT {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(MAX_TEXT - 1).collect();
    t.push('…');
    t
}

/// A directory as the control plane takes one: absolute, plain, no trailing `/`.
fn plain_dir(p: &Path) -> Option<String> {
    let s = p.to_str()?;
    let ok = s.starts_with('/')
        && (s == "/"
            || s[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."));
    ok.then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_escapes_every_glob_character() {
        assert_eq!(literal("a*b?c[d]\\"), "a\\*b\\?c\\[d\\]\\\\");
    }

    #[test]
    fn projects_are_the_allowed_directories_and_those_right_under_them() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("shop/web")).unwrap();
        std::fs::create_dir_all(d.path().join(".hidden")).unwrap();
        std::fs::create_dir_all(d.path().join("blog")).unwrap();
        let p = Places {
            home: d.path().into(),
            allowed: vec![d.path().into()],
            etc: d.path().join("etc"),
        };
        assert_eq!(
            p.projects(),
            vec![
                d.path().to_path_buf(),
                d.path().join("blog"),
                d.path().join("shop")
            ]
        );
    }
}
