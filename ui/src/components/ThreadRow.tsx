// A thread in the list: state, plan revision, what waits, budget, stages, last checkpoint.
import type { ThreadRowView } from "../bindings";
import { useI18n } from "../i18n";
import { ago } from "../format";
import type { RowProps } from "../windowed";
import { Budget, Stages, StateBadge } from "./Badges";

/** `place`: its place in a windowed list (position, measuring ref, aria-posinset/setsize). */
export function ThreadRow({ row, open, now = Date.now(), place }: { row: ThreadRowView; open: (id: string) => void; now?: number; place?: RowProps }) {
  const { t } = useI18n();
  const task = row.task;
  const cp = row.last_checkpoint;
  return (
    <li {...place} className={`thread-row${row.pending_decisions > 0 || row.unknown_effects > 0 ? " attention" : ""}`}>
      <button type="button" className="thread-open" onClick={() => open(task.id)} data-testid={`thread-${task.id}`}>
        <div className="row wrap">
          <StateBadge state={task.state} />
          <strong className="thread-title">{task.title}</strong>
          {row.on_behalf_of && (
            <span className="pill" data-testid="thread-on-behalf-of">
              {t("inbox.forOwner", { user: row.on_behalf_of })}
            </span>
          )}
        </div>
        <div className="row wrap small">
          <span className="muted">{t("threads.rev", { rev: task.plan_revision })}</span>
          {row.pending_decisions > 0 && <span className="pill warn">{t("threads.pending", { n: row.pending_decisions })}</span>}
          {row.unknown_effects > 0 && <span className="pill bad">{t("threads.unknown", { n: row.unknown_effects })}</span>}
          {row.pinned && <span className="pill">{t("threads.pinned")}</span>}
        </div>
      </button>
      <Stages stages={row.stages} />
      <Budget budget={task.budget} />
      <p className="small muted">{cp ? t("threads.lastCheckpoint", { seq: cp.sequence, reason: cp.reason, ago: ago(cp.created_at, t, now) }) : t("threads.noCheckpoint")}</p>
    </li>
  );
}
