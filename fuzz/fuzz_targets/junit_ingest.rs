//! JUnit ingest (`waymark_server::junit::parse`) on arbitrary text: never panics, and what it
//! keeps is bounded by what it was given: counts add up, one failure per failed or errored
//! case, no more cases than `<testcase` tags, no kept text longer than the document, and a
//! finite, non-negative duration.
#![no_main]

use libfuzzer_sys::fuzz_target;
use waymark_server::junit;

fuzz_target!(|data: &[u8]| {
    // The server receives `junit_xml` inside a JSON body, so it is always UTF-8.
    let xml = String::from_utf8_lossy(data);
    let Ok(p) = junit::parse(&xml) else {
        return;
    };
    let t = &p.totals;
    assert_eq!(t.tests, t.passed + t.failures + t.errors + t.skipped);
    assert_eq!(p.failures.len() as u64, t.failures + t.errors);
    assert!(t.tests <= xml.matches("<testcase").count() as u64);
    for f in &p.failures {
        for s in [&f.suite, &f.classname, &f.name, &f.message] {
            assert!(s.len() <= xml.len(), "kept text longer than the document");
        }
        assert!(f.kind == "failure" || f.kind == "error");
    }
    assert!(
        p.duration_seconds.is_finite() && p.duration_seconds >= 0.0,
        "duration {} is not a finite, non-negative number of seconds",
        p.duration_seconds
    );
    // A receipt is stored and sent as JSON: it must survive the trip.
    let json = serde_json::to_value(&p.totals).expect("totals are JSON");
    assert!(json.is_object());
});
