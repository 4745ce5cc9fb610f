// The control plane's wire objects as the web mirror keeps them (waymark-proto's api.rs,
// event.rs and steer.rs): what snapshots and events carry, and what the mirror's queries return.
import type {
  ApprovalDurability,
  AttemptState,
  DecisionKind,
  DecisionStatus,
  DeliveryStep,
  EffectStatus,
  Operation,
  OwnEffect,
  PatternKind,
  RuleAnswer,
  TaskState,
  Value,
} from "../bindings";

/** An RFC 3339 time as the server writes it (`2026-12-01T18:34:07.493Z`). */
export type Time = string;

export type PlanStep = { id: string; title: string; depends_on?: string[] };

export type DecisionOption = { id: string; label: string; gives_up: string; cost?: string | null };

export type Budget = {
  max_wall_seconds?: number | null;
  max_tokens?: number | null;
  max_cost_usd?: number | null;
  thresholds?: number[] | null;
  options?: DecisionOption[];
  default_option?: string | null;
  decision_seconds?: number | null;
};

export type Usage = { tokens: number; cost_usd: number; wall_seconds: number };

export type Materials = { repo?: string | null; commit?: string | null };

export type Task = {
  id: string;
  owner: string;
  title: string;
  goal: string;
  runtime: string | null;
  external_key?: string | null;
  state: TaskState;
  plan: PlanStep[];
  plan_revision: number;
  budget: Budget;
  usage: Usage;
  materials: Materials;
  session_id: string;
  fence: number;
  outcome_summary: string | null;
  created_at: Time;
  updated_at: Time;
  parent_id?: string | null;
  machine_id?: string | null;
};

export type Attempt = {
  id: string;
  task_id: string;
  worker: string;
  fence: number;
  expires_at: Time;
  state: AttemptState;
  manifest_digest: string | null;
  started_at: Time;
  ended_at: Time | null;
  outcome: string | null;
  released?: string[];
};

export type CompletedStep = { step: string; artifact_digests: string[]; verified: boolean };

export type PendingStep = {
  step: string;
  intent_digest?: string | null;
  idempotency_key?: string | null;
  approval_id?: string | null;
};

export type EffectRef = { effect_id: string; status: EffectStatus };

export type CheckpointBody = {
  reason: string;
  plan_revision: number;
  manifest_digest?: string | null;
  completed_steps: CompletedStep[];
  pending_step?: PendingStep | null;
  effects: EffectRef[];
  budget_remaining?: Budget | null;
  materials?: Materials | null;
  summary?: string | null;
};

export type Checkpoint = {
  task_id: string;
  sequence: number;
  attempt_id: string;
  fence: number;
  body: CheckpointBody;
  prev_digest: string | null;
  digest: string;
  created_at: Time;
};

export type Effect = {
  id: string;
  task_id: string;
  idempotency_key: string;
  kind: string;
  step: string | null;
  resource_id: string | null;
  intent: Value;
  intent_digest: string;
  status: EffectStatus;
  receipt: Value | null;
  attempt_id: string;
  fence: number;
  created_at: Time;
  updated_at: Time;
  flag?: string | null;
};

export type DecisionOutcome = {
  option: string | null;
  text?: string | null;
  by: string;
  at: Time;
  edited_intent?: Value | null;
  edited_intent_digest?: string | null;
};

export type Delivery = { state: string; detail?: string | null; at: Time };

export type Decision = {
  id: string;
  task_id: string;
  kind: DecisionKind;
  status: DecisionStatus;
  step: string | null;
  question: string;
  options: DecisionOption[];
  default_option: string | null;
  intent: Value | null;
  intent_digest: string | null;
  effect_id: string | null;
  plan_revision: number;
  risky: boolean;
  expires_at: Time;
  created_at: Time;
  outcome: DecisionOutcome | null;
  durability?: ApprovalDurability | null;
  delivery?: Delivery | null;
  editable?: string | null;
  deliveries?: DeviceDelivery[];
  runtime_deadline?: RuntimeDeadline | null;
  escalation?: Escalation | null;
};

/** Where a decision stands in its user's escalation policy (`Escalation` in waymark-proto). */
export type Escalation = {
  notified: { device_id: string; device_name: string; step: number; reminder?: number | null; at: Time }[];
  next?: { step: number; at: Time; devices: string[] } | null;
  held_until?: Time | null;
  stopped?: string | null;
  reminded?: number;
  next_reminder?: Time | null;
};

/** When the runtime holding an approval decides on its own, and what it does then. */
/** `can_wait`: the runtime can be asked to wait for the answer across its exit (`defer`). */
export type RuntimeDeadline = { runtime: string; at: Time; then: "denies" | "asks_itself"; can_wait?: boolean };

/** One step a decision reached on one device (`decision.delivered`). */
export type DeviceDelivery = {
  decision_id: string;
  device_id: string;
  device_name: string;
  step: DeliveryStep;
  at: Time;
  detail?: string | null;
};

export type Artifact = {
  id: string;
  task_id: string;
  sha256: string;
  name: string;
  media_type: string;
  size: number;
  step: string | null;
  created_at: Time;
};

export type TestTotals = { tests: number; failures: number; errors: number; skipped: number; passed: number };

export type TestFailure = { suite: string; classname: string; name: string; kind: string; message: string };

