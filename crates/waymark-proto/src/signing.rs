//! Ed25519 signatures over the RFC 8785 canonical bytes of a steer command. Devices sign,
//! the server verifies over the JSON it received (not a re-serialisation of its own types).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde_json::Value;

use crate::digest::canonical_json;
use crate::steer::{Signature, SignedEnvelope, SteerCommand};

pub use ed25519_dalek::{SigningKey as DeviceKey, VerifyingKey as DevicePublicKey};

/// The only algorithm.
pub const ALG: &str = "ed25519";

/// Why a signature or key is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningError {
    /// Not base64url, or not the right length.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// The key bytes are not an Ed25519 point.
    #[error("not an Ed25519 public key")]
    BadKey,
    /// The signature does not verify.
    #[error("the signature does not verify")]
    BadSignature,
    /// The command cannot be canonicalised (not plain JSON).
    #[error("the command is not plain JSON")]
    NotCanonical,
    /// The command holds an integer beyond ±(2^53 − 1). Canonical JSON writes every number as
    /// a double, so such a signature would not say which integer was signed (2^53 and 2^53 + 1
    /// have the same canonical bytes).
    #[error(
        "the command holds an integer beyond ±(2^53 − 1), which canonical JSON cannot carry exactly"
    )]
    InexactNumber,
}

/// Whether every integer in `v` is one a double carries exactly, so that the canonical bytes
/// (RFC 8785 reads numbers as doubles) say which value was signed.
fn exact_numbers(v: &Value) -> bool {
    crate::digest::check_exact(v).is_ok()
}

/// base64url without padding.
pub fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Decodes base64url, with or without padding.
pub fn unb64(s: &str, what: &'static str) -> Result<Vec<u8>, SigningError> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|_| SigningError::Malformed(what))
}

