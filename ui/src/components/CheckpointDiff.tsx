// What changed between two checkpoints: steps completed in between, plan revision, commit,
// effect statuses and the step in flight — then both bodies as a diff in the same viewer.
import { useMemo } from "react";
import { createTwoFilesPatch } from "diff";
import type { CheckpointView } from "../bindings";
import { useI18n } from "../i18n";
import { short } from "../format";
import { DiffViewer } from "./DiffViewer";

export function checkpointChanges(a: CheckpointView, b: CheckpointView) {
  const before = new Set(a.completed_steps.map((s) => s.step));
  const steps = b.completed_steps.filter((s) => !before.has(s.step));
  const effA = new Map(a.effects.map((e) => [e.effect_id, e.status]));
  const effects = b.effects
    .filter((e) => effA.get(e.effect_id) !== e.status)
    .map((e) => ({ id: e.effect_id, from: effA.get(e.effect_id) ?? "—", to: e.status }));
  return {
    steps,
    revision: a.plan_revision !== b.plan_revision ? [a.plan_revision, b.plan_revision] : null,
    commit: a.commit !== b.commit ? [a.commit, b.commit] : null,
    pending: a.pending_step?.step !== b.pending_step?.step ? [a.pending_step?.step ?? "—", b.pending_step?.step ?? "—"] : null,
    effects,
  };
}

function body(c: CheckpointView): string {
  const { sequence, reason, plan_revision, completed_steps, pending_step, effects, summary, commit, fence, attempt_id } = c;
  return JSON.stringify({ sequence, reason, plan_revision, attempt_id, fence, commit, summary, completed_steps, pending_step, effects }, null, 2) + "\n";
}

export function CheckpointDiff({ a, b }: { a: CheckpointView; b: CheckpointView }) {
  const { t } = useI18n();
  const ch = useMemo(() => checkpointChanges(a, b), [a, b]);
  const patch = useMemo(() => {
    const [from, to] = [`checkpoint-${a.sequence}.json`, `checkpoint-${b.sequence}.json`];
    // The viewer reads git-style diffs: give the patch the header git would write.
    const raw = createTwoFilesPatch(`a/${from}`, `b/${to}`, body(a), body(b), "", "", { context: 3 });
    return `diff --git a/${from} b/${to}\n` + raw.split("\n").filter((l) => !/^=+$/.test(l)).join("\n");
  }, [a, b]);
  return (
    <div className="cp-diff" data-testid="checkpoint-diff">
      <h4>{t("cpdiff.steps")}</h4>
      {ch.steps.length === 0 ? (
        <p className="muted small">{t("cpdiff.none")}</p>
      ) : (
        <ul>
          {ch.steps.map((s) => (
            <li key={s.step}>
              ✓ {s.step} {s.verified && <span className="pill ok">{t("stage.verified")}</span>}
            </li>
          ))}
        </ul>
      )}
      <ul className="small">
        {ch.revision && <li>{t("cpdiff.revision", { a: ch.revision[0], b: ch.revision[1] })}</li>}
        {ch.commit && <li>{t("cpdiff.commit", { a: short(ch.commit[0], 10) || "—", b: short(ch.commit[1], 10) || "—" })}</li>}
        {ch.pending && <li>{t("cpdiff.pending", { a: ch.pending[0], b: ch.pending[1] })}</li>}
        {ch.effects.map((e) => (
          <li key={e.id} className={e.to === "unknown" ? "warn" : ""}>
            {t("cpdiff.effects", { id: e.id, a: e.from, b: e.to })}
          </li>
        ))}
      </ul>
      <h4>{t("cpdiff.body")}</h4>
      <DiffViewer text={patch} initialView="unified" />
    </div>
  );
}
