//! What the fuzz targets share: the device key the seed envelopes are signed with, the seed
//! commands themselves, a second, independent RFC 8785 serialiser to compare ours against, and
//! number-aware JSON equality.

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;
use waymark_proto::digest::canonical_json;
use waymark_proto::signing::{self, DeviceKey};
use waymark_proto::{Operation, Signature, SignedEnvelope, SteerCommand};

/// The fuzzing device's key (fixed, so envelopes in the corpus verify).
pub fn device_key() -> DeviceKey {
    DeviceKey::from_bytes(&[7; 32])
}

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
}

/// The commands the fuzzing device signed: the seed corpus of the envelope targets, and the
/// only commands an envelope may verify as.
pub fn seed_commands() -> Vec<SteerCommand> {
    let issued = at(1_780_000_000);
    let expires = at(1_780_000_600);
    let base = SteerCommand {
        command_id: "01980000-0000-7000-8000-000000000001".into(),
        task_id: Some("task_842".into()),
        expected_plan_revision: Some(7),
        operation: Operation::Pause,
        scope: vec![],
        args: Value::Null,
        issued_by: "user:alice".into(),
        device_id: "dev_fuzz".into(),
        issued_at: issued,
        expires_at: expires,
    };
    vec![
        base.clone(),
        SteerCommand {
            command_id: "01980000-0000-7000-8000-000000000002".into(),
            operation: Operation::SuspendAndReplan,
            scope: vec!["deploy_staging".into(), "notify_release".into()],
            args: serde_json::json!({"instructions": "do not deploy; write the report only"}),
            ..base.clone()
        },
        SteerCommand {
            command_id: "01980000-0000-7000-8000-000000000003".into(),
            operation: Operation::Approve,
            args: serde_json::json!({
                "decision_id": "dec_19",
                "intent_digest": "sha256:5d41402abc4b2a76b9719d911017c592",
                "note": "ok \u{20ac} \u{1f600}",
            }),
            ..base.clone()
        },
        // At the edge of what a double holds: 2^53 + 1.
        SteerCommand {
            command_id: "01980000-0000-7000-8000-000000000004".into(),
            expected_plan_revision: Some(9_007_199_254_740_993),
            operation: Operation::Resume,
            ..base.clone()
        },
        SteerCommand {
            command_id: "01980000-0000-7000-8000-000000000005".into(),
            task_id: None,
            expected_plan_revision: None,
            operation: Operation::OpenSession,
            ..base
        },
    ]
}

/// The seed commands, signed by [`device_key`] over their canonical bytes the way any device
/// could (without `signing::sign`'s own checks, so the 2^53 + 1 seed is signed too).
pub fn seed_envelopes() -> Vec<SignedEnvelope> {
    use ed25519_dalek::Signer;
    let key = device_key();
    seed_commands()
        .iter()
        .map(|c| {
            let command = serde_json::to_value(c).expect("a command is JSON");
            let bytes = canonical_json(&command).expect("a command is plain JSON");
            SignedEnvelope {
                command,
                signature: Signature {
                    alg: signing::ALG.into(),
                    key_id: c.device_id.clone(),
                    sig: signing::b64(&key.sign(&bytes).to_bytes()),
                },
            }
        })
        .collect()
}

