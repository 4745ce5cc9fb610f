//! IANA time zones for quiet hours and follow-ups: jiff's time zone database — the system's
//! (`/usr/share/zoneinfo`, so Waymark agrees with the machine's other programs), or the copy
//! bundled in the binary where the system has none (a slim container) — as a chrono
//! `TimeZone`, so chrono's arithmetic and the `cron` crate work in them unchanged.
//!
//! Not chrono-tz: it compiles every zone's history into code and tables, ≈ 1.9 MB of every
//! binary that embeds a control plane (the app's too), where jiff reads TZif data (its bundle
//! compressed), ≈ 0.35 MB in all (docs/benchmarks.md).

use std::fmt;

use chrono::{Datelike, Timelike};
use chrono::{
    FixedOffset, MappedLocalTime, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Utc,
};

/// An IANA time zone.
#[derive(Clone, Debug, PartialEq)]
pub struct Zone(jiff::tz::TimeZone);

/// An instant's offset in a [`Zone`] (chrono's `TimeZone::Offset`: it knows its zone).
#[derive(Clone, Debug)]
pub struct ZoneOffset {
    zone: jiff::tz::TimeZone,
    fixed: FixedOffset,
}

impl Zone {
    /// The zone of that name (`Europe/Paris`), from the system's database or the bundled one.
    pub fn named(name: &str) -> Option<Zone> {
        // jiff also resolves POSIX TZ strings and fixed offsets through other calls; a name
        // is looked up in the database only, as chrono-tz did.
        jiff::tz::db().get(name).ok().map(Zone)
    }

    /// Every zone name of the bundled database, sorted: what the API documents as accepted
    /// (the same on every machine, unlike the system's list).
    pub fn bundled_names() -> Vec<String> {
        let mut names: Vec<String> = jiff::tz::TimeZoneDatabase::bundled()
            .available()
            .map(|n| n.as_str().to_owned())
            .collect();
        names.sort();
        names
    }

    fn offset(&self, o: jiff::tz::Offset) -> ZoneOffset {
        ZoneOffset {
            zone: self.0.clone(),
            // Every zone's offset is within ±14 h; chrono's range is ±24 h.
            fixed: FixedOffset::east_opt(o.seconds()).unwrap_or_else(|| Utc.fix()),
        }
    }
}

impl Offset for ZoneOffset {
    fn fix(&self) -> FixedOffset {
        self.fixed
    }
}

impl fmt::Display for ZoneOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fixed.fmt(f)
    }
}

/// A chrono local date-time as jiff's civil one; `None` outside jiff's years (−9999 to 9999).
fn civil(t: &NaiveDateTime) -> Option<jiff::civil::DateTime> {
    let (year, month, day) = (i16::try_from(t.year()).ok()?, t.month(), t.day());
    // A leap second (nanoseconds ≥ 1e9) reads as the second's last nanosecond.
    let nanos = t.nanosecond().min(999_999_999);
    jiff::civil::DateTime::new(
        year,
        month as i8,
        day as i8,
        t.hour() as i8,
        t.minute() as i8,
        t.second() as i8,
        nanos as i32,
    )
    .ok()
}

impl TimeZone for Zone {
    type Offset = ZoneOffset;

    fn from_offset(offset: &ZoneOffset) -> Zone {
        Zone(offset.zone.clone())
    }

    fn offset_from_local_date(&self, local: &NaiveDate) -> MappedLocalTime<ZoneOffset> {
        self.offset_from_local_datetime(&local.and_time(NaiveTime::MIN))
    }

    fn offset_from_local_datetime(&self, local: &NaiveDateTime) -> MappedLocalTime<ZoneOffset> {
        let Some(civil) = civil(local) else {
            return MappedLocalTime::None;
        };
        match self.0.to_ambiguous_timestamp(civil).offset() {
            jiff::tz::AmbiguousOffset::Unambiguous { offset } => {
                MappedLocalTime::Single(self.offset(offset))
            }
            jiff::tz::AmbiguousOffset::Gap { .. } => MappedLocalTime::None,
            // The earlier instant first (the offset before the fold is the larger one).
            jiff::tz::AmbiguousOffset::Fold { before, after } => {
                MappedLocalTime::Ambiguous(self.offset(before), self.offset(after))
            }
        }
    }

