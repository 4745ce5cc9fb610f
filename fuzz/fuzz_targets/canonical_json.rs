//! Canonical JSON (RFC 8785, through `serde_jcs`) on arbitrary JSON: the same bytes as an
//! independent serialiser written from the RFC; canonicalising the canonical form changes
//! nothing; and another text of the same value (keys reordered, whitespace added) has the same
//! canonical bytes and the same digest.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use waymark_fuzz::{ES6_VECTORS, es6_number, independent_jcs, reordered_text};
use waymark_proto::digest::{canonical_json, json_digest};

fuzz_target!(|data: &[u8]| {
    // The oracle is checked against the RFC's vectors before it judges anything.
    static ORACLE: std::sync::Once = std::sync::Once::new();
    ORACLE.call_once(|| {
        for &(bits, want) in ES6_VECTORS {
            assert_eq!(es6_number(f64::from_bits(bits)), want, "oracle: {bits:#x}");
        }
    });
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let ours = canonical_json(&v).expect("parsed JSON is plain JSON");
    let text = std::str::from_utf8(&ours).expect("canonical JSON is UTF-8");
    assert_eq!(
        text,
        independent_jcs(&v),
        "differs from the independent serialiser"
    );

    let again: Value = serde_json::from_slice(&ours).expect("canonical JSON parses");
    assert_eq!(
        canonical_json(&again).as_deref(),
        Some(ours.as_slice()),
        "canonicalising the canonical form changed it"
    );

    let other: Value = serde_json::from_str(&reordered_text(&v)).expect("a reordered text parses");
    assert_eq!(
        canonical_json(&other).as_deref(),
        Some(ours.as_slice()),
        "key order or whitespace changed the canonical form"
    );
    assert_eq!(json_digest(&other), json_digest(&v));
});
