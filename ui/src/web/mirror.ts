// The web companion's mirror: the desktop mirror (crates/waymark-companion/src/mirror.rs) ported
// to SQLite in the browser — same schema, same writes per event, same queries and orderings.
import type { Operation, OutboxStatus, StageStatus, TaskState } from "../bindings";
import type { Db, DbTx } from "./db";
import {
  compareTime,
  EVENT_KINDS,
  ms,
  type Artifact,
  type Attempt,
  type Checkpoint,
  type CommandAck,
  type CommandResult,
  type Decision,
  type DeviceDelivery,
  type Effect,
  type Event,
  type Message,
  type SignedEnvelope,
  type Task,
  type TaskDetail,
  type TestReceipt,
} from "./wire";

/** A plan step as progress shows it: done, in flight, or not started — from checkpoints. */
export type Stage = { step: string; title: string; status: StageStatus; verified: boolean };

/** A thread in the list. */
export type ThreadRow = {
  task: Task;
  pending_decisions: number;
  unknown_effects: number;
  last_checkpoint: Checkpoint | null;
  stages: Stage[];
  pinned: boolean;
};

/** A pending decision with what a person needs to decide it. */
export type InboxItem = {
  decision: Decision;
  task_title: string;
  /** Whose task it is (another user's when they delegated their decisions to this one). */
  task_owner: string;
  plan_revision: number;
  diffs: Artifact[];
  receipts: TestReceipt[];
};

/** Where a command this device signed stands. */
export type OutboxEntry = {
  command_id: string;
  task_id: string;
  operation: Operation;
  based_on_revision: number | null;
  status: OutboxStatus;
  result: CommandResult | null;
  what_changed: string | null;
  created_at: number;
  delivered_at: number | null;
  acknowledged_at: number | null;
};

/** A thread in full. */
export type ThreadDetail = {
  task: Task;
  stages: Stage[];
  attempts: Attempt[];
  checkpoints: Checkpoint[];
  effects: Effect[];
  decisions: Decision[];
  artifacts: Artifact[];
  receipts: TestReceipt[];
  messages: Message[];
  outbox: OutboxEntry[];
};

/** The paired identity, kept in `meta` under `identity` (pairing.rs). */
export type Identity = { server: string; device_id: string; user: string; scopes: string[]; pin?: string | null };

/** The mirror refused or found something it cannot read. */
export class MirrorError extends Error {
  constructor(message: string) {
    super(`the local mirror: ${message}`);
    this.name = "MirrorError";
  }
}

const OUTBOX_STATUSES: readonly OutboxStatus[] = ["queued", "delivered", "acknowledged", "conflict", "rejected", "expired"];

function parse<T>(s: string): T {
  try {
    return JSON.parse(s) as T;
  } catch (e) {
    throw new MirrorError(`corrupt mirror row: ${e instanceof Error ? e.message : String(e)}`);
  }
}

/** Whether an artifact is a diff (inbox cards and the diff viewer). */
export function isDiff(a: Pick<Artifact, "media_type" | "name">): boolean {
  return a.media_type.includes("diff") || a.name.endsWith(".diff") || a.name.endsWith(".patch");
}

/** Rank for "what needs attention first": lower is more urgent. */
function attention(t: Task, pending: number, unknown: number): number {
  const s: TaskState = t.state;
  if (s === "needs_human" || s === "recovery_candidate") return 0;
  if (pending > 0 || unknown > 0) return 1;
  if (s === "waiting_approval" || s === "waiting_human") return 1;
  if (s === "running" || s === "verifying" || s === "paused") return 2;
  if (s === "queued") return 3;
  return 4;
}

/** Plan stages from the checkpoint timeline (mirror.rs `stages`). */
export function stages(task: Task, checkpoints: readonly Checkpoint[]): Stage[] {
  const done = new Map<string, boolean>();
  for (const c of checkpoints) {
    for (const s of c.body.completed_steps ?? []) done.set(s.step, s.verified ?? false);
  }
  const inFlight = checkpoints.at(-1)?.body.pending_step?.step ?? null;
  return task.plan.map((p) => {
    const v = done.get(p.id);
    const [status, verified]: [StageStatus, boolean] =
      v !== undefined ? ["done", v] : inFlight === p.id ? ["in_flight", false] : ["pending", false];
    return { step: p.id, title: p.title, status, verified };
  });
}

