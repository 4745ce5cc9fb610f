// One pending decision: what is asked, the intent with its digest and the plan revision it is
// bound to, the evidence (diff, receipts), when it expires and what happens then, and the
// actions. A risky approval needs a second, explicit confirmation, and so does a runtime's
// choice that grants more than this one call ("always allow", "for this session"), saying what
// it changes; budget options each say what they give up. "Always allow…" opens the add-rule
// form pre-filled from the intent (its tool, its command or path, its directory), all of it
// editable before anything is signed.
import { useEffect, useState } from "react";
import type { DecideOp, DeliveryStep, DeliveryView, EscalationStateView, InboxItemView, MachineView, NewRuleView, OutboxView, RuleAddedView, SeenView } from "../bindings";
import { useI18n } from "../i18n";
import { ago, clock, countdown, short } from "../format";
import { ArtifactBody, type LoadText } from "./Artifact";
import { EditIntent } from "./EditIntent";
import { MachineNote } from "./Machine";
import { QuestionForm } from "./QuestionForm";
import { day, RuleForm } from "./RuleForm";
import { ruleFromIntent } from "../rules";
import { optionGrants } from "../options";
import { Receipts } from "./Receipts";
import { formOf } from "../web/sign";
import type { RowProps } from "../windowed";

/** Answers a decision with what its card showed (`seen`): the device signs exactly that, so a
 * plan that moved on between the render and the tap comes back as a conflict. */
export type Decide = (decisionId: string, op: DecideOp, option: string | null, text: string | null, seen: SeenView) => Promise<OutboxView>;

/** Approves an approval with its editable part changed (JSON text), signed with what the card
 * showed (`seen`) and the edit's own digest. */
export type ApproveEdited = (decisionId: string, editedPart: string, seen: SeenView) => Promise<OutboxView>;

/** Signs a standing rule (`add_rule`) and sends it at once. */
export type AddRule = (rule: NewRuleView) => Promise<RuleAddedView>;

/** What this card shows now: the task's plan revision and the intent digest. */
const shownBy = (item: InboxItemView): SeenView => ({ plan_revision: item.plan_revision, intent_digest: item.decision.intent_digest });

const scalar = (v: unknown): v is string | number | boolean => typeof v === "string" || typeof v === "number" || typeof v === "boolean";

/** A value of the intent as a person reads it: a flat object as `key: value · …` (a budget's
 * usage, say), anything deeper as JSON. */
function intentValue(v: unknown): string {
  if (scalar(v)) return String(v);
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const entries = Object.entries(v as Record<string, unknown>);
    if (entries.length > 0 && entries.every(([, x]) => scalar(x) || x == null)) return entries.map(([k, x]) => `${k}: ${x == null ? "—" : String(x)}`).join(" · ");
  }
  return JSON.stringify(v);
}

function IntentTable({ intent }: { intent: unknown }) {
  if (!intent || typeof intent !== "object") return null;
  const entries = Object.entries(intent as Record<string, unknown>);
  return (
    <dl className="kv">
      {entries.map(([k, v]) => (
        <div key={k} className="kv-row">
          <dt>{k}</dt>
          <dd>
            <code>{intentValue(v)}</code>
          </dd>
        </div>
      ))}
    </dl>
  );
}

const STEPS: DeliveryStep[] = ["pushed", "fetched", "shown", "opened", "answered"];

/** Each device's furthest step, in the order devices were first reached. */
export function furthest(deliveries: readonly DeliveryView[]): DeliveryView[] {
  const by = new Map<string, DeliveryView>();
  for (const d of deliveries) {
    const was = by.get(d.device_id);
    if (!was || STEPS.indexOf(d.step) > STEPS.indexOf(was.step)) by.set(d.device_id, d);
  }
  return [...by.values()];
}

/** Where the decision stands on each device: "alice's phone: notified 2 min ago, not yet
 * opened", or that no device has it yet. */
function Deliveries({ deliveries, now }: { deliveries: readonly DeliveryView[]; now: number }) {
  const { t } = useI18n();
  const each = furthest(deliveries);
  return (
    <p className="small muted" data-testid="deliveries">
      {each.length === 0
        ? t("inbox.delivery.none")
        : each
            .map((d) => {
              const step = t(`inbox.delivery.step.${d.step}` as "inbox.delivery.step.pushed");
              const pending = STEPS.indexOf(d.step) < STEPS.indexOf("opened") ? `, ${t("inbox.delivery.notOpened")}` : "";
              return t("inbox.delivery.device", { device: d.device_name, step, when: ago(d.at, t, now) }) + pending;
            })
            .join(" · ")}
    </p>
  );
}

