//! Escalation and quiet hours (issue 19): a user's policy says who is notified of a new
//! decision first, who next if nobody has opened it after so many minutes, and when nobody is
//! woken for what can wait. Each decision keeps where it stands (`escalation`) and when it moves
//! next (`escalate_at`); every move is a `decision.escalated` event on its task, and pushes go
//! only to the devices a step reached (`push::worth_a_push`).

use chrono::{DateTime, NaiveTime, TimeZone, Utc};
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::convert;
use crate::core::{Tx, emit, invalid, whose};
use crate::delegations;
use crate::error::{ApiError, ApiResult};
use crate::zone::Zone;

/// Steps a policy may have.
pub const MAX_STEPS: usize = 8;
/// Devices one step may notify.
pub const MAX_DEVICES: usize = 16;
/// People (delegates) one step may notify.
pub const MAX_PEOPLE: usize = 8;
/// The longest wait between two steps: a week.
pub const MAX_AFTER_MINUTES: u32 = 7 * 24 * 60;
/// The shortest wait between reminders: nobody is nagged more often.
pub const MIN_REMIND_MINUTES: u32 = 5;
/// Reminders per decision, at most.
pub const MAX_REMINDERS: u32 = 12;

/// `GET /v1/escalation`.
pub async fn get_policy(
    st: &Context,
    caller: &Caller,
    user: Option<String>,
) -> ApiResult<EscalationPolicy> {
    let mut tx = Tx::read(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    match policy_of(&mut tx, &u.id).await? {
        Some(p) => Ok(p),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            format!(
                "`{}` has no escalation policy: every device with a push channel is notified at once",
                u.name
            ),
        )),
    }
}

/// `PUT /v1/escalation`: checks every step names this user's live devices, the waits are
/// bounded and the quiet hours parse, then replaces the policy. Decisions already open keep the
/// steps they were opened with.
pub async fn put_policy(
    st: &Context,
    caller: &Caller,
    user: Option<String>,
    policy: EscalationPolicy,
) -> ApiResult<EscalationPolicy> {
    if policy.steps.is_empty() || policy.steps.len() > MAX_STEPS {
        return Err(invalid(format!(
            "a policy has 1 to {MAX_STEPS} steps, not {}",
            policy.steps.len()
        )));
    }
    if let Some(q) = &policy.quiet_hours {
        quiet_window(q)?;
    }
    if let Some(r) = &policy.reminders {
        if !(MIN_REMIND_MINUTES..=MAX_AFTER_MINUTES).contains(&r.every_minutes) {
            return Err(invalid(format!(
                "`reminders.every_minutes` is {MIN_REMIND_MINUTES} to {MAX_AFTER_MINUTES} (a week), not {}",
                r.every_minutes
            )));
        }
        if !(1..=MAX_REMINDERS).contains(&r.at_most) {
            return Err(invalid(format!(
                "`reminders.at_most` is 1 to {MAX_REMINDERS}, not {}",
                r.at_most
            )));
        }
    }
    let mut tx = Tx::write(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    for (i, step) in policy.steps.iter().enumerate() {
        if step.after_minutes > MAX_AFTER_MINUTES {
            return Err(invalid(format!(
                "step {i}: `after_minutes` is at most {MAX_AFTER_MINUTES} (a week)"
            )));
        }
        if step.devices.is_empty() && step.people.is_empty() {
            return Err(invalid(format!(
                "step {i} notifies nobody: name a device or a person"
            )));
        }
        if step.devices.len() > MAX_DEVICES || step.people.len() > MAX_PEOPLE {
            return Err(invalid(format!(
                "step {i} notifies at most {MAX_DEVICES} devices and {MAX_PEOPLE} people"
            )));
        }
        for (j, name) in step.people.iter().enumerate() {
            if step.people[..j].contains(name) {
                return Err(invalid(format!("step {i} names `{name}` twice")));
            }
            let p = tx.user_by_name(name).await?;
            // Offered is enough to be named: the step skips them until they accept
            // (`step_names`, `people_devices`).
            let shared = match &p {
                Some(p) => delegations::offered(&mut tx, &u.id, &p.id).await?,
                None => false,
            };
            if !shared {
                return Err(invalid(format!(
                    "step {i}: `{name}` is not someone `{}` delegates decisions to (`PUT /v1/delegates/{name}` first)",
                    u.name
                )));
            }
        }
        for (j, id) in step.devices.iter().enumerate() {
            if step.devices[..j].contains(id) {
                return Err(invalid(format!("step {i} names `{id}` twice")));
            }
            match tx.device(id).await? {
                Some(d) if d.user_id == u.id && d.revoked_at.is_none() => {}
                Some(d) if d.user_id == u.id => {
                    return Err(invalid(format!(
                        "step {i}: device `{id}` ({}) is revoked",
                        d.name
                    )));
                }
                _ => {
                    return Err(invalid(format!(
                        "step {i}: `{id}` is not a device of `{}` (see `GET /v1/devices`)",
                        u.name
                    )));
                }
            }
        }
    }
    let now = tx.now;
    tx.put_escalation_policy(&u.id, &policy, now).await?;
    tx.commit().await?;
    Ok(policy)
}

/// `DELETE /v1/escalation`: back to notifying every device at once.
pub async fn delete_policy(st: &Context, caller: &Caller, user: Option<String>) -> ApiResult<()> {
    let mut tx = Tx::write(st).await?;
    let u = whose(&mut tx, caller, user.as_deref()).await?;
    if !tx.delete_escalation_policy(&u.id).await? {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("`{}` has no escalation policy", u.name),
        ));
    }
    tx.commit().await?;
    Ok(())
}

