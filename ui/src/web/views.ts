// Mirror rows → the app's view types, shaped exactly as src-tauri/src/views.rs shapes them, so
// the same React screens render the web companion: times in unix ms, absent options as null.
import type {
  ArtifactView,
  ClosingView,
  EscalationStateView,
  AttemptView,
  CheckpointView,
  DecisionView,
  EffectView,
  InboxItemView,
  MachineView,
  MessageView,
  OutboxView,
  ReceiptView,
  RuleView,
  RulesView,
  RuntimeRuleView,
  StageView,
  TaskState,
  TaskView,
  ThreadDetailView,
  ThreadRowView,
} from "../bindings";
import { isDiff, type InboxItem, type OutboxEntry, type Stage, type ThreadDetail, type ThreadRow } from "./mirror";
import {
  ms,
  type Artifact,
  type Attempt,
  type Checkpoint,
  type Decision,
  type Effect,
  type Machine,
  type ListedRuntimeRule,
  type Rule,
  type RuleList,
  type Message,
  type Task,
  type TestReceipt,
} from "./wire";

const TERMINAL: readonly TaskState[] = ["completed", "partially_delivered", "cancelled", "failed"];

/** A JSON number that is not finite crosses as `null` (serde_json writes NaN as null). */
function real(n: number | null | undefined): number | null {
  return typeof n === "number" && Number.isFinite(n) ? n : null;
}

export function stageView(s: Stage): StageView {
  return { step: s.step, title: s.title, status: s.status, verified: s.verified };
}

/** A task; `now` (unix ms) is when its budget's elapsed time is measured, until it ends. */
export function taskView(t: Task, now: number = Date.now()): TaskView {
  const terminal = TERMINAL.includes(t.state);
  const end = terminal ? ms(t.updated_at) : now;
  return {
    id: t.id,
    title: t.title,
    goal: t.goal,
    runtime: t.runtime ?? null,
    state: t.state,
    terminal,
    plan_revision: t.plan_revision,
    fence: t.fence,
    budget: {
      max_wall_seconds: t.budget.max_wall_seconds ?? null,
      max_tokens: t.budget.max_tokens ?? null,
      max_cost_usd: real(t.budget.max_cost_usd),
      elapsed_seconds: Math.max(0, Math.trunc((end - ms(t.created_at)) / 1000)),
      used_tokens: t.usage.tokens,
      used_cost_usd: real(t.usage.cost_usd),
    },
    repo: t.materials.repo ?? null,
    commit: t.materials.commit ?? null,
    outcome_summary: t.outcome_summary ?? null,
    machine_id: t.machine_id ?? null,
    created_at: ms(t.created_at),
    updated_at: ms(t.updated_at),
  };
}

export function checkpointView(c: Checkpoint): CheckpointView {
  const b = c.body;
  const p = b.pending_step ?? null;
  return {
    sequence: c.sequence,
    attempt_id: c.attempt_id,
    fence: c.fence,
    reason: b.reason ?? "",
    plan_revision: b.plan_revision ?? 0,
    completed_steps: (b.completed_steps ?? []).map((s) => ({
      step: s.step,
      artifact_digests: s.artifact_digests ?? [],
      verified: s.verified ?? false,
    })),
    pending_step: p && {
      step: p.step,
      intent_digest: p.intent_digest ?? null,
      idempotency_key: p.idempotency_key ?? null,
      approval_id: p.approval_id ?? null,
    },
    effects: (b.effects ?? []).map((e) => ({ effect_id: e.effect_id, status: e.status })),
    summary: b.summary ?? null,
    commit: b.materials?.commit ?? null,
    digest: c.digest,
    prev_digest: c.prev_digest ?? null,
    created_at: ms(c.created_at),
  };
}

export function effectView(e: Effect): EffectView {
  return {
    id: e.id,
    kind: e.kind,
    step: e.step ?? null,
    resource_id: e.resource_id ?? null,
    idempotency_key: e.idempotency_key,
    intent: e.intent,
    intent_digest: e.intent_digest,
    status: e.status,
    receipt: e.receipt ?? null,
    flag: e.flag ?? null,
    fence: e.fence,
    updated_at: ms(e.updated_at),
  };
}

