//! The benchmark binary keeps working: a quick run of one benchmark prints figures as JSON.

#[test]
fn a_quick_steer_run_prints_its_figures() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_waymark-bench"))
        .args(["--quick", "--json", "--only", "steer"])
        .env("WAYMARK_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let figures = figures.as_array().unwrap();
    assert_eq!(
        figures.len(),
        6,
        "p50 and p99 with nobody watching, with the subscribers reading, and not"
    );
    assert_eq!(
        figures.iter().filter(|f| f["met"].is_boolean()).count(),
        2,
        "two targets: the p99 with nobody watching and with the subscribers reading"
    );
    for f in figures {
        assert_eq!(f["bench"], "steer");
        assert!(f["value"].as_f64().unwrap() > 0.0, "{f}");
    }
}
