//! JUnit XML written for real by two runners (pytest and cargo-nextest) parses into the right
//! totals and failures.

use std::path::Path;
use std::process::Command;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::Harness;

async fn submit(h: &Harness, xml: &str, command: &str, exit_code: i32) -> Value {
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/test-receipts"),
            json!({"attempt_id": att, "fence": fence, "step": "fix", "command": command,
                     "exit_code": exit_code, "commit": "abc123", "junit_xml": xml}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    // The raw XML is kept as an artifact.
    let d = h.detail(&task).await;
    assert_eq!(d["artifacts"][0]["sha256"], v["junit_sha256"]);
    assert_eq!(d["artifacts"][0]["media_type"], "application/xml");
    v
}

fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} — `.ci/run` installs it"))
}

#[tokio::test]
async fn pytest_junit_parses_into_totals_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("test_cart.py"),
        r#"
import pytest

def total(items):
    return sum(items) + 1  # the bug

def test_empty():
    assert total([]) - 1 == 0

def test_sum():
    assert total([1, 1]) == 2

@pytest.mark.skip(reason="needs network")
def test_remote():
    pass

def test_count():
    assert len([1, 2]) == 2
"#,
    )
    .unwrap();
    let xml_path = dir.path().join("report.xml");
    let out = run(Command::new("python3")
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml"])
        .arg(&xml_path)
        .current_dir(dir.path()));
    assert_eq!(
        out.status.code(),
        Some(1),
        "pytest: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(&xml_path).unwrap();

    let h = Harness::start().await;
    let r = submit(&h, &xml, "python3 -m pytest", 1).await;
    assert_eq!(
        r["totals"],
        json!({"tests": 4, "failures": 1, "errors": 0, "skipped": 1, "passed": 2}),
        "{r}"
    );
    assert_eq!(r["passed"], false);
    assert_eq!(r["failures"][0]["name"], "test_sum");
    assert!(
        r["failures"][0]["message"]
            .as_str()
            .unwrap()
            .contains("assert 3 == 2"),
        "{r}"
    );
}

fn write_crate(root: &Path) {
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join(".config")).unwrap();
    std::fs::write(
        root.join("Cargo.toml"),
        "[package]\nname = \"cart\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(
        root.join(".config/nextest.toml"),
        "[profile.default.junit]\npath = \"junit.xml\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("src/lib.rs"),
        r#"
pub fn total(items: &[u32]) -> u32 { items.iter().sum::<u32>() + 1 }

#[cfg(test)]
mod tests {
    use super::*;
    #[test] fn empty() { assert_eq!(total(&[]) - 1, 0); }
    #[test] fn sum() { assert_eq!(total(&[1, 1]), 2, "the cart total is off by one"); }
    #[test] fn count() { assert_eq!([1, 2].len(), 2); }
}
"#,
    )
    .unwrap();
}

#[tokio::test]
async fn nextest_junit_parses_into_totals_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    write_crate(dir.path());
    let target = dir.path().join("target");
    let out = run(Command::new("cargo")
        .args(["nextest", "run", "--no-fail-fast", "--offline"])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(dir.path()));
    assert_eq!(
        out.status.code(),
        Some(100),
        "nextest: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(target.join("nextest/default/junit.xml")).unwrap();

    let h = Harness::start().await;
    let r = submit(&h, &xml, "cargo nextest run", 100).await;
    assert_eq!(r["totals"]["tests"], 3, "{r}");
    assert_eq!(r["totals"]["failures"], 1, "{r}");
    assert_eq!(r["totals"]["passed"], 2, "{r}");
    assert_eq!(r["passed"], false);
    assert!(
        r["failures"][0]["name"].as_str().unwrap().contains("sum"),
        "{r}"
    );
    assert!(
        r["failures"][0]["message"].as_str().unwrap().len() > 3,
        "{r}"
    );
}

#[tokio::test]
async fn what_is_not_junit_is_refused_and_nothing_is_written() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/test-receipts"),
            json!({"attempt_id": att, "fence": fence, "command": "make test", "exit_code": 0,
                     "junit_xml": "all tests passed!"}),
        )
        .await;
    crate::support::assert_problem(s, &v, 422, "validation_failed");
    let d = h.detail(&task).await;
    assert!(d["test_receipts"].as_array().unwrap().is_empty());
    assert!(d["artifacts"].as_array().unwrap().is_empty());
}

/// Found while writing the `junit_ingest` fuzz target (its seeds `deep.xml` and `inf.xml`): a
/// report nested 100 000 suites deep overflowed a request thread's stack and took the server
/// down; `time="inf"` became `"duration_seconds": null` on the wire, which mirrors refused.
#[tokio::test]
async fn a_report_nested_too_deep_is_refused_and_a_duration_is_always_a_number() {
    let h = Harness::start().await;
    let task = h.create_task(&h.alice).await;
    let (att, fence) = h.attempt(&h.alice, &task, 60).await;
    let n = 100_000;
    let deep = format!(
        "<testsuites>{}{}</testsuites>",
        "<testsuite name=\"x\">".repeat(n),
        "</testsuite>".repeat(n)
    );
    let (s, v) = h
        .post(
            &h.alice,
            &format!("/v1/tasks/{task}/test-receipts"),
            json!({"attempt_id": att, "fence": fence, "command": "make test", "exit_code": 0,
                     "junit_xml": deep}),
        )
        .await;
    crate::support::assert_problem(s, &v, 422, "validation_failed");
    assert!(v["detail"].as_str().unwrap().contains("nested"), "{v}");

    let xml = r#"<testsuites time="inf"><testsuite name="s" time="NaN"><testcase name="a"/></testsuite></testsuites>"#;
    let v = submit(&h, xml, "make test", 0).await;
    assert_eq!(v["duration_seconds"], json!(0.0), "{v}");
    let d = h.detail(v["task_id"].as_str().unwrap()).await;
    assert!(d["test_receipts"][0]["duration_seconds"].is_number(), "{d}");
}