/** "Hermes will deny in 0:42": what happens if nobody answers, and when — the earlier of the
 * runtime's own deadline and ours (`closing`), counting down. */
function Closing({ item, now }: { item: InboxItemView; now: number }) {
  const { t } = useI18n();
  const d = item.decision;
  const c = d.closing;
  const past = c.at <= now;
  const left = countdown(c.at - now);
  const label = c.option ? (d.options.find((o) => o.id === c.option)?.label ?? c.option) : "";
  const runtime = c.runtime ?? "";
  const key = `inbox.closing.${c.then}${past ? ".past" : ""}` as "inbox.closing.default";
  return (
    <p className={`small ${past || c.at - now < 60_000 ? "warn" : "muted"}`} data-testid="closing" title={new Date(c.at).toLocaleString()}>
      {t(key, { runtime, left, option: label })}
    </p>
  );
}

/** "Notified laptop · next: alice's phone in 8:00": who has been told, who is next in line and
 * when, or why nobody further is. */
function EscalationLine({ escalation: e, now }: { escalation: EscalationStateView; now: number }) {
  const { t } = useI18n();
  const parts = [e.notified.length ? t("inbox.escalation.notified", { devices: e.notified.join(", ") }) : t("inbox.escalation.nobodyYet")];
  if (e.held_until != null) parts.push(t("inbox.escalation.held", { time: clock(e.held_until) }));
  if (e.stopped) parts.push(t("inbox.escalation.stopped", { why: e.stopped }));
  else if (e.next_at != null && e.next_devices.length) parts.push(t("inbox.escalation.next", { devices: e.next_devices.join(", "), left: countdown(e.next_at - now) }));
  else parts.push(t("inbox.escalation.last"));
  if (e.reminded > 0) parts.push(t("inbox.escalation.reminded", { n: e.reminded }));
  if (e.next_reminder_at != null) parts.push(t("inbox.escalation.nextReminder", { left: countdown(e.next_reminder_at - now) }));
  return (
    <p className="small muted" data-testid="escalation">
      {parts.join(" · ")}
    </p>
  );
}

/** Now, re-read every second while a deadline is under ten minutes away, else every half
 * minute; a fixed `now` (tests) never ticks. */
function useTicking(deadline: number, fixed?: number): number {
  const [now, setNow] = useState(() => fixed ?? Date.now());
  useEffect(() => {
    if (fixed != null) return;
    const every = deadline - Date.now() < 600_000 ? 1000 : 30_000;
    const id = setTimeout(() => setNow(Date.now()), every);
    return () => clearTimeout(id);
  }, [deadline, fixed, now]);
  return fixed ?? now;
}