/** Rows per statement (at most 6 columns each). */
const CHUNK = 256;

type Column = string | number | null;

/** `INSERT INTO <head> VALUES (…), (…)… <tail>`, `CHUNK` rows at a time. */
async function insertMany<T>(tx: DbTx, head: string, tail: string, rows: readonly T[], bind: (row: T) => Column[]) {
  for (let i = 0; i < rows.length; i += CHUNK) {
    const chunk = rows.slice(i, i + CHUNK).map(bind);
    const values = chunk.map((r) => `(${r.map(() => "?").join(", ")})`).join(", ");
    await tx.exec(`${head}VALUES ${values}${tail}`, chunk.flat());
  }
}

/** The shape checks serde makes on the columns the mirror lifts out of an event's object. */
function need(ev: Event, obj: unknown, fields: Record<string, "string" | "number" | "time">): void {
  const fail = (why: string) => {
    throw new MirrorError(`event ${ev.cursor} (${ev.kind}): ${why}`);
  };
  if (typeof obj !== "object" || obj === null || Array.isArray(obj)) fail("expected an object");
  const o = obj as Record<string, unknown>;
  for (const [k, type] of Object.entries(fields)) {
    const v = o[k];
    if (v === undefined) fail(`missing field \`${k}\``);
    if (type === "time") {
      if (typeof v !== "string") fail(`\`${k}\`: expected a time`);
      try {
        ms(v as string);
      } catch (e) {
        fail(`\`${k}\`: ${(e as Error).message}`);
      }
    } else if (type === "number" ? !Number.isInteger(v) : typeof v !== type) {
      fail(`\`${k}\`: expected ${type === "number" ? "an integer" : "a string"}`);
    }
  }
}

/** One batch's rows, per table, in the order the events came. */
class Rows {
  tasks: Task[] = [];
  attempts: Attempt[] = [];
  checkpoints: Checkpoint[] = [];
  effects: Effect[] = [];
  decisions: Decision[] = [];
  artifacts: Artifact[] = [];
  receipts: TestReceipt[] = [];
  /** With their task's id. */
  messages: [Message, string][] = [];
  acks: CommandAck[] = [];
  deliveries: DeviceDelivery[] = [];

  /** Takes in one event's object. */
  add(ev: Event): void {
    const d = ev.data;
    switch (ev.kind) {
      case "task.created":
      case "task.updated":
        need(ev, d, { id: "string", state: "string", plan_revision: "number", updated_at: "time" });
        this.tasks.push(d as Task);
        break;
      case "attempt.started":
      case "attempt.ended":
      case "attempt.updated":
        need(ev, d, { id: "string", task_id: "string", fence: "number" });
        this.attempts.push(d as Attempt);
        break;
      case "checkpoint.appended":
        need(ev, d, { task_id: "string", sequence: "number" });
        this.checkpoints.push(d as Checkpoint);
        break;
      case "effect.declared":
      case "effect.updated":
        need(ev, d, { id: "string", task_id: "string", status: "string" });
        this.effects.push(d as Effect);
        break;
      case "decision.requested":
      case "decision.closed":
      case "decision.updated":
      case "decision.escalated":
        need(ev, d, { id: "string", task_id: "string", status: "string", kind: "string", expires_at: "time" });
        this.decisions.push(d as Decision);
        this.deliveries.push(...((d as Decision).deliveries ?? []));
        break;
      case "decision.delivered":
        need(ev, d, { decision_id: "string", device_id: "string", step: "string", at: "time" });
        this.deliveries.push(d as DeviceDelivery);
        break;
      case "artifact.added":
        need(ev, d, { id: "string", task_id: "string", sha256: "string", size: "number" });
        this.artifacts.push(d as Artifact);
        break;
      case "test_receipt.added":
        need(ev, d, { id: "string", task_id: "string" });
        this.receipts.push(d as TestReceipt);
        break;
      case "messages.appended": {
        const list = (d as { messages?: unknown } | null)?.messages;
        if (!Array.isArray(list)) throw new MirrorError(`event ${ev.cursor} (${ev.kind}): missing field \`messages\``);
        for (const m of list) {
          need(ev, m, { session_id: "string", seq: "number" });
          this.messages.push([m as Message, ev.task_id]);
        }
        break;
      }
      case "command.applied":
      case "followup.fired":
        break;
      case "command.acknowledged":
        need(ev, d, { command_id: "string", at: "time" });
        this.acks.push(d as CommandAck);
        break;
      default:
        throw new MirrorError(`event ${ev.cursor}: unknown kind \`${String((ev as { kind: unknown }).kind)}\``);
    }
  }