    fn offset_from_utc_date(&self, utc: &NaiveDate) -> ZoneOffset {
        self.offset_from_utc_datetime(&utc.and_time(NaiveTime::MIN))
    }

    fn offset_from_utc_datetime(&self, utc: &NaiveDateTime) -> ZoneOffset {
        // Outside jiff's years the offset of its nearest end stands (no zone changes there).
        let second = utc.and_utc().timestamp().clamp(
            jiff::Timestamp::MIN.as_second(),
            jiff::Timestamp::MAX.as_second(),
        );
        let at = jiff::Timestamp::from_second(second).unwrap_or(jiff::Timestamp::UNIX_EPOCH);
        self.offset(self.0.to_offset(at))
    }
}

#[cfg(test)]
mod tests {
    use chrono::{NaiveDate, TimeZone, Utc};

    use super::*;

    fn local(y: i32, m: u32, d: u32, h: u32, mi: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .and_then(|d| d.and_hms_opt(h, mi, 0))
            .unwrap()
    }

    #[test]
    fn names_resolve_and_nonsense_does_not() {
        assert!(Zone::named("Europe/Paris").is_some());
        assert!(Zone::named("America/Argentina/Buenos_Aires").is_some());
        assert!(Zone::named("UTC").is_some());
        assert!(Zone::named("Mars/Olympus").is_none());
        assert!(Zone::named("").is_none());
        assert!(Zone::named("../../etc/passwd").is_none());
        let names = Zone::bundled_names();
        assert!(names.len() > 300, "{}", names.len());
        assert!(names.iter().any(|n| n == "Asia/Kolkata"));
        assert!(names.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn local_times_in_a_gap_an_overlap_and_plain_summer() {
        let paris = Zone::named("Europe/Paris").unwrap();
        // 2027-03-28 02:30 does not exist in Paris (clocks go 02:00 → 03:00).
        assert_eq!(
            paris.from_local_datetime(&local(2027, 3, 28, 2, 30)),
            MappedLocalTime::None
        );
        // 2027-10-31 02:30 happens twice: first at +02:00, then at +01:00.
        match paris.from_local_datetime(&local(2027, 10, 31, 2, 30)) {
            MappedLocalTime::Ambiguous(a, b) => {
                assert_eq!(
                    a.with_timezone(&Utc),
                    Utc.with_ymd_and_hms(2027, 10, 31, 0, 30, 0).unwrap()
                );
                assert_eq!(
                    b.with_timezone(&Utc),
                    Utc.with_ymd_and_hms(2027, 10, 31, 1, 30, 0).unwrap()
                );
            }
            other => panic!("{other:?}"),
        }
        // Summer: +02:00; from UTC and back.
        let t = paris
            .from_local_datetime(&local(2027, 7, 1, 12, 0))
            .single()
            .unwrap();
        assert_eq!(t.offset().fix().local_minus_utc(), 7200);
        let u = Utc.with_ymd_and_hms(2027, 7, 1, 10, 0, 0).unwrap();
        assert_eq!(u.with_timezone(&paris), t);
        // Far future (past any listed transition, from the zone's rule): still summer time.
        let far = paris
            .from_local_datetime(&local(2090, 7, 1, 12, 0))
            .single()
            .unwrap();
        assert_eq!(far.offset().fix().local_minus_utc(), 7200);
    }

    #[test]
    fn years_outside_the_database_do_not_panic() {
        let tokyo = Zone::named("Asia/Tokyo").unwrap();
        assert_eq!(
            tokyo.from_local_datetime(&local(20_000, 1, 1, 0, 0)),
            MappedLocalTime::None
        );
        let far = chrono::DateTime::<Utc>::MAX_UTC;
        assert_eq!(
            far.with_timezone(&tokyo).offset().fix().local_minus_utc(),
            9 * 3600
        );
    }
}
