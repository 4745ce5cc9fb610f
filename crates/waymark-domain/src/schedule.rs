//! Schedule arithmetic for follow-ups, on the server clock only: ISO 8601 durations, local
//! times in an IANA zone (`zone`) and cron expressions. Local times that do not exist run
//! later by the gap (02:30 → 03:30 summer time); ambiguous ones run at the earlier occurrence —
//! java.time's rule.

use std::str::FromStr;

use chrono::{DateTime, Datelike, Duration, LocalResult, NaiveDateTime, Offset, TimeZone, Utc};
use waymark_proto::Schedule;

use crate::zone::Zone;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Plan {
    /// Runs once.
    Once(DateTime<Utc>),
    /// `start + k·step`, k ≥ 1.
    Every {
        start: DateTime<Utc>,
        step: Duration,
    },
    /// A cron expression in a zone.
    Cron {
        schedule: Box<cron::Schedule>,
        tz: Zone,
    },
}

/// An IANA zone by name.
pub fn zone(name: &str) -> Result<Zone, String> {
    Zone::named(name)
        .ok_or_else(|| format!("`{name}` is not an IANA time zone (like `Europe/Paris`)"))
}

/// The last instant a follow-up may run at: RFC 3339 (and so the API's date-times) has
/// four-digit years.
fn latest() -> DateTime<Utc> {
    DateTime::<Utc>::MAX_UTC
        .with_year(9999)
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn duration(s: &str) -> Result<Duration, String> {
    let d = iso8601_duration::Duration::parse(s)
        .map_err(|_| format!("`{s}` is not an ISO 8601 duration like `PT2H`"))?;
    let secs = d.num_seconds().ok_or_else(|| {
        format!("`{s}`: use days, hours, minutes and seconds (months and years vary in length)")
    })?;
    // Not `to_std`, which panics on a negative or non-finite number of seconds (`P-1D`, `P1e39D`).
    let std = std::time::Duration::try_from_secs_f32(secs)
        .map_err(|_| format!("`{s}` must be longer than zero and finite"))?;
    let d = Duration::from_std(std).map_err(|_| format!("`{s}` is too long"))?;
    if d <= Duration::zero() {
        return Err(format!("`{s}` must be longer than zero"));
    }
    Ok(d)
}

/// The instant a local time means in `tz`, by java.time's rules for gaps and overlaps.
pub fn resolve_local(tz: &Zone, naive: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => t.with_timezone(&Utc),
        LocalResult::Ambiguous(a, b) => a.min(b).with_timezone(&Utc),
        LocalResult::None => {
            // In a gap: read the local time with the offset in force before the gap, which
            // lands later by the gap's length.
            let before = tz.offset_from_utc_datetime(&(naive - Duration::hours(3)));
            (naive - Duration::seconds(i64::from(before.fix().local_minus_utc()))).and_utc()
        }
    }
}

/// Parses a schedule created at `created`.
pub fn plan(s: &Schedule, tz_name: &str, created: DateTime<Utc>) -> Result<Plan, String> {
    let tz = zone(tz_name)?;
    let too_late = |what: &str| format!("`{what}` runs after the year 9999");
    match s {
        Schedule::After { after } => Ok(Plan::Once(
            created
                .checked_add_signed(duration(after)?)
                .filter(|t| *t <= latest())
                .ok_or_else(|| too_late(after))?,
        )),
        Schedule::Every { every } => Ok(Plan::Every {
            start: created,
            step: duration(every)?,
        }),
        Schedule::At { at } => {
            let naive = NaiveDateTime::parse_from_str(at, "%Y-%m-%dT%H:%M:%S")
                .or_else(|_| NaiveDateTime::parse_from_str(at, "%Y-%m-%dT%H:%M"))
                .map_err(|_| format!("`{at}` is not a local date-time like `2027-03-28T02:30` (no offset: `time_zone` says where)"))?;
            Some(resolve_local(&tz, naive))
                .filter(|t| *t <= latest())
                .map(Plan::Once)
                .ok_or_else(|| too_late(at))
        }
        Schedule::Cron { cron } => {
            let fields = cron.split_whitespace().count();
            if fields != 5 {
                return Err(format!(
                    "`{cron}` has {fields} fields; a cron expression has five: minute hour day month weekday"
                ));
            }
            let schedule = cron::Schedule::from_str(&format!("0 {cron}"))
                .map_err(|e| format!("`{cron}` is not a cron expression: {e}"))?;
            Ok(Plan::Cron {
                schedule: Box::new(schedule),
                tz,
            })
        }
    }
}

/// The first nominal time strictly after `after`.
pub fn next_after(p: &Plan, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    match p {
        Plan::Once(t) => (*t > after).then_some(*t),
        Plan::Every { start, step } => {
            // Checked: a long step, or many of them, can pass the last instant a date-time says.
            let first = start.checked_add_signed(*step)?;
            if after < first {
                return Some(first).filter(|t| *t <= latest());
            }
            let k = (after - *start).num_milliseconds() / step.num_milliseconds().max(1) + 1;
            let mut t = start.checked_add_signed(step.checked_mul(i32::try_from(k).ok()?)?)?;
            while t <= after {
                t = t.checked_add_signed(*step)?;
            }
            Some(t).filter(|t| *t <= latest())
        }
        Plan::Cron { schedule, tz } => {
            // Walk local wall-clock times (read as if UTC), then resolve each in the zone.
            let local = after.with_timezone(tz).naive_local() - Duration::hours(4);
            schedule
                .after(&local.and_utc())
                .take(2000)
                .map(|t| resolve_local(tz, t.naive_utc()))
                .find(|t| *t > after)
        }
    }
}

