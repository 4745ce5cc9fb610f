//! Follow-ups ("do this later"): scheduled messages delivered into a task's session on the
//! server clock, de-duplicated by (follow-up, nominal time) so restarts and replicas never
//! double a run, with a stated catch-up rule for periods missed while the server was down.

use chrono::{DateTime, Utc};
use serde::Deserialize;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::*;
use crate::error::{ApiError, ApiResult};

use crate::schedule::{self, Plan};

/// A period counts as on time when it runs at most this late (for `catch_up: skip`), or half
/// its interval when that is shorter.
pub const ON_TIME_MS: i64 = 60_000;

pub fn on_time_window(plan: &Plan) -> i64 {
    match plan {
        Plan::Every { step, .. } => (step.num_milliseconds() / 2).clamp(1, ON_TIME_MS),
        _ => ON_TIME_MS,
    }
}

pub fn plan_of(f: &FollowupRow) -> ApiResult<Plan> {
    let s: Schedule = serde_json::from_value(f.schedule.clone())
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("corrupt schedule: {e}")))?;
    schedule::plan(&s, &f.time_zone, convert::dt(f.created_at))
        .map_err(|e| ApiError::new(ErrorCode::Internal, e))
}

pub async fn create(
    st: &Context,
    caller: &Caller,
    task_id: String,
    req: CreateFollowup,
) -> ApiResult<Made<Followup>> {
    if req.message.trim().is_empty() || req.message.len() > 20_000 {
        return Err(invalid("`message` must be 1–20000 bytes"));
    }
    let tz = req.time_zone.clone().unwrap_or_else(|| "UTC".into());
    let now = st.now_ms();
    let plan = schedule::plan(&req.schedule, &tz, convert::dt(now)).map_err(invalid)?;
    let next = schedule::next_after(&plan, convert::dt(now))
        .ok_or_else(|| invalid("the schedule has no run in the future"))?;
    audited(st, caller, "followup.create", async {
        let mut tx = Tx::write(st).await?;
        let task = task_for(&mut tx, caller, &task_id).await?;
        let row = FollowupRow {
            id: ids::followup(),
            task_id: task.id.clone(),
            schedule: to_value(&req.schedule),
            time_zone: tz.clone(),
            catch_up: req.catch_up.unwrap_or(CatchUp::RunOnce),
            message: req.message.clone(),
            state: FollowupState::Active,
            next_run_at: Some(next.timestamp_millis()),
            last_run_at: None,
            runs: 0,
            missed: 0,
            created_at: now,
        };
        tx.insert_followup(&row).await?;
        let cursor = tx.max_cursor().await?;
        tx.commit().await?;
        Ok(created(cursor, convert::followup(&row)?))
    })
    .await
}

/// `?next=N`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct NextQuery {
    /// How many upcoming nominal run times to list (default 10, at most 1000).
    #[param(maximum = 1000)]
    next: Option<usize>,
}

pub async fn get(
    st: &Context,
    caller: &Caller,
    id: String,
    q: NextQuery,
) -> ApiResult<FollowupPlan> {
    let n = q.next.unwrap_or(10);
    if n > 1000 {
        return Err(ApiError::new(
            ErrorCode::BadRequest,
            "`next` is at most 1000",
        ));
    }
    let mut tx = Tx::read(st).await?;
    let f = tx
        .followup(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("follow-up", &id))?;
    task_for(&mut tx, caller, &f.task_id)
        .await
        .map_err(|_| ApiError::not_found("follow-up", &id))?;
    let next = if f.state == FollowupState::Active {
        let from = f
            .last_run_at
            .map_or_else(|| convert::dt(tx.now), convert::dt)
            .max(convert::dt(tx.now));
        schedule::upcoming(&plan_of(&f)?, from, n)
    } else {
        Vec::new()
    };
    Ok(FollowupPlan {
        followup: convert::followup(&f)?,
        next,
    })
}

/// Runs every due follow-up once (by the catch-up rule). One replica at a time; each in its
/// own transaction, where the run row makes a second delivery of a nominal time impossible.
pub async fn tick(st: &Context) -> ApiResult<usize> {
    let now = st.now_ms();
    let due = Tx::read(st).await?.due_followups(now).await?;
    if due.is_empty() {
        return Ok(0);
    }
    let mut claim = Tx::read(st).await?;
    if !claim.try_claim("followups").await? {
        return Ok(0);
    }
    let mut ran = 0;
    for f in due {
        if run_one(st, &f.id, now).await? {
            ran += 1;
        }
    }
    drop(claim);
    Ok(ran)
}

pub async fn run_one(st: &Context, id: &str, now: i64) -> ApiResult<bool> {
    let mut tx = Tx::write(st).await?;
    let Some(task_id) = tx.followup(id).await?.map(|f| f.task_id) else {
        return Ok(false);
    };
    let Some(task) = tx.task(&task_id).await? else {
        return Ok(false);
    };
    let Some(mut f) = tx.followup(id).await? else {
        return Ok(false);
    };
    if f.state != FollowupState::Active || f.next_run_at.is_none_or(|n| n > now) {
        return Ok(false);
    }
    let plan = plan_of(&f)?;
    let after: DateTime<Utc> = convert::dt(f.last_run_at.unwrap_or(f.created_at));
    let (count, last) = schedule::due_between(&plan, after, convert::dt(now), 1_000_000);
    let mut delivered = false;
    if let Some(nominal) = last {
        let late = now - nominal.timestamp_millis();
        let run = f.catch_up == CatchUp::RunOnce || late <= on_time_window(&plan);
        let missed_now = count as i64 - i64::from(run);
        if run
            && tx
                .insert_followup_run(&f.id, nominal.timestamp_millis(), now, missed_now)
                .await?
        {
            let mut text = f.message.clone();
            if missed_now > 0 && f.catch_up == CatchUp::RunOnce {
                text.push_str(&format!(
                    " ({missed_now} earlier period(s) were missed while the control plane was down: they run once, now)"
                ));
            } else if missed_now > 0 {
                text.push_str(&format!(
                    " ({missed_now} period(s) missed while the control plane was down were skipped)"
                ));
            }
            let m = say(&mut tx, &task, "followup", text).await?;
            // A runner's run receives it in its own session: the runtime acts on it.
            crate::machines::queue_resume(&mut tx, &task, "follow_up", Some(m.text.clone()))
                .await?;
            f.runs += 1;
            delivered = true;
        }
        f.missed += missed_now.max(0);
        f.last_run_at = Some(nominal.timestamp_millis());
        let next = schedule::next_after(&plan, nominal.max(convert::dt(now)));
        f.next_run_at = next.map(|t| t.timestamp_millis());
        if next.is_none() {
            f.state = FollowupState::Done;
        }
        tx.update_followup(&f).await?;
        if delivered || missed_now > 0 {
            let fired = FollowupFired {
                followup: convert::followup(&f)?,
                nominal_at: nominal,
                missed_now,
            };
            emit(&mut tx, &task, EventKind::FollowupFired, fired).await?;
        }
    } else {
        f.next_run_at = schedule::next_after(&plan, convert::dt(now)).map(|t| t.timestamp_millis());
        if f.next_run_at.is_none() {
            f.state = FollowupState::Done;
        }
        tx.update_followup(&f).await?;
    }
    tx.commit().await?;
    Ok(delivered)
}
