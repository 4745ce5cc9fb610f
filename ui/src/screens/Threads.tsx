// Threads: what needs the person first (the mirror sorts), with the link's health on top.
import type { StatusView } from "../bindings";
import { commands, useMirror } from "../data";
import { useI18n } from "../i18n";
import { ago } from "../format";
import { ThreadRow } from "../components/ThreadRow";

export function ThreadsScreen({ go, status }: { go: (r: string) => void; status: StatusView | null }) {
  const { t } = useI18n();
  const { data, error } = useMirror(() => commands.listThreads(), []);
  return (
    <section aria-labelledby="threads-title">
      <div className="row space">
        <h2 id="threads-title">{t("threads.title")}</h2>
        {status && (
          <span className={`link-health ${status.connected ? "ok" : "bad"}`} data-testid="link-health">
            {status.connected ? t("status.live") : `${t("status.offline")} · ${ago(status.last_sync_at, t)}`}
          </span>
        )}
      </div>
      <p className="muted small">{t("threads.sortedBy")}</p>
      {error && <p className="error">{t("common.error", { message: error })}</p>}
      {data && data.length === 0 && <p className="muted empty">{t("threads.empty")}</p>}
      <ul className="threads">
        {data?.map((row) => (
          <ThreadRow key={row.task.id} row={row} open={(id) => go(`/threads/${id}`)} />
        ))}
      </ul>
    </section>
  );
}
