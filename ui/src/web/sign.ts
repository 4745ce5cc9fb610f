// Steer commands made and signed in the browser exactly as the Rust companion makes them (same
// serde shape, RFC 8785 bytes and Ed25519 signature), so the server's one verifier takes both.
import canonicalize from "canonicalize";
import type { DecisionKind, NewRuleView, Operation } from "../bindings";
import { base64url, type DeviceKey } from "./keys";
import { optionGrants } from "../options";
import type { FormAnswer, QuestionForm, Signature as WireSignature, SteerCommand as WireSteerCommand } from "./proto";

export type { FormAnswer, FormQuestion, QuestionForm } from "./proto";

/** A steer command as `waymark_proto::steer::SteerCommand` serialises (generated: absent fields
 * are omitted, never `null`, and the server verifies over the JSON it receives), with its `args`
 * as the web builds them — any object, which `canonicalBytes` refuses to sign unless it is plain
 * JSON — rather than the generated `Value`. */
export type SteerCommand = Omit<WireSteerCommand, "args"> & { args?: Record<string, unknown> };

/** `waymark_proto::steer::Signature` (generated), with the one algorithm the server takes. */
export type Signature = WireSignature & { alg: "ed25519" };

/** What a device sends: `waymark_proto::steer::SignedEnvelope`, whose `command` Rust keeps as
 * the JSON it received (to verify over it) and the web knows to be a `SteerCommand`. */
export interface SignedEnvelope {
  command: SteerCommand;
  signature: Signature;
}

/** What the person was shown when they decided (`waymark_companion::steer::Seen`). */
export interface Seen {
  plan_revision: number;
  intent_digest: string | null;
}

/** How long a signed steer command stays valid (the Rust companion's `COMMAND_LIFETIME`). */
export const COMMAND_LIFETIME_MS = 24 * 3600 * 1000;
/** How long an `open_session` request stays valid (as the Rust companion signs it). */
export const OPEN_SESSION_LIFETIME_MS = 2 * 60 * 1000;

/** The value cannot be written as canonical JSON (not plain JSON data). */
export class NotCanonicalError extends Error {
  constructor(detail: string) {
    super(`the command is not plain JSON: ${detail}`);
    this.name = "NotCanonicalError";
  }
}

/** The value holds an integer beyond ±(2^53 − 1) (`SigningError::InexactNumber`). RFC 8785
 * reads every number as a double, so the signature would not say which integer was signed. */
export class InexactNumberError extends Error {
  constructor(
    readonly pointer: string,
    readonly value: string,
  ) {
    super(
      `the integer ${value} at \`${pointer}\` is beyond ±(2^53 − 1), which canonical JSON cannot carry exactly — send it as a string`,
    );
    this.name = "InexactNumberError";
  }
}

/** The server's threshold (`waymark_proto::MAX_SAFE_INTEGER`). */
const MAX_SAFE = Number.MAX_SAFE_INTEGER;

/** Whether the server would refuse `v` as `InexactNumber`: beyond ±(2^53 − 1), and written
 * (as JSON.stringify writes it) as digits serde_json reads as a 64-bit integer (i64 or u64).
 * Longer digits, and exponent forms like `1e21`, it reads as doubles, whose canonical form is
 * themselves, and accepts. (In JS it is already a double: JSON.parse rounded 2^53 + 1.) */
function inexact(v: number): boolean {
  if (!Number.isInteger(v) || Math.abs(v) <= MAX_SAFE) return false;
  const text = String(v);
  if (text.includes("e")) return false;
  const n = BigInt(text);
  return n >= -(2n ** 63n) && n < 2n ** 64n;
}

function check(v: unknown, pointer: string): void {
  switch (typeof v) {
    case "string":
    case "boolean":
      return;
    case "number":
      if (!Number.isFinite(v)) throw new NotCanonicalError(`${v} at \`${pointer}\``);
      if (inexact(v)) throw new InexactNumberError(pointer, String(v));
      return;
    case "bigint":
      if (v > BigInt(MAX_SAFE) || v < -BigInt(MAX_SAFE)) throw new InexactNumberError(pointer, String(v));
      throw new NotCanonicalError(`a bigint at \`${pointer}\`: pass a number`);
    case "object": {
      if (v === null) return;
      const at = (k: string | number) => `${pointer}/${String(k).replace(/~/g, "~0").replace(/\//g, "~1")}`;
      if (Array.isArray(v)) {
        v.forEach((item, i) => {
          if (item === undefined) throw new NotCanonicalError(`undefined at \`${at(i)}\``);
          check(item, at(i));
        });
        return;
      }
      const proto = Object.getPrototypeOf(v);
      if (proto !== Object.prototype && proto !== null) {
        throw new NotCanonicalError(`a ${proto?.constructor?.name ?? "non-plain object"} at \`${pointer}\``);
      }
      // Members that are undefined are left out, as JSON.stringify leaves them out of what is sent.
      for (const [k, item] of Object.entries(v)) if (item !== undefined) check(item, at(k));
      return;
    }
    default:
      throw new NotCanonicalError(`${typeof v} at \`${pointer}\``);
  }
}

