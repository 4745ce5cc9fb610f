// Rules: the user's standing rules as the server lists them (newest first; live, revoked and
// expired, with how often each answered), each revocable by a signed `revoke_rule`, and the form
// that signs a new one. Read live, like Machines: a rule's uses and liveness are the server's,
// so offline this screen says so rather than show an old list as current. Below them, the
// runtimes' own rules their machines' runners read (Claude Code's allow rules, Codex's prefix
// rules, …): they act before Waymark is asked, so a Waymark rule they work against is named on
// both cards, never silently resolved.
import { useCallback, useEffect, useState } from "react";
import type { RuleConflictView, RulesView, RuleView, RuntimeRuleView } from "../bindings";
import { commands, errorText } from "../data";
import { useI18n, type T } from "../i18n";
import { ago } from "../format";
import { blankRule } from "../rules";
import { day, RuleForm } from "../components/RuleForm";

function RuleCard({ rule: r, revoked, now, conflicts }: { rule: RuleView; revoked: () => void; now?: number; conflicts: RuleConflictView[] }) {
  const { t, lang } = useI18n();
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const state = r.revoked_at != null ? "revoked" : r.live ? "live" : "expired";
  const revoke = async () => {
    setBusy(true);
    setError(null);
    try {
      await commands.revokeRule(r.id);
      setConfirming(false);
      revoked();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <li className={`card rule rule-${state}`} data-testid="rule" data-rule={r.id} data-state={state}>
      <div className="card-head">
        <span className={`pill ${r.answer === "allow" ? "ok" : "bad"}`}>{t(`rules.answer.${r.answer}`)}</span>
        <span className={`pill ${state === "live" ? "" : "warn"}`}>{t(`rules.state.${state}`)}</span>
        {r.allow_risky && <span className="pill bad">{t("rules.risky")}</span>}
      </div>
      <dl className="facts rule-match">
        {r.tool && (
          <>
            <dt>{t("rules.part.tool")}</dt>
            <dd>
              <code>{r.tool}</code>
            </dd>
          </>
        )}
        {r.pattern && (
          <>
            <dt>{t(r.pattern_kind === "regex" ? "rules.part.regex" : "rules.part.pattern")}</dt>
            <dd>
              <code data-testid="rule-pattern">{r.pattern}</code>
            </dd>
          </>
        )}
        {r.directory && (
          <>
            <dt>{t("rules.part.directory")}</dt>
            <dd>
              <code>{r.directory}</code>
            </dd>
          </>
        )}
        {r.runtime && (
          <>
            <dt>{t("rules.part.runtime")}</dt>
            <dd>{r.runtime}</dd>
          </>
        )}
        {r.machine && (
          <>
            <dt>{t("rules.part.machine")}</dt>
            <dd>{r.machine}</dd>
          </>
        )}
        {!r.tool && !r.pattern && !r.directory && !r.runtime && !r.machine && (
          <>
            <dt>{t("rules.part.pattern")}</dt>
            <dd>{t("rules.anything")}</dd>
          </>
        )}
      </dl>
      {r.note && <p className="rule-note">“{r.note}”</p>}
      {conflicts.map((c, i) => (
        <p key={i} className="warn small rule-conflict" data-testid="rule-conflict">
          {t("rules.conflict", { says: c.says })}
        </p>
      ))}
      <p className="small muted">
        {state === "revoked" ? t("rules.revokedOn", { date: day(r.revoked_at!, lang) }) : state === "expired" ? t("rules.expiredOn", { date: day(r.expires_at, lang) }) : t("rules.until", { date: day(r.expires_at, lang) })}
        {" · "}
        <span data-testid="rule-uses">{r.uses > 0 ? t("rules.uses", { count: r.uses, ago: ago(r.last_used_at, t, now) }) : t("rules.usesNone")}</span>
        {" · "}
        {t("rules.signedOn", { device: r.device_name })}
      </p>
      {state === "live" &&
        (confirming ? (
          <div className="confirm" role="alertdialog" aria-label={t("rules.revokeYes")}>
            <p>{t("rules.revokeConfirm")}</p>
            <div className="row wrap">
              <button type="button" className="danger" disabled={busy} onClick={() => void revoke()} data-testid="rule-revoke-confirm" autoFocus>
                {t("rules.revokeYes")}
              </button>
              <button type="button" onClick={() => setConfirming(false)}>
                {t("rules.form.cancel")}
              </button>
            </div>
          </div>
        ) : (
          <button type="button" className="secondary" onClick={() => setConfirming(true)} data-testid="rule-revoke">
            {t("rules.revoke")}
          </button>
        ))}
      {error && (
        <p className="error" role="alert">
          {t("common.error", { message: error })}
        </p>
      )}
    </li>
  );
}

/** One of our rules in a line, for a runtime's card that names it. */
function ruleLine(r: RuleView, t: T): string {
  const what = [r.tool, r.pattern ? `\`${r.pattern}\`` : null].filter(Boolean).join(" ") || t("rules.anything");
  return `${t(`rules.answer.${r.answer}`)} ${what}${r.directory ? ` · ${r.directory}` : ""}`;
}

function RuntimeRuleCard({ rule: r, ours }: { rule: RuntimeRuleView; ours: RuleView[] }) {
  const { t } = useI18n();
  return (
    <li className="card rule runtime-rule" data-testid="runtime-rule" data-effect={r.effect}>
      <div className="card-head">
        <span className={`pill ${r.effect === "allow" ? "ok" : r.effect === "deny" ? "bad" : ""}`}>{t(`rules.own.effect.${r.effect}`)}</span>
        <span className="pill">{r.runtime}</span>
        <span className="muted small">{t("rules.own.on", { machine: r.machine })}</span>
      </div>
      <p>
        <code data-testid="runtime-rule-text">{r.text}</code>
      </p>
      <p className="small muted">
        {r.directory ? t("rules.own.inDirectory", { directory: r.directory }) : t("rules.own.everywhere")}
        {" · "}
        <code>{r.source}</code>
      </p>
      {r.conflicts.map((c) => {
        const rule = ours.find((o) => o.id === c.rule_id);
        return (
          <p key={c.rule_id} className="warn small rule-conflict" data-testid="runtime-rule-conflict" data-rule={c.rule_id}>
            {t("rules.own.conflict", { rule: rule ? ruleLine(rule, t) : c.rule_id })}
          </p>
        );
      })}
    </li>
  );
}

export function RulesScreen({ now }: { now?: number }) {
  const { t } = useI18n();
  const [list, setList] = useState<RulesView | null>(null);
  const rules = list?.rules ?? null;
  const [error, setError] = useState<string | null>(null);
  const [adding, setAdding] = useState(false);
  const [made, setMade] = useState<string | null>(null);
  const reload = useCallback(() => {
    commands.listRules().then(
      (r) => {
        setList(r);
        setError(null);
      },
      (e) => setError(errorText(e)),
    );
  }, []);
  useEffect(() => {
    reload();
    const timer = window.setInterval(reload, 30_000);
    return () => window.clearInterval(timer);
  }, [reload]);

  return (
    <section aria-labelledby="rules-title" className="narrow-page">
      <div className="row space">
        <h2 id="rules-title">{t("rules.title")}</h2>
        {!adding && (
          <button
            type="button"
            className="primary"
            data-testid="rule-new"
            onClick={() => {
              setAdding(true);
              setMade(null);
            }}
          >
            {t("rules.new")}
          </button>
        )}
      </div>
      <p className="muted small">{t("rules.explain")}</p>
      {adding && (
        <div className="card">
          <h3>{t("rules.form.title")}</h3>
          <RuleForm
            initial={blankRule()}
            sign={(r) => commands.addRule(r)}
            now={now}
            onCancel={() => setAdding(false)}
            onMade={(m) => {
              setAdding(false);
              setMade(m.detail);
              reload();
            }}
          />
        </div>
      )}
      {made && (
        <p className="card small" role="status" data-testid="rule-made">
          {t("rules.made", { detail: made })}
        </p>
      )}
      {error && (
        <p className="error" role="alert">
          {t("rules.unreachable", { error })}{" "}
          <button type="button" onClick={reload}>
            {t("banner.retry")}
          </button>
        </p>
      )}
      {rules && rules.length === 0 && !adding && (
        <p className="muted empty" data-testid="rules-empty">
          {t("rules.empty")}
        </p>
      )}
      <ul className="cards" role="list">
        {rules?.map((r) => (
          <RuleCard key={r.id} rule={r} revoked={reload} now={now} conflicts={conflictsOf(list, r.id)} />
        ))}
      </ul>
      {list && list.runtime_rules.length > 0 && (
        <section aria-labelledby="runtime-rules-title" data-testid="runtime-rules" className="runtime-rules">
          <h3 id="runtime-rules-title">{t("rules.own.title")}</h3>
          <p className="muted small">{t("rules.own.explain")}</p>
          <ul className="cards" role="list">
            {list.runtime_rules.map((r, i) => (
              <RuntimeRuleCard key={i} rule={r} ours={rules ?? []} />
            ))}
          </ul>
        </section>
      )}
    </section>
  );
}

/** What the runtimes' own rules say against one of ours. */
function conflictsOf(list: RulesView | null, id: string): RuleConflictView[] {
  return (list?.runtime_rules ?? []).flatMap((r) => r.conflicts.filter((c) => c.rule_id === id));
}
