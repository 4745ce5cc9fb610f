// The web companion's database worker: OPFS sync access handles (the `opfs-sahpool` VFS) exist
// only in a dedicated worker, so the persistent mirror lives here and the page sends it SQL.
import wasmUrl from "@sqlite.org/sqlite-wasm/sqlite3.wasm?url";
import type { Database } from "@sqlite.org/sqlite-wasm";
import { backOff } from "exponential-backoff";
import { initSqlite, run } from "./sqlite";
import type { WorkerCall, WorkerReply } from "./db";

let db: Database | null = null;

/** Opens `filename` in OPFS; in memory, with the reason, where OPFS cannot be used. */
async function open(filename: string): Promise<{ persistent: boolean; reason: string | null }> {
  const sqlite3 = await initSqlite(wasmUrl);
  try {
    // The page that had the mirror open a moment ago (a reload, the app reopened) may still be
    // letting go of its file handles: wait for them (about 3 s) before giving up on OPFS.
    const pool = await backOff(() => sqlite3.installOpfsSAHPoolVfs({ name: "waymark-sahpool", preserveOnInitFailure: true }), {
      numOfAttempts: 8,
      startingDelay: 100,
      maxDelay: 1000,
    });
    db = new pool.OpfsSAHPoolDb(filename);
    db.exec("PRAGMA foreign_keys = ON; PRAGMA synchronous = FULL");
    return { persistent: true, reason: null };
  } catch (e) {
    const why = e instanceof Error ? e.message : String(e);
    db = new sqlite3.oo1.DB(":memory:", "c");
    db.exec("PRAGMA foreign_keys = ON");
    return {
      persistent: false,
      reason: `the browser's private file system (OPFS) cannot be used here (${why}); another tab may have the mirror open`,
    };
  }
}

self.onmessage = async (e: MessageEvent<WorkerCall>) => {
  const msg = e.data;
  let reply: WorkerReply;
  try {
    if (msg.kind === "open") {
      reply = { id: msg.id, ok: true, ...(await open(msg.filename)) };
    } else if (msg.kind === "close") {
      db?.close();
      db = null;
      reply = { id: msg.id, ok: true };
    } else {
      if (!db) throw new Error("the database is not open");
      reply = { id: msg.id, ok: true, rows: run(db, msg.req) };
    }
  } catch (err) {
    reply = { id: msg.id, ok: false, error: err instanceof Error ? err.message : String(err) };
  }
  self.postMessage(reply);
};