/// JSON equality as a reader of the values sees it: integers compare exactly, and a number
/// written with a fraction or exponent compares by its double value (`5` and `5.0` are the
/// same number; `9007199254740993` and `9007199254740992` are not).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let int = |n: &serde_json::Number| {
                n.as_i64()
                    .map(i128::from)
                    .or_else(|| n.as_u64().map(i128::from))
            };
            match (int(x), int(y)) {
                (Some(i), Some(j)) => i == j,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// RFC 8785, written from the RFC without `serde_jcs` or `ryu-js`: keys sorted by UTF-16 code
/// units, strings with the minimal escapes, numbers in ECMAScript `Number.prototype.toString`
/// form built from Rust's shortest round-trip digits.
pub fn independent_jcs(v: &Value) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&es6_number(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(s) => write_string(s, out),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(x, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<(&String, Vec<u16>)> =
                m.keys().map(|k| (k, k.encode_utf16().collect())).collect();
            keys.sort_by(|a, b| a.1.cmp(&b.1));
            out.push('{');
            for (i, (k, _)) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_value(&m[k.as_str()], out);
            }
            out.push('}');
        }
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\u{c}' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// RFC 8785 appendix B's number vectors (IEEE 754 bits, canonical text), and the tie the
/// fuzzer found in the first version of [`es6_number`].
pub const ES6_VECTORS: &[(u64, &str)] = &[
    (0x0000000000000000u64, "0"),
    (0x8000000000000000, "0"),
    (0x0000000000000001, "5e-324"),
    (0x8000000000000001, "-5e-324"),
    (0x7fefffffffffffff, "1.7976931348623157e+308"),
    (0xffefffffffffffff, "-1.7976931348623157e+308"),
    (0x4340000000000000, "9007199254740992"),
    (0xc340000000000000, "-9007199254740992"),
    (0x4430000000000000, "295147905179352830000"),
    (0x44b52d02c7e14af5, "9.999999999999997e+22"),
    (0x44b52d02c7e14af6, "1e+23"),
    (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
    (0x444b1ae4d6e2ef4e, "999999999999999700000"),
    (0x444b1ae4d6e2ef4f, "999999999999999900000"),
    (0x444b1ae4d6e2ef50, "1e+21"),
    (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
    (0x3eb0c6f7a0b5ed8d, "0.000001"),
    (0x41b3de4355555553, "333333333.3333332"),
    (0x41b3de4355555554, "333333333.33333325"),
    (0x41b3de4355555555, "333333333.3333333"),
    (0x41b3de4355555556, "333333333.3333334"),
    (0x41b3de4355555557, "333333333.33333343"),
    (0xbecbf647612f3696, "-0.0000033333333333333333"),
    (0x43143ff3c1cb0959, "1424953923781206.2"),
    // A tie between two shortest forms: the even one (found by the fuzzer).
    (0x42d9438493bc71c8, "111111111111111.12"), // 111111111111111.125
];

/// ECMAScript's Number::toString(x) for a finite double (ECMA-262 §6.1.6.1.20).
pub fn es6_number(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    if x < 0.0 {
        return format!("-{}", es6_number(-x));
    }
    let (digits, n) = shortest_digits(x);
    let k = digits.len() as i64;
    if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let sign = if e < 0 { '-' } else { '+' };
        if k == 1 {
            format!("{digits}e{sign}{}", e.abs())
        } else {
            format!("{}.{}e{sign}{}", &digits[..1], &digits[1..], e.abs())
        }
    }
}

/// `x` (positive, finite) as `0.d1d2…dk × 10^n`: the fewest digits that read back as `x`; of
/// two such digit strings equally close to `x`, the even one (ECMA-262 §6.1.6.1.20 note 2).
fn shortest_digits(x: f64) -> (String, i64) {
    fn sci(s: &str) -> (String, i64) {
        let (mantissa, exp) = s.split_once('e').unwrap_or((s, "0"));
        let digits = mantissa.chars().filter(|c| *c != '.').collect();
        (digits, exp.parse::<i64>().unwrap_or(0) + 1)
    }
    // Rust's `{:e}` prints the shortest digits that round-trip, but breaks ties its own way.
    let (digits, n) = sci(&format!("{x:e}"));
    let k = digits.len();
    // The exact decimal value of `x` (a double has at most 767 significant digits).
    let (exact, exact_n) = sci(&format!("{x:.800e}"));
    if exact_n != n || exact.len() <= k {
        return (digits, n);
    }
    let (head, tail) = exact.split_at(k);
    let is_tie = tail.as_bytes()[0] == b'5' && tail.bytes().skip(1).all(|b| b == b'0');
    if !is_tie {
        return (digits, n);
    }
    // Equally close: `head` and `head + 1` in the last place. Keep the even one that reads
    // back as `x`.
    let mut up: Vec<u8> = head.bytes().collect();
    let mut i = up.len();
    while i > 0 {
        i -= 1;
        if up[i] == b'9' {
            up[i] = b'0';
        } else {
            up[i] += 1;
            break;
        }
    }
    let up = String::from_utf8(up).unwrap_or_default();
    let reads_back = |d: &str| format!("0.{d}e{n}").parse::<f64>().is_ok_and(|y| y == x);
    for candidate in [head, up.as_str()] {
        let even = candidate
            .bytes()
            .last()
            .is_some_and(|b| (b - b'0').is_multiple_of(2));
        if even && !candidate.starts_with('0') && reads_back(candidate) {
            let trimmed = candidate.trim_end_matches('0');
            return (trimmed.to_owned(), n);
        }
    }
    (digits, n)
}

/// `v` as JSON text with every object's keys in reverse order and whitespace between tokens:
/// a different text of the same value.
pub fn reordered_text(v: &Value) -> String {
    let mut out = String::new();
    write_reordered(v, &mut out);
    out
}

fn write_reordered(v: &Value, out: &mut String) {
    match v {
        Value::Array(a) => {
            out.push_str("[ ");
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                write_reordered(x, out);
            }
            out.push_str(" ]");
        }
        Value::Object(m) => {
            out.push_str("{\t");
            for (i, (k, x)) in m.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(",\r\n ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(" : ");
                write_reordered(x, out);
            }
            out.push_str(" }");
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn es6_numbers_match_rfc8785_appendix_b() {
        for &(bits, want) in ES6_VECTORS {
            assert_eq!(es6_number(f64::from_bits(bits)), want, "{bits:#x}");
        }
    }

    #[test]
    fn the_independent_serialiser_agrees_with_ours_on_the_seeds() {
        for env in seed_envelopes() {
            let ours = canonical_json(&env.command).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                independent_jcs(&env.command)
            );
            let verified = signing::verify(&env, &device_key().verifying_key());
            if env.command["expected_plan_revision"] == 9_007_199_254_740_993u64 {
                assert_eq!(verified, Err(signing::SigningError::InexactNumber));
            } else {
                verified.unwrap();
            }
        }
    }

    #[test]
    fn same_tells_big_integers_apart_and_not_number_spellings() {
        let v = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert!(same(&v("[5, {\"a\": 0.5}]"), &v("[5.0, {\"a\": 5e-1}]")));
        assert!(!same(&v("9007199254740993"), &v("9007199254740992")));
        assert!(!same(&v("{\"a\": 1}"), &v("{\"a\": 1, \"b\": 2}")));
    }

    /// Writes the seed corpora that are made from code (signed envelopes).
    /// `cargo test --manifest-path fuzz/Cargo.toml --lib -- --ignored write_seeds`
    #[test]
    #[ignore]
    fn write_seeds() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        let dir = root.join("envelope_parse_verify");
        std::fs::create_dir_all(&dir).unwrap();
        for (i, env) in seed_envelopes().iter().enumerate() {
            let text = serde_json::to_string_pretty(env).unwrap();
            std::fs::write(dir.join(format!("envelope-{}.json", i + 1)), text).unwrap();
        }
    }
}