async fn policy_of(tx: &mut Tx, user_id: &str) -> ApiResult<Option<EscalationPolicy>> {
    Ok(tx.escalation_policy(user_id).await?)
}

/// The quiet hours' start and end times and zone, or why they do not parse.
fn quiet_window(q: &QuietHours) -> ApiResult<(NaiveTime, NaiveTime, Zone)> {
    let time = |what: &str, s: &str| {
        NaiveTime::parse_from_str(s, "%H:%M").map_err(|_| {
            invalid(format!(
                "`quiet_hours.{what}` is a time of day as HH:MM, e.g. 22:00, not `{s}`"
            ))
        })
    };
    let from = time("from", &q.from)?;
    let to = time("to", &q.to)?;
    if from == to {
        return Err(invalid("`quiet_hours.from` and `to` must differ"));
    }
    let tz = Zone::named(&q.time_zone).ok_or_else(|| {
        invalid(format!(
            "`quiet_hours.time_zone` `{}` is not an IANA time zone such as Europe/Berlin",
            q.time_zone
        ))
    })?;
    Ok((from, to, tz))
}

/// When the quiet hours holding `now` end, or `None` when `now` is not inside them.
pub fn quiet_until(q: &QuietHours, now: DateTime<Utc>) -> ApiResult<Option<DateTime<Utc>>> {
    let (from, to, tz) = quiet_window(q)?;
    let local = now.with_timezone(&tz);
    let t = local.time();
    let inside = if from < to {
        from <= t && t < to
    } else {
        t >= from || t < to
    };
    if !inside {
        return Ok(None);
    }
    // The end is today's `to`, or tomorrow's when the window spans midnight and `to` is behind.
    let mut day = local.date_naive();
    if to <= t {
        day = day.succ_opt().unwrap_or(day);
    }
    let end = tz
        .from_local_datetime(&day.and_time(to))
        .earliest()
        // `to` falls in a spring-forward gap: the hour after it.
        .or_else(|| {
            tz.from_local_datetime(&(day.and_time(to) + chrono::Duration::hours(1)))
                .earliest()
        })
        .map(|d| d.with_timezone(&Utc));
    Ok(end)
}

/// Starts a new decision's escalation when its owner has a policy: fills `escalation` and
/// `escalate_at` before the row is written; the first step fires at once when it is due now.
pub async fn start(tx: &mut Tx, owner_id: &str, row: &mut DecisionRow) -> ApiResult<()> {
    let Some(policy) = policy_of(tx, owner_id).await? else {
        return Ok(());
    };
    let first = &policy.steps[0];
    let mut esc = Escalation {
        notified: Vec::new(),
        next: Some(EscalationNext {
            step: 0,
            at: convert::dt(tx.now + i64::from(first.after_minutes) * 60_000),
            devices: step_names(tx, owner_id, first).await?,
        }),
        held_until: None,
        stopped: None,
        reminded: 0,
        next_reminder: None,
        policy: Some(policy),
    };
    advance(tx, owner_id, row, &mut esc).await?;
    Ok(())
}