/** What happens if nobody answers, and when: `Decision::closing` in `waymark-proto`. */
export function closingOf(d: Decision): ClosingView {
  const expires = ms(d.expires_at);
  const r = d.runtime_deadline;
  if (r && ms(r.at) <= expires) {
    return { at: ms(r.at), runtime: r.runtime, then: r.then === "denies" ? "runtime_denies" : "runtime_asks_itself", option: null };
  }
  if (d.durability === "fail_open_hook") {
    return { at: expires, runtime: "Claude Code", then: "runtime_asks_itself", option: null };
  }
  return d.default_option != null
    ? { at: expires, runtime: null, then: "default", option: d.default_option }
    : { at: expires, runtime: null, then: "no_default", option: null };
}

/** Where a decision stands in its escalation, as `EscalationStateView` in views.rs. */
export function escalationView(e: NonNullable<Decision["escalation"]>): EscalationStateView {
  const notified: string[] = [];
  for (const n of e.notified) if (!notified.includes(n.device_name)) notified.push(n.device_name);
  return {
    notified,
    next_devices: e.next?.devices ?? [],
    next_at: e.next ? ms(e.next.at) : null,
    held_until: e.held_until ? ms(e.held_until) : null,
    stopped: e.stopped ?? null,
    reminded: e.reminded ?? 0,
    next_reminder_at: e.next_reminder ? ms(e.next_reminder) : null,
  };
}

export function decisionView(d: Decision): DecisionView {
  return {
    closing: closingOf(d),
    can_wait: d.runtime_deadline?.can_wait === true,
    escalation: d.escalation ? escalationView(d.escalation) : null,
    id: d.id,
    task_id: d.task_id,
    kind: d.kind,
    status: d.status,
    step: d.step ?? null,
    question: d.question,
    options: d.options.map((o) => ({ id: o.id, label: o.label, gives_up: o.gives_up ?? "", cost: o.cost ?? null })),
    default_option: d.default_option ?? null,
    intent: d.intent ?? null,
    intent_digest: d.intent_digest ?? null,
    effect_id: d.effect_id ?? null,
    plan_revision: d.plan_revision,
    risky: d.risky,
    expires_at: ms(d.expires_at),
    created_at: ms(d.created_at),
    outcome: d.outcome
      ? {
          option: d.outcome.option ?? null,
          text: d.outcome.text ?? null,
          by: d.outcome.by,
          at: ms(d.outcome.at),
          edited_intent: d.outcome.edited_intent ?? null,
        }
      : null,
    durability: d.durability ?? null,
    delivery: d.delivery?.state ?? null,
    delivery_detail: d.delivery?.detail ?? null,
    editable: d.editable ?? null,
    deliveries: (d.deliveries ?? [])
      .map((x) => ({ device_id: x.device_id, device_name: x.device_name, step: x.step, at: ms(x.at), detail: x.detail ?? null }))
      .sort((a, b) => a.at - b.at || (a.device_id < b.device_id ? -1 : a.device_id > b.device_id ? 1 : 0)),
  };
}

export function artifactView(a: Artifact): ArtifactView {
  return {
    id: a.id,
    sha256: a.sha256,
    name: a.name,
    media_type: a.media_type,
    size: a.size,
    step: a.step ?? null,
    is_diff: isDiff(a),
    created_at: ms(a.created_at),
  };
}

export function receiptView(r: TestReceipt): ReceiptView {
  return {
    id: r.id,
    step: r.step ?? null,
    command: r.command,
    exit_code: r.exit_code,
    commit: r.commit ?? null,
    totals: {
      tests: r.totals.tests,
      passed: r.totals.passed,
      failures: r.totals.failures,
      errors: r.totals.errors,
      skipped: r.totals.skipped,
    },
    failures: r.failures.map((f) => ({
      suite: f.suite,
      classname: f.classname,
      name: f.name,
      kind: f.kind,
      message: f.message,
    })),
    duration_seconds: real(r.duration_seconds),
    passed: r.passed,
    junit_sha256: r.junit_sha256,
    created_at: ms(r.created_at),
  };
}

export function messageView(m: Message): MessageView {
  return { seq: m.seq, role: m.role, text: m.text, created_at: ms(m.created_at) };
}

export function attemptView(a: Attempt): AttemptView {
  return {
    id: a.id,
    worker: a.worker,
    fence: a.fence,
    state: a.state,
    outcome: a.outcome ?? null,
    started_at: ms(a.started_at),
    ended_at: a.ended_at ? ms(a.ended_at) : null,
    expires_at: ms(a.expires_at),
  };
}

