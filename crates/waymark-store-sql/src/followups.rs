//! `FollowupsTx`'s statements: scheduled follow-ups, and the runs that make each nominal time fire
//! once. All of them are the same on both backends.

use waymark_store::FollowupRow;

use crate::Statement;

/// Raises a unique violation on a duplicate id, on both backends.
pub fn insert_followup(f: &FollowupRow) -> Statement<'_> {
    Statement::new(
        "INSERT INTO followups (id, task_id, schedule, time_zone, catch_up, message, state,
           next_run_at, last_run_at, runs, missed, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(&f.id)
    .bind(&f.task_id)
    .json(&f.schedule)
    .bind(&f.time_zone)
    .bind(f.catch_up.as_str())
    .bind(&f.message)
    .bind(f.state.as_str())
    .bind(f.next_run_at)
    .bind(f.last_run_at)
    .bind(f.runs)
    .bind(f.missed)
    .bind(f.created_at)
}

pub fn followup(id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM followups WHERE id = $1").bind(id)
}

pub fn update_followup(f: &FollowupRow) -> Statement<'_> {
    Statement::new(
        "UPDATE followups SET state = $1, next_run_at = $2, last_run_at = $3, runs = $4,
           missed = $5
         WHERE id = $6",
    )
    .bind(f.state.as_str())
    .bind(f.next_run_at)
    .bind(f.last_run_at)
    .bind(f.runs)
    .bind(f.missed)
    .bind(&f.id)
}

pub fn due_followups(now_ms: i64) -> Statement<'static> {
    Statement::new(
        "SELECT * FROM followups WHERE state = 'active' AND next_run_at <= $1
         ORDER BY next_run_at, id",
    )
    .bind(now_ms)
}

pub fn list_followups(task_id: &str) -> Statement<'_> {
    Statement::new("SELECT * FROM followups WHERE task_id = $1 ORDER BY created_at, id")
        .bind(task_id)
}

/// Writes no row (0 rows affected) for a time that already ran.
pub fn insert_followup_run(
    followup_id: &str,
    nominal_at: i64,
    ran_at: i64,
    missed: i64,
) -> Statement<'_> {
    Statement::new(
        "INSERT INTO followup_runs (followup_id, nominal_at, ran_at, missed)
         VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
    )
    .bind(followup_id)
    .bind(nominal_at)
    .bind(ran_at)
    .bind(missed)
}
