// New run: the person picks a machine, one of its runtimes, a directory its owner allowed (or
// one below it), writes the prompt and says which tools need their approval; the device signs
// `start_run` with exactly that — shown before signing — and the machine's runner starts the
// runtime there. Offline, the command waits in the outbox and the run starts on the next sync.
// A refusal (the machine or directory not allowed, a runtime it lacks) is shown with its reason
// and the form keeps what was typed.
import { useEffect, useMemo, useState } from "react";
import type { StartedRunView } from "../bindings";
import { commands, errorText } from "../data";
import { useI18n } from "../i18n";
import { MachineState, runtimeLabel, runtimeName, useMachines } from "../components/Machine";

/** `base` joined with a relative folder below it; `null` when `below` leaves it (`..`, `/x`). */
export function joinBelow(base: string, below: string): string | null {
  const parts = below.trim().split("/").filter((p) => p !== "" && p !== ".");
  if (below.trim().startsWith("/") || parts.some((p) => p === "..")) return null;
  return parts.length ? `${base.replace(/\/+$/, "")}/${parts.join("/")}` : base;
}

/** The runtimes a run can start in plan mode (`waymark_proto::PLAN_RUNTIMES`). */
const PLAN_RUNTIMES = ["claude-code", "codex"];

function validGate(gate: string): boolean {
  if (!gate.trim()) return true;
  try {
    new RegExp(gate);
    return true;
  } catch {
    return false;
  }
}

