// Outbox: every command signed on this device, newest first.
import { commands, useMirror } from "../data";
import { useI18n } from "../i18n";
import { OutboxList } from "../components/Outbox";

export function OutboxScreen() {
  const { t } = useI18n();
  const { data } = useMirror(() => Promise.all([commands.listOutbox(), commands.listThreads()]), [], true);
  const titles = Object.fromEntries((data?.[1] ?? []).map((r) => [r.task.id, r.task.title]));
  return (
    <section aria-labelledby="outbox-title">
      <h2 id="outbox-title">{t("outbox.title")}</h2>
      {data && <OutboxList entries={data[0]} titles={titles} />}
    </section>
  );
}
