// Steer: signed commands, not chat. Each shows the plan revision it is based on and is signed
// with exactly that revision (a sync that moves the plan before the tap makes it a conflict);
// cancel, replan and take-over ask for confirmation because they cannot be taken back, and the
// confirmation keeps the revision it asked about.
import { useState } from "react";
import type { OutboxView, SteerOp, TaskView } from "../bindings";
import { useI18n } from "../i18n";

export type Steer = (taskId: string, op: SteerOp, instructions: string | null, suspend: string[], seenRevision: number) => Promise<OutboxView>;

const DESTRUCTIVE: SteerOp[] = ["cancel", "replan", "take_over"];

export function SteerPanel({ task, steps, steer }: { task: TaskView; steps: { step: string; title: string; status: string }[]; steer: Steer }) {
  const { t } = useI18n();
  const [confirm, setConfirm] = useState<{ op: SteerOp; rev: number } | null>(null);
  const [replan, setReplan] = useState(false);
  const [instructions, setInstructions] = useState("");
  const [suspend, setSuspend] = useState<string[]>([]);
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<OutboxView | null>(null);
  const [error, setError] = useState<string | null>(null);

  if (task.terminal) return <p className="muted">{t("steer.terminal", { state: task.state })}</p>;

  const send = async (op: SteerOp, rev: number) => {
    setBusy(true);
    setError(null);
    try {
      const r = await steer(task.id, op, op === "replan" ? instructions.trim() : null, op === "replan" ? suspend : [], rev);
      setResult(r);
      setConfirm(null);
      if (op === "replan") setReplan(false);
    } catch (e) {
      setError((e as { message?: string })?.message ?? String(e));
    } finally {
      setBusy(false);
    }
  };
  // The revision on screen when the person tapped.
  const ask = (op: SteerOp) => (DESTRUCTIVE.includes(op) ? setConfirm({ op, rev: task.plan_revision }) : void send(op, task.plan_revision));
  const confirmText = confirm?.op === "replan" ? t("steer.confirm.replan", { rev: confirm.rev }) : confirm?.op === "cancel" ? t("steer.confirm.cancel") : t("steer.confirm.take_over");

  return (
    <section className="steer" aria-labelledby="steer-title">
      <h3 id="steer-title">{t("steer.title")}</h3>
      <p className="small muted" data-testid="steer-revision">
        {t("steer.basedOn", { rev: task.plan_revision })}
      </p>
      <div className="row wrap">
        {task.state === "paused" ? (
          <button type="button" disabled={busy} onClick={() => ask("resume")} data-testid="steer-resume">
            {t("steer.resume")}
          </button>
        ) : (
          <button type="button" disabled={busy} onClick={() => ask("pause")} data-testid="steer-pause">
            {t("steer.pause")}
          </button>
        )}
        <button type="button" disabled={busy} aria-expanded={replan} onClick={() => setReplan(!replan)} data-testid="steer-replan">
          {t("steer.replan")}
        </button>
        <button type="button" disabled={busy} onClick={() => ask("take_over")}>
          {t("steer.takeOver")}
        </button>
        <button type="button" className="danger" disabled={busy} onClick={() => ask("cancel")} data-testid="steer-cancel">
          {t("steer.cancel")}
        </button>
      </div>
      {replan && (
        <form
          className="replan"
          onSubmit={(e) => {
            e.preventDefault();
            if (instructions.trim()) ask("replan");
          }}
        >
          <label>
            {t("steer.instructions")}
            <textarea value={instructions} placeholder={t("steer.instructionsPlaceholder")} onChange={(e) => setInstructions(e.target.value)} rows={3} />
          </label>
          <fieldset>
            <legend>{t("steer.suspend")}</legend>
            {steps
              .filter((s) => s.status !== "done")
              .map((s) => (
                <label key={s.step} className="check">
                  <input type="checkbox" checked={suspend.includes(s.step)} onChange={(e) => setSuspend(e.target.checked ? [...suspend, s.step] : suspend.filter((x) => x !== s.step))} />
                  {s.title || s.step}
                </label>
              ))}
          </fieldset>
          <button type="submit" className="primary" disabled={busy || !instructions.trim()}>
            {t("steer.send")}
          </button>
        </form>
      )}
      {confirm && (
        <div className="confirm" role="alertdialog" aria-label={confirmText}>
          <p>{confirmText}</p>
          {confirm.rev !== task.plan_revision && (
            <p className="warn" data-testid="steer-moved">
              {t("inbox.movedSince", { rev: task.plan_revision })}
            </p>
          )}
          <div className="row">
            <button type="button" className="danger" disabled={busy} onClick={() => send(confirm.op, confirm.rev)} autoFocus data-testid="steer-confirm">
              {t("steer.confirmYes")}
            </button>
            <button type="button" onClick={() => setConfirm(null)}>
              {t("inbox.cancel")}
            </button>
          </div>
        </div>
      )}
      {result && (
        <p className="small" role="status" data-testid="steer-result">
          {result.status === "queued" ? t("steer.queued") : t("inbox.sent", { status: t(`outbox.status.${result.status}` as "outbox.status.queued") })}
          {result.what_changed ? ` — ${result.what_changed}` : result.detail ? ` — ${result.detail}` : ""}
        </p>
      )}
      {error && (
        <p className="error" role="alert">
          {t("common.error", { message: error })}
        </p>
      )}
    </section>
  );
}
