//! Secret hygiene: common secret patterns (cloud and forge tokens, private keys, bearer tokens,
//! `password=`-style assignments, Waymark's own tokens) are replaced by `[REDACTED:kind]` in
//! session messages and checkpoint bodies before they are stored, so a transcript never turns
//! into a credential store. The marker stays visible in the thread.

use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde_json::Value;

/// The built-in patterns, by kind (a kind may have several).
static BUILTIN: LazyLock<Vec<(String, Regex)>> = LazyLock::new(|| {
    [
        ("private-key", r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(-----END [A-Z ]*PRIVATE KEY-----|$)"),
        ("aws-access-key", r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
        ("github-token", r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
        ("github-token", r"\bgithub_pat_[A-Za-z0-9_]{40,}\b"),
        ("slack-token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"),
        ("api-key", r"\bsk-[A-Za-z0-9_-]{20,}\b"),
        ("waymark-token", r"\bwmk_[asw]_[A-Za-z0-9_-]{20,}"),
        ("bearer-token", r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{20,}"),
        ("secret", r#"(?i)\b(password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token)\b(\s*[:=]\s*|"\s*:\s*")[^\s"',;]{6,}"#),
    ]
    .into_iter()
    .map(|(k, p)| (k.to_owned(), Regex::new(p).expect("a valid pattern")))
    .collect()
});

/// The built-in kinds, in order, each once.
pub fn builtin_kinds() -> Vec<&'static str> {
    kinds_of(&BUILTIN)
}

/// The kinds of `patterns`, in order, each once.
fn kinds_of(patterns: &[(String, Regex)]) -> Vec<&str> {
    let mut kinds: Vec<&str> = Vec::new();
    for (k, _) in patterns {
        if !kinds.contains(&k.as_str()) {
            kinds.push(k);
        }
    }
    kinds
}

/// A redaction setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RedactionError {
    /// `--no-redact-kind` names no built-in kind.
    #[error("no built-in secret kind `{0}`; the kinds are: {1}")]
    UnknownKind(String, String),
    /// An operator's kind is not a plain name.
    #[error("`{0}` is not a usable kind: use 1–32 lower-case letters, digits or `-`")]
    BadKind(String),
    /// An operator's pattern is missing or is not a regular expression.
    #[error("the pattern for `{kind}` is not a valid regular expression: {reason}")]
    BadPattern {
        /// Its kind.
        kind: String,
        /// What the regex crate said.
        reason: String,
    },
    /// An operator's pattern matches the empty string, so it would mark every gap.
    #[error("the pattern for `{0}` matches the empty string; it must match at least one character")]
    MatchesEmpty(String),
}

/// What is redacted before storage: the built-in patterns minus the kinds turned off, plus the
/// operator's own (`waymark serve --redact KIND=REGEX`). Each match becomes `[REDACTED:KIND]`.
#[derive(Debug, Clone)]
pub struct Redaction {
    patterns: Arc<Vec<(String, Regex)>>,
}

impl Default for Redaction {
    /// Every built-in pattern.
    fn default() -> Self {
        Redaction {
            patterns: Arc::new(BUILTIN.clone()),
        }
    }
}

impl Redaction {
    /// Nothing is redacted (`waymark serve --no-redact`).
    pub fn off() -> Self {
        Redaction {
            patterns: Arc::new(Vec::new()),
        }
    }

    /// The built-in patterns without the kinds in `off`, then `extra` as `(kind, regex)`.
    pub fn new(off: &[String], extra: &[(String, String)]) -> Result<Self, RedactionError> {
        let known = builtin_kinds();
        if let Some(unknown) = off.iter().find(|k| !known.contains(&k.as_str())) {
            return Err(RedactionError::UnknownKind(
                unknown.clone(),
                known.join(", "),
            ));
        }
        let mut patterns: Vec<(String, Regex)> = BUILTIN
            .iter()
            .filter(|(k, _)| !off.contains(k))
            .cloned()
            .collect();
        for (kind, pattern) in extra {
            let plain = (1..=32).contains(&kind.len())
                && kind
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
            if !plain {
                return Err(RedactionError::BadKind(kind.clone()));
            }
            let re = Regex::new(pattern).map_err(|e| RedactionError::BadPattern {
                kind: kind.clone(),
                reason: e.to_string(),
            })?;
            if re.is_match("") {
                return Err(RedactionError::MatchesEmpty(kind.clone()));
            }
            patterns.push((kind.clone(), re));
        }
        Ok(Redaction {
            patterns: Arc::new(patterns),
        })
    }

    /// The kinds redacted, in order, each once.
    pub fn kinds(&self) -> Vec<&str> {
        kinds_of(&self.patterns)
    }

    /// Redacts a string; returns it and how many secrets were found.
    pub fn text(&self, s: &str) -> (String, usize) {
        let mut out = s.to_owned();
        let mut n = 0;
        for (kind, re) in self.patterns.iter() {
            let found = re.find_iter(&out).count();
            if found > 0 {
                n += found;
                out = re
                    .replace_all(&out, regex::NoExpand(&format!("[REDACTED:{kind}]")))
                    .into_owned();
            }
        }
        (out, n)
    }

    /// Redacts every string in a JSON value, in place; returns how many secrets were found.
    pub fn json(&self, v: &mut Value) -> usize {
        if self.patterns.is_empty() {
            return 0;
        }
        match v {
            Value::String(s) => {
                let (r, n) = self.text(s);
                if n > 0 {
                    *s = r;
                }
                n
            }
            Value::Array(a) => a.iter_mut().map(|v| self.json(v)).sum(),
            Value::Object(o) => o.values_mut().map(|v| self.json(v)).sum(),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> (String, usize) {
        Redaction::default().text(s)
    }

    fn json(v: &mut Value) -> usize {
        Redaction::default().json(v)
    }

    #[test]
    fn common_secrets_are_replaced_and_plain_text_is_not() {
        let (r, n) = text(
            "deploying with AKIAABCDEFGHIJKLMNOP and ghp_0123456789abcdefghijklmnopqrstuvwxyzAB, password=hunter2hunter",
        );
        assert_eq!(n, 3, "{r}");
        assert!(
            !r.contains("AKIA") && !r.contains("ghp_") && !r.contains("hunter2"),
            "{r}"
        );
        assert!(
            r.contains("[REDACTED:aws-access-key]")
                && r.contains("[REDACTED:github-token]")
                && r.contains("[REDACTED:secret]"),
            "{r}"
        );
        let (r, n) = text(
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----",
        );
        assert_eq!((r.as_str(), n), ("[REDACTED:private-key]", 1));
        let plain = "the password field is validated; tests pass at abc123";
        assert_eq!(text(plain), (plain.to_owned(), 0));
    }

    #[test]
    fn json_strings_are_redacted_wherever_they_are() {
        let mut v = serde_json::json!({"summary": "used Bearer abcdefghijklmnopqrstuvwxyz123", "steps": [{"note": "token: wmk_w_abcdefghijklmnopqrstuvwxyz"}], "n": 3});
        assert_eq!(json(&mut v), 2);
        assert_eq!(v["n"], 3);
        assert!(v.to_string().contains("[REDACTED:bearer-token]"), "{v}");
    }
}

#[cfg(test)]
mod configured {
    use super::*;

    #[test]
    fn an_operators_pattern_is_redacted_under_its_kind_and_a_kind_turned_off_is_kept() {
        let r = Redaction::new(
            &["secret".to_owned()],
            &[("ticket".to_owned(), r"TICKET-[0-9]{3,}".to_owned())],
        )
        .unwrap();
        let (out, n) = r.text("see TICKET-4821, password=hunter2hunter, AKIAABCDEFGHIJKLMNOP");
        assert_eq!(n, 2, "{out}");
        assert!(
            out.contains("[REDACTED:ticket]") && !out.contains("4821"),
            "{out}"
        );
        assert!(
            out.contains("password=hunter2hunter"),
            "`secret` is off: {out}"
        );
        assert!(out.contains("[REDACTED:aws-access-key]"), "{out}");
        assert!(r.kinds().contains(&"ticket") && !r.kinds().contains(&"secret"));
    }

    #[test]
    fn a_replacement_is_literal_even_when_the_kind_looks_like_a_group() {
        let r = Redaction::new(&[], &[("x-1".to_owned(), r"(sec)ret-[a-z]+".to_owned())]).unwrap();
        assert_eq!(r.text("a secret-abc b").0, "a [REDACTED:x-1] b");
    }

    #[test]
    fn unusable_settings_are_refused_with_what_is_wrong() {
        let e = Redaction::new(&["passwords".to_owned()], &[]).unwrap_err();
        assert!(
            e.to_string().contains("`passwords`") && e.to_string().contains("github-token"),
            "{e}"
        );
        let e = Redaction::new(&[], &[("Ticket".to_owned(), "T-1".to_owned())]).unwrap_err();
        assert!(matches!(e, RedactionError::BadKind(_)), "{e}");
        let e = Redaction::new(&[], &[("t".to_owned(), "T-(".to_owned())]).unwrap_err();
        assert!(matches!(e, RedactionError::BadPattern { .. }), "{e}");
        let e = Redaction::new(&[], &[("t".to_owned(), "x*".to_owned())]).unwrap_err();
        assert!(matches!(e, RedactionError::MatchesEmpty(_)), "{e}");
    }

    #[test]
    fn off_redacts_nothing() {
        let mut v = serde_json::json!({"k": "AKIAABCDEFGHIJKLMNOP"});
        assert_eq!(Redaction::off().json(&mut v), 0);
        assert_eq!(v["k"], "AKIAABCDEFGHIJKLMNOP");
    }
}
