// The escalation policy editor: who is notified of a new decision first, who next if nobody
// opened it in time, and quiet hours that hold what can wait. The server checks what is saved
// (its devices, people, waits, time zone) and says why it refuses. A step may name people this
// user delegates to (`Delegates`): all of their devices are notified.
import { useEffect, useState } from "react";
import type { DeviceView, EscalationPolicyView, EscalationStepView, RemindersView } from "../bindings";
import { commands, errorText } from "../data";
import { useI18n } from "../i18n";

const localZone = (): string => {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  } catch {
    return "UTC";
  }
};

export function EscalationEditor({ devices, people = [] }: { devices: readonly DeviceView[]; people?: readonly string[] }) {
  const { t } = useI18n();
  const live = devices.filter((d) => d.revoked_at == null);
  const [loaded, setLoaded] = useState(false);
  const [saved, setSaved] = useState<EscalationPolicyView | null>(null);
  const [steps, setSteps] = useState<EscalationStepView[]>([]);
  const [quiet, setQuiet] = useState<{ from: string; to: string; time_zone: string } | null>(null);
  const [reminders, setReminders] = useState<RemindersView | null>(null);
  const [busy, setBusy] = useState(false);
  const [msg, setMsg] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  const show = (p: EscalationPolicyView | null) => {
    setSaved(p);
    setSteps(p?.steps ?? []);
    setQuiet(p?.quiet_hours ?? null);
    setReminders(p?.reminders ?? null);
  };

  useEffect(() => {
    let live = true;
    commands
      .getEscalation()
      .then((p) => live && show(p))
      .catch((e) => live && setError(errorText(e)))
      .finally(() => live && setLoaded(true));
    return () => {
      live = false;
    };
  }, []);

  const save = async (policy: EscalationPolicyView | null) => {
    setBusy(true);
    setError(null);
    setMsg(null);
    try {
      show(await commands.setEscalation(policy));
      setMsg(policy ? t("escalation.saved") : t("escalation.cleared"));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  const setStep = (i: number, s: EscalationStepView) => setSteps(steps.map((x, j) => (j === i ? s : x)));
  const toggle = (i: number, id: string, on: boolean) => setStep(i, { ...steps[i], devices: on ? [...steps[i].devices, id] : steps[i].devices.filter((d) => d !== id) });
  const togglePerson = (i: number, user: string, on: boolean) => setStep(i, { ...steps[i], people: on ? [...steps[i].people, user] : steps[i].people.filter((p) => p !== user) });

  if (!loaded) return null;
  return (
    <section className="escalation" aria-labelledby="escalation-h" data-testid="escalation-editor">
      <h3 id="escalation-h">{t("escalation.title")}</h3>
      <p className="small muted">{saved ? t("escalation.explain") : t("escalation.none")}</p>
      <ol className="steps">
        {steps.map((s, i) => (
          <li key={i} className="step" data-testid={`escalation-step-${i}`}>
            <label>
              {i === 0 ? t("escalation.firstAfter") : t("escalation.thenAfter")}{" "}
              <input type="number" min={0} max={10080} value={s.after_minutes} aria-label={t("escalation.minutes")} onChange={(e) => setStep(i, { ...s, after_minutes: Math.max(0, Math.floor(Number(e.target.value) || 0)) })} /> {t("escalation.min")}
            </label>
            <div className="row wrap">
              {live.map((d) => (
                <label key={d.id} className="small">
                  <input type="checkbox" checked={s.devices.includes(d.id)} onChange={(e) => toggle(i, d.id, e.target.checked)} /> {d.name}
                  {d.stale ? ` (${t("pairing.stale")})` : ""}
                </label>
              ))}
              {/* People this user delegates to, and any a saved step still names. */}
              {[...people, ...s.people.filter((p) => !people.includes(p))].map((p) => (
                <label key={`@${p}`} className="small" data-testid={`escalation-person-${i}-${p}`}>
                  <input type="checkbox" checked={s.people.includes(p)} onChange={(e) => togglePerson(i, p, e.target.checked)} /> {t("escalation.person", { user: p })}
                </label>
              ))}
            </div>
            <button type="button" className="link" onClick={() => setSteps(steps.filter((_, j) => j !== i))}>
              {t("escalation.removeStep")}
            </button>
          </li>
        ))}
      </ol>
      {steps.length < 8 && (
        <button type="button" className="secondary" data-testid="escalation-add" onClick={() => setSteps([...steps, { after_minutes: steps.length === 0 ? 0 : 10, devices: [], people: [] }])}>
          {t("escalation.addStep")}
        </button>
      )}
      <p className="small muted">{t("escalation.atDeadline")}</p>
      <label className="small">
        <input type="checkbox" checked={quiet != null} onChange={(e) => setQuiet(e.target.checked ? { from: "22:00", to: "07:00", time_zone: localZone() } : null)} data-testid="escalation-quiet" /> {t("escalation.quiet")}
      </label>
      {quiet && (
        <div className="row wrap">
          <label className="small">
            {t("escalation.from")} <input type="time" value={quiet.from} onChange={(e) => setQuiet({ ...quiet, from: e.target.value })} />
          </label>
          <label className="small">
            {t("escalation.to")} <input type="time" value={quiet.to} onChange={(e) => setQuiet({ ...quiet, to: e.target.value })} />
          </label>
          <label className="small">
            {t("escalation.zone")} <input value={quiet.time_zone} onChange={(e) => setQuiet({ ...quiet, time_zone: e.target.value })} />
          </label>
          <p className="small muted">{t("escalation.urgent")}</p>
        </div>
      )}
      <label className="small">
        <input type="checkbox" checked={reminders != null} onChange={(e) => setReminders(e.target.checked ? { every_minutes: 30, at_most: 3 } : null)} data-testid="escalation-remind" /> {t("escalation.remind")}
      </label>
      {reminders && (
        <div className="row wrap">
          <label className="small">
            {t("escalation.remindEvery")}{" "}
            <input type="number" min={5} max={10080} value={reminders.every_minutes} aria-label={t("escalation.remindEvery")} data-testid="escalation-remind-every" onChange={(e) => setReminders({ ...reminders, every_minutes: Math.max(0, Math.floor(Number(e.target.value) || 0)) })} /> {t("escalation.remindMin")}
          </label>
          <label className="small">
            {t("escalation.remindAtMost")}{" "}
            <input type="number" min={1} max={12} value={reminders.at_most} aria-label={t("escalation.remindAtMost")} data-testid="escalation-remind-times" onChange={(e) => setReminders({ ...reminders, at_most: Math.max(0, Math.floor(Number(e.target.value) || 0)) })} /> {t("escalation.remindTimes")}
          </label>
          <p className="small muted">{t("escalation.remindExplain")}</p>
        </div>
      )}
      <div className="row">
        <button type="button" className="primary" disabled={busy || steps.length === 0} data-testid="escalation-save" onClick={() => void save({ steps, quiet_hours: quiet, reminders })}>
          {t("escalation.save")}
        </button>
        {saved && (
          <button type="button" className="danger" disabled={busy} onClick={() => void save(null)}>
            {t("escalation.clear")}
          </button>
        )}
      </div>
      {msg && (
        <p role="status" className="ok">
          {msg}
        </p>
      )}
      {error && (
        <p role="alert" className="error" data-testid="escalation-error">
          {t("common.error", { message: error })}
        </p>
      )}
    </section>
  );
}
