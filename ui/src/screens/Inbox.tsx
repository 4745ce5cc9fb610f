// Inbox: pending decisions, soonest expiry first. The cards are a windowed feed
// (../windowed.ts): only the cards in view and an overscan are rendered, each measured as it
// renders (cards differ in height, and grow when a diff is opened), so 10,000 pending decisions
// cost what a screenful does. ARIA feed: each card says its place and the total, and
// Page Down / Page Up move between cards. Approvals can be selected and answered together,
// each still its own signed command. A card with an open diff, a confirmation, a typed
// answer or a send in flight stays rendered when scrolled away, and so does the focused one.
import { useCallback, useEffect, useRef, useState } from "react";
import type { DecideOp, OutboxView, SeenView } from "../bindings";
import { del, get } from "idb-keyval";
import { commands, errorText, loadText, useMirror } from "../data";
import { useI18n } from "../i18n";
import { InboxCard } from "../components/InboxCard";
import { machinesByTask, useMachines } from "../components/Machine";
import { answerMany } from "../components/batch";
import { useWindowed } from "../windowed";
import { howClosed } from "../closed";

/** A card's height before it is measured (px): an approval with its intent, two receipts (one
 * with a failure) and the actions measure ≈ 555 px at desktop width (WebKitGTK; ≈ 770 px at
 * phone width). */
export const CARD_ESTIMATE = 560;

const estimate = () => CARD_ESTIMATE;

/** A notification's Approve / Deny as the service worker hands it over (web companion). */
type HandedAction = { nonce: string; op: "approve" | "deny"; decision_id: string; plan_revision: number; intent_digest: string | null; at: number };

/** How long a notification's action waits for the page to carry it out. */
const ACTION_TTL_MS = 2 * 60 * 1000;

