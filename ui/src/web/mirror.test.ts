// The web mirror against the conformance fixture recorded from a real server run
// (crates/waymark-companion/tests/conformance.rs): the same rows and query answers as the Rust
// mirror, then the outbox, snapshots and the views the screens render.
import { MIGRATIONS_TABLE, migrate, openMemoryDb, parseMigrations, type Db, type Migration } from "./db";
import { MirrorError, WebMirror } from "./mirror";
import { inboxItemView, outboxView, threadDetailView, threadRowView } from "./views";
import { ms, type CommandResult, type Event, type SignedEnvelope, type TaskDetail } from "./wire";
import recorded from "./fixtures/mirror-events.json";
import committedRows from "./fixtures/mirror-rows.json";
import committedQueries from "./fixtures/mirror-queries.json";

/** An envelope as the outbox keeps it (the mirror never looks inside). */
const envelope: SignedEnvelope = {
  command: { command_id: "c", operation: "pause", issued_by: "user:alice", device_id: "dev_1", issued_at: "2026-12-01T00:00:00Z", expires_at: "2026-12-02T00:00:00Z" },
  signature: { alg: "ed25519", key_id: "dev_1", sig: "x" },
};

const fixture = recorded as unknown as { snapshot: { cursor: number; threads: TaskDetail[] }; events: Event[] };

/** migrations/companion read from disk: the dev server's file allow-list (ui/ only) keeps the
 * `import.meta.glob` of ./migrations.ts from reaching them in tests. */
async function readMigrations(): Promise<Migration[]> {
  type Fs = { readdirSync(p: string): string[]; readFileSync(p: string, enc: "utf8"): string };
  const fs = (await import(/* @vite-ignore */ ["node", "fs"].join(":"))) as Fs;
  const cwd = (globalThis as unknown as { process: { cwd(): string } }).process.cwd();
  const dir = `${cwd}/../migrations/companion/`;
  const names = fs.readdirSync(dir).filter((f) => f.endsWith(".sql"));
  return parseMigrations(Object.fromEntries(names.map((f) => [f, fs.readFileSync(dir + f, "utf8")])));
}

/** Every mirror table with its primary key, as the Rust dump lists them. */
const TABLES: [string, string][] = [
  ["meta", "key"],
  ["tasks", "id"],
  ["attempts", "id"],
  ["checkpoints", "task_id, sequence"],
  ["effects", "id"],
  ["decisions", "id"],
  ["artifacts", "id"],
  ["receipts", "id"],
  ["messages", "session_id, seq"],
  ["deliveries", "decision_id, device_id, step"],
  ["outbox", "seq"],
  ["blobs", "sha256"],
  ["notified", "key"],
];
const JSON_COLUMNS = ["data", "envelope", "result"];

/** Every table's rows, all columns, sorted by primary key, JSON text parsed (as the Rust test). */
async function dump(db: Db): Promise<Record<string, Record<string, unknown>[]>> {
  const names = await db.select<{ name: string }>(
    `SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'
       AND name NOT IN ('_sqlx_migrations', '${MIGRATIONS_TABLE}') ORDER BY name`,
  );
  expect(names.map((n) => n.name)).toEqual(TABLES.map(([t]) => t).sort());
  const out: Record<string, Record<string, unknown>[]> = {};
  for (const [table, pk] of TABLES) {
    const rows = await db.select(`SELECT * FROM ${table} ORDER BY ${pk}`);
    // Integers stay integers (a REAL would serialize alike in JSON, so it is checked here).
    const cols = await db.select<{ name: string }>(`SELECT name FROM pragma_table_info('${table}')`);
    const types = await db.select(`SELECT ${cols.map((c) => `typeof("${c.name}") AS "${c.name}"`).join(", ")} FROM ${table}`);
    expect(types.flatMap((t) => Object.values(t))).not.toContain("real");
    out[table] = rows.map((r) =>
      Object.fromEntries(
        Object.entries(r).map(([k, v]) => [
          k,
          typeof v === "string" && JSON_COLUMNS.includes(k) ? JSON.parse(v) : v instanceof Uint8Array ? [...v] : v,
        ]),
      ),
    );
  }
  return out;
}

