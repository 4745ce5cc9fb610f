// One statement runner over a sqlite-wasm `oo1` database, shared by the in-memory database on
// the page and the OPFS database in its worker, so both answer a request identically.
import type { Database, Sqlite3Static } from "@sqlite.org/sqlite-wasm";

/** A value SQLite stores and returns. */
export type SqlValue = string | number | null | Uint8Array;

/** Positional (`?`) or named (`:name`) parameters. */
export type Bind = readonly SqlValue[] | Readonly<Record<string, SqlValue>>;

/** One statement (or, for `exec`, a script) sent to a connection. */
export type DbRequest = { op: "exec" | "select"; sql: string; bind?: Bind };

/** A result row: column name to value. */
export type DbRow = Record<string, SqlValue>;

/** Runs one request; `select` returns its rows, `exec` none. Integers come back as numbers. */
export function run(db: Database, req: DbRequest): DbRow[] {
  if (req.op === "exec") {
    if (req.bind === undefined) db.exec(req.sql);
    else db.exec({ sql: req.sql, bind: req.bind as never });
    return [];
  }
  const rows = db.exec({
    sql: req.sql,
    bind: req.bind as never,
    rowMode: "object",
    returnValue: "resultRows",
  }) as Record<string, unknown>[];
  return rows.map((r) => {
    const out: DbRow = {};
    for (const [k, v] of Object.entries(r)) out[k] = typeof v === "bigint" ? Number(v) : (v as SqlValue);
    return out;
  });
}

/** Loads SQLite; `wasmUrl` says where its .wasm file is served (needed in the browser, where
 * Vite's dependency pre-bundling moves the module away from the file next to it). */
export async function initSqlite(wasmUrl?: string): Promise<Sqlite3Static> {
  // Loaded on first use, so the desktop app (which never opens a web mirror) does not carry it.
  const { default: sqlite3InitModule } = await import("@sqlite.org/sqlite-wasm");
  // The published types leave the Emscripten module argument out on purpose; it is there.
  const init = sqlite3InitModule as unknown as (module?: { locateFile?: (file: string) => string }) => Promise<Sqlite3Static>;
  return init(wasmUrl === undefined ? undefined : { locateFile: () => wasmUrl });
}