export function machineView(m: Machine): MachineView {
  return {
    id: m.id,
    name: m.name,
    online: m.online,
    last_seen_at: m.last_seen_at ? ms(m.last_seen_at) : null,
    offline_since: m.offline_since ? ms(m.offline_since) : null,
    runtimes: m.runtimes.map((r) => ({ runtime: r.runtime, version: r.version ?? null })),
    directories: m.directories,
    inhibits_sleep: m.inhibits_sleep,
    active_tasks: m.active_tasks,
    runner_version: m.runner_version ?? null,
  };
}

export function outboxView(e: OutboxEntry): OutboxView {
  return {
    command_id: e.command_id,
    task_id: e.task_id,
    operation: e.operation,
    based_on_revision: e.based_on_revision,
    status: e.status,
    detail: e.result?.detail ?? null,
    met_revision: e.result?.plan_revision ?? null,
    what_changed: e.what_changed,
    created_at: e.created_at,
    delivered_at: e.delivered_at,
    acknowledged_at: e.acknowledged_at,
  };
}

/** A row for `me` (this device's user): another owner's thread says whose it is. */
export function threadRowView(r: ThreadRow, now: number = Date.now(), me: string | null = null): ThreadRowView {
  return {
    on_behalf_of: me != null && r.task.owner && r.task.owner !== me ? r.task.owner : null,
    task: taskView(r.task, now),
    pending_decisions: r.pending_decisions,
    unknown_effects: r.unknown_effects,
    last_checkpoint: r.last_checkpoint ? checkpointView(r.last_checkpoint) : null,
    stages: r.stages.map(stageView),
    pinned: r.pinned,
  };
}

/** A card for `me` (this device's user): another owner's decision says whose it is. */
export function inboxItemView(i: InboxItem, me: string | null = null): InboxItemView {
  return {
    decision: decisionView(i.decision),
    task_title: i.task_title,
    on_behalf_of: me != null && i.task_owner && i.task_owner !== me ? i.task_owner : null,
    plan_revision: i.plan_revision,
    // Asked at an older plan revision than the task has now: answering would conflict.
    stale: i.decision.plan_revision !== i.plan_revision,
    diffs: i.diffs.map(artifactView),
    receipts: i.receipts.map(receiptView),
  };
}

export function threadDetailView(d: ThreadDetail, now: number = Date.now()): ThreadDetailView {
  return {
    task: taskView(d.task, now),
    stages: d.stages.map(stageView),
    attempts: d.attempts.map(attemptView),
    checkpoints: d.checkpoints.map(checkpointView),
    effects: d.effects.map(effectView),
    decisions: d.decisions.map(decisionView),
    artifacts: d.artifacts.map(artifactView),
    receipts: d.receipts.map(receiptView),
    messages: d.messages.map(messageView),
    outbox: d.outbox.map(outboxView),
  };
}

/** A rule as `RuleView::from` shapes it: its match flat, times in unix ms. */
export function ruleView(r: Rule): RuleView {
  const m = r.match;
  return {
    id: r.id,
    digest: r.digest,
    device_name: r.device_name,
    runtime: m.runtime ?? null,
    machine: m.machine ?? null,
    directory: m.directory ?? null,
    tool: m.tool ?? null,
    pattern: m.input?.pattern ?? null,
    pattern_kind: m.input?.kind ?? null,
    answer: r.answer,
    note: r.note ?? null,
    allow_risky: r.allow_risky,
    created_at: ms(r.created_at),
    expires_at: ms(r.expires_at),
    revoked_at: r.revoked_at ? ms(r.revoked_at) : null,
    uses: r.uses,
    last_used_at: r.last_used_at ? ms(r.last_used_at) : null,
    live: r.live,
  };
}

/** A runtime's own rule as `RuntimeRuleView::from` shapes it. */
export function runtimeRuleView(l: ListedRuntimeRule): RuntimeRuleView {
  const r = l.rule;
  return {
    machine: l.machine,
    runtime: r.runtime,
    source: r.source,
    text: r.text,
    effect: r.effect,
    tool: r.match.tool ?? null,
    pattern: r.match.input?.pattern ?? null,
    directory: r.match.directory ?? null,
    reported_at: l.reported_at ? ms(l.reported_at) : null,
    conflicts: l.conflicts.map((c) => ({ rule_id: c.rule_id, says: c.says })),
  };
}

/** The Rules screen's list as `RulesView::from` shapes it. */
export function rulesView(l: RuleList): RulesView {
  return { rules: l.rules.map(ruleView), runtime_rules: (l.runtime_rules ?? []).map(runtimeRuleView) };
}