let migrations: Migration[];
beforeAll(async () => {
  migrations = await readMigrations();
});

async function fresh(): Promise<WebMirror> {
  return new WebMirror(await openMemoryDb(migrations));
}

async function replayed(): Promise<WebMirror> {
  const m = await fresh();
  await m.applySnapshot(fixture.snapshot.cursor, fixture.snapshot.threads);
  await m.applyEvents(fixture.events);
  return m;
}

const task = fixture.snapshot.threads.find((t) => t.task.title === "Fix checkout total")!.task.id;
const acks = fixture.events.filter((e) => e.kind === "command.acknowledged");

describe("conformance with the Rust mirror", () => {
  test("the recorded snapshot and events give the rows the Rust mirror gives", async () => {
    const m = await replayed();
    expect(await dump(m.db)).toEqual(committedRows);
    expect(m.persistent).toBe(false);
  });

  test("threads, inbox and every thread answer as the Rust mirror's queries do", async () => {
    const m = await replayed();
    const threads = await m.threads();
    const details: Record<string, unknown> = {};
    for (const t of threads) details[t.task.id] = await m.thread(t.task.id);
    expect({ threads, inbox: await m.inbox(), thread: details }).toEqual(committedQueries);
  });

  test("event by event, or the whole stream again, gives the same rows; an old batch moves nothing", async () => {
    const m = await fresh();
    await m.applySnapshot(fixture.snapshot.cursor, fixture.snapshot.threads);
    for (const ev of fixture.events) await m.applyEvents([ev]);
    expect(await dump(m.db)).toEqual(committedRows);
    // An older batch leaves the cursor (as in Rust, `last_event_at` is that batch's time).
    const old = fixture.events.slice(0, 3);
    await m.applyEvents(old);
    expect(await m.cursor()).toBe(fixture.events.at(-1)!.cursor);
    expect(await m.lastEventAt()).toBe(ms(old[2].at));
    await m.applyEvents(fixture.events);
    expect(await dump(m.db)).toEqual(committedRows);
  });
});

describe("applying", () => {
  test("an event the mirror does not know fails the whole batch and writes nothing", async () => {
    const m = await fresh();
    await m.applySnapshot(fixture.snapshot.cursor, fixture.snapshot.threads);
    const before = await dump(m.db);
    const bad = { ...fixture.events[0], cursor: 999, kind: "task.exploded" } as unknown as Event;
    await expect(m.applyEvents([fixture.events[0], bad])).rejects.toThrow(MirrorError);
    const broken = { ...fixture.events[0], cursor: 998, data: { id: "art_x" } };
    await expect(m.applyEvents([broken])).rejects.toThrow("event 998 (artifact.added): missing field `task_id`");
    expect(await dump(m.db)).toEqual(before);
  });

  test("a snapshot replaces the threads and keeps pins and the outbox", async () => {
    const m = await replayed();
    expect(await m.pin(task, true)).toBe(true);
    expect(await m.pin("task_missing", true)).toBe(false);
    await m.enqueue(task, "pause", 1, "cmd-1", envelope);
    const only = fixture.snapshot.threads.filter((t) => t.task.id === task);
    await m.applySnapshot(40, only);
    const threads = await m.threads();
    expect(threads.map((t) => [t.task.id, t.pinned])).toEqual([[task, true]]);
    expect(await m.cursor()).toBe(40);
    expect((await m.outbox()).map((e) => e.command_id)).toEqual(["cmd-1"]);
  });
});

