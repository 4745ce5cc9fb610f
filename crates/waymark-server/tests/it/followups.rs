//! Follow-ups and budget thresholds (SPEC §6).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Harness, assert_problem};

async fn followup(h: &Harness, task: &str, body: Value) -> Value {
    let (s, v) = h
        .post(&h.alice, &format!("/v1/tasks/{task}/followups"), body)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    v
}

async fn plan(h: &Harness, id: &str, n: usize) -> Value {
    let (s, v) = h
        .get(&h.alice, &format!("/v1/followups/{id}?next={n}"))
        .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    v
}

fn followup_messages(d: &Value) -> usize {
    d["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "followup")
        .count()
}

#[tokio::test]
async fn a_daily_0230_paris_follow_up_is_listed_once_a_day_through_both_transitions() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let f = followup(&h, &task, json!({"schedule": {"cron": "30 2 * * *"}, "time_zone": "Europe/Paris", "message": "check the nightly run"})).await;
    let p = plan(&h, f["id"].as_str().unwrap(), 400).await;
    let times: Vec<DateTime<Utc>> = p["next"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    assert_eq!(times.len(), 400);
    let paris = waymark_domain::zone::Zone::named("Europe/Paris").unwrap();
    let mut per_day: BTreeMap<chrono::NaiveDate, Vec<String>> = BTreeMap::new();
    for t in &times {
        let local = t.with_timezone(&paris);
        per_day
            .entry(local.date_naive())
            .or_default()
            .push(local.format("%H:%M %Z").to_string());
    }
    assert!(
        per_day.values().all(|v| v.len() == 1),
        "a day ran twice or not at all"
    );
    assert_eq!(per_day.len(), 400, "one run a day, every day");
    // 400 days always cross a spring-forward: that day runs at 03:30 CEST, once.
    let shifted: Vec<_> = per_day
        .values()
        .filter(|v| v[0].starts_with("03:30"))
        .collect();
    assert_eq!(shifted.len(), 1, "{shifted:?}");
    assert!(
        per_day
            .values()
            .filter(|v| !v[0].starts_with("03:30"))
            .all(|v| v[0].starts_with("02:30"))
    );
}

#[tokio::test]
async fn bad_schedules_are_refused_with_the_reason() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    for (body, needle) in [
        (
            json!({"schedule": {"at": "2020-01-01T10:00"}, "time_zone": "UTC", "message": "m"}),
            "future",
        ),
        (
            json!({"schedule": {"cron": "30 2 * * *"}, "time_zone": "Mars/Olympus", "message": "m"}),
            "IANA",
        ),
        (
            json!({"schedule": {"every": "P1M"}, "message": "m"}),
            "months",
        ),
        (json!({"schedule": {"whenever": "x"}, "message": "m"}), ""),
        // Found by `scripts/api-fuzz`: a negative or infinite duration panicked the handler, and
        // a run past the year 9999 was answered as a date-time RFC 3339 cannot spell.
        (
            json!({"schedule": {"after": "P-1D"}, "message": "m"}),
            "longer than zero",
        ),
        (
            json!({"schedule": {"every": "P1e39D"}, "message": "m"}),
            "finite",
        ),
        (
            json!({"schedule": {"after": "P3885321W"}, "message": "m"}),
            "9999",
        ),
        (
            json!({"schedule": {"at": "+12027-01-01T10:00"}, "message": "m"}),
            "9999",
        ),
    ] {
        let (s, v) = h
            .post(&h.alice, &format!("/v1/tasks/{task}/followups"), body)
            .await;
        assert_problem(s, &v, 422, "validation_failed");
        assert!(v["detail"].as_str().unwrap().contains(needle), "{v}");
    }
}

