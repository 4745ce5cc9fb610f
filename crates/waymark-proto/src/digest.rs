//! Digests over canonical JSON (RFC 8785). Intent digests, effect body digests and the
//! checkpoint hash chain all hash the same canonical bytes, so any client can recompute them.
//!
//! RFC 8785 writes every number as a double, so an integer beyond ±(2^53 − 1) is rounded in the
//! canonical bytes: 2^53 and 2^53 + 1 would have the same digest. A digest that binds a value
//! (an approval to its intent, an idempotency key to its body) must say which value, so
//! [`json_digest`] refuses such integers ([`DigestError::InexactNumber`]) instead of rounding
//! them, as signing does.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Why a value has no digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The value cannot be represented in JSON (a map with non-string keys, a non-finite
    /// float): a programming error on the caller's side.
    #[error("the value is not plain JSON")]
    NotPlainJson,
    /// The value holds an integer a double cannot carry exactly.
    #[error(
        "the integer {value} at `{pointer}` is beyond ±(2^53 − 1), which canonical JSON cannot carry exactly — send it as a string"
    )]
    InexactNumber {
        /// Where, as a JSON Pointer (RFC 6901) into the value (`""` for the value itself).
        pointer: String,
        /// The integer as it was given.
        value: String,
    },
}

/// The RFC 8785 canonical bytes of a value, integers beyond ±(2^53 − 1) rounded as RFC 8785
/// rounds them (use [`exact_canonical_json`] when the bytes must say which integer it was).
///
/// Serialising plain data cannot fail; a value that cannot be represented in JSON (a map with
/// non-string keys, a non-finite float) is a programming error, reported as `None`.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Option<Vec<u8>> {
    serde_jcs::to_vec(value).ok()
}

/// Finds the first integer in `v` that a double does not carry exactly (beyond
/// ±(2^53 − 1)); `Ok` when there is none.
pub fn check_exact(v: &Value) -> Result<(), DigestError> {
    let mut pointer = String::new();
    match first_inexact(v, &mut pointer) {
        None => Ok(()),
        Some(value) => Err(DigestError::InexactNumber { pointer, value }),
    }
}

/// Depth-first; leaves `pointer` at the integer found.
fn first_inexact(v: &Value, pointer: &mut String) -> Option<String> {
    let max = crate::MAX_SAFE_INTEGER.unsigned_abs();
    match v {
        Value::Number(n) => {
            let exact = match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => i.unsigned_abs() <= max,
                (None, Some(u)) => u <= max,
                // A double already: its canonical form is itself.
                (None, None) => true,
            };
            (!exact).then(|| n.to_string())
        }
        Value::Array(a) => a.iter().enumerate().find_map(|(i, item)| {
            let len = pointer.len();
            pointer.push('/');
            pointer.push_str(&i.to_string());
            let found = first_inexact(item, pointer);
            if found.is_none() {
                pointer.truncate(len);
            }
            found
        }),
        Value::Object(m) => m.iter().find_map(|(k, item)| {
            let len = pointer.len();
            pointer.push('/');
            pointer.push_str(&k.replace('~', "~0").replace('/', "~1"));
            let found = first_inexact(item, pointer);
            if found.is_none() {
                pointer.truncate(len);
            }
            found
        }),
        _ => None,
    }
}

/// The RFC 8785 canonical bytes of a value that holds only integers a double carries exactly;
/// any other is refused, so equal bytes mean equal values.
pub fn exact_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, DigestError> {
    let v = serde_json::to_value(value).map_err(|_| DigestError::NotPlainJson)?;
    check_exact(&v)?;
    canonical_json(&v).ok_or(DigestError::NotPlainJson)
}

/// Lower-case hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256:<hex>` of a value's canonical JSON: the form intent digests take on the wire.
/// A value holding an integer beyond ±(2^53 − 1) has none ([`DigestError::InexactNumber`]).
pub fn json_digest<T: Serialize + ?Sized>(value: &T) -> Result<String, DigestError> {
    exact_canonical_json(value).map(|b| format!("sha256:{}", sha256_hex(&b)))
}