  /** Writes every row: objects that change are upserted (the last version wins), the
   * append-only ones inserted once. */
  async write(tx: DbTx): Promise<void> {
    const text = JSON.stringify;
    await insertMany(
      tx,
      "INSERT INTO tasks (id, data, state, plan_revision, updated_at) ",
      " ON CONFLICT(id) DO UPDATE SET data = excluded.data, state = excluded.state, plan_revision = excluded.plan_revision, updated_at = excluded.updated_at",
      this.tasks,
      (t) => [t.id, text(t), t.state, t.plan_revision, ms(t.updated_at)],
    );
    await insertMany(
      tx,
      "INSERT INTO attempts (id, task_id, fence, data) ",
      " ON CONFLICT(id) DO UPDATE SET data = excluded.data",
      this.attempts,
      (a) => [a.id, a.task_id, a.fence, text(a)],
    );
    await insertMany(
      tx,
      "INSERT INTO checkpoints (task_id, sequence, data) ",
      " ON CONFLICT DO NOTHING",
      this.checkpoints,
      (c) => [c.task_id, c.sequence, text(c)],
    );
    await insertMany(
      tx,
      "INSERT INTO effects (id, task_id, status, data) ",
      " ON CONFLICT(id) DO UPDATE SET status = excluded.status, data = excluded.data",
      this.effects,
      (e) => [e.id, e.task_id, e.status, text(e)],
    );
    await insertMany(
      tx,
      "INSERT INTO decisions (id, task_id, status, kind, expires_at, data) ",
      " ON CONFLICT(id) DO UPDATE SET status = excluded.status, data = excluded.data",
      this.decisions,
      (d) => [d.id, d.task_id, d.status, d.kind, ms(d.expires_at), text(d)],
    );
    await insertMany(
      tx,
      "INSERT INTO artifacts (id, task_id, sha256, size, data) ",
      " ON CONFLICT(id) DO NOTHING",
      this.artifacts,
      (a) => [a.id, a.task_id, a.sha256, a.size, text(a)],
    );
    await insertMany(
      tx,
      "INSERT INTO receipts (id, task_id, data) ",
      " ON CONFLICT(id) DO NOTHING",
      this.receipts,
      (r) => [r.id, r.task_id, text(r)],
    );
    await insertMany(
      tx,
      "INSERT INTO messages (session_id, seq, task_id, data) ",
      " ON CONFLICT DO NOTHING",
      this.messages,
      ([m, taskId]) => [m.session_id, m.seq, taskId, text(m)],
    );
    await insertMany(
      tx,
      "INSERT INTO deliveries (decision_id, device_id, step, data) ",
      " ON CONFLICT DO NOTHING",
      this.deliveries,
      (d) => [d.decision_id, d.device_id, d.step, text(d)],
    );
    for (const ack of this.acks) await acknowledgeIn(tx, ack);
  }
}

async function acknowledgeIn(tx: DbTx, ack: CommandAck): Promise<void> {
  await tx.exec(
    "UPDATE outbox SET status = 'acknowledged', acknowledged_at = ? WHERE command_id = ? AND status IN ('queued', 'delivered')",
    [ms(ack.at), ack.command_id],
  );
}

const SET_META =
  "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value";

/** Tables a snapshot replaces (the outbox, blob cache and notification marks are the device's). */
const MIRRORED = ["tasks", "attempts", "checkpoints", "effects", "decisions", "artifacts", "receipts", "messages", "deliveries"];