export type TestReceipt = {
  id: string;
  task_id: string;
  step: string | null;
  command: string;
  exit_code: number;
  commit: string | null;
  totals: TestTotals;
  failures: TestFailure[];
  /** `null` when the server's number was not finite (JSON has no NaN). */
  duration_seconds: number | null;
  passed: boolean;
  junit_sha256: string;
  created_at: Time;
};

export type Message = { session_id: string; seq: number; role: string; text: string; created_at: Time };

/** `GET /v1/tasks/{task}`: a thread in full, as a snapshot is made of. */
export type TaskDetail = {
  cursor: number;
  task: Task;
  attempts: Attempt[];
  checkpoints: Checkpoint[];
  effects: Effect[];
  decisions: Decision[];
  artifacts: Artifact[];
  test_receipts: TestReceipt[];
  messages: Message[];
  [more: string]: unknown;
};

/** Every event kind (event.rs), with the object its `data` carries. */
export const EVENT_KINDS = [
  "task.created",
  "task.updated",
  "attempt.started",
  "attempt.ended",
  "attempt.updated",
  "checkpoint.appended",
  "effect.declared",
  "effect.updated",
  "decision.requested",
  "decision.closed",
  "decision.updated",
  "artifact.added",
  "test_receipt.added",
  "messages.appended",
  "command.applied",
  "followup.fired",
  "command.acknowledged",
  "decision.delivered",
  "decision.escalated",
] as const;

export type EventKind = (typeof EVENT_KINDS)[number];

/** One entry of the event log. */
export type Event = { cursor: number; task_id: string; kind: EventKind; at: Time; data: unknown };

export type CommandStatus = "applied" | "duplicate" | "conflict" | "rejected";

/** The ledger's answer to a command. */
export type CommandResult = {
  status: CommandStatus;
  command_id: string;
  task_id?: string | null;
  operation?: Operation | null;
  reason?: string | null;
  detail: string;
  based_on_revision?: number | null;
  plan_revision?: number | null;
  task_state?: TaskState | null;
  cursor?: number | null;
  original?: CommandResult | null;
};

/** The worker saw a command. */
export type CommandAck = { command_id: string; task_id: string; attempt_id: string; at: Time };

/** What a device sends: the command as signed, and the signature (built by ./sign). */
export type { SignedEnvelope } from "./sign";

/** Unix milliseconds of a wire time, as chrono's `timestamp_millis` (sub-millisecond digits
 * dropped). Throws on anything that is not RFC 3339. */
export function ms(t: Time): number {
  return timeKey(t)[0];
}

/** `[unix ms, nanoseconds past that ms]`: wire times compared at full precision. */
export function timeKey(t: Time): [number, number] {
  const m = /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d{2}):(\d{2}))$/.exec(t);
  if (!m) throw new Error(`not an RFC 3339 time: ${JSON.stringify(t)}`);
  const frac = (m[7] ?? "").padEnd(9, "0");
  const offset = m[8] ? 0 : (m[9] === "-" ? -1 : 1) * (Number(m[10]) * 60 + Number(m[11])) * 60_000;
  const whole = Date.UTC(Number(m[1]), Number(m[2]) - 1, Number(m[3]), Number(m[4]), Number(m[5]), Number(m[6]));
  return [whole + Number(frac.slice(0, 3)) - offset, Number(frac.slice(3))];
}

/** Orders two wire times, at full precision. */
export function compareTime(a: Time, b: Time): number {
  const [am, an] = timeKey(a);
  const [bm, bn] = timeKey(b);
  return am - bm || an - bn;
}

/** `GET /v1/machines`: one of the user's machines, as its runner last reported it. */
export type Machine = {
  id: string;
  name: string;
  owner: string;
  online: boolean;
  last_seen_at?: Time | null;
  offline_since?: Time | null;
  runtimes: { runtime: string; version?: string | null }[];
  directories: string[];
  runner_version?: string | null;
  inhibits_sleep: boolean;
  active_tasks: string[];
};

export type MachineList = { machines: Machine[] };

/** `GET /v1/rules`: one of the user's standing rules (`waymark_proto::Rule`). */
export type Rule = {
  id: string;
  digest: string;
  owner: string;
  device_id: string;
  device_name: string;
  match: { runtime?: string; machine?: string; directory?: string; tool?: string; input?: { kind: PatternKind; pattern: string } };
  answer: RuleAnswer;
  note?: string | null;
  allow_risky: boolean;
  command_id: string;
  created_at: Time;
  expires_at: Time;
  revoked_at?: Time | null;
  revoked_by?: string | null;
  uses: number;
  last_used_at?: Time | null;
  live: boolean;
};

/** `GET /v1/rules`: a runtime's own rule as a runner read it (`waymark_proto::ListedRuntimeRule`). */
export type ListedRuntimeRule = {
  machine: string;
  reported_at?: Time | null;
  rule: {
    runtime: string;
    source: string;
    text: string;
    effect: OwnEffect;
    match: { runtime?: string; machine?: string; directory?: string; tool?: string; input?: { kind: PatternKind; pattern: string } };
  };
  conflicts: { rule_id: string; says: string }[];
};

export type RuleList = { rules: Rule[]; runtime_rules?: ListedRuntimeRule[] };