export function NewRunScreen({ machine: initial, go }: { machine?: string; go: (r: string) => void }) {
  const { t } = useI18n();
  const { machines, error: loadError } = useMachines();
  const [machine, setMachine] = useState(initial ?? "");
  const [runtime, setRuntime] = useState("");
  const [base, setBase] = useState("");
  const [below, setBelow] = useState("");
  const [prompt, setPrompt] = useState("");
  const [title, setTitle] = useState("");
  const [gate, setGate] = useState("");
  const [plan, setPlan] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [started, setStarted] = useState<StartedRunView | null>(null);

  const m = useMemo(() => machines?.find((x) => x.name === machine) ?? null, [machines, machine]);
  // Defaults once the machines are known: the first usable machine, its first runtime and directory.
  useEffect(() => {
    if (!machines?.length) return;
    if (!m) {
      const first = machines.find((x) => x.runtimes.length && x.directories.length) ?? machines[0];
      setMachine(first.name);
      return;
    }
    if (!m.runtimes.some((r) => r.runtime === runtime)) setRuntime(m.runtimes[0]?.runtime ?? "");
    if (!m.directories.includes(base)) setBase(m.directories[0] ?? "");
  }, [machines, m, runtime, base]);

  const directory = base ? joinBelow(base, below) : null;
  // Plan first: only where the runtime has a plan mode a runner can start it in.
  const canPlan = PLAN_RUNTIMES.includes(runtime);
  const problems: string[] = [];
  if (!m) problems.push(t("newRun.needMachine"));
  else if (!m.runtimes.length) problems.push(t("newRun.noRuntime", { name: m.name }));
  if (base && directory === null) problems.push(t("newRun.badBelow"));
  if (!prompt.trim()) problems.push(t("newRun.needPrompt"));
  if (!validGate(gate)) problems.push(t("newRun.badGate"));

  const submit = async () => {
    if (!m || !directory || problems.length) return;
    setBusy(true);
    setError(null);
    try {
      const r = await commands.startRun({ machine: m.name, runtime, directory, prompt, title: title.trim() || null, gate: gate.trim() || null, plan: plan && canPlan });
      if (r.command.status === "rejected" || r.command.status === "expired") setError(r.command.detail ?? r.command.status);
      else setStarted(r);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  if (started) {
    const queued = started.command.status === "queued";
    return (
      <section aria-labelledby="newrun-title" className="narrow-page">
        <h2 id="newrun-title">{t("newRun.title")}</h2>
        <p className="card" role="status" data-testid="run-started" data-status={started.command.status}>
          {queued ? t("newRun.queued", { name: machine }) : m?.online ? t("newRun.started", { name: machine }) : t("newRun.startsWhenBack", { name: machine })}
        </p>
        <div className="row wrap">
          {!queued && (
            <button type="button" className="primary" data-testid="open-run" onClick={() => go(`/threads/${started.task_id}`)}>
              {t("newRun.open")}
            </button>
          )}
          {queued && (
            <button type="button" onClick={() => go("/outbox")}>
              {t("nav.outbox")}
            </button>
          )}
          <button type="button" onClick={() => go("/machines")}>
            {t("machines.title")}
          </button>
        </div>
      </section>
    );
  }

  return (
    <section aria-labelledby="newrun-title" className="narrow-page">
      <h2 id="newrun-title">{t("newRun.title")}</h2>
      {loadError && <p className="error">{t("machines.unreachable", { error: loadError })}</p>}
      {machines && machines.length === 0 && <p className="muted">{t("machines.empty")}</p>}
      <form
        className="form"
        onSubmit={(e) => {
          e.preventDefault();
          void submit();
        }}
      >
        <label>
          {t("newRun.machine")}
          <select value={machine} onChange={(e) => setMachine(e.target.value)} data-testid="run-machine">
            {machines?.map((x) => (
              <option key={x.id} value={x.name}>
                {x.name}
                {x.online ? "" : ` — ${t("machines.offline")}`}
              </option>
            ))}
          </select>
        </label>
        {m && (
          <p className="small">
            <MachineState m={m} /> {!m.online && t("newRun.offlineNote", { name: m.name })}
          </p>
        )}
        <label>
          {t("newRun.runtime")}
          <select value={runtime} onChange={(e) => setRuntime(e.target.value)} data-testid="run-runtime">
            {m?.runtimes.map((r) => (
              <option key={r.runtime} value={r.runtime}>
                {runtimeLabel(r.runtime, r.version)}
              </option>
            ))}
          </select>
        </label>
        <label>
          {t("newRun.directory")}
          <select value={base} onChange={(e) => setBase(e.target.value)} data-testid="run-directory">
            {m?.directories.map((d) => (
              <option key={d} value={d}>
                {d}
              </option>
            ))}
          </select>
        </label>
        <label>
          {t("newRun.below")}
          <input value={below} onChange={(e) => setBelow(e.target.value)} placeholder="app" autoCapitalize="off" autoCorrect="off" spellCheck={false} data-testid="run-below" />
        </label>
        <label>
          {t("newRun.prompt")}
          <textarea value={prompt} onChange={(e) => setPrompt(e.target.value)} rows={5} required data-testid="run-prompt" />
        </label>
        <label>
          {t("newRun.titleField")}
          <input value={title} onChange={(e) => setTitle(e.target.value)} placeholder={prompt.split("\n")[0].slice(0, 80)} data-testid="run-title" />
        </label>
        <label>
          {t("newRun.gate")}
          <input value={gate} onChange={(e) => setGate(e.target.value)} placeholder="Bash|Write|Edit" autoCapitalize="off" autoCorrect="off" spellCheck={false} data-testid="run-gate" />
          <span className="small muted">{t("newRun.gateHelp")}</span>
        </label>
        {canPlan && (
          <label className="plan-first">
            <input type="checkbox" checked={plan} onChange={(e) => setPlan(e.target.checked)} data-testid="run-plan" />
            <span>
              {t("newRun.plan")}
              <span className="small muted block">{t("newRun.planHelp")}</span>
            </span>
          </label>
        )}
        {m && directory && (
          <p className="panel small" data-testid="run-summary">
            {t("newRun.summary", { runtime: runtimeName(runtime), directory, name: m.name })}
            {gate.trim() ? ` ${t("newRun.summaryGate", { gate: gate.trim() })}` : ` ${t("newRun.summaryNoGate")}`}
            {plan && canPlan ? ` ${t("newRun.summaryPlan")}` : ""}
          </p>
        )}
        {problems.length > 0 && (prompt || below || gate) && (
          <ul className="error small" data-testid="run-problems">
            {problems.map((p) => (
              <li key={p}>{p}</li>
            ))}
          </ul>
        )}
        {error && (
          <p className="error" role="alert" data-testid="run-error">
            {t("newRun.refused", { error })}
          </p>
        )}
        <button type="submit" className="primary" disabled={busy || problems.length > 0} data-testid="run-start">
          {busy ? t("newRun.signing") : t("newRun.start")}
        </button>
      </form>
    </section>
  );
}
