// The web companion's database: SQLite (sqlite-wasm) behind one small async interface, kept in
// the browser's origin-private file system when it can be, in memory (and said so) when not.
import { initSqlite, run, type Bind, type DbRequest, type DbRow } from "./sqlite";

export type { Bind, DbRow, SqlValue } from "./sqlite";

/** Statements inside a transaction. */
export interface DbTx {
  /** Runs a statement (or, without `bind`, a script of several). */
  exec(sql: string, bind?: Bind): Promise<void>;
  /** Runs a query; one object per row, keyed by column name. */
  select<T = DbRow>(sql: string, bind?: Bind): Promise<T[]>;
}

/** The mirror's database. Calls run one at a time, in the order they were made. */
export interface Db extends DbTx {
  /** Runs `fn` in a write transaction (`BEGIN IMMEDIATE`): committed when it resolves, rolled
   * back when it throws. Use the `tx` it is given inside, never the `Db` (that waits for the
   * transaction to end, forever). */
  transaction<R>(fn: (tx: DbTx) => Promise<R>): Promise<R>;
  /** Whether the data outlives the page (OPFS). `false`: this browser keeps no offline copy. */
  readonly persistent: boolean;
  /** Why the data is not kept, when it is not. */
  readonly fallbackReason: string | null;
  /** Closes the database (and its worker). */
  close(): Promise<void>;
}

/** Where a request goes: SQLite on this thread, or in the worker. */
interface Channel {
  send(req: DbRequest): Promise<DbRow[]>;
  close(): Promise<void>;
}

class SerialDb implements Db {
  private tail: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly channel: Channel,
    readonly persistent: boolean,
    readonly fallbackReason: string | null,
  ) {}

  private locked<R>(f: () => Promise<R>): Promise<R> {
    const next = this.tail.then(f, f);
    this.tail = next.catch(() => undefined);
    return next;
  }

  exec(sql: string, bind?: Bind): Promise<void> {
    return this.locked(() => this.channel.send({ op: "exec", sql, bind })).then(() => undefined);
  }

  select<T = DbRow>(sql: string, bind?: Bind): Promise<T[]> {
    return this.locked(() => this.channel.send({ op: "select", sql, bind })) as Promise<T[]>;
  }

  transaction<R>(fn: (tx: DbTx) => Promise<R>): Promise<R> {
    return this.locked(async () => {
      let open = true;
      const send = (req: DbRequest) => {
        if (!open) return Promise.reject(new Error("the transaction has ended"));
        return this.channel.send(req);
      };
      const tx: DbTx = {
        exec: (sql, bind) => send({ op: "exec", sql, bind }).then(() => undefined),
        select: <T = DbRow>(sql: string, bind?: Bind) => send({ op: "select", sql, bind }) as Promise<T[]>,
      };
      await this.channel.send({ op: "exec", sql: "BEGIN IMMEDIATE" });
      try {
        const r = await fn(tx);
        open = false;
        await this.channel.send({ op: "exec", sql: "COMMIT" });
        return r;
      } catch (e) {
        open = false;
        await this.channel.send({ op: "exec", sql: "ROLLBACK" }).catch(() => undefined);
        throw e;
      }
    });
  }

  close(): Promise<void> {
    return this.locked(() => this.channel.close());
  }
}

/** A migration of `migrations/companion`, the same files the desktop mirror runs. */
export type Migration = { version: number; description: string; sql: string };

/** The migrations from `<version>_<description>.sql` files (path → SQL), oldest first. */
export function parseMigrations(files: Record<string, string>): Migration[] {
  return Object.entries(files)
    .map(([path, sql]) => {
      const name = path.slice(path.lastIndexOf("/") + 1);
      const m = /^(\d+)_(.+)\.sql$/.exec(name);
      if (!m) throw new Error(`migrations/companion/${name}: not named <version>_<description>.sql`);
      return { version: Number(m[1]), description: m[2].replace(/_/g, " "), sql };
    })
    .sort((a, b) => a.version - b.version);
}

/** The table recording which migrations ran (the desktop's is sqlx's `_sqlx_migrations`). */
export const MIGRATIONS_TABLE = "schema_migrations";

