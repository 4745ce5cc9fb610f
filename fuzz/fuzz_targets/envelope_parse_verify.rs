//! Arbitrary bytes as a device's request body: parse the signed envelope, verify it the way
//! the server does (the key named by `key_id`, then the signature over the canonical bytes of
//! the command as received). Never panics; and whatever verifies is, to a reader, one of the
//! commands the fuzzing device really signed.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use waymark_fuzz::{device_key, same, seed_envelopes};
use waymark_proto::signing::{self, DevicePublicKey};
use waymark_proto::{SignedEnvelope, SteerCommand};

struct Known {
    key: DevicePublicKey,
    key_b64: String,
    signed: Vec<SignedEnvelope>,
}

fn known() -> &'static Known {
    static K: OnceLock<Known> = OnceLock::new();
    K.get_or_init(|| {
        let key = device_key().verifying_key();
        Known {
            key_b64: signing::public_key_b64(&key),
            key,
            signed: seed_envelopes(),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let k = known();
    let Ok(env) = serde_json::from_slice::<SignedEnvelope>(data) else {
        return;
    };
    // The server parses the command into its type separately from verifying it.
    let _ = serde_json::from_value::<SteerCommand>(env.command.clone());
    // `key_id` is attacker-chosen text; a stored key is base64url.
    let _ = signing::public_key(&env.signature.key_id);
    let _ = signing::public_key(&k.key_b64).expect("our own key parses");
    if signing::verify(&env, &k.key).is_ok() {
        assert!(
            k.signed.iter().any(|s| same(&s.command, &env.command)),
            "an envelope verified as a command the device never signed: {}",
            env.command
        );
    }
});
