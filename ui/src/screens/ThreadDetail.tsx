// One thread in full: steer, stages, the checkpoint timeline (compare two), effects by status
// with `unknown` standing out, artifacts in the viewers, receipts, decisions, messages and
// this device's commands about it. Everything reads from the mirror, so it works offline.
import { useState } from "react";
import type { CheckpointView, EffectView, ThreadDetailView } from "../bindings";
import { commands, loadText, useMirror } from "../data";
import { useI18n } from "../i18n";
import { ago, short } from "../format";
import { Budget, Stages, StateBadge } from "../components/Badges";
import { SteerPanel } from "../components/SteerPanel";
import { CheckpointDiff } from "../components/CheckpointDiff";
import { ArtifactBody } from "../components/Artifact";
import { Receipts } from "../components/Receipts";
import { OutboxList } from "../components/Outbox";
import { MachineNote, useMachines } from "../components/Machine";

function Timeline({ checkpoints }: { checkpoints: CheckpointView[] }) {
  const { t } = useI18n();
  const last = checkpoints.length;
  const [from, setFrom] = useState<number | null>(last > 1 ? checkpoints[last - 2].sequence : null);
  const [to, setTo] = useState<number | null>(last > 0 ? checkpoints[last - 1].sequence : null);
  const a = checkpoints.find((c) => c.sequence === from);
  const b = checkpoints.find((c) => c.sequence === to);
  return (
    <>
      <p className="muted small">
        {t("detail.chainNote")} {t("detail.compareHint")}
      </p>
      <ol className="timeline">
        {checkpoints.map((c) => (
          <li key={c.sequence} className={c.sequence === from || c.sequence === to ? "selected" : ""}>
            <div className="row wrap">
              <strong>#{c.sequence}</strong>
              <span className="tag">{c.reason}</span>
              <span className="muted small">
                {ago(c.created_at, t)} · {t("threads.rev", { rev: c.plan_revision })} · {t("detail.fence", { fence: c.fence })} · <code title={c.digest}>{short(c.digest, 10)}</code>
              </span>
            </div>
            {c.summary && <p className="small">{c.summary}</p>}
            <div className="row small">
              <label className="check">
                <input type="radio" name="cp-from" checked={from === c.sequence} onChange={() => setFrom(c.sequence)} />
                {t("detail.compareFrom")}
              </label>
              <label className="check">
                <input type="radio" name="cp-to" checked={to === c.sequence} onChange={() => setTo(c.sequence)} />
                {t("detail.compareTo")}
              </label>
            </div>
          </li>
        ))}
      </ol>
      {a && b && a.sequence !== b.sequence && <CheckpointDiff a={a.sequence < b.sequence ? a : b} b={a.sequence < b.sequence ? b : a} />}
    </>
  );
}

function Effects({ effects }: { effects: EffectView[] }) {
  const { t } = useI18n();
  if (effects.length === 0) return <p className="muted">{t("detail.noEffects")}</p>;
  const groups = new Map<string, EffectView[]>();
  for (const e of effects) groups.set(e.status, [...(groups.get(e.status) ?? []), e]);
  const order = ["unknown", "failed_compensable", "failed", "in_progress", "intended", "confirmed", "compensated"];
  const keys = [...groups.keys()].sort((x, y) => order.indexOf(x) - order.indexOf(y));
  return (
    <div className="effects">
      {keys.map((k) => (
        <div key={k} className={`effect-group st-${k}`}>
          <h4>
            <span className={`pill st-${k}`}>{k.replace(/_/g, " ")}</span> ({groups.get(k)!.length})
          </h4>
          {k === "unknown" && <p className="warn">{t("detail.unknownWarn")}</p>}
          <ul>
            {groups.get(k)!.map((e) => (
              <li key={e.id} className="effect">
                <strong>{e.kind}</strong> <span className="muted small">{e.resource_id ?? ""}</span>
                <div className="small muted">
                  key <code>{e.idempotency_key}</code> · intent <code title={e.intent_digest}>{short(e.intent_digest, 10)}</code> · {t("detail.fence", { fence: e.fence })}
                </div>
                {e.flag && <p className="warn small">{e.flag}</p>}
                {e.receipt != null && (
                  <details>
                    <summary className="small">{t("detail.receipt")}</summary>
                    <pre className="text-view small">{JSON.stringify(e.receipt, null, 2)}</pre>
                  </details>
                )}
              </li>
            ))}
          </ul>
        </div>
      ))}
    </div>
  );
}

function Section({ title, children, id }: { title: string; children: React.ReactNode; id: string }) {
  return (
    <section className="panel" aria-labelledby={id}>
      <h3 id={id}>{title}</h3>
      {children}
    </section>
  );
}

