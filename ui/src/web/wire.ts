// The control plane's wire objects as the web companion receives them. Every type is generated
// from waymark-proto (api.rs, event.rs, steer.rs, machine.rs, rules.rs) into ./proto.ts, in the
// shape the server serialises (src-tauri/src/wire.rs): a field skipped when empty is optional and
// never null, a `#[serde(default)]` one always there, a `DateTime<Utc>` a string, an f64
// `number | null` (serde_json writes NaN as null). This file names them for the web companion and
// keeps only what is web-only: the name `Time`, the event kinds a stream carries, and the time
// helpers.
import type { EventKind as AnyEventKind } from "./proto";

// Generated, re-exported as they are. The enums the app's views use too (`TaskState`, …) are
// the same unions in ../bindings, where the screens import them from.
export type {
  Artifact,
  Attempt,
  Budget,
  ChainStatus,
  Checkpoint,
  CheckpointBody,
  CommandAck,
  CommandResult,
  CommandStatus,
  CompletedStep,
  Decision,
  DecisionOption,
  DecisionOutcome,
  Delegates,
  Delegation,
  Delivery,
  DeliveryState,
  Device,
  DeviceDelivery,
  DeviceReceipt,
  DeviceSession,
  Effect,
  EffectRef,
  Escalation,
  EscalationNext,
  EscalationNotice,
  EscalationPolicy,
  EscalationStep,
  Event,
  FinishOutcome,
  FormAnswer,
  FormChoice,
  FormQuestion,
  Health,
  InputPattern,
  ListedRuntimeRule,
  Machine,
  MachineList,
  MachineRuntime,
  Materials,
  Message,
  PendingStep,
  PlanStep,
  PostReceipts,
  QuestionForm,
  QuietHours,
  ReceiptsRecorded,
  RejectReason,
  Reminders,
  Rule,
  RuleConflict,
  RuleList,
  RuleMatch,
  RuleRef,
  RuntimeDeadline,
  RuntimeFallback,
  RuntimeRule,
  Session,
  Snapshot,
  Task,
  TaskDetail,
  TaskSummary,
  TestFailure,
  TestReceipt,
  TestTotals,
  Usage,
  VapidKey,
  WorkingTree,
} from "./proto";

/** What the device sends: the command as signed, and the signature (built by ./sign, which
 * narrows the generated `SteerCommand` and `Signature` to what the browser signs). */
export type { SignedEnvelope, SteerCommand, Signature } from "./sign";

/** An RFC 3339 time as the server writes it (`2026-12-01T18:34:07.493Z`): a `DateTime<Utc>`,
 * which the generated types give as `string`. Named for what `ms` and `timeKey` read. */
export type Time = string;

/** Every event kind a stream carries, in event.rs's order: the generated `EventKind` without
 * `access.changed`, which the server keeps to its own streams and never sends. A value, not
 * only a type, because the mirror refuses a kind it does not know; the check below fails to
 * compile when event.rs gains a kind this list lacks. */
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
] as const satisfies readonly AnyEventKind[];

/** A kind of event a stream carries. */
export type EventKind = (typeof EVENT_KINDS)[number];

/** `never` unless a kind of event.rs other than `access.changed` is missing from `EVENT_KINDS`. */
type Unlisted = Exclude<AnyEventKind, EventKind | "access.changed">;
export const EVERY_KIND_LISTED: [Unlisted] extends [never] ? true : Unlisted = true;

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
