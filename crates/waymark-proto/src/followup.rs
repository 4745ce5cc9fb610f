//! Follow-ups ("do this later", SPEC §6): a message delivered into a task's session after a
//! delay, at a local time in an explicit IANA time zone, at a fixed interval, or by cron — with
//! a stated rule for periods missed while the control plane was down.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// When a follow-up runs. Exactly one field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Schedule {
    /// Once, after an ISO 8601 duration from creation: `{"after": "PT2H"}`.
    After {
        /// e.g. `PT2H`, `P1D`: weeks, days, hours, minutes and seconds (months and years vary in
        /// length); longer than zero.
        #[schema(
            pattern = r"^P(\d+([.,]\d+)?W|\d+([.,]\d+)?D(T|T(\d+([.,]\d+)?H(\d+([.,]\d+)?M)?(\d+([.,]\d+)?S)?|\d+([.,]\d+)?M(\d+([.,]\d+)?S)?|\d+([.,]\d+)?S))?|T(\d+([.,]\d+)?H(\d+([.,]\d+)?M)?(\d+([.,]\d+)?S)?|\d+([.,]\d+)?M(\d+([.,]\d+)?S)?|\d+([.,]\d+)?S))$"
        )]
        after: String,
    },
    /// Once, at a local date-time in `time_zone`: `{"at": "2027-03-28T02:30"}`.
    At {
        /// `YYYY-MM-DDTHH:MM[:SS]`, no offset: the time zone says where. In the future.
        #[schema(
            pattern = r"^(\d{4}|[+-]\d{4,})-(0?[1-9]|1[0-2])-(0?[1-9]|[12]\d|3[01])T([01]?\d|2[0-3]):[0-5]?\d(:([0-5]?\d|60))?$"
        )]
        at: String,
    },
    /// Repeatedly, every ISO 8601 duration from creation: `{"every": "PT1H"}`.
    Every {
        /// e.g. `PT1H`: weeks, days, hours, minutes and seconds; longer than zero.
        #[schema(
            pattern = r"^P(\d+([.,]\d+)?W|\d+([.,]\d+)?D(T|T(\d+([.,]\d+)?H(\d+([.,]\d+)?M)?(\d+([.,]\d+)?S)?|\d+([.,]\d+)?M(\d+([.,]\d+)?S)?|\d+([.,]\d+)?S))?|T(\d+([.,]\d+)?H(\d+([.,]\d+)?M)?(\d+([.,]\d+)?S)?|\d+([.,]\d+)?M(\d+([.,]\d+)?S)?|\d+([.,]\d+)?S))$"
        )]
        every: String,
    },
    /// By a five-field cron expression in `time_zone`: `{"cron": "30 2 * * *"}`.
    Cron {
        /// minute hour day-of-month month day-of-week.
        #[schema(pattern = r"^[ \t]*[0-9A-Za-z*/,?#-]+([ \t]+[0-9A-Za-z*/,?#-]+){4}[ \t]*$")]
        cron: String,
    },
}

str_enum! {
    /// What happens to periods missed while the control plane was down.
    pub enum CatchUp {
        /// Missed periods are counted and dropped; the next on-time period runs.
        Skip => "skip",
        /// Missed periods run once, together (counted), then the schedule goes on.
        RunOnce => "run_once",
    }
}

/// `POST /v1/tasks/{task}/followups`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateFollowup {
    /// When.
    pub schedule: Schedule,
    /// IANA time zone, e.g. `Europe/Paris` (default `UTC`). Local times that do not exist
    /// (spring forward) run once, later by the gap; ambiguous ones (fall back) run once, at the
    /// earlier occurrence.
    #[serde(default)]
    pub time_zone: Option<String>,
    /// Missed periods (default `run_once`).
    #[serde(default)]
    pub catch_up: Option<CatchUp>,
    /// What to deliver into the task's session.
    #[schema(
        min_length = 1,
        max_length = 20000,
        pattern = r"^[^\x00]*[^\s\x00][^\x00]*$"
    )]
    pub message: String,
}

/// A follow-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Followup {
    /// `fup_…`.
    #[schema(pattern = r"^fup_[0-9a-f]{32}$")]
    pub id: String,
    /// Its task.
    pub task_id: String,
    /// When.
    pub schedule: Schedule,
    /// IANA time zone.
    pub time_zone: String,
    /// Missed periods.
    pub catch_up: CatchUp,
    /// What it delivers.
    pub message: String,
    /// Whether it still runs.
    pub state: crate::FollowupState,
    /// The next nominal run (UTC).
    pub next_run_at: Option<DateTime<Utc>>,
    /// The last nominal time that ran.
    pub last_run_at: Option<DateTime<Utc>>,
    /// Runs delivered.
    pub runs: i64,
    /// Periods missed (by the catch-up rule).
    pub missed: i64,
    /// Created at.
    pub created_at: DateTime<Utc>,
}

/// `GET /v1/followups/{id}?next=N`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FollowupPlan {
    /// The follow-up.
    pub followup: Followup,
    /// Its next nominal run times, RFC 3339 UTC.
    pub next: Vec<DateTime<Utc>>,
}

/// `data` of a `followup.fired` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FollowupFired {
    /// The follow-up after the run.
    pub followup: Followup,
    /// The nominal time that ran.
    pub nominal_at: DateTime<Utc>,
    /// Periods missed before it (already counted in `followup.missed`).
    pub missed_now: i64,
}