/// A public key from its base64url form.
pub fn public_key(s: &str) -> Result<VerifyingKey, SigningError> {
    let bytes: [u8; 32] = unb64(s, "public key")?
        .try_into()
        .map_err(|_| SigningError::Malformed("public key"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| SigningError::BadKey)
}

/// The base64url form of a public key.
pub fn public_key_b64(key: &VerifyingKey) -> String {
    b64(key.as_bytes())
}

/// Signs a command: the signature covers its canonical JSON.
pub fn sign(command: &SteerCommand, key: &SigningKey) -> Result<SignedEnvelope, SigningError> {
    let value = serde_json::to_value(command).map_err(|_| SigningError::NotCanonical)?;
    sign_value(value, &command.device_id, key)
}

/// Signs a command given as JSON.
pub fn sign_value(
    command: Value,
    key_id: &str,
    key: &SigningKey,
) -> Result<SignedEnvelope, SigningError> {
    if !exact_numbers(&command) {
        return Err(SigningError::InexactNumber);
    }
    let bytes = canonical_json(&command).ok_or(SigningError::NotCanonical)?;
    let sig = key.sign(&bytes);
    Ok(SignedEnvelope {
        command,
        signature: Signature {
            alg: ALG.into(),
            key_id: key_id.into(),
            sig: b64(&sig.to_bytes()),
        },
    })
}

/// Verifies an envelope's signature with the device's public key, over the canonical bytes of
/// the command exactly as received.
pub fn verify(envelope: &SignedEnvelope, key: &VerifyingKey) -> Result<(), SigningError> {
    let sig: [u8; 64] = unb64(&envelope.signature.sig, "signature")?
        .try_into()
        .map_err(|_| SigningError::Malformed("signature"))?;
    if !exact_numbers(&envelope.command) {
        return Err(SigningError::InexactNumber);
    }
    let bytes = canonical_json(&envelope.command).ok_or(SigningError::NotCanonical)?;
    // Strict: refuses small-order keys and non-canonical signatures (no malleability).
    key.verify_strict(&bytes, &ed25519_dalek::Signature::from_bytes(&sig))
        .map_err(|_| SigningError::BadSignature)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Operation;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 8032 §7.1, tests 1–3.
    #[test]
    fn rfc8032_test_vectors() {
        let vectors = [
            (
                "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
                "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
            ),
            (
                "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
                "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
            ),
            (
                "c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
                "fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
                "af82",
                "6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a",
            ),
        ];
        for (sk, pk, msg, sig) in vectors {
            let key = SigningKey::from_bytes(&hex(sk).try_into().unwrap());
            assert_eq!(key.verifying_key().as_bytes().to_vec(), hex(pk));
            let s = key.sign(&hex(msg));
            assert_eq!(s.to_bytes().to_vec(), hex(sig));
            assert!(key.verifying_key().verify_strict(&hex(msg), &s).is_ok());
        }
    }

    /// RFC 8785 §3.2.2 and §3.2.3 examples, and number forms from appendix B.
    #[test]
    fn rfc8785_examples() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        let v: Value = serde_json::from_str(input).unwrap();
        let out = String::from_utf8(canonical_json(&v).unwrap()).unwrap();
        assert_eq!(
            out,
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );

        // Keys sort by UTF-16 code units: U+1F600 (D83D DE00) sorts before U+FB33.
        let sorting = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let v: Value = serde_json::from_str(sorting).unwrap();
        let out = String::from_utf8(canonical_json(&v).unwrap()).unwrap();
        let order: Vec<&str> = [
            "\r",
            "1",
            "\u{80}",
            "\u{f6}",
            "\u{20ac}",
            "\u{1f600}",
            "\u{fb33}",
        ]
        .to_vec();
        let positions: Vec<usize> = order
            .iter()
            .map(|k| {
                out.find(&format!("\"{}\":", k.replace('\r', "\\r")))
                    .unwrap()
            })
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{out}");

        for (n, want) in [
            ("1e21", "1e+21"),
            ("1e20", "100000000000000000000"),
            ("-0", "0"),
            ("1e-7", "1e-7"),
            ("9007199254740991", "9007199254740991"),
        ] {
            let v: Value = serde_json::from_str(n).unwrap();
            assert_eq!(
                String::from_utf8(canonical_json(&v).unwrap()).unwrap(),
                want,
                "{n}"
            );
        }
    }

    /// The fixture the web companion's signer (ui/src/web/sign.ts) is tested against: both
    /// signers must produce these canonical bytes, so a command signed in a browser verifies here.
    #[test]
    fn the_web_companions_canonical_json_fixture_holds() {
        let fixture: Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../ui/src/web/fixtures/jcs.json"
        )))
        .unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert!(!cases.is_empty());
        for case in cases {
            let (input, want) = (case[0].as_str().unwrap(), case[1].as_str().unwrap());
            let v: Value = serde_json::from_str(input).unwrap();
            let got = String::from_utf8(canonical_json(&v).unwrap()).unwrap();
            assert_eq!(got, want, "{input}");
            // Every case is signable: no integer beyond ±(2^53 − 1).
            assert!(exact_numbers(&v), "{input}");
        }
        // And these are not, on either side.
        for input in fixture["inexact"].as_array().unwrap() {
            let input = input.as_str().unwrap();
            let v: Value = serde_json::from_str(input).unwrap();
            assert!(!exact_numbers(&v), "{input}");
        }
    }

    /// Envelopes the web companion signed (ui/src/web/sign.test.ts re-makes them byte for byte):
    /// the server's verifier accepts them, and its types read them back to the same JSON, so the
    /// browser's commands have the Rust shape (omitted fields, chrono's times) exactly.
    #[test]
    fn envelopes_signed_by_the_web_companion_verify() {
        let fixture: Value = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../ui/src/web/fixtures/envelopes.json"
        )))
        .unwrap();
        let key = public_key(fixture["public_key"].as_str().unwrap()).unwrap();
        let envelopes = fixture["envelopes"].as_array().unwrap();
        assert_eq!(envelopes.len(), 2);
        for env in envelopes {
            let env: SignedEnvelope = serde_json::from_value(env.clone()).unwrap();
            verify(&env, &key).unwrap();
            let cmd: SteerCommand = serde_json::from_value(env.command.clone()).unwrap();
            assert_eq!(serde_json::to_value(&cmd).unwrap(), env.command);
            assert!(uuid::Uuid::parse_str(&cmd.command_id).is_ok_and(|u| u.get_version_num() == 7));
            let mut tampered = env.clone();
            tampered.command["issued_by"] = "user:mallory".into();
            assert_eq!(verify(&tampered, &key), Err(SigningError::BadSignature));
        }
    }

    fn command() -> SteerCommand {
        SteerCommand {
            command_id: crate::ids::command(),
            task_id: Some("task_842".into()),
            expected_plan_revision: Some(7),
            operation: Operation::SuspendAndReplan,
            scope: vec!["deploy_staging".into(), "notify_release".into()],
            args: serde_json::json!({"instructions": "do not deploy; write the report only"}),
            issued_by: "user:alice".into(),
            device_id: "dev_1".into(),
            issued_at: chrono::Utc::now(),
            expires_at: chrono::Utc::now() + chrono::Duration::minutes(10),
        }
    }

    #[test]
    fn a_signed_command_verifies_and_any_change_breaks_it() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let env = sign(&command(), &key).unwrap();
        verify(&env, &key.verifying_key()).unwrap();

        let mut tampered = env.clone();
        tampered.command["expected_plan_revision"] = 8.into();
        assert_eq!(
            verify(&tampered, &key.verifying_key()),
            Err(SigningError::BadSignature)
        );

        let mut extra = env.clone();
        extra.command["smuggled"] = true.into();
        assert_eq!(
            verify(&extra, &key.verifying_key()),
            Err(SigningError::BadSignature)
        );

        let mut flipped = env.clone();
        let mut raw = unb64(&flipped.signature.sig, "signature").unwrap();
        raw[10] ^= 1;
        flipped.signature.sig = b64(&raw);
        assert_eq!(
            verify(&flipped, &key.verifying_key()),
            Err(SigningError::BadSignature)
        );

        let other = SigningKey::generate(&mut rand::rngs::OsRng);
        assert_eq!(
            verify(&env, &other.verifying_key()),
            Err(SigningError::BadSignature)
        );

        // Key order and whitespace do not matter: the canonical bytes do.
        let reordered: Value =
            serde_json::from_str(&serde_json::to_string_pretty(&env.command).unwrap()).unwrap();
        verify(
            &SignedEnvelope {
                command: reordered,
                signature: env.signature.clone(),
            },
            &key.verifying_key(),
        )
        .unwrap();
    }

    /// Found by the `envelope_parse_verify` fuzz target: 2^53 + 1 and 2^53 have the same
    /// canonical bytes, so a command signed with one verified with the other.
    #[test]
    fn an_integer_a_double_cannot_carry_is_refused_not_rounded() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let mut cmd = command();
        cmd.expected_plan_revision = Some(crate::MAX_SAFE_INTEGER + 2);
        assert_eq!(sign(&cmd, &key), Err(SigningError::InexactNumber));

        // A device that signs the canonical bytes itself gets no further.
        let value = serde_json::to_value(&cmd).unwrap();
        let sig = key.sign(&canonical_json(&value).unwrap());
        let mut env = SignedEnvelope {
            command: value,
            signature: Signature {
                alg: ALG.into(),
                key_id: cmd.device_id.clone(),
                sig: b64(&sig.to_bytes()),
            },
        };
        assert_eq!(
            verify(&env, &key.verifying_key()),
            Err(SigningError::InexactNumber)
        );
        env.command["expected_plan_revision"] = (crate::MAX_SAFE_INTEGER + 1).into();
        assert_eq!(
            verify(&env, &key.verifying_key()),
            Err(SigningError::InexactNumber)
        );
        // Anywhere in the command, negative too.
        let mut cmd = command();
        cmd.args = serde_json::json!({"plan": [{"n": -(crate::MAX_SAFE_INTEGER + 1)}]});
        assert_eq!(sign(&cmd, &key), Err(SigningError::InexactNumber));

        // The largest safe integers still sign and verify.
        let mut cmd = command();
        cmd.expected_plan_revision = Some(crate::MAX_SAFE_INTEGER);
        cmd.args = serde_json::json!({"n": -crate::MAX_SAFE_INTEGER, "f": 1e300});
        verify(&sign(&cmd, &key).unwrap(), &key.verifying_key()).unwrap();
    }

    #[test]
    fn public_keys_round_trip_and_garbage_is_refused() {
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        let s = public_key_b64(&key.verifying_key());
        assert_eq!(public_key(&s).unwrap(), key.verifying_key());
        assert!(public_key("short").is_err());
        assert!(public_key("!!!!").is_err());
    }
}