/** The RFC 8785 canonical bytes (UTF-8) of plain JSON data: what is signed. Refuses what the
 * server would refuse or could not read back: non-finite numbers, integers beyond ±(2^53 − 1)
 * (`InexactNumberError`, exactly where the server's `check_exact` refuses), anything that is
 * not plain JSON. */
export function canonicalBytes(value: unknown): Uint8Array {
  check(value, "");
  let text: string | undefined;
  try {
    text = canonicalize(value);
  } catch (e) {
    // A lone surrogate: not text a server can hold.
    throw new NotCanonicalError(e instanceof Error ? e.message : String(e));
  }
  if (text === undefined) throw new NotCanonicalError("nothing to write");
  return new TextEncoder().encode(text);
}

/** A fresh UUIDv7 (RFC 9562 §5.7) in its hyphenated form, as `waymark_proto::ids::command`
 * makes command ids: 48 bits of unix milliseconds, version 7, 74 random bits, variant 10. */
export function commandId(now: Date = new Date()): string {
  const b = crypto.getRandomValues(new Uint8Array(16));
  let ms = now.getTime();
  for (let i = 5; i >= 0; i--) {
    b[i] = ms % 256;
    ms = Math.floor(ms / 256);
  }
  b[6] = 0x70 | (b[6] & 0x0f);
  b[8] = 0x80 | (b[8] & 0x3f);
  const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** RFC 3339 UTC as chrono serialises a `DateTime<Utc>` (`SecondsFormat::AutoSi`, `Z`): the
 * fraction only when there is one, in milliseconds here. */
export function rfc3339(t: Date): string {
  return t.toISOString().replace(/\.000Z$/, "Z");
}

/** A steer command made now, with exactly the plan revision the person was shown. Absent
 * fields are omitted as the Rust side omits them; `open_session` lives 2 minutes, the rest 24 h. */
export function newCommand(o: {
  taskId: string | null;
  operation: Operation;
  args?: Record<string, unknown> | null;
  scope?: string[];
  expectedPlanRevision: number | null;
  user: string;
  deviceId: string;
  now?: Date;
}): SteerCommand {
  const rev = o.expectedPlanRevision;
  if (rev !== null && !(Number.isSafeInteger(rev) && rev >= 1)) {
    throw new Error(`plan revision ${rev} was never shown: revisions start at 1`);
  }
  const now = o.now ?? new Date();
  const lifetime = o.operation === "open_session" ? OPEN_SESSION_LIFETIME_MS : COMMAND_LIFETIME_MS;
  const cmd: SteerCommand = {
    command_id: commandId(now),
    operation: o.operation,
    issued_by: `user:${o.user}`,
    device_id: o.deviceId,
    issued_at: rfc3339(now),
    expires_at: rfc3339(new Date(now.getTime() + lifetime)),
  };
  if (o.taskId !== null) cmd.task_id = o.taskId;
  if (rev !== null) cmd.expected_plan_revision = rev;
  if (o.scope && o.scope.length > 0) cmd.scope = [...o.scope];
  if (o.args != null) cmd.args = o.args;
  return cmd;
}

/** Signs a command: Ed25519 over its canonical bytes, the key id being its device. */
export async function signCommand(key: DeviceKey, cmd: SteerCommand): Promise<SignedEnvelope> {
  const bytes = canonicalBytes(cmd);
  const sig = await key.sign(bytes);
  return { command: cmd, signature: { alg: "ed25519", key_id: cmd.device_id, sig: base64url(sig) } };
}

/** What an answer needs of its decision (a `DecisionView` will do). */
export interface DecisionRef {
  id: string;
  kind: DecisionKind;
  options: { id: string }[];
  /** Whether its runtime can wait for the answer across its exit: the wire decision's… */
  runtime_deadline?: { can_wait?: boolean } | null;
  /** …or a `DecisionView`'s. */
  can_wait?: boolean;
  /** A question in parts keeps its form in the intent, bound by `intent_digest`. */
  intent?: unknown;
  intent_digest?: string | null;
}

/** The form of a question in parts (`Decision::form`, kept in its intent), or null. */
export function formOf(decision: { kind: DecisionKind; intent?: unknown }): QuestionForm | null {
  if (decision.kind !== "question") return null;
  const form = (decision.intent as { form?: QuestionForm } | null | undefined)?.form;
  return form && Array.isArray(form.questions) ? form : null;
}

/** Why `answers` do not answer `form`, as `QuestionForm::check_answers` says it; null when they do. */
export function formProblem(form: QuestionForm, answers: Record<string, FormAnswer>): string | null {
  for (const id of Object.keys(answers)) {
    if (!form.questions.some((q) => q.id === id)) return `\`${id}\` is not a question of this form`;
  }
  for (const q of form.questions) {
    const a = answers[q.id];
    if (!a) return `question \`${q.id}\` is not answered`;
    const chosen = a.chosen ?? [];
    for (const c of chosen) {
      if (!q.choices.some((x) => x.label === c)) return `\`${c}\` is not a choice of question \`${q.id}\``;
    }
    if (new Set(chosen).size !== chosen.length) return `a choice is chosen twice in question \`${q.id}\``;
    if (chosen.length > 1 && !q.multi_select) return `question \`${q.id}\` takes one choice, not ${chosen.length}`;
    if (a.text !== undefined) {
      if (!q.free_text) return `question \`${q.id}\` takes only its choices, not words of your own`;
      if (!a.text.trim()) return `the words for question \`${q.id}\` are empty`;
    }
    if (chosen.length === 0 && a.text === undefined) return `question \`${q.id}\` is not answered: choose ${q.multi_select ? "at least one" : "one"} or write an answer`;
    if (!q.multi_select && chosen.length > 0 && a.text !== undefined) return `question \`${q.id}\` takes one answer: a choice or your own words, not both`;
  }
  return null;
}

/** The operation and args that answer a decision, as `Companion::answer` builds them:
 * approve/deny bind the intent digest the person was shown; `choose_option` on an approval
 * becomes an approve (or a deny, for `deny`/`deny_…`) carrying the option; other kinds choose
 * an option or answer with text. Sign it with `newCommand` at `seen.plan_revision`, no scope. */
export function answerArgs(
  decision: DecisionRef,
  operation: Operation,
  option: string | null,
  text: string | null,
  seen: Seen,
): { operation: Operation; args: Record<string, unknown> } {
  const args: Record<string, unknown> = { decision_id: decision.id };
  let op = operation;
  if (op === "choose_option" && option !== null && decision.kind === "approval") {
    op = optionGrants(option) === false ? "deny" : "approve";
  }
  const checkOption = (o: string) => {
    if (decision.options.some((x) => x.id === o)) return;
    const ids = decision.options.map((x) => x.id).join(", ");
    throw new Error(`\`${o}\` is not an option of \`${decision.id}\`: choose one of ${ids}`);
  };
  switch (op) {
    case "approve":
    case "deny":
      if (decision.kind !== "approval") {
        throw new Error(`\`${decision.id}\` is a ${decision.kind} decision: choose an option or answer it`);
      }
      if (seen.intent_digest === null) {
        throw new Error(`\`${decision.id}\` is an approval: say which intent digest you were shown`);
      }
      args.intent_digest = seen.intent_digest;
      if (option !== null) {
        checkOption(option);
        args.option = option;
      }
      break;
    // Asking the runtime to wait for the answer: bound to the intent shown, and only where the
    // runtime can (`runtime_deadline.can_wait`).
    case "defer":
      if (decision.runtime_deadline?.can_wait !== true && decision.can_wait !== true) {
        throw new Error(`\`${decision.id}\`'s runtime cannot wait for the answer across its exit: approve or deny it`);
      }
      if (seen.intent_digest === null) {
        throw new Error(`\`${decision.id}\` is an approval: say which intent digest you were shown`);
      }
      args.intent_digest = seen.intent_digest;
      break;
    case "choose_option":
      if (option === null) throw new Error("name an option");
      checkOption(option);
      args.option = option;
      break;
    default: {
      // A question in parts: `text` carries its answers as JSON, checked here against the
      // form shown and bound to its digest.
      const form = formOf(decision);
      if (op === "answer_question" && form) {
        let answers: Record<string, FormAnswer>;
        try {
          answers = JSON.parse(text ?? "") as Record<string, FormAnswer>;
        } catch {
          throw new Error("the answers to a question in parts are JSON: {QID: {chosen, text}}");
        }
        const problem = formProblem(form, answers);
        if (problem) throw new Error(problem);
        if (!decision.intent_digest) throw new Error(`\`${decision.id}\` has no digest for its questions — sync first`);
        return { operation: op, args: { decision_id: decision.id, intent_digest: decision.intent_digest, answers } };
      }
      args.text = text ?? "";
      if (option !== null) args.option = option;
    }
  }
  if (text !== null) args.text = text;
  return { operation: op, args };
}

/** `sha256:` + hex of a value's RFC 8785 bytes, as `waymark_proto::digest::json_digest`. */
export async function jsonDigest(value: unknown): Promise<string> {
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", canonicalBytes(value) as BufferSource));
  return `sha256:${Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** An approval whose runtime takes an edit: its intent and the pointer of the editable part. */
export interface EditableRef {
  id: string;
  intent: unknown;
  editable: string | null;
}

/** `d`'s intent with the part at its `editable` pointer (RFC 6901) replaced by `part`, as
 * `waymark_companion::edited_intent` makes it; refused where the runtime takes no edit or the
 * part would change its JSON type. */
export function editedIntent(d: EditableRef, part: unknown): Record<string, unknown> {
  if (!d.editable || typeof d.intent !== "object" || d.intent === null) {
    throw new Error(`\`${d.id}\` cannot be edited: its runtime runs the intent only as asked`);
  }
  const edited = structuredClone(d.intent) as Record<string, unknown>;
  const keys = d.editable
    .split("/")
    .slice(1)
    .map((k) => k.replaceAll("~1", "/").replaceAll("~0", "~"));
  let parent: Record<string, unknown> = edited;
  for (const k of keys.slice(0, -1)) {
    const next = parent[k];
    if (typeof next !== "object" || next === null) throw new Error(`\`${d.id}\` has nothing at \`${d.editable}\` to edit`);
    parent = next as Record<string, unknown>;
  }
  const last = keys[keys.length - 1];
  if (!(last in parent)) throw new Error(`\`${d.id}\` has nothing at \`${d.editable}\` to edit`);
  const kind = (v: unknown) => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);
  if (kind(parent[last]) !== kind(part)) {
    throw new Error(`the edit of \`${d.editable}\` must keep its JSON type (it is ${kind(parent[last])})`);
  }
  parent[last] = part;
  return edited;
}

