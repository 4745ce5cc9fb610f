//! JUnit XML ingest, through `junit-parser`: totals counted from the test cases themselves
//! (runners disagree on the summary attributes), failures with their messages.

use waymark_proto::{TestFailure, TestTotals};

/// What a receipt keeps of a JUnit report.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Parsed {
    pub(crate) totals: TestTotals,
    pub(crate) failures: Vec<TestFailure>,
    pub(crate) duration_seconds: f64,
}

/// Why a document is not a JUnit report.
#[derive(Debug, thiserror::Error)]
pub(crate) enum JunitError {
    #[error("{0}")]
    Xml(String),
    #[error("no <testsuites> or <testsuite> element")]
    NoSuites,
}

fn first_line(s: &str) -> String {
    let line = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut out: String = line.chars().take(500).collect();
    if out.len() < line.len() {
        out.push('…');
    }
    out
}

fn walk(suite: &junit_parser::TestSuite, totals: &mut TestTotals, failures: &mut Vec<TestFailure>) {
    for case in &suite.cases {
        totals.tests += 1;
        let classname = case.classname.clone().unwrap_or_default();
        let (kind, message) = match &case.status {
            junit_parser::TestStatus::Success => {
                totals.passed += 1;
                continue;
            }
            junit_parser::TestStatus::Skipped(_) => {
                totals.skipped += 1;
                continue;
            }
            junit_parser::TestStatus::Failure(f) => {
                totals.failures += 1;
                (
                    "failure",
                    if f.message.is_empty() {
                        first_line(&f.text)
                    } else {
                        f.message.clone()
                    },
                )
            }
            junit_parser::TestStatus::Error(e) => {
                totals.errors += 1;
                (
                    "error",
                    if e.message.is_empty() {
                        first_line(&e.text)
                    } else {
                        e.message.clone()
                    },
                )
            }
        };
        failures.push(TestFailure {
            suite: suite.name.clone(),
            classname,
            name: case.original_name.clone(),
            kind: kind.into(),
            message,
        });
    }
    for nested in &suite.suites {
        walk(nested, totals, failures);
    }
}

/// Parses a JUnit XML document.
pub(crate) fn parse(xml: &str) -> Result<Parsed, JunitError> {
    let doc = junit_parser::from_reader(std::io::Cursor::new(xml.as_bytes()))
        .map_err(|e| JunitError::Xml(e.to_string()))?;
    if doc.suites.is_empty() && !xml.contains("<testsuite") {
        return Err(JunitError::NoSuites);
    }
    let mut totals = TestTotals::default();
    let mut failures = Vec::new();
    for s in &doc.suites {
        walk(s, &mut totals, &mut failures);
    }
    let suites_time: f64 = doc.suites.iter().map(|s| s.time).sum();
    let duration_seconds = if doc.time > 0.0 {
        doc.time
    } else {
        suites_time
    };
    Ok(Parsed {
        totals,
        failures,
        duration_seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_cases_and_keeps_messages() {
        let xml = r#"<?xml version="1.0"?>
<testsuites><testsuite name="s" tests="3" time="1.5">
  <testcase name="ok" classname="m"/>
  <testcase name="bad" classname="m"><failure message="expected 2, got 3">trace</failure></testcase>
  <testcase name="skip" classname="m"><skipped/></testcase>
  <testcase name="boom" classname="m"><error>panicked at src/lib.rs
more</error></testcase>
</testsuite></testsuites>"#;
        let p = parse(xml).unwrap();
        assert_eq!(
            p.totals,
            TestTotals {
                tests: 4,
                failures: 1,
                errors: 1,
                skipped: 1,
                passed: 1
            }
        );
        assert_eq!(p.failures[0].message, "expected 2, got 3");
        assert_eq!(p.failures[1].kind, "error");
        assert_eq!(p.failures[1].message, "panicked at src/lib.rs");
        assert!((p.duration_seconds - 1.5).abs() < 1e-9);
    }

    #[test]
    fn refuses_what_is_not_junit() {
        assert!(parse("hello").is_err());
        assert!(parse("<html><body/></html>").is_err());
    }
}