/// Whether a string is a well-formed sha256 hex digest (64 lower-case hex characters).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The link of a checkpoint in its task's hash chain: sha256 over the canonical JSON of the
/// checkpoint's identity, its body and the previous link. Editing any stored field, or
/// reordering checkpoints, changes every later link.
///
/// The server refuses a checkpoint body holding an integer beyond ±(2^53 − 1) before it links
/// it ([`check_exact`]), so every link it writes says exactly what it covers; this function
/// still links any body the way it always did, so chains written before that check verify.
pub fn checkpoint_digest(
    task_id: &str,
    sequence: i64,
    attempt_id: &str,
    fence: i64,
    body: &serde_json::Value,
    prev_digest: Option<&str>,
) -> String {
    let link = serde_json::json!({
        "task_id": task_id,
        "sequence": sequence,
        "attempt_id": attempt_id,
        "fence": fence,
        "body": body,
        "prev_digest": prev_digest,
    });
    let bytes = canonical_json(&link).expect("a checkpoint link is plain JSON");
    format!("sha256:{}", sha256_hex(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_form_sorts_keys_and_drops_whitespace() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{ "b": 1, "a": [true, null, "x"] }"#).unwrap();
        assert_eq!(
            canonical_json(&v).unwrap(),
            br#"{"a":[true,null,"x"],"b":1}"#
        );
    }

    #[test]
    fn chain_link_covers_every_field() {
        let body = serde_json::json!({"note": "x"});
        let base = checkpoint_digest("t", 1, "a", 1, &body, None);
        assert_ne!(base, checkpoint_digest("t", 2, "a", 1, &body, None));
        assert_ne!(base, checkpoint_digest("t", 1, "a", 2, &body, None));
        assert_ne!(
            base,
            checkpoint_digest("t", 1, "a", 1, &serde_json::json!({"note": "y"}), None)
        );
        assert_ne!(
            base,
            checkpoint_digest("t", 1, "a", 1, &body, Some("sha256:00"))
        );
        assert_eq!(base, checkpoint_digest("t", 1, "a", 1, &body, None));
    }

    /// RFC 8785 writes 2^53 + 1 as 9007199254740992, so a digest over it would also be the
    /// digest of 2^53: an approval of one amount would bind the other.
    #[test]
    fn an_integer_a_double_cannot_carry_has_no_digest() {
        let max = crate::MAX_SAFE_INTEGER;
        let a = serde_json::json!({"args": {"amount": max + 2}});
        let b = serde_json::json!({"args": {"amount": max + 1}});
        assert_eq!(
            canonical_json(&a),
            canonical_json(&b),
            "RFC 8785 rounds both"
        );
        assert_eq!(
            json_digest(&a),
            Err(DigestError::InexactNumber {
                pointer: "/args/amount".into(),
                value: (max + 2).to_string(),
            })
        );
        assert!(matches!(
            json_digest(&b),
            Err(DigestError::InexactNumber { .. })
        ));
        // Negative, in arrays, under keys a pointer escapes, and beyond i64.
        let deep = serde_json::json!({"a/b": [0, {"~n": -(max + 1)}]});
        let e = json_digest(&deep).unwrap_err();
        assert_eq!(
            e,
            DigestError::InexactNumber {
                pointer: "/a~1b/1/~0n".into(),
                value: (-(max + 1)).to_string(),
            }
        );
        assert!(e.to_string().contains("/a~1b/1/~0n"), "{e}");
        assert!(matches!(
            json_digest(&serde_json::json!(u64::MAX)),
            Err(DigestError::InexactNumber { pointer, .. }) if pointer.is_empty()
        ));
        assert!(matches!(
            exact_canonical_json(&serde_json::json!([max + 1])),
            Err(DigestError::InexactNumber { .. })
        ));
        // Typed values are checked the same way as JSON.
        #[derive(Serialize)]
        struct Big {
            n: u64,
        }
        assert!(matches!(
            json_digest(&Big { n: 1 << 60 }),
            Err(DigestError::InexactNumber { .. })
        ));

        // The largest exact integers, and doubles of any size, digest; so do their neighbours
        // differently.
        let edge = serde_json::json!({"n": max, "m": -max, "f": 1e300, "g": 9007199254740993.0});
        let d = json_digest(&edge).unwrap();
        let other =
            serde_json::json!({"n": max - 1, "m": -max, "f": 1e300, "g": 9007199254740993.0});
        assert_ne!(d, json_digest(&other).unwrap());
        assert_eq!(
            d,
            format!("sha256:{}", sha256_hex(&canonical_json(&edge).unwrap()))
        );
    }

    /// Chains written before digests refused inexact integers still verify: a link is the same
    /// bytes it always was.
    #[test]
    fn a_checkpoint_link_over_a_large_integer_is_what_it_was() {
        let body = serde_json::json!({"n": crate::MAX_SAFE_INTEGER + 2});
        let link = serde_json::json!({
            "task_id": "t", "sequence": 1, "attempt_id": "a", "fence": 1,
            "body": body, "prev_digest": null,
        });
        assert_eq!(
            checkpoint_digest("t", 1, "a", 1, &body, None),
            format!("sha256:{}", sha256_hex(&canonical_json(&link).unwrap()))
        );
    }

    #[test]
    fn sha256_hex_shape() {
        assert!(is_sha256_hex(&sha256_hex(b"")));
        assert!(!is_sha256_hex("ABC"));
    }
}
