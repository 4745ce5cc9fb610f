//! Secret hygiene: common secret patterns (cloud and forge tokens, private keys, bearer tokens,
//! `password=`-style assignments, Waymark's own tokens) are replaced by `[REDACTED:kind]` in
//! session messages and checkpoint bodies before they are stored, so a transcript never turns
//! into a credential store. The marker stays visible in the thread.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

static PATTERNS: LazyLock<Vec<(&'static str, Regex)>> = LazyLock::new(|| {
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
    .map(|(k, p)| (k, Regex::new(p).expect("a valid pattern")))
    .collect()
});

/// Redacts a string; returns it and how many secrets were found.
pub(crate) fn text(s: &str) -> (String, usize) {
    let mut out = s.to_owned();
    let mut n = 0;
    for (kind, re) in PATTERNS.iter() {
        let found = re.find_iter(&out).count();
        if found > 0 {
            n += found;
            out = re
                .replace_all(&out, format!("[REDACTED:{kind}]").as_str())
                .into_owned();
        }
    }
    (out, n)
}

/// Redacts every string in a JSON value, in place; returns how many secrets were found.
pub(crate) fn json(v: &mut Value) -> usize {
    match v {
        Value::String(s) => {
            let (r, n) = text(s);
            if n > 0 {
                *s = r;
            }
            n
        }
        Value::Array(a) => a.iter_mut().map(json).sum(),
        Value::Object(o) => o.values_mut().map(json).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