/// Moves an escalation as far as the clock allows: fires each due step (unless quiet hours
/// hold it and the decision is not urgent), and sets when it moves next. Writes `escalation`
/// and `escalate_at` on the row; the caller writes the row and its event.
async fn advance(
    tx: &mut Tx,
    owner_id: &str,
    row: &mut DecisionRow,
    esc: &mut Escalation,
) -> ApiResult<()> {
    let now = convert::dt(tx.now);
    let policy = esc.policy.clone().unwrap_or_else(|| EscalationPolicy {
        steps: Vec::new(),
        quiet_hours: None,
        reminders: None,
    });
    while let Some(next) = esc.next.clone() {
        if next.at > now || esc.stopped.is_some() {
            break;
        }
        if let Some(q) = &policy.quiet_hours
            && let Some(end) = quiet_until(q, now)?
            && !urgent(row, end)?
        {
            esc.held_until = Some(end);
            row.escalate_at = Some(end.timestamp_millis());
            row.escalation = Some(esc.clone());
            return Ok(());
        }
        esc.held_until = None;
        let step = next.step as usize;
        for id in &policy.steps[step].devices {
            if let Some(d) = tx.device(id).await?
                && d.revoked_at.is_none()
            {
                esc.notified.push(EscalationNotice {
                    device_id: d.id.clone(),
                    device_name: d.name.clone(),
                    person: None,
                    step: next.step,
                    reminder: None,
                    at: now,
                });
            }
        }
        for (person, d) in people_devices(tx, owner_id, &policy.steps[step]).await? {
            esc.notified.push(EscalationNotice {
                device_id: d.id.clone(),
                device_name: format!("{} ({person})", d.name),
                person: Some(person),
                step: next.step,
                reminder: None,
                at: now,
            });
        }
        esc.next = match policy.steps.get(step + 1) {
            Some(s) => Some(EscalationNext {
                step: next.step + 1,
                at: now + chrono::Duration::minutes(i64::from(s.after_minutes)),
                devices: step_names(tx, owner_id, s).await?,
            }),
            None => None,
        };
    }
    if let Some(r) = policy.reminders {
        while let Some(at) = next_reminder(esc, r) {
            if at > now {
                break;
            }
            if let Some(q) = &policy.quiet_hours
                && let Some(end) = quiet_until(q, now)?
                && !urgent(row, end)?
            {
                esc.held_until = Some(end);
                esc.next_reminder = Some(at);
                row.escalate_at = Some(end.timestamp_millis());
                row.escalation = Some(esc.clone());
                return Ok(());
            }
            esc.held_until = None;
            remind(tx, owner_id, esc, now).await?;
        }
    }
    esc.next_reminder = policy.reminders.and_then(|r| next_reminder(esc, r));
    row.escalate_at = esc
        .next
        .as_ref()
        .filter(|_| esc.stopped.is_none())
        .map(|n| n.at)
        .into_iter()
        .chain(esc.next_reminder)
        .min()
        .map(|at| at.timestamp_millis());
    row.escalation = Some(esc.clone());
    Ok(())
}

/// When the next reminder is due: `every_minutes` after the last notification of any kind,
/// while fewer than `at_most` were sent; none before anyone was notified.
fn next_reminder(esc: &Escalation, r: Reminders) -> Option<DateTime<Utc>> {
    if esc.reminded >= r.at_most {
        return None;
    }
    let last = esc.notified.iter().map(|n| n.at).max()?;
    Some(last + chrono::Duration::minutes(i64::from(r.every_minutes)))
}

/// Reminds every device notified so far that is still live (and, for a delegate's, still
/// delegated to): each gets a notice marked as this reminder, which is what pushes it again.
async fn remind(
    tx: &mut Tx,
    owner_id: &str,
    esc: &mut Escalation,
    now: DateTime<Utc>,
) -> ApiResult<()> {
    esc.reminded += 1;
    let step = esc.notified.iter().map(|n| n.step).max().unwrap_or(0);
    let mut seen: Vec<String> = Vec::new();
    let mut again = Vec::new();
    for n in &esc.notified {
        if seen.contains(&n.device_id) {
            continue;
        }
        seen.push(n.device_id.clone());
        let Some(d) = tx.device(&n.device_id).await? else {
            continue;
        };
        if d.revoked_at.is_some() {
            continue;
        }
        if let Some(person) = &n.person
            && still_delegated(tx, owner_id, person)
                .await?
                .is_none_or(|p| p.id != d.user_id)
        {
            continue;
        }
        again.push(EscalationNotice {
            device_id: d.id.clone(),
            device_name: n.device_name.clone(),
            person: n.person.clone(),
            step,
            reminder: Some(esc.reminded),
            at: now,
        });
    }
    esc.notified.extend(again);
    Ok(())
}