/** Decisions as their `data`, with `deliveries` put back from their own table (a newer version
 * of a decision arrives without them) — the Rust mirror's `DECISIONS`. */
const DECISIONS =
  "SELECT CASE WHEN EXISTS (SELECT 1 FROM deliveries x WHERE x.decision_id = decisions.id) " +
  "THEN json_set(data, '$.deliveries', json((SELECT json_group_array(json(x.data)) " +
  "FROM deliveries x WHERE x.decision_id = decisions.id))) ELSE data END AS data FROM decisions";

type OutboxRow = {
  seq: number;
  command_id: string;
  task_id: string;
  operation: string;
  based_on_revision: number | null;
  envelope: string;
  status: string;
  result: string | null;
  created_at: number;
  delivered_at: number | null;
  acknowledged_at: number | null;
};

/** The mirror database (mirror.rs `Mirror`), over a {@link Db} already migrated. */
export class WebMirror {
  constructor(readonly db: Db) {}

  /** Whether the mirror outlives the page; `false`: this browser keeps no offline copy. */
  get persistent(): boolean {
    return this.db.persistent;
  }

  // meta

  /** A meta value. */
  async meta(key: string): Promise<string | null> {
    const rows = await this.db.select<{ value: string }>("SELECT value FROM meta WHERE key = ?", [key]);
    return rows[0]?.value ?? null;
  }

  /** Sets a meta value. */
  async setMeta(key: string, value: string): Promise<void> {
    await this.db.exec(SET_META, [key, value]);
  }

  /** The event cursor the mirror is current to. */
  async cursor(): Promise<number | null> {
    const c = await this.meta("cursor");
    if (c === null || !/^-?\d+$/.test(c.trim())) return null;
    return Number(c);
  }

  /** Sets the cursor outright (a snapshot or `applyEvents` normally moves it). */
  async setCursor(cursor: number): Promise<void> {
    await this.setMeta("cursor", String(cursor));
  }

  /** Server time (unix ms) of the last event applied. */
  async lastEventAt(): Promise<number | null> {
    const v = await this.meta("last_event_at");
    return v === null ? null : Number(v);
  }

  /** The paired identity, if any (a row that does not parse counts as none, as in pairing.rs). */
  async identity(): Promise<Identity | null> {
    const s = await this.meta("identity");
    if (s === null) return null;
    try {
      return JSON.parse(s) as Identity;
    } catch {
      return null;
    }
  }

  /** Records the paired identity. */
  async setIdentity(id: Identity): Promise<void> {
    await this.setMeta("identity", JSON.stringify(id));
  }

  // snapshot and events

  /** Replaces every mirrored thread with a fresh snapshot, at `cursor` (mirror.rs
   * `replace_all`). The outbox, the blob cache and pins are kept. */
  async applySnapshot(cursor: number, threads: readonly TaskDetail[]): Promise<void> {
    const rows = new Rows();
    for (const d of threads) {
      rows.tasks.push(d.task);
      rows.attempts.push(...d.attempts);
      rows.checkpoints.push(...d.checkpoints);
      rows.effects.push(...d.effects);
      rows.decisions.push(...d.decisions);
      for (const x of d.decisions) rows.deliveries.push(...(x.deliveries ?? []));
      rows.artifacts.push(...d.artifacts);
      rows.receipts.push(...d.test_receipts);
      rows.messages.push(...d.messages.map((m): [Message, string] => [m, d.task.id]));
    }
    await this.db.transaction(async (tx) => {
      const pins = await tx.select<{ id: string }>("SELECT id FROM tasks WHERE pinned = 1");
      for (const table of MIRRORED) await tx.exec(`DELETE FROM ${table}`);
      await rows.write(tx);
      for (const { id } of pins) await tx.exec("UPDATE tasks SET pinned = 1 WHERE id = ?", [id]);
      await tx.exec(SET_META, ["cursor", String(cursor)]);
    });
  }

