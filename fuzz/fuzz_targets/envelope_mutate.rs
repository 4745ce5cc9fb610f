//! A valid signed envelope, changed: a field set, removed or added, a number nudged, a string
//! edited, a signature byte flipped, the algorithm or key id changed. Whatever still verifies
//! must read, field by field, as the command that was signed (same canonical bytes, and the
//! same integers and strings).
#![no_main]

use arbitrary::Arbitrary;
use chrono::{TimeZone, Utc};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use waymark_fuzz::{device_key, same};
use waymark_proto::digest::canonical_json;
use waymark_proto::signing;
use waymark_proto::{Operation, SignedEnvelope, SteerCommand};

/// A JSON value the fuzzer builds.
#[derive(Debug, Arbitrary)]
enum Json {
    Null,
    Bool(bool),
    Int(i64),
    Uint(u64),
    Float(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(String, Json)>),
}

impl Json {
    fn value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Int(i) => Value::from(*i),
            Json::Uint(u) => Value::from(*u),
            Json::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Json::Str(s) => Value::String(s.clone()),
            Json::Arr(a) => Value::Array(a.iter().map(Json::value).collect()),
            Json::Obj(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), v.value())).collect()),
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Command {
    task_id: Option<String>,
    expected_plan_revision: Option<i64>,
    operation: u8,
    scope: Vec<String>,
    args: Vec<(String, Json)>,
    issued_by: String,
    issued_at: u32,
    lifetime: u16,
}

#[derive(Debug, Arbitrary)]
enum Mutation {
    /// Set a field (one of the command's own names, picked by index, or any name) to a value.
    Set(u8, Option<String>, Json),
    /// Remove the nth field.
    Remove(u8),
    /// Add `delta` to the nth number in the command (depth first).
    Nudge(u16, i64),
    /// Write the nth number as a double instead of an integer.
    ToFloat(u16),
    /// Replace the char at `at` in the nth string.
    EditString(u16, u16, char),
    /// Flip bits in the signature.
    FlipSig(u8, u8),
    /// Replace the signature text.
    SigText(String),
    /// Pad the signature with `=`.
    PadSig,
    /// Replace the algorithm.
    Alg(String),
    /// Replace the key id.
    KeyId(String),
    /// Send the envelope through JSON text with a different key order and whitespace.
    Reserialise,
}

const FIELDS: &[&str] = &[
    "command_id",
    "task_id",
    "expected_plan_revision",
    "operation",
    "scope",
    "args",
    "issued_by",
    "device_id",
    "issued_at",
    "expires_at",
];

const OPS: &[Operation] = &[
    Operation::Pause,
    Operation::Resume,
    Operation::Cancel,
    Operation::SuspendAndReplan,
    Operation::Replan,
    Operation::AnswerQuestion,
    Operation::Approve,
    Operation::Deny,
    Operation::ChooseOption,
    Operation::TakeOver,
    Operation::OpenSession,
];

/// Replaces the nth number (depth first) with what `f` makes of it.
fn with_nth_number(v: &mut Value, n: u16, f: impl FnOnce(&serde_json::Number) -> Option<Value>) {
    fn walk<'a>(v: &'a mut Value, n: &mut u16) -> Option<&'a mut Value> {
        match v {
            Value::Number(_) if *n == 0 => Some(v),
            Value::Number(_) => {
                *n -= 1;
                None
            }
            Value::Array(a) => a.iter_mut().find_map(|x| walk(x, n)),
            Value::Object(m) => m.values_mut().find_map(|x| walk(x, n)),
            _ => None,
        }
    }
    let mut n = n;
    if let Some(slot) = walk(v, &mut n)
        && let Value::Number(num) = slot
        && let Some(new) = f(num)
    {
        *slot = new;
    }
}

fn with_nth_string(v: &mut Value, n: u16, at: u16, ch: char) {
    fn walk(v: &mut Value, n: &mut u16, at: u16, ch: char) -> bool {
        match v {
            Value::String(s) => {
                if *n == 0 {
                    let mut chars: Vec<char> = s.chars().collect();
                    if chars.is_empty() {
                        chars.push(ch);
                    } else {
                        let i = at as usize % chars.len();
                        chars[i] = ch;
                    }
                    *s = chars.into_iter().collect();
                    return true;
                }
                *n -= 1;
                false
            }
            Value::Array(a) => a.iter_mut().any(|x| walk(x, n, at, ch)),
            Value::Object(m) => m.values_mut().any(|x| walk(x, n, at, ch)),
            _ => false,
        }
    }
    let mut n = n;
    walk(v, &mut n, at, ch);
}

