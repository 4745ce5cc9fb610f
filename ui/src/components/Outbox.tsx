// The outbox: each command signed on this device and where it stands — queued, delivered,
// acknowledged by the agent, or a conflict/rejection with what changed.
import type { OutboxView } from "../bindings";
import { useI18n } from "../i18n";
import { ago } from "../format";

export function OutboxList({ entries, titles, now = Date.now() }: { entries: OutboxView[]; titles?: Record<string, string>; now?: number }) {
  const { t } = useI18n();
  if (entries.length === 0) return <p className="muted">{t("outbox.empty")}</p>;
  return (
    <ul className="outbox" data-testid="outbox">
      {entries.map((e) => (
        <li key={e.command_id} className={`outbox-entry st-${e.status}`} data-testid={`outbox-${e.operation}`} data-status={e.status}>
          <div className="row wrap">
            <span className={`pill st-${e.status}`}>{t(`outbox.status.${e.status}` as "outbox.status.queued")}</span>
            <strong>{e.operation.replace(/_/g, " ")}</strong>
            <span className="muted small">{titles?.[e.task_id] ?? e.task_id}</span>
          </div>
          <div className="muted small">
            {e.based_on_revision != null && t("outbox.basedOn", { rev: e.based_on_revision })}
            {e.met_revision != null && <> · {t("outbox.met", { rev: e.met_revision })}</>}
            {" · "}
            {t("outbox.signed", { ago: ago(e.created_at, t, now) })}
          </div>
          {e.what_changed && <p className="warn small">{e.what_changed}</p>}
          {!e.what_changed && e.detail && <p className="small">{e.detail}</p>}
        </li>
      ))}
    </ul>
  );
}
