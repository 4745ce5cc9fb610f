//! Digests over canonical JSON (RFC 8785). Intent digests, effect body digests and the
//! checkpoint hash chain all hash the same canonical bytes, so any client can recompute them.

use serde::Serialize;
use sha2::{Digest, Sha256};

/// The RFC 8785 canonical bytes of a value.
///
/// Serialising plain data cannot fail; a value that cannot be represented in JSON (a map with
/// non-string keys, a non-finite float) is a programming error, reported as `None`.
pub fn canonical_json<T: Serialize + ?Sized>(value: &T) -> Option<Vec<u8>> {
    serde_jcs::to_vec(value).ok()
}

/// Lower-case hex sha256 of bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// `sha256:<hex>` of a value's canonical JSON: the form intent digests take on the wire.
pub fn json_digest<T: Serialize + ?Sized>(value: &T) -> Option<String> {
    canonical_json(value).map(|b| format!("sha256:{}", sha256_hex(&b)))
}

/// Whether a string is a well-formed sha256 hex digest (64 lower-case hex characters).
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The link of a checkpoint in its task's hash chain: sha256 over the canonical JSON of the
/// checkpoint's identity, its body and the previous link. Editing any stored field, or
/// reordering checkpoints, changes every later link.
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
    json_digest(&link).expect("a checkpoint link is plain JSON")
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

    #[test]
    fn sha256_hex_shape() {
        assert!(is_sha256_hex(&sha256_hex(b"")));
        assert!(!is_sha256_hex("ABC"));
    }
}
