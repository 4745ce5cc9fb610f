// Inbox: pending decisions, soonest expiry first.
import { useEffect, useState } from "react";
import type { DecideOp, OutboxView } from "../bindings";
import { commands, loadText, useMirror } from "../data";
import { useI18n } from "../i18n";
import { InboxCard } from "../components/InboxCard";

export function InboxScreen({ focus, confirm, go }: { focus?: string; confirm?: string | null; go: (r: string) => void }) {
  const { t } = useI18n();
  const { data, error } = useMirror(() => commands.listInbox(), []);
  // An answered decision leaves the inbox as soon as the mirror hears of it; what was sent
  // stays visible here so the person sees their answer went out (or was queued).
  const [sent, setSent] = useState<{ question: string; op: DecideOp; entry: OutboxView }[]>([]);
  const decide = async (id: string, op: DecideOp, option: string | null, text: string | null) => {
    const question = data?.find((i) => i.decision.id === id)?.decision.question ?? id;
    const entry = await commands.decide(id, op, option, text);
    setSent((s) => [{ question, op, entry }, ...s].slice(0, 5));
    return entry;
  };
  useEffect(() => {
    if (focus && data) document.querySelector<HTMLElement>(`[data-testid="decision-${focus}"]`)?.focus();
  }, [focus, data]);
  return (
    <section aria-labelledby="inbox-title">
      <h2 id="inbox-title">{t("inbox.title")}</h2>
      {error && <p className="error">{t("common.error", { message: error })}</p>}
      {sent.map((s) => (
        <p key={s.entry.command_id} className="sent small" role="status" data-testid="decision-result">
          <span className={`pill st-${s.entry.status}`}>{t(`outbox.status.${s.entry.status}` as "outbox.status.queued")}</span> <strong>{s.op}</strong> — {s.question}
          {s.entry.what_changed ? ` — ${s.entry.what_changed}` : ""}
        </p>
      ))}
      {data && data.length === 0 && <p className="muted empty">{t("inbox.empty")}</p>}
      <div className="cards">
        {data?.map((item) => (
          <InboxCard
            key={item.decision.id}
            item={item}
            decide={decide}
            load={loadText}
            focus={focus === item.decision.id}
            confirmFirst={focus === item.decision.id ? confirm : null}
            openThread={(task) => go(`/threads/${task}`)}
          />
        ))}
      </div>
    </section>
  );
}