/** Creates or brings the schema up to date; refuses a database a newer build wrote. */
export async function migrate(db: Db, migrations: readonly Migration[]): Promise<void> {
  await db.exec(
    `CREATE TABLE IF NOT EXISTS ${MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at INTEGER NOT NULL)`,
  );
  const done = new Set(
    (await db.select<{ version: number }>(`SELECT version FROM ${MIGRATIONS_TABLE}`)).map((r) => r.version),
  );
  const known = new Set(migrations.map((m) => m.version));
  for (const v of done) {
    if (!known.has(v)) {
      throw new Error(`the mirror was written by a newer waymark (migration ${v}); reload the page to update`);
    }
  }
  for (const m of migrations) {
    if (done.has(m.version)) continue;
    await db.transaction(async (tx) => {
      await tx.exec(m.sql);
      await tx.exec(`INSERT INTO ${MIGRATIONS_TABLE} (version, description, applied_at) VALUES (?, ?, ?)`, [
        m.version,
        m.description,
        Date.now(),
      ]);
    });
  }
}

/** An in-memory database on this thread with `migrations` applied: the tests' database (they
 * read the migration files from disk), and the page's when OPFS cannot be used (`persistent`
 * is then `false`, with `reason`). */
export async function openMemoryDb(
  migrations: readonly Migration[],
  options: { wasmUrl?: string; reason?: string } = {},
): Promise<Db> {
  const sqlite3 = await initSqlite(options.wasmUrl);
  const raw = new sqlite3.oo1.DB(":memory:", "c");
  raw.exec("PRAGMA foreign_keys = ON");
  const channel: Channel = {
    send: async (req) => run(raw, req),
    close: async () => raw.close(),
  };
  const db = new SerialDb(channel, false, options.reason ?? "an in-memory database keeps nothing");
  await migrate(db, migrations);
  return db;
}

/** The mirror's file in OPFS. */
export const MIRROR_FILE = "/waymark-mirror.sqlite3";

/** What the worker answers. */
export type WorkerReply =
  | { id: number; ok: true; rows?: DbRow[]; persistent?: boolean; reason?: string | null }
  | { id: number; ok: false; error: string };

/** What the page asks the worker. */
export type WorkerCall =
  | { id: number; kind: "open"; filename: string }
  | { id: number; kind: "request"; req: DbRequest }
  | { id: number; kind: "close" };

type Pending = { resolve: (r: WorkerReply & { ok: true }) => void; reject: (e: Error) => void };

/** Requests to the database worker, answered in order. */
class WorkerChannel implements Channel {
  private nextId = 1;
  private pending = new Map<number, Pending>();

  constructor(private readonly worker: Worker) {
    worker.onmessage = (e: MessageEvent<WorkerReply>) => {
      const p = this.pending.get(e.data.id);
      if (!p) return;
      this.pending.delete(e.data.id);
      if (e.data.ok) p.resolve(e.data);
      else p.reject(new Error(e.data.error));
    };
    worker.onerror = (e: ErrorEvent) => this.fail(new Error(`the database worker failed: ${e.message || "it did not start"}`));
  }

  private fail(error: Error) {
    for (const p of this.pending.values()) p.reject(error);
    this.pending.clear();
  }

  call(msg: { kind: "open"; filename: string } | { kind: "request"; req: DbRequest } | { kind: "close" }) {
    const id = this.nextId++;
    return new Promise<WorkerReply & { ok: true }>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ ...msg, id } as WorkerCall);
    });
  }

  async send(req: DbRequest): Promise<DbRow[]> {
    return (await this.call({ kind: "request", req })).rows ?? [];
  }

  async close(): Promise<void> {
    await this.call({ kind: "close" }).catch(() => undefined);
    this.worker.terminate();
  }
}

/** The page's database: SQLite in a worker on the `opfs-sahpool` VFS, kept across visits and
 * needing no cross-origin isolation headers. Where OPFS (or a module worker) is missing, or
 * another tab holds the file, an in-memory one (`persistent: false`, with the reason). */
export async function openBrowserDb(filename: string = MIRROR_FILE): Promise<Db> {
  // The schema: migrations/companion, bundled by Vite (see ./migrations.ts).
  const { MIGRATIONS } = await import("./migrations");
  const fallback = async (reason: string) => {
    const { default: wasmUrl } = await import("@sqlite.org/sqlite-wasm/sqlite3.wasm?url");
    return openMemoryDb(MIGRATIONS, { wasmUrl, reason });
  };
  if (typeof Worker === "undefined") return fallback("this browser cannot run a database worker");
  let channel: WorkerChannel;
  let opened: WorkerReply & { ok: true };
  try {
    channel = new WorkerChannel(new Worker(new URL("./db.worker.ts", import.meta.url), { type: "module" }));
    opened = await channel.call({ kind: "open", filename });
  } catch (e) {
    return fallback(e instanceof Error ? e.message : String(e));
  }
  const db = new SerialDb(channel, opened.persistent === true, opened.reason ?? null);
  await migrate(db, MIGRATIONS);
  return db;
}