/// The next `n` nominal times after `after`.
pub fn upcoming(p: &Plan, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    let mut out = Vec::with_capacity(n);
    let mut cursor = after;
    while out.len() < n {
        match next_after(p, cursor) {
            Some(t) => {
                out.push(t);
                cursor = t;
            }
            None => break,
        }
    }
    out
}

/// How many nominal times fall in `(after, until]` (at most `cap`), and the latest of them.
pub fn due_between(
    p: &Plan,
    after: DateTime<Utc>,
    until: DateTime<Utc>,
    cap: usize,
) -> (usize, Option<DateTime<Utc>>) {
    if let Plan::Every { start, step } = p {
        // Arithmetic, so a long outage costs nothing to count.
        let k = |t: DateTime<Utc>| {
            ((t - *start).num_milliseconds().max(0) / step.num_milliseconds().max(1)) as usize
        };
        let (a, u) = (k(after), k(until));
        let n = u.saturating_sub(a);
        let last = i32::try_from(u)
            .ok()
            .and_then(|u| step.checked_mul(u))
            .and_then(|d| start.checked_add_signed(d));
        return (n.min(cap), last.filter(|_| n > 0));
    }
    let mut n = 0;
    let mut last = None;
    let mut cursor = after;
    while n < cap {
        match next_after(p, cursor) {
            Some(t) if t <= until => {
                n += 1;
                last = Some(t);
                cursor = t;
            }
            _ => break,
        }
    }
    (n, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn a_daily_0230_paris_runs_once_a_day_across_both_transitions() {
        let p = plan(
            &Schedule::Cron {
                cron: "30 2 * * *".into(),
            },
            "Europe/Paris",
            utc("2027-03-26T00:00:00Z"),
        )
        .unwrap();
        let runs = upcoming(&p, utc("2027-03-26T00:00:00Z"), 4);
        assert_eq!(
            runs,
            vec![
                utc("2027-03-26T01:30:00Z"), // 02:30 CET
                utc("2027-03-27T01:30:00Z"), // 02:30 CET
                utc("2027-03-28T01:30:00Z"), // 02:30 does not exist: 03:30 CEST
                utc("2027-03-29T00:30:00Z"), // 02:30 CEST
            ]
        );
        let p = plan(
            &Schedule::Cron {
                cron: "30 2 * * *".into(),
            },
            "Europe/Paris",
            utc("2027-10-29T00:00:00Z"),
        )
        .unwrap();
        let runs = upcoming(&p, utc("2027-10-29T00:00:00Z"), 4);
        assert_eq!(
            runs,
            vec![
                utc("2027-10-29T00:30:00Z"), // 02:30 CEST
                utc("2027-10-30T00:30:00Z"), // 02:30 CEST
                utc("2027-10-31T00:30:00Z"), // 02:30 happens twice: the earlier, CEST
                utc("2027-11-01T01:30:00Z"), // 02:30 CET
            ]
        );
    }

    #[test]
    fn an_absolute_local_time_in_a_gap_or_overlap() {
        let p = plan(
            &Schedule::At {
                at: "2027-03-28T02:30".into(),
            },
            "Europe/Paris",
            utc("2027-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(
            next_after(&p, utc("2027-01-01T00:00:00Z")),
            Some(utc("2027-03-28T01:30:00Z"))
        );
        let p = plan(
            &Schedule::At {
                at: "2027-10-31T02:30".into(),
            },
            "Europe/Paris",
            utc("2027-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(
            next_after(&p, utc("2027-01-01T00:00:00Z")),
            Some(utc("2027-10-31T00:30:00Z"))
        );
        assert_eq!(next_after(&p, utc("2027-10-31T00:30:00Z")), None, "once");
    }

    #[test]
    fn intervals_and_delays() {
        let start = utc("2027-01-01T00:00:00Z");
        let p = plan(
            &Schedule::Every {
                every: "PT1H".into(),
            },
            "UTC",
            start,
        )
        .unwrap();
        assert_eq!(
            upcoming(&p, start, 2),
            vec![utc("2027-01-01T01:00:00Z"), utc("2027-01-01T02:00:00Z")]
        );
        assert_eq!(
            due_between(
                &p,
                utc("2027-01-01T01:00:00Z"),
                utc("2027-01-01T04:30:00Z"),
                100
            ),
            (3, Some(utc("2027-01-01T04:00:00Z")))
        );
        let p = plan(
            &Schedule::After {
                after: "PT2H".into(),
            },
            "UTC",
            start,
        )
        .unwrap();
        assert_eq!(upcoming(&p, start, 5), vec![utc("2027-01-01T02:00:00Z")]);
    }

    #[test]
    fn bad_schedules_say_why() {
        let t = utc("2027-01-01T00:00:00Z");
        assert!(
            plan(
                &Schedule::Every {
                    every: "P1M".into()
                },
                "UTC",
                t
            )
            .unwrap_err()
            .contains("months")
        );
        assert!(
            plan(
                &Schedule::Every {
                    every: "soon".into()
                },
                "UTC",
                t
            )
            .unwrap_err()
            .contains("ISO 8601")
        );
        assert!(
            plan(
                &Schedule::Cron {
                    cron: "* * *".into()
                },
                "UTC",
                t
            )
            .unwrap_err()
            .contains("five")
        );
        assert!(
            plan(
                &Schedule::At {
                    at: "2027-01-01T00:00".into()
                },
                "Mars/Olympus",
                t
            )
            .unwrap_err()
            .contains("IANA")
        );
        assert!(
            plan(
                &Schedule::At {
                    at: "tomorrow".into()
                },
                "UTC",
                t
            )
            .unwrap_err()
            .contains("local date-time")
        );
    }
}
