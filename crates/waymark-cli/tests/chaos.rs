//! `waymark chaos` as a user runs it: the real binary breaks a real `waymark serve` child
//! with SIGKILL, crashes and stalls workers, repeats and partitions, kills real `waymark
//! runner` children and their runtimes, and its figures must show nothing acknowledged lost,
//! nothing applied twice, no stale write accepted and no run lost.

use std::process::{Command, Output};

use serde_json::Value;

fn chaos(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_waymark"))
        .env("WAYMARK_LOG", "error")
        .env_remove("WAYMARK_DATA_DIR")
        .arg("chaos")
        .args(args)
        .output()
        .unwrap()
}

fn report(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let first = stdout.lines().next().unwrap_or_default();
    serde_json::from_str(first).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {stdout:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Asserts the figures every scenario must show.
fn assert_clean(name: &str, f: &Value, runs: u64) {
    assert_eq!(f["runs"], runs, "{name}: {f}");
    assert!(
        f["writes_acknowledged"].as_u64().unwrap() > 0,
        "{name} acknowledged nothing, so it proved nothing: {f}"
    );
    for zero in [
        "acknowledged_writes_lost",
        "duplicate_effects",
        "stale_writes_accepted",
        "invalid_states",
        "runs_lost",
        "runs_waiting",
        "errors",
    ] {
        assert_eq!(f[zero], 0, "{name}: {zero} — {f}");
    }
}

#[test]
fn every_scenario_loses_nothing_duplicates_nothing_and_accepts_no_stale_write() {
    let out = chaos(&["--runs", "3", "--json", "--seed", "7"]);
    let r = report(&out);
    assert!(out.status.success(), "{r:#}");
    assert_eq!(r["ok"], true, "{r:#}");
    assert_eq!(r["broken"], serde_json::json!([]), "{r:#}");
    assert_clean("totals", &r["totals"], 18);
    let scenarios = r["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["scenario"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "server-kill",
            "crash-after-commit",
            "stale-worker",
            "duplicate-commands",
            "partition",
            "runner-kill"
        ]
    );
    for s in scenarios {
        let name = s["scenario"].as_str().unwrap();
        assert_clean(name, s, 3);
        assert_eq!(s["violations"], serde_json::json!([]), "{name}: {s}");
        match name {
            // Each deploying scenario deployed exactly once per run.
            "crash-after-commit" | "stale-worker" | "partition" => {
                assert_eq!(s["deploys"], 3, "{name}: {s}")
            }
            _ => assert_eq!(s["deploys"], 0, "{name}: {s}"),
        }
        if name == "runner-kill" {
            assert_killed_and_revived(s, 3);
        }
        if name == "stale-worker" || name == "partition" {
            // Stale writes were really tried: a checkpoint, a receipt, a declaration, a
            // message, a heartbeat and a deploy per run, at least.
            assert!(
                s["stale_writes_tried"].as_u64().unwrap() >= 18,
                "{name}: {s}"
            );
        }
    }
    // The server was killed once or twice in each run.
    assert!(
        scenarios[0]["kills"].as_u64().unwrap() >= 3,
        "{}",
        scenarios[0]
    );
    // Writers were busy when the server died: many writes, all found again.
    assert!(
        scenarios[0]["writes_acknowledged"].as_u64().unwrap() >= 100,
        "{}",
        scenarios[0]
    );
}

/// The runner-kill figures that show it broke something: every run was killed at least once
/// (its first point is always reached) and some runtime was resumed after its kill; with every
/// card answered, no run is left waiting on a person (`assert_clean`).
fn assert_killed_and_revived(s: &serde_json::Value, runs: u64) {
    assert!(
        s["kills"].as_u64().unwrap() >= runs,
        "killed in every run: {s}"
    );
    assert!(
        s["revives"].as_u64().unwrap() >= 1,
        "a killed runtime was resumed: {s}"
    );
}

#[test]
fn runners_and_runtimes_killed_mid_run_lose_no_run_and_repeat_no_call() {
    let out = chaos(&[
        "--scenario",
        "runner-kill",
        "--runs",
        "6",
        "--json",
        "--seed",
        "11",
    ]);
    let r = report(&out);
    assert!(out.status.success(), "{r:#}");
    let s = &r["scenarios"][0];
    assert_eq!(s["scenario"], "runner-kill");
    assert_clean("runner-kill", s, 6);
    assert_eq!(s["violations"], serde_json::json!([]), "{s}");
    assert_killed_and_revived(s, 6);
    assert!(
        s["recovery_cards"].as_u64().unwrap() >= 1,
        "a call was in doubt and a card answered it: {s}"
    );
}

#[test]
fn a_hundred_crashes_after_commit_deploy_exactly_a_hundred_times() {
    let out = chaos(&[
        "--scenario",
        "crash-after-commit",
        "--runs",
        "100",
        "--json",
    ]);
    let r = report(&out);
    assert!(out.status.success(), "{r:#}");
    let s = &r["scenarios"][0];
    assert_eq!(s["scenario"], "crash-after-commit");
    assert_clean("crash-after-commit", s, 100);
    assert_eq!(s["deploys"], 100, "{s}");
}

#[test]
fn the_table_names_every_figure_and_a_bad_run_count_is_a_usage_error() {
    let out = chaos(&["--scenario", "duplicate-commands", "--runs", "2"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for column in [
        "runs",
        "acked writes",
        "lost",
        "duplicates",
        "stale accepted",
        "duplicate-commands",
        "✔",
    ] {
        assert!(text.contains(column), "{column} missing from:\n{text}");
    }

    let out = chaos(&["--runs", "0"]);
    assert_eq!(out.status.code(), Some(2));
}