  /** Applies a batch of events in one transaction and advances the cursor to the last (mirror.rs
   * `apply`). Applying an event twice changes nothing; rows are written per table in event
   * order (the newest version of an object wins); the cursor only moves forward. */
  async applyEvents(events: readonly Event[]): Promise<void> {
    const last = events.at(-1);
    if (!last) return;
    const rows = new Rows();
    for (const ev of events) {
      if (!(EVENT_KINDS as readonly string[]).includes(ev.kind)) {
        throw new MirrorError(`event ${ev.cursor}: unknown kind \`${ev.kind}\``);
      }
      rows.add(ev);
    }
    const at = ms(last.at);
    await this.db.transaction(async (tx) => {
      await rows.write(tx);
      await tx.exec(
        `INSERT INTO meta (key, value) VALUES ('cursor', ?1), ('last_event_at', ?2)
         ON CONFLICT(key) DO UPDATE SET value = CASE
           WHEN key = 'cursor' AND CAST(value AS INTEGER) >= CAST(excluded.value AS INTEGER) THEN value
           ELSE excluded.value END`,
        [String(last.cursor), String(at)],
      );
    });
  }

  /** Forgets everything this browser holds — threads, cursor, outbox, cache, identity — as when
   * unpairing; the schema stays, so the next sync starts from a snapshot. */
  async reset(): Promise<void> {
    await this.db.transaction(async (tx) => {
      for (const table of [...MIRRORED, "outbox", "blobs", "notified", "meta"]) await tx.exec(`DELETE FROM ${table}`);
    });
  }

  /** Pins or unpins a thread for offline review; whether the thread is mirrored. */
  async pin(taskId: string, pinned: boolean): Promise<boolean> {
    await this.db.exec("UPDATE tasks SET pinned = ? WHERE id = ?", [pinned ? 1 : 0, taskId]);
    const rows = await this.db.select<{ n: number }>("SELECT COUNT(*) AS n FROM tasks WHERE id = ?", [taskId]);
    return rows[0].n === 1;
  }

  // reads

  /** A mirrored task. */
  async task(id: string): Promise<Task | null> {
    const rows = await this.db.select<{ data: string }>("SELECT data FROM tasks WHERE id = ?", [id]);
    return rows[0] ? parse<Task>(rows[0].data) : null;
  }

  private async list<T>(sql: string, taskId: string): Promise<T[]> {
    const rows = await this.db.select<{ data: string }>(sql, [taskId]);
    return rows.map((r) => parse<T>(r.data));
  }

  /** Threads, what needs attention first (then the most recently changed). */
  async threads(): Promise<ThreadRow[]> {
    const rows = await this.db.select<{ data: string; pinned: number; pending: number; unknown: number }>(
      `SELECT t.data, t.pinned,
         (SELECT COUNT(*) FROM decisions d WHERE d.task_id = t.id AND d.status = 'pending') AS pending,
         (SELECT COUNT(*) FROM effects e WHERE e.task_id = t.id AND e.status = 'unknown') AS unknown
       FROM tasks t`,
    );
    const out: ThreadRow[] = [];
    for (const r of rows) {
      const task = parse<Task>(r.data);
      const cps = await this.list<Checkpoint>("SELECT data FROM checkpoints WHERE task_id = ? ORDER BY sequence", task.id);
      out.push({
        task,
        pending_decisions: r.pending,
        unknown_effects: r.unknown,
        last_checkpoint: cps.at(-1) ?? null,
        stages: stages(task, cps),
        pinned: r.pinned !== 0,
      });
    }
    return out.sort(
      (a, b) =>
        attention(a.task, a.pending_decisions, a.unknown_effects) -
          attention(b.task, b.pending_decisions, b.unknown_effects) ||
        compareTime(b.task.updated_at, a.task.updated_at),
    );
  }

