//! Tasks: creating one (or finding the runtime session's task again), plans and budgets.

use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::Caller;
use crate::core::{Made, Tx, check_text, created, emit, found, invalid, task_wire};
use crate::error::ApiResult;

/// Steps a plan may have: far beyond any plan a person reads, well within what is checked in
/// microseconds.
pub const MAX_PLAN_STEPS: usize = 2_000;
/// Dependencies a plan may have in all.
pub const MAX_PLAN_DEPENDENCIES: usize = 20_000;

pub fn validate_plan(plan: &[PlanStep]) -> ApiResult<()> {
    use std::collections::HashMap;
    if plan.len() > MAX_PLAN_STEPS {
        return Err(invalid(format!(
            "a plan has at most {MAX_PLAN_STEPS} steps ({} given)",
            plan.len()
        )));
    }
    let edges: usize = plan.iter().map(|s| s.depends_on.len()).sum();
    if edges > MAX_PLAN_DEPENDENCIES {
        return Err(invalid(format!(
            "a plan has at most {MAX_PLAN_DEPENDENCIES} dependencies in all ({edges} given)"
        )));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(plan.len());
    for (i, s) in plan.iter().enumerate() {
        check_text("plan[].id", &s.id, 128, true)?;
        check_text("plan[].title", &s.title, 1000, false)?;
        if index.insert(s.id.as_str(), i).is_some() {
            return Err(invalid(format!("plan step `{}` appears twice", s.id)));
        }
    }
    // Who waits on each step, by index: O(steps + dependencies) in all.
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); plan.len()];
    for (i, s) in plan.iter().enumerate() {
        for d in &s.depends_on {
            let Some(&j) = index.get(d.as_str()) else {
                return Err(invalid(format!(
                    "plan step `{}` depends on unknown step `{d}`",
                    s.id
                )));
            };
            dependents[j].push(i);
        }
    }
    // Kahn's algorithm: the plan must be a DAG.
    let mut indegree: Vec<usize> = plan.iter().map(|s| s.depends_on.len()).collect();
    let mut ready: Vec<usize> = (0..plan.len()).filter(|&i| indegree[i] == 0).collect();
    let mut done = 0;
    while let Some(i) = ready.pop() {
        done += 1;
        for &k in &dependents[i] {
            indegree[k] -= 1;
            if indegree[k] == 0 {
                ready.push(k);
            }
        }
    }
    if done != plan.len() {
        return Err(invalid("the plan's dependencies form a cycle"));
    }
    Ok(())
}

pub fn validate_budget(b: &Budget) -> ApiResult<()> {
    if b.max_cost_usd.is_some_and(|c| !c.is_finite() || c < 0.0) {
        return Err(invalid(
            "`budget.max_cost_usd` must be a non-negative number",
        ));
    }
    Ok(())
}

/// The task a runtime adapter created before for the same runtime id, answered as `200`.
pub async fn existing_task(
    st: &Context,
    caller: &Caller,
    runtime: &Option<String>,
    key: &Option<String>,
) -> ApiResult<Option<Made<Task>>> {
    if runtime.is_none() || key.is_none() {
        return Ok(None);
    }
    let mut tx = Tx::read(st).await?;
    existing_task_in(&mut tx, caller, runtime, key).await
}

/// [`existing_task`] in a given transaction.
pub async fn existing_task_in(
    tx: &mut Tx,
    caller: &Caller,
    runtime: &Option<String>,
    key: &Option<String>,
) -> ApiResult<Option<Made<Task>>> {
    let (Some(runtime), Some(key)) = (runtime, key) else {
        return Ok(None);
    };
    let Some(row) = tx
        .task_by_external_key(&caller.user_id, runtime, key)
        .await?
    else {
        return Ok(None);
    };
    let task = task_wire(tx, &row).await?;
    let cursor = tx.max_cursor().await?;
    Ok(Some(found(cursor, task)))
}

