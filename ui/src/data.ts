// The screens' link to the shell: generated commands and events (bindings.ts), and a hook
// that re-reads the mirror whenever the shell says it changed.
import { useCallback, useEffect, useState } from "react";
import { commands, events } from "./bindings";

export { commands, events };

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