/// A decision that cannot wait for quiet hours to end: a risky one, or one whose deadline
/// (ours or the runtime's) comes before they end.
fn urgent(row: &DecisionRow, quiet_end: DateTime<Utc>) -> ApiResult<bool> {
    Ok(row.risky || convert::decision(row)?.closing().at <= quiet_end)
}

/// Who a step notifies, for people: its live devices' names, then the people still delegated
/// (who accepted: one offered and not yet accepted, or declined, is skipped).
async fn step_names(tx: &mut Tx, owner_id: &str, step: &EscalationStep) -> ApiResult<Vec<String>> {
    let mut names = Vec::with_capacity(step.devices.len() + step.people.len());
    for id in &step.devices {
        if let Some(d) = tx.device(id).await?
            && d.revoked_at.is_none()
        {
            names.push(d.name);
        }
    }
    for name in &step.people {
        if still_delegated(tx, owner_id, name).await?.is_some() {
            names.push(name.clone());
        }
    }
    Ok(names)
}

/// A person a step names, when the owner still delegates to them and they accepted.
async fn still_delegated(tx: &mut Tx, owner_id: &str, name: &str) -> ApiResult<Option<UserRow>> {
    let Some(p) = tx.user_by_name(name).await? else {
        return Ok(None);
    };
    Ok(delegations::delegated(tx, owner_id, &p.id)
        .await?
        .then_some(p))
}

/// The live devices of the people a step names who are still delegated to, with their names.
async fn people_devices(
    tx: &mut Tx,
    owner_id: &str,
    step: &EscalationStep,
) -> ApiResult<Vec<(String, DeviceRow)>> {
    let mut out = Vec::new();
    for name in &step.people {
        if let Some(p) = still_delegated(tx, owner_id, name).await? {
            for d in tx.list_devices(Some(&p.id)).await? {
                if d.revoked_at.is_none() {
                    out.push((name.clone(), d));
                }
            }
        }
    }
    Ok(out)
}

/// Someone opened (or answered) the decision on `device`: nobody further is notified.
pub async fn seen(
    tx: &mut Tx,
    task: &TaskRow,
    decision_id: &str,
    device: &DeviceRow,
    step: DeliveryStep,
) -> ApiResult<Option<i64>> {
    let Some(mut row) = tx.decision(decision_id).await? else {
        return Ok(None);
    };
    let Some(mut esc) = row.escalation.clone() else {
        return Ok(None);
    };
    if row.status != DecisionStatus::Pending || esc.stopped.is_some() || esc.next.is_none() {
        return Ok(None);
    }
    // A delegate's device is named with its person: "opened on phone (bob)".
    let by = if device.user_id == task.owner_id {
        device.name.clone()
    } else {
        let person = tx.user_by_id(&device.user_id).await?.map(|u| u.name);
        format!("{} ({})", device.name, person.as_deref().unwrap_or("?"))
    };
    esc.stopped = Some(format!("{step} on {by}"));
    // Stopped: nobody is next (the API says `next` is absent once it stops).
    esc.next = None;
    esc.held_until = None;
    // Reminders go on until someone answers.
    row.escalate_at = esc.next_reminder.map(|at| at.timestamp_millis());
    row.escalation = Some(esc);
    tx.update_decision(&row).await?;
    let wire = convert::decision(&row)?;
    Ok(Some(
        emit(tx, task, EventKind::DecisionEscalated, &wire).await?,
    ))
}

/// Moves every escalation that is due. One replica at a time; each decision in its own
/// transaction under its task's lock, re-checked there. Returns how many moved.
pub async fn escalate_due(st: &Context) -> ApiResult<usize> {
    let due = Tx::read(st).await?.due_escalations(st.now_ms()).await?;
    if due.is_empty() {
        return Ok(0);
    }
    let mut claim = Tx::read(st).await?;
    if !claim.try_claim("escalate").await? {
        return Ok(0);
    }
    let mut n = 0;
    for d in due {
        let mut tx = Tx::write(st).await?;
        let Some(task) = tx.task(&d.task_id).await? else {
            continue;
        };
        let Some(mut row) = tx.decision(&d.id).await? else {
            continue;
        };
        let due_now = row.escalate_at.is_some_and(|at| at <= tx.now);
        let Some(mut esc) = row.escalation.clone() else {
            continue;
        };
        if row.status != DecisionStatus::Pending || !due_now {
            continue;
        }
        advance(&mut tx, &task.owner_id, &mut row, &mut esc).await?;
        tx.update_decision(&row).await?;
        let wire = convert::decision(&row)?;
        emit(&mut tx, &task, EventKind::DecisionEscalated, &wire).await?;
        tx.commit().await?;
        n += 1;
    }
    drop(claim);
    Ok(n)
}