#[tokio::test]
async fn an_interval_runs_into_the_session_and_a_long_outage_runs_once_then_never_doubles() {
    let mut h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let f = followup(&h, &task, json!({"schedule": {"every": "PT1S"}, "catch_up": "run_once", "message": "poll the canary"})).await;
    let id = f["id"].as_str().unwrap().to_owned();
    h.advance(Duration::from_millis(1200)).await;
    h.advance(Duration::from_millis(1200)).await;
    let before = plan(&h, &id, 1).await["followup"].clone();
    assert!(before["runs"].as_i64().unwrap() >= 2, "{before}");
    assert_eq!(
        followup_messages(&h.detail(&task).await) as i64,
        before["runs"].as_i64().unwrap()
    );

    // Down for three and a half periods.
    h.restart_after(Duration::from_millis(3500)).await;
    let after = plan(&h, &id, 1).await["followup"].clone();
    let missed = after["missed"].as_i64().unwrap() - before["missed"].as_i64().unwrap();
    assert!((2..=4).contains(&missed), "missed {missed}: {after}");
    let d = h.detail(&task).await;
    assert_eq!(
        followup_messages(&d) as i64,
        after["runs"].as_i64().unwrap(),
        "one message per run"
    );
    assert!(
        d["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["text"].as_str().unwrap().contains("were missed"))
    );

    // Restarting again at once doubles nothing.
    let runs = after["runs"].as_i64().unwrap();
    h.restart_after(Duration::from_millis(0)).await;
    let again = plan(&h, &id, 1).await["followup"].clone();
    assert!(again["runs"].as_i64().unwrap() <= runs + 2, "{again}");
    assert_eq!(
        followup_messages(&h.detail(&task).await) as i64,
        again["runs"].as_i64().unwrap()
    );
}

#[tokio::test]
async fn with_catch_up_skip_missed_periods_are_counted_not_run() {
    let mut h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let f = followup(
        &h,
        &task,
        json!({"schedule": {"every": "PT1S"}, "catch_up": "skip", "message": "m"}),
    )
    .await;
    let id = f["id"].as_str().unwrap().to_owned();
    h.advance(Duration::from_millis(1300)).await;
    let before = plan(&h, &id, 1).await["followup"].clone();
    h.restart_after(Duration::from_millis(3500)).await;
    let after = plan(&h, &id, 1).await["followup"].clone();
    assert!(
        after["missed"].as_i64().unwrap() - before["missed"].as_i64().unwrap() >= 2,
        "{before} → {after}"
    );
    assert!(
        after["runs"].as_i64().unwrap() - before["runs"].as_i64().unwrap() <= 2,
        "missed periods ran: {after}"
    );
    let d = h.detail(&task).await;
    assert!(
        !d["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["text"].as_str().unwrap().contains("run once"))
    );
}

#[tokio::test]
async fn budget_thresholds_open_one_decision_each_with_what_each_option_gives_up() {
    let h = Harness::start().await;
    let (s, t) = h
        .post(
            &h.alice,
            "/v1/tasks",
            json!({"title": "budgeted", "budget": {"max_tokens": 1000, "decision_seconds": 1}}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let task = t["id"].as_str().unwrap();
    let path = format!("/v1/tasks/{task}/usage");
    let usage = |tokens: u64| h.post(&h.alice, &path, json!({"tokens": tokens}));
    let (_, v) = usage(500).await;
    assert!(v.get("budget_decision").is_none(), "{v}");
    let (_, v) = usage(350).await;
    let d = &v["budget_decision"];
    assert_eq!(d["kind"], "budget", "{v}");
    assert!(d["question"].as_str().unwrap().starts_with("80%"), "{d}");
    let ids: Vec<&str> = d["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["relevant_tests", "full_suite", "deliver_patch"]);
    assert!(
        d["options"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| !o["gives_up"].as_str().unwrap().is_empty())
    );
    assert_eq!(d["default_option"], "deliver_patch");
    assert_eq!(v["usage"]["tokens"], 850, "the reply is still the task");
    let (_, v) = usage(50).await;
    assert!(v.get("budget_decision").is_none(), "80% asks once: {v}");
    let (_, v) = usage(200).await;
    assert!(
        v["budget_decision"]["question"]
            .as_str()
            .unwrap()
            .starts_with("100%"),
        "{v}"
    );
    // Nobody answers: the stated default applies.
    let id = v["budget_decision"]["id"].as_str().unwrap();
    let (_, d) = h
        .get(
            &h.alice,
            &format!("/v1/tasks/{task}/decisions/{id}?wait=5s"),
        )
        .await;
    assert_eq!(d["status"], "expired");
    assert_eq!(d["outcome"]["option"], "deliver_patch");
}

/// A budget decision waits at most 30 days, whatever the budget asks: a longer wait overflowed
/// (a panic) or ended past the year 9999.
#[tokio::test]
async fn a_budget_decision_waits_at_most_thirty_days() {
    let h = Harness::start().await;
    for seconds in [1_000_000_000_000_u64, u64::MAX] {
        let (s, t) = h
            .post(
                &h.alice,
                "/v1/tasks",
                json!({"title": "budgeted", "budget": {"max_tokens": 1, "decision_seconds": seconds}}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{t}");
        let task = t["id"].as_str().unwrap();
        let (s, v) = h
            .post(
                &h.alice,
                &format!("/v1/tasks/{task}/usage"),
                json!({"tokens": 5}),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        let d = &v["budget_decision"];
        let expires: DateTime<Utc> = d["expires_at"].as_str().unwrap().parse().unwrap();
        let created: DateTime<Utc> = d["created_at"].as_str().unwrap().parse().unwrap();
        assert_eq!((expires - created).num_days(), 30, "{d}");
    }
}
