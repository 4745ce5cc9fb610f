// Threads: what needs the person first (the mirror sorts), with the link's health on top. The
// list is windowed (../windowed.ts): only the rows in view and an overscan are rendered, so
// 10,000 threads cost what a screenful does; ↑ ↓ Home End move between threads.
import { useCallback } from "react";
import type { StatusView } from "../bindings";
import { commands, useMirror } from "../data";
import { useI18n } from "../i18n";
import { ago } from "../format";
import { ThreadRow } from "../components/ThreadRow";
import { useWindowed } from "../windowed";

/** A thread row's height before it is measured (px): title, pills, stages, one budget bar and
 * the last checkpoint measure 190 px at desktop width (WebKitGTK; ≈ 285 px at phone width). */
export const THREAD_ROW_ESTIMATE = 190;

const estimate = () => THREAD_ROW_ESTIMATE;

export function ThreadsScreen({ go, status }: { go: (r: string) => void; status: StatusView | null }) {
  const { t } = useI18n();
  const { data, error } = useMirror(() => commands.listThreads(), []);
  const getKey = useCallback((i: number) => data![i].task.id, [data]);
  const list = useWindowed({ count: data?.length ?? 0, getKey, estimateSize: estimate, overscan: 4, focusSelector: "button.thread-open", keys: "list" });
  const open = useCallback((id: string) => go(`/threads/${id}`), [go]);
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
      {/* role="list": WebKit drops a list's semantics when its bullets are styled away. */}
      <ul className="threads" role="list" aria-labelledby="threads-title" {...list.listProps} onKeyDown={list.onKeyDown}>
        {data &&
          list.rows.map((r) => <ThreadRow key={r.key as string} row={data[r.index]} open={open} place={list.rowProps(r)} />)}
      </ul>
    </section>
  );
}
