//! How long `scripts/test` takes on this machine (issue 20's last row): `scripts/test` appends
//! each run's wall time and the caches it started from to a log outside the clone; this prints
//! the newest passing run from a warm cargo target dir and the newest from a cold one against
//! their targets. A run cannot be timed from inside itself, so the figures are of the runs
//! before this bench, and say when they ran.

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::Figure;

/// One line of the log, as `scripts/test` writes it.
#[derive(Debug, Deserialize)]
struct Run {
    at: String,
    seconds: u64,
    rc: i32,
    target_cache: String,
    runtimes_cached: bool,
    commit: String,
}

fn log_path() -> PathBuf {
    match std::env::var_os("WAYMARK_TEST_TIMES").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/waymark/test-runs.jsonl"),
    }
}

pub(crate) fn suite(out: &mut Vec<Figure>) -> Result<()> {
    let path = log_path();
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "suite: no run of scripts/test logged at {} yet — run scripts/test first",
                path.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let runs: Vec<Run> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for (cache, limit, what) in [
        ("warm", 25.0, "scripts/test, warm cargo target (min)"),
        ("cold", 60.0, "scripts/test, cold cargo target (min)"),
    ] {
        let newest = runs
            .iter()
            .rev()
            .find(|r| r.rc == 0 && r.target_cache == cache);
        match newest {
            Some(r) => {
                let minutes = r.seconds as f64 / 60.0;
                eprintln!(
                    "suite: {cache} run at {} of {} ({}runtimes cached)",
                    r.at,
                    r.commit,
                    if r.runtimes_cached { "" } else { "no " }
                );
                out.push(Figure {
                    bench: "suite".into(),
                    measure: what.into(),
                    value: minutes,
                    unit: "min".into(),
                    baseline: None,
                    ratio: None,
                    target: format!("≤ {limit} min"),
                    met: Some(minutes <= limit),
                });
            }
            None => eprintln!(
                "suite: no passing {cache}-cache run of scripts/test logged in {}",
                path.display()
            ),
        }
    }
    Ok(())
}
