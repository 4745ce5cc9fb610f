// A machine in a sentence: its state (online, offline since when), where a runner's run runs
// and that an answer waits while it is away, the runtimes' names — and the live list of the
// user's machines the screens and cards read.
import { useCallback, useEffect, useState } from "react";
import type { MachineView } from "../bindings";
import { commands, errorText } from "../data";
import { useI18n } from "../i18n";
import { ago, clock } from "../format";

/** People's names for the runtimes a runner starts. */
export function runtimeName(runtime: string): string {
  const names: Record<string, string> = { "claude-code": "Claude Code", codex: "Codex", hermes: "Hermes Agent", gemini: "Gemini CLI", "gemini-cli": "Gemini CLI", opencode: "OpenCode", copilot: "Copilot CLI", openclaw: "OpenClaw" };
  return names[runtime] ?? runtime;
}

/** A runtime and its version, without the name the version repeats (`claude --version`
 * answers "2.1.328 (Claude Code)", `codex --version` "codex-cli 0.169.0"). */
export function runtimeLabel(runtime: string, version: string | null): string {
  const name = runtimeName(runtime);
  const v = (version ?? "")
    .replace(new RegExp(`\\s*\\(${name}\\)\\s*$`, "i"), "")
    .replace(new RegExp(`^${runtime}\\S*\\s+`, "i"), "")
    .trim();
  return v ? `${name} ${v}` : name;
}

/** The machines, re-read every 15 s (a runner's heartbeat is 20 s at most). */
export function useMachines(): { machines: MachineView[] | null; error: string | null; reload: () => void } {
  const [machines, setMachines] = useState<MachineView[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const reload = useCallback(() => {
    commands.listMachines().then(
      (m) => {
        setMachines(m);
        setError(null);
      },
      (e) => setError(errorText(e)),
    );
  }, []);
  useEffect(() => {
    reload();
    const timer = window.setInterval(reload, 15000);
    return () => window.clearInterval(timer);
  }, [reload]);
  return { machines, error, reload };
}

export function MachineState({ m }: { m: MachineView }) {
  const { t } = useI18n();
  if (m.online) return <span className="pill ok" data-testid="machine-state">{t("machines.online")}</span>;
  if (m.offline_since != null)
    return (
      <span className="pill bad" data-testid="machine-state" title={clock(m.offline_since)}>
        {t("machines.offlineSince", { time: clock(m.offline_since), ago: ago(m.offline_since, t) })}
      </span>
    );
  return <span className="pill warn" data-testid="machine-state">{t("machines.neverSeen")}</span>;
}

/** Where a runner's run runs, and — when that machine is away — that an answer waits for it. */
export function MachineNote({ machine }: { machine?: MachineView | null }) {
  const { t } = useI18n();
  if (!machine) return null;
  if (!machine.online && machine.offline_since != null)
    return (
      <p className="warn small machine-note" data-testid="machine-away">
        {t("machine.awayNote", { name: machine.name, time: clock(machine.offline_since) })}
      </p>
    );
  return (
    <p className="muted small machine-note">
      <span data-testid="machine-on">{t("machine.runsOn", { name: machine.name })}</span> <MachineState m={machine} />
    </p>
  );
}


/** Each active task's machine. */
export function machinesByTask(machines: MachineView[] | null): Map<string, MachineView> {
  const m = new Map<string, MachineView>();
  for (const x of machines ?? []) for (const task of x.active_tasks) m.set(task, x);
  return m;
}