export function InboxCard({
  item,
  decide,
  load,
  focus,
  confirmFirst,
  openThread,
  now: fixedNow,
  place,
  onEngaged,
  selected,
  onSelect,
  approveEdited,
  onOpened,
  machine,
  addRule,
}: {
  item: InboxItemView;
  /** The machine whose runner runs the task (a run started through a runner). */
  machine?: MachineView | null;
  decide: Decide;
  /** Where given, an approval whose runtime takes an edit offers "Edit, then approve". */
  approveEdited?: ApproveEdited;
  /** Where given, an approval offers "Always allow…": a standing rule made from its intent. */
  addRule?: AddRule;
  /** Told once the card is on screen: the person has it in front of them (proof of delivery). */
  onOpened?: (decisionId: string) => void;
  load: LoadText;
  focus?: boolean;
  confirmFirst?: string | null;
  openThread?: (taskId: string) => void;
  now?: number;
  /** Its place in a windowed feed (position, measuring ref, aria-posinset/setsize). */
  place?: RowProps;
  /** Told whether the card holds something a person would lose if it were unmounted (an open
   * diff, a confirmation, a typed answer, a send in flight), so a windowed feed keeps it. */
  onEngaged?: (decisionId: string, engaged: boolean) => void;
  /** Whether the card is selected for answering several at once (approvals only). */
  selected?: boolean;
  /** Selects or unselects it, with what the card shows now (that is what gets signed). */
  onSelect?: (decisionId: string, seen: SeenView | null) => void;
}) {
  const { t, lang } = useI18n();
  const d = item.decision;
  const now = useTicking(d.closing.at, fixedNow);
  const [showDiff, setShowDiff] = useState<string | null>(null);
  // A confirmation keeps what it asked about: confirming signs that, even if a sync moved the
  // card underneath it meanwhile.
  const [confirming, setConfirming] = useState<{ action: string; seen: SeenView } | null>(confirmFirst ? { action: confirmFirst, seen: shownBy(item) } : null);
  const [answer, setAnswer] = useState("");
  const [busy, setBusy] = useState(false);
  const [result, setResult] = useState<OutboxView | null>(null);
  const [error, setError] = useState<string | null>(null);
  // Editing keeps what the card showed when it opened: that is what the edit is signed against.
  const [editing, setEditing] = useState<SeenView | null>(null);
  // "Always allow…": the form open, then the rule it made.
  const [ruling, setRuling] = useState(false);
  const [ruleMade, setRuleMade] = useState<{ id: string; expires: number } | null>(null);
  const engaged = showDiff != null || confirming != null || answer !== "" || busy || editing != null || ruling;
  useEffect(() => {
    onOpened?.(d.id);
  }, [onOpened, d.id]);
  useEffect(() => {
    if (!onEngaged) return;
    onEngaged(d.id, engaged);
    return () => onEngaged(d.id, false);
  }, [onEngaged, d.id, engaged]);

  const send = async (op: DecideOp, option: string | null = null, text: string | null = null, seen: SeenView = shownBy(item)) => {
    setBusy(true);
    setError(null);
    try {
      setResult(await decide(d.id, op, option, text, seen));
      setConfirming(null);
    } catch (e) {
      setError((e as { message?: string })?.message ?? String(e));
    } finally {
      setBusy(false);
    }
  };

  const sendEdited = async (part: string, seen: SeenView) => {
    if (!approveEdited) return;
    setBusy(true);
    setError(null);
    try {
      setResult(await approveEdited(d.id, part, seen));
      setEditing(null);
    } catch (e) {
      setError((e as { message?: string })?.message ?? String(e));
    } finally {
      setBusy(false);
    }
  };

  // A plan to approve (Claude Code's `ExitPlanMode`): shown as written, and "keep planning"
  // carries the person's feedback.
  const planOf = (d.intent as { plan?: unknown } | null | undefined)?.plan;
  const plan = d.kind === "approval" && typeof planOf === "string" ? planOf : null;

  // The runtime decided at its own deadline: the record follows; nothing here may answer.
  const decidedByRuntime = d.status === "pending" && d.closing.runtime != null && d.closing.at <= now;
  const locked = busy || decidedByRuntime;

  return (
    <article
      {...place}
      className={`card decision kind-${d.kind}${focus ? " focused" : ""}`}
      data-testid={`decision-${d.id}`}
      aria-labelledby={`q-${d.id}`}
      tabIndex={place ? 0 : -1}
    >
      <header className="card-head">
        <span className={`pill kind`}>{t(`inbox.kind.${d.kind}` as "inbox.kind.approval")}</span>
        {d.risky && <span className="pill bad">{t("inbox.risky")}</span>}
        {item.on_behalf_of && (
          <span className="pill" data-testid="on-behalf-of">
            {t("inbox.forOwner", { user: item.on_behalf_of })}
          </span>
        )}
        {onSelect && d.kind === "approval" && (
          <label className="select small">
            <input type="checkbox" checked={selected ?? false} data-testid="select" onChange={(e) => onSelect(d.id, e.target.checked ? shownBy(item) : null)} /> {t("inbox.select")}
          </label>
        )}
        <button type="button" className="link" onClick={() => openThread?.(d.task_id)}>
          {item.task_title}
        </button>
      </header>
      <h3 id={`q-${d.id}`} className="question">
        {d.question}
      </h3>
      {item.stale && <p className="warn">{t("inbox.stale", { asked: d.plan_revision, now: item.plan_revision })}</p>}
      <MachineNote machine={machine} />

      {plan != null && (
        <section className="plan">
          <pre className="plan-text" data-testid="plan">
            {plan}
          </pre>
          {d.status === "pending" && <input aria-label={t("inbox.plan.feedback")} placeholder={t("inbox.plan.feedback")} value={answer} onChange={(e) => setAnswer(e.target.value)} data-testid="plan-feedback" />}
        </section>
      )}
      {d.intent != null && !formOf(d) && (
        <section className="intent">
          {plan == null && <h4>{t("inbox.intent")}</h4>}
          {plan == null && <IntentTable intent={d.intent} />}
          <p className="small">
            {d.intent_digest != null && (
              <>
                {t("inbox.digest")}: <code title={d.intent_digest} data-testid="intent-digest">{short(d.intent_digest, 16)}…</code> ·{" "}
              </>
            )}
            {t("inbox.boundTo", { rev: d.plan_revision })}
          </p>
        </section>
      )}

      <Deliveries deliveries={d.deliveries} now={now} />

      {d.durability != null && (
        <p className="small muted" data-testid="durability">
          {t(`inbox.held.${d.durability}` as "inbox.held.durable")}
        </p>
      )}

      <Closing item={item} now={now} />
      {d.can_wait && !decidedByRuntime && d.status === "pending" && (
        <div className="small wait-offer" data-testid="wait-offer">
          <p>{machine ? t("inbox.wait.explainRunner", { runtime: d.closing.runtime ?? "", name: machine.name }) : t("inbox.wait.explain", { runtime: d.closing.runtime ?? "" })}</p>
          <button type="button" className="secondary" disabled={locked} data-testid="wait" onClick={() => send("wait")}>
            {t("inbox.wait.button", { runtime: d.closing.runtime ?? "" })}
          </button>
        </div>
      )}
      {d.escalation && <EscalationLine escalation={d.escalation} now={now} />}

      <section className="evidence">
        <h4>{t("inbox.evidence")}</h4>
        {item.diffs.length === 0 ? (
          <p className="muted small">{t("inbox.noDiff")}</p>
        ) : (
          <div className="row wrap">
            {item.diffs.map((a) => (
              <button key={a.id} type="button" className="secondary" aria-expanded={showDiff === a.sha256} data-testid="show-diff" onClick={() => setShowDiff(showDiff === a.sha256 ? null : a.sha256)}>
                {showDiff === a.sha256 ? t("inbox.hideDiff") : t("inbox.showDiff", { name: a.name })}
              </button>
            ))}
          </div>
        )}
        {showDiff && item.diffs.filter((a) => a.sha256 === showDiff).map((a) => <ArtifactBody key={a.id} artifact={a} load={load} />)}
        <Receipts receipts={item.receipts} />
      </section>

      <footer className="actions">
        {d.kind === "approval" &&
          (confirming?.action === "approve" ? (
            <div className="confirm" role="alertdialog" aria-label={t("inbox.confirmApprove")}>
              <p>{t("inbox.confirmQuestion", { digest: short(confirming.seen.intent_digest, 12), rev: confirming.seen.plan_revision })}</p>
              {(confirming.seen.plan_revision !== item.plan_revision || confirming.seen.intent_digest !== d.intent_digest) && (
                <p className="warn" data-testid="confirm-moved">
                  {t("inbox.movedSince", { rev: item.plan_revision })}
                </p>
              )}
              <div className="row">
                <button type="button" className="primary" disabled={locked} onClick={() => send("approve", null, null, confirming.seen)} data-testid="confirm-approve" autoFocus>
                  {t("inbox.confirmApprove")}
                </button>
                <button type="button" onClick={() => setConfirming(null)}>
                  {t("inbox.cancel")}
                </button>
              </div>
            </div>
          ) : editing != null && d.editable ? (
            <EditIntent intent={d.intent} pointer={d.editable} busy={busy} onApprove={(part) => void sendEdited(part, editing)} onCancel={() => setEditing(null)} />
          ) : confirming == null ? (
            <div className="row">
              <button type="button" className="primary" disabled={locked} data-testid="approve" onClick={() => (d.risky ? setConfirming({ action: "approve", seen: shownBy(item) }) : send("approve"))}>
                {plan ? (d.options.find((o) => o.id === "approve")?.label ?? t("inbox.approve")) : t("inbox.approve")}
              </button>
              <button type="button" className="danger" disabled={locked} data-testid="deny" onClick={() => send("deny", null, plan && answer.trim() ? answer.trim() : null)}>
                {plan ? (d.options.find((o) => o.id === "deny")?.label ?? t("inbox.deny")) : t("inbox.deny")}
              </button>
              {d.editable && approveEdited && (
                <button type="button" className="secondary" disabled={locked} data-testid="edit" onClick={() => setEditing(shownBy(item))}>
                  {t("inbox.edit.open")}
                </button>
              )}
            </div>
          ) : null)}
        {d.kind === "approval" &&
          confirming != null &&
          confirming.action !== "approve" &&
          optionGrants(confirming.action) === true &&
          d.options
            .filter((o) => o.id === confirming.action)
            .map((o) => (
              <div key={o.id} className="confirm" role="alertdialog" aria-label={t("inbox.confirmGrant")}>
                <p>
                  {t("inbox.confirmGrant")} <strong>{o.label}</strong>
                </p>
                {o.gives_up && <p className="warn">{o.gives_up}</p>}
                <div className="row">
                  <button type="button" className="primary" disabled={locked} onClick={() => send("approve", o.id, null, confirming.seen)} data-testid="confirm-option" autoFocus>
                    {t("inbox.confirmGrantButton", { label: o.label })}
                  </button>
                  <button type="button" onClick={() => setConfirming(null)}>
                    {t("inbox.cancel")}
                  </button>
                </div>
              </div>
            ))}
        {d.kind === "approval" && confirming == null && editing == null && d.options.some((o) => o.id !== "approve" && o.id !== "deny") && (
          <ul className="options" aria-label={t("inbox.moreChoices")}>
            {d.options
              .filter((o) => o.id !== "approve" && o.id !== "deny")
              .map((o) => (
                <li key={o.id} className="option">
                  <button type="button" className={optionGrants(o.id) === false ? "danger" : "secondary"} disabled={locked} onClick={() => (optionGrants(o.id) === false ? send("deny", o.id) : setConfirming({ action: o.id, seen: shownBy(item) }))} data-testid={`option-${o.id}`}>
                    {o.label}
                  </button>
                  {o.gives_up && <span className="small">{t("inbox.givesUp", { what: o.gives_up })}</span>}
                </li>
              ))}
          </ul>
        )}
        {d.kind !== "approval" && d.options.length > 0 && (
          <ul className="options">
            {d.options.map((o) => (
              <li key={o.id} className="option">
                <button type="button" disabled={locked} onClick={() => send(d.kind === "question" ? "answer" : "choose", o.id)} data-testid={`option-${o.id}`}>
                  {o.label}
                  {o.id === d.default_option ? " ★" : ""}
                </button>
                <span className="small">{t("inbox.givesUp", { what: o.gives_up || "—" })}</span>
                {o.cost && <span className="small muted">{t("inbox.cost", { cost: o.cost })}</span>}
              </li>
            ))}
          </ul>
        )}
        {formOf(d) && <QuestionForm decisionId={d.id} form={formOf(d)!} locked={locked} onAnswer={(json) => void send("answer", null, json)} />}
        {d.kind === "question" && d.options.length === 0 && !formOf(d) && (
          <form
            className="row"
            onSubmit={(e) => {
              e.preventDefault();
              if (answer.trim()) void send("answer", null, answer.trim());
            }}
          >
            <input aria-label={t("inbox.answerPlaceholder")} placeholder={t("inbox.answerPlaceholder")} value={answer} onChange={(e) => setAnswer(e.target.value)} />
            <button type="submit" className="primary" disabled={busy || !answer.trim()}>
              {t("inbox.answer")}
            </button>
          </form>
        )}
        {addRule && d.kind === "approval" && d.status === "pending" && plan == null && d.intent != null && !ruling && !ruleMade && (
          <button type="button" className="link always-allow" data-testid="always-allow" onClick={() => setRuling(true)}>
            {t("inbox.alwaysAllow")}
          </button>
        )}
        {addRule && ruling && (
          <section className="always-allow-form" aria-label={t("inbox.alwaysAllow")}>
            <h4>{t("inbox.alwaysAllow")}</h4>
            <p className="small muted">{t("inbox.alwaysAllowExplain")}</p>
            <RuleForm
              initial={ruleFromIntent(d.intent)}
              sign={addRule}
              now={now}
              onCancel={() => setRuling(false)}
              onMade={(m, r) => {
                setRuling(false);
                setRuleMade({ id: m.rule_id, expires: now + r.days * 86_400_000 });
              }}
            />
          </section>
        )}
        {ruleMade && (
          <p className="small ok-text" role="status" data-testid="rule-made">
            {t("inbox.ruleMade", { id: ruleMade.id, date: day(ruleMade.expires, lang) })}
          </p>
        )}
        {result && (
          <p className="small" role="status" data-testid="decision-result">
            {t("inbox.sent", { status: t(`outbox.status.${result.status}` as "outbox.status.queued") })}
            {result.what_changed ? ` — ${result.what_changed}` : ""}
          </p>
        )}
        {error && (
          <p className="error" role="alert">
            {t("common.error", { message: error })}
          </p>
        )}
      </footer>
    </article>
  );
}