describe("the outbox", () => {
  const result = (status: CommandResult["status"], extra: Partial<CommandResult> = {}): CommandResult => ({
    status,
    command_id: "c",
    detail: `the server said ${status}`,
    ...extra,
  });

  test("queued → delivered → acknowledged by the worker's event", async () => {
    const m = await fresh();
    await m.applySnapshot(fixture.snapshot.cursor, fixture.snapshot.threads);
    const [first, second] = acks.map((e) => (e.data as { command_id: string }).command_id);
    await m.enqueue(task, "pause", 1, first, envelope);
    await m.enqueue(task, "resume", 1, second, envelope);
    expect((await m.queued()).map(([id]) => id)).toEqual([first, second]);
    await m.recordResult(first, "delivered", result("applied", { plan_revision: 1 }));
    expect((await m.queued()).map(([id]) => id)).toEqual([second]);

    await m.applyEvents(fixture.events);
    const [resume, pause] = await m.outbox(task);
    expect(pause.status).toBe("acknowledged");
    expect(pause.acknowledged_at).toBe(ms(acks[0].at));
    expect(resume.status).toBe("acknowledged");
    const view = outboxView(pause);
    expect(view).toMatchObject({ operation: "pause", status: "acknowledged", detail: "the server said applied", met_revision: 1 });
    expect(view.delivered_at).toBeGreaterThan(0);
    expect((await m.thread(task))!.outbox.map((e) => e.command_id)).toEqual([second, first]);
  });

  test("a conflict says what changed; a rejection gives the server's words; answers land once", async () => {
    const m = await fresh();
    await m.enqueue(task, "approve", 1, "a", envelope);
    await m.enqueue(task, "replan", 1, "b", envelope);
    await m.recordResult("a", "conflict", result("conflict", { plan_revision: 2, task_state: "paused" }));
    await m.recordResult("b", "rejected", result("rejected"));
    await m.recordResult("b", "delivered", result("applied"));
    const [b, a] = await m.outbox();
    expect(a.what_changed).toBe(
      "you decided at plan revision 1; the plan is now at revision 2 (paused) — review the thread and decide again",
    );
    expect(b.status).toBe("rejected");
    expect(b.what_changed).toBe("the server said rejected");
    await m.acknowledge({ command_id: "a", task_id: task, attempt_id: "att", at: "2026-12-01T18:00:00Z" });
    expect((await m.outbox())[1].status).toBe("conflict");
  });
});

describe("what the screens render", () => {
  const now = Date.parse("2026-12-03T00:00:00Z");

  test("the pending approval is in the inbox with its diff and test receipt", async () => {
    const m = await replayed();
    const items = await m.inbox();
    const inbox = items.map((i) => inboxItemView(i, "alice"));
    expect(inbox).toHaveLength(1);
    expect(inbox[0].on_behalf_of).toBeNull();
    // The same decision seen by bob, whom alice delegated to, says whose it is.
    expect(inboxItemView(items[0], "bob").on_behalf_of).toBe("alice");
    const [item] = inbox;
    expect(item.decision).toMatchObject({
      kind: "approval",
      status: "pending",
      question: "Deploy def456 to staging-green?",
      risky: true,
      intent: { target: "staging-green", commit: "def456" },
      outcome: null,
      delivery: null,
    });
    expect(item.stale).toBe(false);
    expect(item.task_title).toBe("Fix checkout total");
    expect(item.diffs.map((d) => [d.name, d.is_diff])).toEqual([["fix.diff", true]]);
    expect(item.receipts[0]).toMatchObject({ command: "pytest -q", passed: true, totals: { tests: 3, passed: 2, skipped: 1 } });
    expect(typeof item.decision.expires_at).toBe("number");
  });

  test("threads: what needs attention first, stages from checkpoints", async () => {
    const m = await replayed();
    const rows = (await m.threads()).map((r) => threadRowView(r, now));
    expect(rows.map((r) => [r.task.title, r.task.state, r.pending_decisions])).toEqual([
      ["Fix checkout total", "waiting_approval", 1],
      ["Update the README", "queued", 0],
      ["Bump the lockfile", "completed", 0],
    ]);
    expect(rows[0].stages).toEqual([
      { step: "fix", title: "Fix the off-by-one", status: "done", verified: true },
      { step: "test", title: "Run the tests", status: "done", verified: true },
      { step: "deploy", title: "Deploy to staging", status: "in_flight", verified: false },
    ]);
    expect(rows[0].last_checkpoint).toMatchObject({ sequence: 3, pending_step: { step: "deploy", approval_id: null } });
    expect(rows[0].task.budget).toMatchObject({ max_tokens: 200000, max_cost_usd: 5, used_tokens: 48210, used_cost_usd: 0.62 });
    expect(rows[1].last_checkpoint).toBeNull();
    expect(rows[0].on_behalf_of).toBeNull();
    // Seen by bob, whom alice delegated to, her threads say whose they are.
    const bobs = (await m.threads()).map((r) => threadRowView(r, now, "bob"));
    expect(bobs.map((r) => r.on_behalf_of)).toEqual(["alice", "alice", "alice"]);
    const done = rows[2].task;
    expect(done.terminal).toBe(true);
    expect(done.budget.elapsed_seconds).toBe(Math.trunc((done.updated_at - done.created_at) / 1000));
    expect(rows[0].task.budget.elapsed_seconds).toBe(Math.trunc((now - rows[0].task.created_at) / 1000));
  });

  test("a thread in full: decisions newest first, the effect with its receipt, messages in order", async () => {
    const m = await replayed();
    const d = threadDetailView((await m.thread(task))!, now);
    expect(d.decisions.map((x) => [x.kind, x.status, x.outcome?.option ?? null])).toEqual([
      ["approval", "pending", null],
      ["question", "resolved", "green"],
    ]);
    expect(d.effects).toMatchObject([{ kind: "http.post", status: "confirmed", receipt: { run: 9131, status: "passed" }, resource_id: "ci-9131" }]);
    expect(d.messages.map((x) => x.seq)).toEqual([1, 2, 3]);
    expect(d.checkpoints.map((c) => c.sequence)).toEqual([1, 2, 3]);
    expect(d.checkpoints[1].commit).toBe("def456");
    expect(d.attempts).toMatchObject([{ worker: "agent", state: "active", ended_at: null }]);
    expect(d.artifacts.map((a) => a.is_diff)).toEqual([true, false]);
    expect(await m.thread("task_missing")).toBeNull();
  });
});