/// Whether a decision event reaches `device_id` by push under its escalation: the devices a
/// step notified in the very transaction that wrote the event (`at`); `None` when the decision
/// has no escalation (every device is notified, as without a policy).
pub fn pushes_to(data: &serde_json::Value, at: i64, device_id: &str) -> Option<bool> {
    let esc = data.get("escalation").filter(|v| !v.is_null())?;
    let at = convert::dt(at);
    Some(
        esc.get("notified")
            .and_then(|v| v.as_array())
            .is_some_and(|all| {
                all.iter().any(|n| {
                    n.get("device_id").and_then(|v| v.as_str()) == Some(device_id)
                        && n.get("at")
                            .and_then(|v| v.as_str())
                            .and_then(|s| s.parse::<DateTime<Utc>>().ok())
                            == Some(at)
                })
            }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(from: &str, to: &str, zone: &str) -> QuietHours {
        QuietHours {
            from: from.into(),
            to: to.into(),
            time_zone: zone.into(),
        }
    }

    fn utc(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn quiet_hours_that_span_midnight_end_the_next_morning_in_their_zone() {
        let q = quiet("22:00", "07:00", "Europe/Berlin");
        // 21:59 in Berlin (UTC+1 in December): not quiet.
        assert_eq!(quiet_until(&q, utc("2026-12-06T20:59:00Z")).unwrap(), None);
        // 22:00 and 03:00 in Berlin: quiet until 07:00 Berlin the next morning.
        let end = utc("2026-12-07T06:00:00Z");
        assert_eq!(
            quiet_until(&q, utc("2026-12-06T21:00:00Z")).unwrap(),
            Some(end)
        );
        assert_eq!(
            quiet_until(&q, utc("2026-12-07T02:00:00Z")).unwrap(),
            Some(end)
        );
        // 07:00 itself is no longer quiet.
        assert_eq!(quiet_until(&q, end).unwrap(), None);
    }

    #[test]
    fn quiet_hours_within_a_day_and_across_a_clock_change() {
        let q = quiet("12:00", "14:00", "America/New_York");
        assert_eq!(
            quiet_until(&q, utc("2026-12-06T17:30:00Z")).unwrap(),
            Some(utc("2026-12-06T19:00:00Z"))
        );
        assert_eq!(quiet_until(&q, utc("2026-12-06T19:30:00Z")).unwrap(), None);
        // Ending in the spring-forward gap (02:30 does not exist in Berlin on 2027-03-28): the
        // hour after it.
        let gap = quiet("01:00", "02:30", "Europe/Berlin");
        assert_eq!(
            quiet_until(&gap, utc("2027-03-28T00:30:00Z")).unwrap(),
            Some(utc("2027-03-28T01:30:00Z"))
        );
    }

    #[test]
    fn quiet_hours_that_do_not_parse_say_why() {
        for (q, says) in [
            (quiet("10pm", "07:00", "UTC"), "quiet_hours.from"),
            (quiet("22:00", "22:00", "UTC"), "must differ"),
            (quiet("22:00", "07:00", "Mars/Olympus"), "IANA time zone"),
        ] {
            let e = quiet_until(&q, utc("2026-12-06T21:00:00Z")).unwrap_err();
            assert_eq!(e.code(), ErrorCode::ValidationFailed);
            assert!(e.problem.detail.contains(says), "{}", e.problem.detail);
        }
    }

    #[test]
    fn a_reminder_follows_the_last_notice_until_the_policy_has_sent_them_all() {
        let r = Reminders {
            every_minutes: 30,
            at_most: 2,
        };
        let notice = |at: &str| EscalationNotice {
            device_id: "dev_1".into(),
            device_name: "phone".into(),
            person: None,
            step: 0,
            reminder: None,
            at: utc(at),
        };
        let mut esc = Escalation {
            notified: Vec::new(),
            next: None,
            held_until: None,
            stopped: None,
            reminded: 0,
            next_reminder: None,
            policy: None,
        };
        assert_eq!(next_reminder(&esc, r), None, "nobody notified yet");
        esc.notified = vec![
            notice("2026-12-06T10:00:00Z"),
            notice("2026-12-06T10:20:00Z"),
        ];
        assert_eq!(next_reminder(&esc, r), Some(utc("2026-12-06T10:50:00Z")));
        esc.reminded = 2;
        assert_eq!(next_reminder(&esc, r), None, "all sent");
    }
}
