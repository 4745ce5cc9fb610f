// Machines: where the user's runs run, as each machine's runner last reported it — online or
// offline since when, the runtimes it can start, the directories its owner allowed, its active
// runs — and the way to start a new run on one. Read live: a machine's state is only worth its
// freshness, so offline this screen says so instead of showing an old answer as current.
import { commands, useMirror } from "../data";
import { useI18n } from "../i18n";
import { ago } from "../format";
import { MachineState, runtimeLabel, useMachines } from "../components/Machine";

export function MachinesScreen({ go }: { go: (r: string) => void }) {
  const { t } = useI18n();
  const { machines, error, reload } = useMachines();
  const { data: threads } = useMirror(() => commands.listThreads(), []);
  const titles = Object.fromEntries((threads ?? []).map((r) => [r.task.id, r.task.title]));
  return (
    <section aria-labelledby="machines-title">
      <div className="row space">
        <h2 id="machines-title">{t("machines.title")}</h2>
        {!!machines?.length && (
          <button type="button" className="primary" data-testid="new-run" onClick={() => go("/machines/new")}>
            {t("machines.newRun")}
          </button>
        )}
      </div>
      <p className="muted small">{t("machines.explain")}</p>
      {error && (
        <p className="error" role="alert">
          {t("machines.unreachable", { error })}{" "}
          <button type="button" onClick={reload}>
            {t("banner.retry")}
          </button>
        </p>
      )}
      {machines && machines.length === 0 && (
        <div className="muted empty" data-testid="machines-empty">
          <p>{t("machines.empty")}</p>
          <p className="commands">
            <code>waymark admin runner-token --machine laptop --user YOU</code>
            <code>waymark runner install --server URL --token TOKEN --name laptop --allow ~/src</code>
          </p>
        </div>
      )}
      <ul className="cards" role="list">
        {machines?.map((m) => (
          <li key={m.id} className="card" data-testid="machine" data-machine={m.name}>
            <div className="card-head">
              <strong>{m.name}</strong>
              <MachineState m={m} />
              {m.inhibits_sleep && <span className="pill">{t("machines.keepsAwake")}</span>}
            </div>
            <dl className="facts">
              <dt>{t("machines.runtimes")}</dt>
              <dd>{m.runtimes.length ? m.runtimes.map((r) => runtimeLabel(r.runtime, r.version)).join(" · ") : t("machines.noRuntimes")}</dd>
              <dt>{t("machines.directories")}</dt>
              <dd>
                {m.directories.length ? (
                  m.directories.map((d) => (
                    <code key={d} className="dir">
                      {d}
                    </code>
                  ))
                ) : (
                  t("machines.noDirectories")
                )}
              </dd>
              <dt>{t("machines.active")}</dt>
              <dd>
                {m.active_tasks.length === 0
                  ? t("machines.noActive")
                  : m.active_tasks.map((id) => (
                      <a key={id} href={`#/threads/${id}`} className="task-link">
                        {titles[id] ?? id}
                      </a>
                    ))}
              </dd>
            </dl>
            {m.last_seen_at != null && <p className="small muted">{t("machines.lastSeen", { ago: ago(m.last_seen_at, t) })}</p>}
            <button type="button" data-testid="new-run-here" disabled={!m.runtimes.length || !m.directories.length} onClick={() => go(`/machines/new/${encodeURIComponent(m.name)}`)}>
              {t("machines.newRunHere", { name: m.name })}
            </button>
          </li>
        ))}
      </ul>
    </section>
  );
}