/// Creates a task with its first session, or answers the runtime session's task when one exists for
/// `(runtime, external_key)`.
pub async fn create_task(st: &Context, caller: &Caller, req: CreateTask) -> ApiResult<Made<Task>> {
    check_text("title", &req.title, 200, true)?;
    check_text("goal", &req.goal, 20_000, false)?;
    validate_plan(&req.plan)?;
    validate_budget(&req.budget)?;
    if let Some(key) = &req.external_key {
        check_text("external_key", key, 300, true)?;
        if req.runtime.is_none() {
            return Err(invalid(
                "`external_key` needs `runtime`: keys are per runtime",
            ));
        }
    }
    if let Some(found) = existing_task(st, caller, &req.runtime, &req.external_key).await? {
        return Ok(found);
    }
    let now = st.now_ms();
    let task_id = ids::task();
    let session_id = ids::session();
    let row = TaskRow {
        id: task_id.clone(),
        owner_id: caller.user_id.clone(),
        title: req.title,
        goal: req.goal,
        runtime: req.runtime,
        state: TaskState::Queued,
        plan: req.plan,
        plan_revision: 1,
        budget: req.budget,
        usage: Usage::default(),
        materials: req.materials,
        session_id: session_id.clone(),
        fence: 0,
        outcome_summary: None,
        created_at: now,
        updated_at: now,
        parent_id: None,
        external_key: req.external_key,
        machine_id: caller.machine.clone(),
    };
    let mut tx = Tx::write(st).await?;
    if let Err(e) = tx.insert_task(&row).await {
        // Another request created the same runtime key in the meantime: that task is the one.
        // It may sit in the same group commit, not yet visible to readers (SQLite): this write
        // transaction sees it, and its commit answers once that task is durable. Where a failed
        // statement ends the transaction (PostgreSQL), the other one had to commit before this
        // insert could fail, so a fresh read finds it.
        if let Ok(Some(found)) =
            existing_task_in(&mut tx, caller, &row.runtime, &row.external_key).await
        {
            tx.commit().await?;
            return Ok(found);
        }
        drop(tx);
        if let Some(found) = existing_task(st, caller, &row.runtime, &row.external_key).await? {
            return Ok(found);
        }
        return Err(e.into());
    }
    tx.insert_session(&SessionRow {
        id: session_id,
        task_id,
        parent_id: None,
        created_at: now,
    })
    .await?;
    let task = task_wire(&mut tx, &row).await?;
    let cursor = emit(&mut tx, &row, EventKind::TaskCreated, &task).await?;
    tx.commit().await?;
    st.metrics.tasks_created.inc();
    Ok(created(cursor, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(id: &str, deps: &[&str]) -> PlanStep {
        serde_json::from_value(serde_json::json!({"id": id, "title": id, "depends_on": deps}))
            .unwrap()
    }

    #[test]
    fn a_plan_is_a_bounded_dag_of_known_steps() {
        assert!(
            validate_plan(&[step("a", &[]), step("b", &["a"]), step("c", &["a", "b"])]).is_ok()
        );
        let err = |p: &[PlanStep]| validate_plan(p).unwrap_err().problem.detail;
        assert!(err(&[step("a", &["b"]), step("b", &["a"])]).contains("cycle"));
        assert!(err(&[step("a", &["a"])]).contains("cycle"));
        assert!(err(&[step("a", &["z"])]).contains("unknown step `z`"));
        assert!(err(&[step("a", &[]), step("a", &[])]).contains("twice"));
        // A long chain (each step on the one before) is fine up to the cap…
        let chain: Vec<PlanStep> = (0..MAX_PLAN_STEPS)
            .map(|i| {
                let deps: Vec<String> =
                    (i > 0).then(|| format!("s{}", i - 1)).into_iter().collect();
                serde_json::from_value(
                    serde_json::json!({"id": format!("s{i}"), "title": "x", "depends_on": deps}),
                )
                .unwrap()
            })
            .collect();
        assert!(validate_plan(&chain).is_ok());
        // …and refused beyond it, before anything else is looked at.
        let mut over = chain;
        over.push(step("one-more", &[]));
        assert!(err(&over).contains("at most 2000 steps"));
    }
}