describe("the database", () => {
  test("migrations run once and a database from a newer build is refused", async () => {
    const db = await openMemoryDb(migrations);
    await migrate(db, migrations);
    const applied = await db.select<{ version: number }>(`SELECT version FROM ${MIGRATIONS_TABLE}`);
    expect(applied.map((r) => r.version)).toEqual(migrations.map((x) => x.version));
    await db.exec(`INSERT INTO ${MIGRATIONS_TABLE} (version, description, applied_at) VALUES (99999999999999, 'future', 0)`);
    await expect(migrate(db, migrations)).rejects.toThrow("newer waymark (migration 99999999999999)");
  });

  test("a transaction that throws leaves nothing; calls made meanwhile wait their turn", async () => {
    const db = await openMemoryDb(migrations);
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const failing = db.transaction(async (tx) => {
      await tx.exec("INSERT INTO meta (key, value) VALUES ('a', '1')");
      await gate;
      throw new Error("boom");
    });
    const read = db.select<{ n: number }>("SELECT COUNT(*) AS n FROM meta WHERE key = 'a'");
    release();
    await expect(failing).rejects.toThrow("boom");
    expect(await read).toEqual([{ n: 0 }]);
  });

  test("the cursor, identity and notifications live in meta and notified", async () => {
    const m = await fresh();
    expect(await m.cursor()).toBeNull();
    await m.setCursor(12);
    expect(await m.cursor()).toBe(12);
    await m.setIdentity({ server: "https://w.example", device_id: "dev_1", user: "alice", scopes: ["view"], pin: null });
    expect((await m.identity())?.device_id).toBe("dev_1");
    expect(await m.firstNotification("k")).toBe(true);
    expect(await m.firstNotification("k")).toBe(false);
    await m.reset();
    expect([await m.cursor(), await m.identity()]).toEqual([null, null]);
    expect(await m.firstNotification("k")).toBe(true);
  });

  test("blobs are cached and the least recently used go beyond the cap", async () => {
    const m = await replayed();
    expect((await m.blobsToPrefetch()).map(([, size]) => size).sort()).toHaveLength(2);
    await m.putBlob("a", new Uint8Array([1, 2, 3]), 5);
    await m.putBlob("b", new Uint8Array([4, 5, 6]), 5);
    expect(await m.blob("a")).toBeNull();
    expect([...(await m.blob("b"))!]).toEqual([4, 5, 6]);
  });
});
