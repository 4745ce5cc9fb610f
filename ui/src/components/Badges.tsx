// State badges, plan stages (done / in flight / pending — from checkpoints, never a guessed
// percentage) and the budget bar (only what is known: limits and reported spend).
import type { BudgetView, StageView } from "../bindings";
import { useI18n } from "../i18n";
import { seconds } from "../format";

export function StateBadge({ state }: { state: string }) {
  return <span className={`state state-${state}`}>{state.replace(/_/g, " ")}</span>;
}

export function Stages({ stages }: { stages: StageView[] }) {
  const { t } = useI18n();
  const done = stages.filter((s) => s.status === "done").length;
  return (
    <div className="stages" aria-label={t("threads.stages", { done, total: stages.length })}>
      <ol className="stage-list">
        {stages.map((s) => (
          <li key={s.step} className={`stage stage-${s.status}`} title={`${s.title} — ${t(`stage.${s.status}` as "stage.done")}${s.verified ? `, ${t("stage.verified")}` : ""}`}>
            <span className="stage-dot" aria-hidden="true">
              {s.status === "done" ? "✓" : s.status === "in_flight" ? "●" : "○"}
            </span>
            <span className="stage-title">{s.title || s.step}</span>
          </li>
        ))}
      </ol>
      <span className="muted small">{t("threads.stages", { done, total: stages.length })}</span>
    </div>
  );
}

function Bar({ label, used, max, fmt }: { label: string; used: number; max: number; fmt: (n: number) => string }) {
  const { t } = useI18n();
  const ratio = max > 0 ? Math.min(1, used / max) : 0;
  const level = ratio >= 1 ? "over" : ratio >= 0.8 ? "high" : "ok";
  return (
    <div className="budget-row">
      <span className="budget-label">{label}</span>
      <div className={`bar bar-${level}`} role="meter" aria-valuemin={0} aria-valuemax={max} aria-valuenow={Math.min(used, max)} aria-label={label}>
        <div className="bar-fill" style={{ width: `${ratio * 100}%` }} />
      </div>
      <span className="budget-text small">{t("budget.of", { used: fmt(used), max: fmt(max) })}</span>
    </div>
  );
}

export function Budget({ budget }: { budget: BudgetView }) {
  const { t } = useI18n();
  const rows = [];
  if (budget.max_wall_seconds != null)
    rows.push(<Bar key="t" label={t("budget.time")} used={budget.elapsed_seconds} max={budget.max_wall_seconds} fmt={seconds} />);
  if (budget.max_tokens != null)
    rows.push(<Bar key="k" label={t("budget.tokens")} used={budget.used_tokens} max={budget.max_tokens} fmt={(n) => n.toLocaleString()} />);
  if (budget.max_cost_usd != null)
    rows.push(<Bar key="c" label={t("budget.cost")} used={budget.used_cost_usd ?? 0} max={budget.max_cost_usd} fmt={(n) => `$${n.toFixed(2)}`} />);
  if (rows.length === 0) return <span className="muted small">{t("budget.none")}</span>;
  return <div className="budget">{rows}</div>;
}