/** The machine a runner's run runs on (read live; nothing is said while it cannot be read). */
function ThreadMachine({ id }: { id: string }) {
  const { machines } = useMachines();
  return <MachineNote machine={machines?.find((m) => m.id === id) ?? null} />;
}

function Detail({ d, go }: { d: ThreadDetailView; go: (r: string) => void }) {
  const { t } = useI18n();
  const [open, setOpen] = useState<string | null>(null);
  const task = d.task;
  return (
    <div className="detail">
      <header className="detail-head">
        <button type="button" className="link" onClick={() => go("/threads")}>
          ← {t("detail.back")}
        </button>
        <h2>{task.title}</h2>
        <div className="row wrap">
          <StateBadge state={task.state} />
          <span className="muted small" data-testid="thread-state" data-state={task.state}>
            {t("threads.rev", { rev: task.plan_revision })} · {t("detail.fence", { fence: task.fence })} · {task.id}
          </span>
        </div>
        {task.machine_id && !task.terminal && <ThreadMachine id={task.machine_id} />}
        {task.outcome_summary && <p>{task.outcome_summary}</p>}
      </header>
      <div className="detail-grid">
        <div className="col">
          <Section title={t("detail.stages")} id="sec-stages">
            <Stages stages={d.stages} />
            <Budget budget={task.budget} />
          </Section>
          <SteerPanel task={task} steps={d.stages} steer={(id, op, ins, sus, rev) => commands.steer(id, op, ins, sus, rev)} />
          {d.decisions.length > 0 && (
            <Section title={t("detail.decisions")} id="sec-decisions">
              <ul className="small">
                {d.decisions.map((x) => (
                  <li key={x.id}>
                    <span className="tag">{x.kind}</span> {x.question} — <strong>{x.status}</strong>
                    {x.outcome && ` (${x.outcome.option ?? ""} ${x.outcome.by})`}
                    {x.delivery && (
                      <span className={`small ${x.delivery === "acknowledged" ? "muted" : "warn"}`} data-testid="delivery" title={x.delivery_detail ?? undefined}>
                        {" — "}
                        {t(`delivery.${x.delivery}` as "delivery.pending")}
                      </span>
                    )}
                    {x.status === "pending" && (
                      <>{" "}<button type="button" className="link" onClick={() => go(`/inbox/${x.id}`)}>
                        {t("nav.inbox")} →
                      </button></>
                    )}
                  </li>
                ))}
              </ul>
            </Section>
          )}
          <Section title={t("detail.outbox")} id="sec-outbox">
            <OutboxList entries={d.outbox} />
          </Section>
          <Section title={t("detail.effects")} id="sec-effects">
            <Effects effects={d.effects} />
          </Section>
        </div>
        <div className="col">
          <Section title={t("detail.timeline")} id="sec-timeline">
            <Timeline key={d.checkpoints.length} checkpoints={d.checkpoints} />
          </Section>
          <Section title={t("detail.artifacts")} id="sec-artifacts">
            {d.artifacts.length === 0 ? (
              <p className="muted">{t("detail.noArtifacts")}</p>
            ) : (
              <ul className="artifacts">
                {d.artifacts.map((a) => (
                  <li key={a.id}>
                    <div className="row wrap">
                      <code>{a.name}</code>
                      <span className="muted small">
                        {a.media_type} · {a.size} B · {short(a.sha256, 10)}
                      </span>
                      <button type="button" className="secondary" aria-expanded={open === a.id} onClick={() => setOpen(open === a.id ? null : a.id)} data-testid={`artifact-${a.name}`}>
                        {open === a.id ? t("detail.hide") : t("detail.view")}
                      </button>
                    </div>
                    {open === a.id && <ArtifactBody artifact={a} load={loadText} />}
                  </li>
                ))}
              </ul>
            )}
          </Section>
          <Section title={t("detail.receipts")} id="sec-receipts">
            <Receipts receipts={d.receipts} />
          </Section>
          <Section title={t("detail.messages")} id="sec-messages">
            {d.messages.length === 0 ? (
              <p className="muted">{t("detail.noMessages")}</p>
            ) : (
              <ol className="messages">
                {d.messages.map((m) => (
                  <li key={m.seq} className={`msg role-${m.role}`}>
                    <span className="tag">{m.role}</span> <span className="msg-text">{m.text}</span>
                  </li>
                ))}
              </ol>
            )}
          </Section>
        </div>
      </div>
    </div>
  );
}

export function ThreadDetailScreen({ id, go }: { id: string; go: (r: string) => void }) {
  const { t } = useI18n();
  const { data, error } = useMirror(() => commands.getThread(id), [id]);
  if (error && !data) return <p className="error">{t("common.error", { message: error })}</p>;
  if (!data) return <p className="muted">{t("detail.loading")}</p>;
  return <Detail d={data} go={go} />;
}
