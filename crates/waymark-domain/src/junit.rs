//! JUnit XML ingest, through `junit-parser`: totals counted from the test cases themselves
//! (runners disagree on the summary attributes), failures with their messages.

use waymark_proto::{TestFailure, TestTotals};

/// What a receipt keeps of a JUnit report.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// Cases counted by outcome.
    pub totals: TestTotals,
    /// Failed and errored cases with their messages.
    pub failures: Vec<TestFailure>,
    /// The report's duration.
    pub duration_seconds: f64,
}

/// Why a document is not a JUnit report.
#[derive(Debug, thiserror::Error)]
pub enum JunitError {
    /// Not well-formed, or not the shape of JUnit XML.
    #[error("{0}")]
    Xml(String),
    /// Well-formed, but no suite anywhere.
    #[error("no <testsuites> or <testsuite> element")]
    NoSuites,
    /// Elements nested deeper than any runner writes.
    #[error("elements nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// How deep elements may nest. Runners write four or five levels; `junit-parser` recurses once
/// per nested `<testsuite>`, so an unbounded depth would overflow the stack and abort the server.
pub const MAX_DEPTH: usize = 64;

/// Refuses a document whose elements nest deeper than [`MAX_DEPTH`], without recursing.
/// Syntax errors are left to the parser to report.
fn check_depth(xml: &str) -> Result<(), JunitError> {
    use quick_xml::events::Event as XmlEvent;
    let mut reader = quick_xml::Reader::from_str(xml);
    let mut depth = 0usize;
    loop {
        match reader.read_event() {
            Ok(XmlEvent::Start(_)) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(JunitError::TooDeep);
                }
            }
            Ok(XmlEvent::End(_)) => depth = depth.saturating_sub(1),
            Ok(XmlEvent::Eof) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
    }
}

/// A duration attribute as seconds: `inf`, `NaN` and negative values (all of which parse as
/// numbers) count as 0, so a receipt's `duration_seconds` is always a JSON number.
fn seconds(t: f64) -> f64 {
    if t.is_finite() && t > 0.0 { t } else { 0.0 }
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

/// Parses a JUnit XML document. Public for the fuzz target (`fuzz/`).
pub fn parse(xml: &str) -> Result<Parsed, JunitError> {
    check_depth(xml)?;
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
    let suites_time: f64 = doc.suites.iter().map(|s| seconds(s.time)).sum();
    let duration_seconds = if seconds(doc.time) > 0.0 {
        doc.time
    } else {
        seconds(suites_time)
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

    /// Found with the `junit_ingest` fuzz target's duration check: `time="inf"` parsed as
    /// infinity, which JSON writes as `null`, where a receipt promises a number.
    #[test]
    fn a_duration_that_is_not_a_finite_number_counts_as_zero() {
        for time in ["inf", "-inf", "NaN", "-3"] {
            let xml = format!(
                r#"<testsuites time="{time}"><testsuite name="s" time="{time}"><testcase name="a"/></testsuite></testsuites>"#
            );
            let p = parse(&xml).unwrap();
            assert!(
                p.duration_seconds.is_finite() && p.duration_seconds >= 0.0,
                "{time}: {}",
                p.duration_seconds
            );
        }
        // Two finite suites whose sum is not.
        let p = parse(r#"<testsuites><testsuite name="s" time="1e308"/><testsuite name="t" time="1e308"/></testsuites>"#).unwrap();
        assert_eq!(p.duration_seconds, 0.0);
        let p = parse(r#"<testsuite name="s" time="2.5"/>"#).unwrap();
        assert!((p.duration_seconds - 2.5).abs() < 1e-9);
    }

    /// `junit-parser` recurses per nested suite: 100 000 of them overflowed the stack.
    #[test]
    fn nesting_deeper_than_any_runner_writes_is_refused_not_recursed() {
        let n = 100_000;
        let xml = format!(
            "<testsuites>{}{}</testsuites>",
            "<testsuite name=\"x\">".repeat(n),
            "</testsuite>".repeat(n)
        );
        assert!(matches!(parse(&xml), Err(JunitError::TooDeep)));
        // As deep as allowed still parses.
        let n = MAX_DEPTH - 1;
        let xml = format!(
            "<testsuites>{}<testcase name=\"a\"/>{}</testsuites>",
            "<testsuite name=\"x\">".repeat(n - 1),
            "</testsuite>".repeat(n - 1)
        );
        assert_eq!(parse(&xml).unwrap().totals.tests, 1);
    }

    #[test]
    fn refuses_what_is_not_junit() {
        assert!(parse("hello").is_err());
        assert!(parse("<html><body/></html>").is_err());
    }
}
