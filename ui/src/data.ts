// The screens' link to their data: in the desktop app, the Tauri shell's generated commands and
// events (bindings.ts); in a browser (the web companion at `<server>/app/`), the same calls
// served by the page itself (web/transport.ts). Screens never know which; and a hook that
// re-reads the mirror whenever it changed.
import { useCallback, useEffect, useState } from "react";
import { commands as shellCommands, events as shellEvents } from "./bindings";
import { webTransport } from "./web/facade";
import type { WebCompanion } from "./web/transport";

/** In the Tauri app (its IPC is injected before the page runs), or in a browser. */
export const inApp = typeof window !== "undefined" && "__TAURI_INTERNALS__" in window;

let opened: Promise<WebCompanion> | null = null;
/** The page's web companion, opened on first use and then following the server. */
export function webCompanion(): Promise<WebCompanion> {
  opened ??= import("./web/transport").then(async ({ WebCompanion }) => {
    const c = await WebCompanion.open();
    void c.start();
    return c;
  });
  return opened;
}

const web = inApp ? null : webTransport(webCompanion);

// `waymark-bench --only phone` measures the web companion in Chromium through this handle
// (the page opened with `?bench`); nothing else reads it.
if (!inApp && typeof window !== "undefined" && new URLSearchParams(window.location.search).has("bench")) {
  (window as unknown as { __waymarkBench: unknown }).__waymarkBench = { webCompanion };
}
export const commands: typeof shellCommands = web ? web.commands : shellCommands;
export const events = (web ? web.events : shellEvents) as typeof shellEvents;

export function errorText(e: unknown): string {
  return (e as { message?: string })?.message ?? String(e);
}

/** Reads `fetch` now and again on every `mirrorChanged` (and `statusChanged` when asked). */
export function useMirror<T>(fetch: () => Promise<T>, deps: unknown[], alsoOnStatus = false): { data: T | null; error: string | null; reload: () => void } {
  const [data, setData] = useState<T | null>(null);
  const [error, setError] = useState<string | null>(null);
  // eslint-disable-next-line react-hooks/exhaustive-deps
  const run = useCallback(fetch, deps);
  const reload = useCallback(() => {
    run().then(
      (d) => {
        setData(d);
        setError(null);
      },
      (e) => setError(errorText(e)),
    );
  }, [run]);
  useEffect(() => {
    reload();
    const offs: Promise<() => void>[] = [events.mirrorChanged.listen(() => reload())];
    if (alsoOnStatus) offs.push(events.statusChanged.listen(() => reload()));
    return () => {
      for (const o of offs) void o.then((f) => f());
    };
  }, [reload, alsoOnStatus]);
  return { data, error, reload };
}

export const loadText = (sha256: string) => commands.artifactText(sha256);
