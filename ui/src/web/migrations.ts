// The desktop mirror's migrations (migrations/companion/*.sql) bundled into the web companion, so
// both mirrors are made by the same files; a new migration file is picked up automatically.
// Outside ui/: `vite build` reads it as is; the dev server serves it only when its
// `server.fs.allow` includes the repository root (e.g. `allow: [".."]`).
import { parseMigrations, type Migration } from "./db";

const files = import.meta.glob<string>("../../../migrations/companion/*.sql", {
  query: "?raw",
  import: "default",
  eager: true,
});

/** Every migration, oldest first. */
export const MIGRATIONS: readonly Migration[] = parseMigrations(files);