export function InboxScreen({ focus, confirm, actionNonce, go }: { focus?: string; confirm?: string | null; actionNonce?: string | null; go: (r: string) => void }) {
  const { t } = useI18n();
  const { data, error } = useMirror(() => commands.listInbox(), []);
  const { machines } = useMachines();
  const machineOf = machinesByTask(machines);
  // An answered decision leaves the inbox as soon as the mirror hears of it; what was sent
  // stays visible here so the person sees their answer went out (or was queued).
  const [sent, setSent] = useState<{ question: string; op: DecideOp; entry: OutboxView }[]>([]);
  // Decisions that left the inbox while shown here without being answered here (answered on
  // another device, by a rule, by their default or the runtime): each says how it closed, in
  // place of a card that silently vanished.
  const answeredHere = useRef<Set<string>>(new Set());
  const shownBefore = useRef<Map<string, string> | null>(null);
  const [closedElsewhere, setClosedElsewhere] = useState<{ id: string; question: string; how: string }[]>([]);
  useEffect(() => {
    if (!data) return;
    const now = new Map(data.map((i) => [i.decision.id, i.decision.task_id]));
    const before = shownBefore.current;
    shownBefore.current = now;
    if (!before) return;
    for (const [id, task] of before) {
      if (now.has(id) || answeredHere.current.has(id)) continue;
      commands
        .getThread(task)
        .then((th) => {
          const d = th.decisions.find((x) => x.id === id);
          if (!d || d.status === "pending") return;
          setClosedElsewhere((c) => [{ id, question: d.question, how: howClosed(d, t) }, ...c.filter((x) => x.id !== id)].slice(0, 20));
        })
        .catch((e: unknown) => console.info("waymark: could not say how a decision closed", e));
    }
  }, [data, t]);
  const decide = useCallback(
    async (id: string, op: DecideOp, option: string | null, text: string | null, seen: SeenView) => {
      answeredHere.current.add(id);
      const question = data?.find((i) => i.decision.id === id)?.decision.question ?? id;
      const entry = await commands.decide(id, op, option, text, seen);
      setSent((s) => [{ question, op, entry }, ...s].slice(0, 20));
      return entry;
    },
    [data],
  );
  const approveEdited = useCallback(
    async (id: string, part: string, seen: SeenView) => {
      answeredHere.current.add(id);
      const question = data?.find((i) => i.decision.id === id)?.decision.question ?? id;
      const entry = await commands.approveEdited(id, part, seen);
      setSent((s) => [{ question, op: "approve" as DecideOp, entry }, ...s].slice(0, 20));
      return entry;
    },
    [data],
  );
  // Cards on screen are "opened" on this device (proof of delivery), reported in batches.
  const opened = useRef<Set<string>>(new Set());
  const toReport = useRef<string[]>([]);
  const onOpened = useCallback((id: string) => {
    if (opened.current.has(id)) return;
    opened.current.add(id);
    toReport.current.push(id);
    if (toReport.current.length > 1) return;
    window.setTimeout(() => {
      const ids = toReport.current;
      toReport.current = [];
      commands.markOpened(ids).catch((e: unknown) => console.info("waymark: could not report the cards opened", e));
    }, 500);
  }, []);
  // Several approvals answered at once (../components/batch.ts): each keeps what its card
  // showed when it was selected.
  const [selected, setSelected] = useState<ReadonlyMap<string, SeenView>>(new Map());
  const [batchNote, setBatchNote] = useState<string[]>([]);
  const [batchBusy, setBatchBusy] = useState(false);
  const onSelect = useCallback((id: string, seen: SeenView | null) => {
    setSelected((m) => {
      const next = new Map(m);
      if (seen) next.set(id, seen);
      else next.delete(id);
      return next;
    });
  }, []);
  const answerSelected = async (op: "approve" | "deny") => {
    if (!data) return;
    setBatchBusy(true);
    try {
      const r = await answerMany(data, selected, op, decide);
      const notes: string[] = [];
      if (r.gone) notes.push(t("inbox.batch.gone", { n: r.gone }));
      if (r.risky) notes.push(t("inbox.batch.risky", { n: r.risky }));
      for (const f of r.failures) notes.push(`${f.question}: ${errorText(f.error)}`);
      setSelected(r.left);
      setBatchNote(notes);
    } finally {
      setBatchBusy(false);
    }
  };
  const [engaged, setEngaged] = useState<readonly string[]>([]);
  const onEngaged = useCallback((id: string, on: boolean) => {
    setEngaged((ids) => (ids.includes(id) === on ? ids : on ? [...ids, id] : ids.filter((x) => x !== id)));
  }, []);
  const getKey = useCallback((i: number) => data![i].decision.id, [data]);
  const feed = useWindowed({ count: data?.length ?? 0, getKey, estimateSize: estimate, overscan: 2, keep: engaged, keys: "feed" });
  const openThread = useCallback((task: string) => go(`/threads/${task}`), [go]);

  // A notification's Approve / Deny: taken once from where the service worker left it, only
  // under the nonce in the URL, only for this decision and not stale, and only for a decision
  // not marked risky (a risky one waits on its card for the person's confirmation). Signed
  // with the revision and digest the notification showed.
  const acted = useRef(false);
  const [actError, setActError] = useState<string | null>(null);
  useEffect(() => {
    if (acted.current || !actionNonce || !focus || !data) return;
    acted.current = true;
    void (async () => {
      const handed = (await get("waymark-action")) as HandedAction | undefined;
      await del("waymark-action");
      if (!handed || handed.nonce !== actionNonce || handed.decision_id !== focus || Date.now() - handed.at > ACTION_TTL_MS) {
        setActError(t("inbox.actionRefused"));
        return;
      }
      const item = data.find((i) => i.decision.id === focus);
      if (item?.decision.risky) return;
      await decide(focus, handed.op, null, null, { plan_revision: handed.plan_revision, intent_digest: handed.intent_digest });
    })().catch((e) => setActError(errorText(e)));
  }, [actionNonce, focus, data, decide, t]);

  // A deep link to a decision (a notification, the tray) scrolls to its card and focuses it,
  // once: the mirror re-reading later does not pull the person back.
  const focused = useRef(false);
  const { focusIndex } = feed;
  useEffect(() => {
    if (focused.current || !focus || !data) return;
    const i = data.findIndex((item) => item.decision.id === focus);
    if (i < 0) return;
    focused.current = true;
    focusIndex(i, "start");
  }, [focus, data, focusIndex]);

  return (
    <section aria-labelledby="inbox-title">
      <h2 id="inbox-title">{t("inbox.title")}</h2>
      {error && <p className="error">{t("common.error", { message: error })}</p>}
      {actError && (
        <p className="error" role="alert" data-testid="decision-error">
          {t("common.error", { message: actError })}
        </p>
      )}
      {sent.map((s) => (
        <p key={s.entry.command_id} className="sent small" role="status" data-testid="decision-result">
          <span className={`pill st-${s.entry.status}`}>{t(`outbox.status.${s.entry.status}` as "outbox.status.queued")}</span> <strong>{s.op}</strong> — {s.question}
          {s.entry.what_changed ? ` — ${s.entry.what_changed}` : ""}
        </p>
      ))}
      {closedElsewhere.map((c) => (
        <p key={c.id} className="sent small muted" role="status" data-testid="closed-elsewhere">
          {t("inbox.closedElsewhere", { question: c.question, how: c.how })}
        </p>
      ))}
      {batchNote.map((n) => (
        <p key={n} className="warn small" role="status" data-testid="batch-note">
          {n}
        </p>
      ))}
      {selected.size > 0 && (
        <div className="batch row wrap" role="region" aria-label={t("inbox.batch.selected", { n: selected.size })} data-testid="batch-bar">
          <span>{t("inbox.batch.selected", { n: selected.size })}</span>
          <button type="button" className="primary" disabled={batchBusy} data-testid="batch-approve" onClick={() => void answerSelected("approve")}>
            {t("inbox.batch.approve", { n: selected.size })}
          </button>
          <button type="button" className="danger" disabled={batchBusy} data-testid="batch-deny" onClick={() => void answerSelected("deny")}>
            {t("inbox.batch.deny", { n: selected.size })}
          </button>
          <button type="button" className="link" disabled={batchBusy} onClick={() => setSelected(new Map())}>
            {t("inbox.batch.clear")}
          </button>
        </div>
      )}
      {data && data.length === 0 && <p className="muted empty">{t("inbox.empty")}</p>}
      <div className="cards" role="feed" aria-labelledby="inbox-title" aria-busy={data == null} {...feed.listProps} onKeyDown={feed.onKeyDown}>
        {data &&
          feed.rows.map((r) => {
            const item = data[r.index];
            return (
              <InboxCard
                key={r.key as string}
                item={item}
                decide={decide}
                approveEdited={approveEdited}
                addRule={commands.addRule}
                onOpened={onOpened}
                load={loadText}
                focus={focus === item.decision.id}
                confirmFirst={focus === item.decision.id ? confirm : null}
                openThread={openThread}
                place={feed.rowProps(r)}
                onEngaged={onEngaged}
                selected={selected.has(item.decision.id)}
                onSelect={onSelect}
                machine={machineOf.get(item.decision.task_id) ?? null}
              />
            );
          })}
      </div>
    </section>
  );
}
