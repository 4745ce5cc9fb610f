// The add-rule form, on the Rules screen and under "Always allow…" on an approval card: what
// the rule matches (tool, a pattern over the command or path, directory, runtime, machine), its
// answer, how many days it lives, a note. Everything it will sign is on screen and editable
// first; a rule that also allows calls marked risky asks a second time, and that second yes is
// what the signed command repeats (`confirm_risky`).
import { useState } from "react";
import type { NewRuleView, RuleAddedView } from "../bindings";
import { errorText } from "../data";
import { useI18n, type T } from "../i18n";
import { matchParts, ruleProblem } from "../rules";

/** `Bash “npm test*” in /src/shop`, as a sentence reads it, or "every call". */
export function describeMatch(r: Parameters<typeof matchParts>[0], t: T): string {
  const parts = matchParts(r);
  if (!parts.length) return t("rules.anything");
  return parts.map(([k, v]) => t(`rules.sum.${k}` as "rules.sum.tool", { v })).join(" ");
}

/** A date as people read it, in the UI's language. */
export function day(ms: number, lang: string): string {
  return new Date(ms).toLocaleDateString(lang, { day: "numeric", month: "short", year: "numeric" });
}

export function RuleForm({
  initial,
  sign,
  onMade,
  onCancel,
  now,
}: {
  initial: NewRuleView;
  sign: (rule: NewRuleView) => Promise<RuleAddedView>;
  onMade: (made: RuleAddedView, rule: NewRuleView) => void;
  onCancel?: () => void;
  now?: number;
}) {
  const { t, lang } = useI18n();
  const [rule, setRule] = useState<NewRuleView>(initial);
  const [confirmingRisky, setConfirmingRisky] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const set = <K extends keyof NewRuleView>(k: K, v: NewRuleView[K]) => {
    setRule((r) => ({ ...r, [k]: v }));
    setConfirmingRisky(false);
  };
  const text = (k: "tool" | "pattern" | "directory" | "runtime" | "machine" | "note") => ({
    value: rule[k] ?? "",
    onChange: (e: { target: { value: string } }) => set(k, e.target.value === "" ? null : e.target.value),
    autoCapitalize: "off",
    autoCorrect: "off",
    spellCheck: false,
    "data-testid": `rule-${k}`,
  });
  const problem = ruleProblem(rule);
  const until = day((now ?? Date.now()) + (Number.isFinite(rule.days) ? rule.days : 0) * 86_400_000, lang);
  const what = describeMatch({ ...rule, pattern_kind: rule.pattern_kind }, t);
  const risky = rule.answer === "allow" && rule.allow_risky;

  const submit = async (confirmed: boolean) => {
    if (problem) return;
    if (risky && !confirmed) {
      setConfirmingRisky(true);
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const signed = { ...rule, allow_risky: risky, confirmed_risky: risky && confirmed };
      onMade(await sign(signed), signed);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
      setConfirmingRisky(false);
    }
  };

  return (
    <form
      className="form rule-form"
      data-testid="rule-form"
      onSubmit={(e) => {
        e.preventDefault();
        void submit(false);
      }}
    >
      <label>
        {t("rules.form.pattern")}
        <input {...text("pattern")} className="mono" placeholder={rule.pattern_kind === "regex" ? "cargo (test|build)( .*)?" : "npm test*"} />
        <span className="small muted">{rule.pattern_kind === "regex" ? t("rules.form.regexHelp") : t("rules.form.patternHelp")}</span>
      </label>
      <label>
        {t("rules.form.kind")}
        <select value={rule.pattern_kind} onChange={(e) => set("pattern_kind", e.target.value as NewRuleView["pattern_kind"])} data-testid="rule-kind">
          <option value="glob">{t("rules.form.kind.glob")}</option>
          <option value="regex">{t("rules.form.kind.regex")}</option>
        </select>
      </label>
      <label>
        {t("rules.form.tool")}
        <input {...text("tool")} placeholder="Bash" />
        <span className="small muted">{t("rules.form.toolHelp")}</span>
      </label>
      <label>
        {t("rules.form.directory")}
        <input {...text("directory")} className="mono" placeholder="/home/you/src/shop" />
        <span className="small muted">{t("rules.form.directoryHelp")}</span>
      </label>
      <fieldset className="row wrap answer-choice">
        <legend>{t("rules.form.answer")}</legend>
        {(["allow", "deny"] as const).map((a) => (
          <label key={a} className="inline">
            <input type="radio" name="rule-answer" value={a} checked={rule.answer === a} onChange={() => set("answer", a)} data-testid={`rule-answer-${a}`} /> {t(`rules.answer.${a}`)}
          </label>
        ))}
      </fieldset>
      <div className="row wrap two">
        <label>
          {t("rules.form.runtime")}
          <input {...text("runtime")} placeholder="claude-code" />
        </label>
        <label>
          {t("rules.form.machine")}
          <input {...text("machine")} placeholder="laptop" />
        </label>
      </div>
      <label>
        {t("rules.form.days")}
        <input type="number" min={1} max={90} step={1} value={Number.isFinite(rule.days) ? rule.days : ""} onChange={(e) => set("days", e.target.value === "" ? NaN : Number(e.target.value))} data-testid="rule-days" />
      </label>
      <label>
        {t("rules.form.note")}
        <input {...text("note")} />
      </label>
      {rule.answer === "allow" && (
        <label className="inline">
          <input type="checkbox" checked={rule.allow_risky} onChange={(e) => set("allow_risky", e.target.checked)} data-testid="rule-allow-risky" /> {t("rules.form.allowRisky")}
        </label>
      )}
      <p className={`panel small rule-summary answer-${rule.answer}`} data-testid="rule-summary">
        {t("rules.form.summary", { answer: t(`rules.answer.${rule.answer}`), what, date: until })}
      </p>
      {problem && (rule.tool || rule.pattern || rule.directory || problem === "days") && (
        <p className="error small" data-testid="rule-problem">
          {t(`rules.problem.${problem}`)}
        </p>
      )}
      {confirmingRisky ? (
        <div className="confirm" role="alertdialog" aria-label={t("rules.form.confirmRiskyYes")}>
          <p>{t("rules.form.confirmRisky", { what, date: until })}</p>
          <div className="row wrap">
            <button type="button" className="danger" disabled={busy} onClick={() => void submit(true)} data-testid="rule-confirm-risky" autoFocus>
              {t("rules.form.confirmRiskyYes")}
            </button>
            <button type="button" onClick={() => setConfirmingRisky(false)}>
              {t("rules.form.cancel")}
            </button>
          </div>
        </div>
      ) : (
        <div className="row wrap">
          <button type="submit" className="primary" disabled={busy || problem != null} data-testid="rule-sign">
            {busy ? t("rules.form.signing") : t("rules.form.sign")}
          </button>
          {onCancel && (
            <button type="button" onClick={onCancel} data-testid="rule-cancel">
              {t("rules.form.cancel")}
            </button>
          )}
        </div>
      )}
      {error && (
        <p className="error" role="alert" data-testid="rule-error">
          {t("rules.refused", { error })}
        </p>
      )}
    </form>
  );
}