fuzz_target!(|input: (Command, Vec<Mutation>)| {
    let (c, mutations) = input;
    let issued = Utc
        .timestamp_opt(1_700_000_000 + i64::from(c.issued_at), 0)
        .single()
        .unwrap_or_default();
    let command = SteerCommand {
        command_id: "01980000-0000-7000-8000-00000000f022".into(),
        task_id: c.task_id,
        expected_plan_revision: c.expected_plan_revision,
        operation: OPS[usize::from(c.operation) % OPS.len()],
        scope: c.scope,
        args: if c.args.is_empty() {
            Value::Null
        } else {
            Value::Object(
                c.args
                    .iter()
                    .map(|(k, v)| (k.clone(), v.value()))
                    .collect::<Map<_, _>>(),
            )
        },
        issued_by: c.issued_by,
        device_id: "dev_fuzz".into(),
        issued_at: issued,
        expires_at: issued + chrono::Duration::seconds(i64::from(c.lifetime)),
    };
    let key = device_key();
    let original = match signing::sign(&command, &key) {
        Ok(env) => env,
        // A revision beyond 2^53 is refused, never signed.
        Err(signing::SigningError::InexactNumber) => return,
        Err(e) => panic!("a command did not sign: {e}"),
    };
    signing::verify(&original, &key.verifying_key()).expect("a fresh signature verifies");

    let mut env = original.clone();
    for m in mutations.iter().take(8) {
        match m {
            Mutation::Set(i, name, v) => {
                let name = name
                    .clone()
                    .unwrap_or_else(|| FIELDS[usize::from(*i) % FIELDS.len()].into());
                if let Value::Object(o) = &mut env.command {
                    o.insert(name, v.value());
                }
            }
            Mutation::Remove(i) => {
                if let Value::Object(o) = &mut env.command
                    && !o.is_empty()
                    && let Some(k) = o.keys().nth(usize::from(*i) % o.len()).cloned()
                {
                    o.remove(&k);
                }
            }
            Mutation::Nudge(n, delta) => with_nth_number(&mut env.command, *n, |num| {
                if let Some(i) = num.as_i64() {
                    i.checked_add(*delta).map(Value::from)
                } else if let Some(u) = num.as_u64() {
                    u.checked_add_signed(*delta).map(Value::from)
                } else {
                    num.as_f64()
                        .and_then(|f| serde_json::Number::from_f64(f + *delta as f64))
                        .map(Value::Number)
                }
            }),
            Mutation::ToFloat(n) => with_nth_number(&mut env.command, *n, |num| {
                num.as_f64()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
            }),
            Mutation::EditString(n, at, ch) => with_nth_string(&mut env.command, *n, *at, *ch),
            Mutation::FlipSig(i, bits) => {
                if let Ok(mut raw) = signing::unb64(&env.signature.sig, "signature")
                    && !raw.is_empty()
                {
                    let i = usize::from(*i) % raw.len();
                    raw[i] ^= bits;
                    env.signature.sig = signing::b64(&raw);
                }
            }
            Mutation::SigText(s) => env.signature.sig = s.clone(),
            Mutation::PadSig => env.signature.sig.push('='),
            Mutation::Alg(s) => env.signature.alg = s.clone(),
            Mutation::KeyId(s) => env.signature.key_id = s.clone(),
            Mutation::Reserialise => {
                let text =
                    waymark_fuzz::reordered_text(&serde_json::to_value(&env).expect("plain JSON"));
                env = serde_json::from_str(&text).expect("a reordered envelope parses");
            }
        }
    }
    // What the server receives: the envelope's JSON text, parsed.
    let text = serde_json::to_string(&env).expect("plain JSON");
    let Ok(received) = serde_json::from_str::<SignedEnvelope>(&text) else {
        return;
    };
    if signing::verify(&received, &key.verifying_key()).is_ok() {
        assert_eq!(
            canonical_json(&received.command),
            canonical_json(&original.command),
            "a changed command verified"
        );
        assert!(
            same(&received.command, &original.command),
            "a command that reads differently verified:\n signed:   {}\n received: {}",
            original.command,
            received.command
        );
    }
});