  /** Pending decisions, most urgent (soonest expiry) first, with their evidence. */
  async inbox(): Promise<InboxItem[]> {
    const rows = await this.db.select<{ data: string }>(
      `${DECISIONS} WHERE status = 'pending' ORDER BY expires_at, id`,
    );
    const out: InboxItem[] = [];
    // Each task's evidence is read once, however many of its decisions wait: every query is a
    // round trip to the database's worker.
    const evidence = new Map<string, { task: Task; diffs: Artifact[]; receipts: TestReceipt[] } | null>();
    for (const r of rows) {
      const decision = parse<Decision>(r.data);
      let e = evidence.get(decision.task_id);
      if (e === undefined) {
        const task = await this.task(decision.task_id);
        e = task && {
          task,
          diffs: (await this.list<Artifact>("SELECT data FROM artifacts WHERE task_id = ? ORDER BY rowid", task.id)).filter(isDiff),
          receipts: await this.list<TestReceipt>("SELECT data FROM receipts WHERE task_id = ? ORDER BY rowid", task.id),
        };
        evidence.set(decision.task_id, e);
      }
      if (!e) continue;
      out.push({
        decision,
        task_title: e.task.title,
        task_owner: e.task.owner,
        plan_revision: e.task.plan_revision,
        diffs: e.diffs,
        receipts: e.receipts,
      });
    }
    return out;
  }

  /** A pending or closed decision by id. */
  async decision(id: string): Promise<Decision | null> {
    const rows = await this.db.select<{ data: string }>(`${DECISIONS} WHERE id = ?`, [id]);
    return rows[0] ? parse<Decision>(rows[0].data) : null;
  }

  /** A thread in full, from the mirror alone. */
  async thread(id: string): Promise<ThreadDetail | null> {
    const task = await this.task(id);
    if (!task) return null;
    const checkpoints = await this.list<Checkpoint>("SELECT data FROM checkpoints WHERE task_id = ? ORDER BY sequence", id);
    const effects = await this.list<Effect>("SELECT data FROM effects WHERE task_id = ? ORDER BY rowid", id);
    // `unknown` first, otherwise in the order declared (a stable sort, as Rust's).
    effects.sort((a, b) => Number(a.status !== "unknown") - Number(b.status !== "unknown"));
    return {
      task,
      stages: stages(task, checkpoints),
      attempts: await this.list<Attempt>("SELECT data FROM attempts WHERE task_id = ? ORDER BY fence", id),
      checkpoints,
      effects,
      decisions: await this.list<Decision>(`${DECISIONS} WHERE task_id = ? ORDER BY rowid DESC`, id),
      artifacts: await this.list<Artifact>("SELECT data FROM artifacts WHERE task_id = ? ORDER BY rowid", id),
      receipts: await this.list<TestReceipt>("SELECT data FROM receipts WHERE task_id = ? ORDER BY rowid", id),
      messages: await this.list<Message>("SELECT data FROM messages WHERE task_id = ? ORDER BY seq", id),
      outbox: await this.outbox(id),
    };
  }

  // outbox

  /** Queues a signed command. */
  async enqueue(
    taskId: string,
    op: Operation,
    basedOn: number | null,
    commandId: string,
    envelope: SignedEnvelope,
  ): Promise<void> {
    await this.db.exec(
      `INSERT INTO outbox (command_id, task_id, operation, based_on_revision, envelope, status, created_at)
       VALUES (?, ?, ?, ?, ?, 'queued', ?)`,
      [commandId, taskId, op, basedOn, JSON.stringify(envelope), Date.now()],
    );
  }

  /** Queued commands, in the order they were made. */
  async queued(): Promise<[string, SignedEnvelope][]> {
    const rows = await this.db.select<{ command_id: string; envelope: string }>(
      "SELECT command_id, envelope FROM outbox WHERE status = 'queued' ORDER BY seq",
    );
    return rows.map((r) => [r.command_id, parse<SignedEnvelope>(r.envelope)]);
  }

  /** Records the server's answer to a queued command. */
  async recordResult(commandId: string, status: OutboxStatus, result: CommandResult): Promise<void> {
    await this.db.exec(
      "UPDATE outbox SET status = ?, result = ?, delivered_at = ? WHERE command_id = ? AND status = 'queued'",
      [status, JSON.stringify(result), Date.now(), commandId],
    );
  }

  /** The worker saw a command (what a `command.acknowledged` event does to the outbox). */
  async acknowledge(ack: CommandAck): Promise<void> {
    await this.db.transaction((tx) => acknowledgeIn(tx, ack));
  }