/** The args of an `approve` of an edited intent: the digest the person was shown, the edited
 * intent and its digest (`waymark_companion`'s `approve_edited`). */
export async function approveEditedArgs(d: EditableRef, part: unknown, seen: Seen): Promise<Record<string, unknown>> {
  if (seen.intent_digest === null) throw new Error(`\`${d.id}\` is an approval: say which intent digest you were shown`);
  const edited = editedIntent(d, part);
  return {
    decision_id: d.id,
    intent_digest: seen.intent_digest,
    edited_intent: edited,
    edited_intent_digest: await jsonDigest(edited),
  };
}

/** A rule id chosen on the device (`waymark_proto::ids::rule`): `rul_` and 32 lower-case hex
 * digits, so a resend of the same command names the same rule. */
export function ruleId(): string {
  return `rul_${Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("")}`;
}

/** `waymark_proto::RuleSpec` as serde writes it (absent parts left out, `allow_risky` only
 * when set), expiring `days` after `now` in whole seconds — as the terminal and the app sign
 * it (`NewRuleView::into_new_rule`). Blank parts match anything. */
export function ruleSpec(r: NewRuleView, now: Date = new Date()): Record<string, unknown> {
  const text = (v: string | null) => (v != null && v.trim() ? v.trim() : null);
  const match: Record<string, unknown> = {};
  for (const k of ["runtime", "machine", "directory", "tool"] as const) {
    const v = text(r[k]);
    if (v !== null) match[k] = v;
  }
  if (r.pattern != null && r.pattern.trim()) match.input = { kind: r.pattern_kind, pattern: r.pattern };
  const spec: Record<string, unknown> = { match, answer: r.answer, expires_at: rfc3339(new Date((Math.floor(now.getTime() / 1000) + r.days * 86_400) * 1000)) };
  const note = text(r.note);
  if (note !== null) spec.note = note;
  if (r.allow_risky) spec.allow_risky = true;
  return spec;
}

/** The args of `add_rule` (`Companion::add_rule`): the rule, its id, and — for a rule that
 * allows risky calls, once the person confirmed a second time — its digest repeated in
 * `confirm_risky`. Sign with no task and no plan revision. */
export async function addRuleArgs(r: NewRuleView, id: string = ruleId(), now: Date = new Date()): Promise<Record<string, unknown>> {
  const rule = ruleSpec(r, now);
  const args: Record<string, unknown> = { rule, rule_id: id };
  if (r.allow_risky) {
    if (r.answer !== "allow") throw new Error("only an allow rule may allow risky calls");
    if (!r.confirmed_risky) throw new Error("a rule that allows risky calls must be confirmed a second time");
    args.confirm_risky = await jsonDigest(rule);
  }
  return args;
}