  /** The outbox, newest first; one task's when given. */
  async outbox(taskId: string | null = null): Promise<OutboxEntry[]> {
    const rows = await this.db.select<OutboxRow>(
      "SELECT * FROM outbox WHERE (? IS NULL OR task_id = ?) ORDER BY seq DESC",
      [taskId, taskId],
    );
    return rows.map((r) => {
      const result = r.result === null ? null : parse<CommandResult>(r.result);
      const status = r.status as OutboxStatus;
      if (!OUTBOX_STATUSES.includes(status)) throw new MirrorError(`corrupt mirror row: outbox status \`${r.status}\``);
      let whatChanged: string | null = null;
      if (result && status === "conflict") {
        whatChanged = `you decided at plan revision ${r.based_on_revision ?? "?"}; the plan is now at revision ${
          result.plan_revision ?? "?"
        } (${result.task_state ?? "unknown state"}) — review the thread and decide again`;
      } else if (result && (status === "rejected" || status === "expired")) {
        whatChanged = result.detail;
      }
      return {
        command_id: r.command_id,
        task_id: r.task_id,
        operation: r.operation as Operation,
        based_on_revision: r.based_on_revision,
        status,
        result,
        what_changed: whatChanged,
        created_at: r.created_at,
        delivered_at: r.delivered_at,
        acknowledged_at: r.acknowledged_at,
      };
    });
  }

  // blobs

  /** A cached blob (and marks it used). */
  async blob(sha256: string): Promise<Uint8Array | null> {
    const rows = await this.db.select<{ data: Uint8Array }>("SELECT data FROM blobs WHERE sha256 = ?", [sha256]);
    if (!rows[0]) return null;
    await this.db.exec("UPDATE blobs SET last_access = ? WHERE sha256 = ?", [Date.now(), sha256]);
    return rows[0].data;
  }

  /** Caches a blob, then evicts the least recently used ones beyond `capBytes`. */
  async putBlob(sha256: string, data: Uint8Array, capBytes: number): Promise<void> {
    await this.db.transaction(async (tx) => {
      await tx.exec(
        "INSERT INTO blobs (sha256, size, data, last_access) VALUES (?, ?, ?, ?) ON CONFLICT(sha256) DO UPDATE SET last_access = excluded.last_access",
        [sha256, data.length, data, Date.now()],
      );
      const [{ total }] = await tx.select<{ total: number }>("SELECT COALESCE(SUM(size), 0) AS total FROM blobs");
      if (total <= capBytes) return;
      const rows = await tx.select<{ sha256: string; size: number }>(
        "SELECT sha256, size FROM blobs WHERE sha256 != ? ORDER BY last_access, sha256",
        [sha256],
      );
      let over = total - capBytes;
      for (const r of rows) {
        if (over <= 0) break;
        await tx.exec("DELETE FROM blobs WHERE sha256 = ?", [r.sha256]);
        over -= r.size;
      }
    });
  }

  /** Artifacts of pinned threads and threads with pending decisions that are not cached. */
  async blobsToPrefetch(): Promise<[string, number][]> {
    const rows = await this.db.select<{ sha256: string; size: number }>(
      `SELECT DISTINCT a.sha256, a.size FROM artifacts a JOIN tasks t ON t.id = a.task_id
       WHERE (t.pinned = 1 OR EXISTS (SELECT 1 FROM decisions d WHERE d.task_id = t.id AND d.status = 'pending'))
         AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.sha256 = a.sha256)`,
    );
    return rows.map((r) => [r.sha256, r.size]);
  }

  /** Whether a notification with this key was shown; marks it shown. */
  async firstNotification(key: string): Promise<boolean> {
    return this.db.transaction(async (tx) => {
      const before = await tx.select<{ n: number }>("SELECT COUNT(*) AS n FROM notified WHERE key = ?", [key]);
      if (before[0].n > 0) return false;
      await tx.exec("INSERT INTO notified (key, at) VALUES (?, ?)", [key, Date.now()]);
      return true;
    });
  }
}
