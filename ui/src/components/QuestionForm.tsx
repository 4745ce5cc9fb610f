// A question in parts (Claude Code's `AskUserQuestion`): each part's choices as radio buttons
// or checkboxes, each with what it means, and the person's own words where the part takes
// them. Nothing is sent until every part is answered; the answers go out as one signed
// `answer_question` bound to the digest of exactly these questions.
import { useState } from "react";
import { useI18n } from "../i18n";
import { formProblem, type FormAnswer, type QuestionForm as Form } from "../web/sign";

export function QuestionForm({ decisionId, form, locked, onAnswer }: { decisionId: string; form: Form; locked: boolean; onAnswer: (answersJson: string) => void }) {
  const { t } = useI18n();
  const [chosen, setChosen] = useState<Record<string, string[]>>({});
  const [words, setWords] = useState<Record<string, string>>({});

  const answers: Record<string, FormAnswer> = {};
  for (const q of form.questions) {
    const a: FormAnswer = {};
    const c = chosen[q.id] ?? [];
    const w = (words[q.id] ?? "").trim();
    if (c.length) a.chosen = c;
    if (w) a.text = w;
    answers[q.id] = a;
  }
  const problem = formProblem(form, answers);

  const pick = (qid: string, label: string, multi: boolean, on: boolean) => {
    setChosen((was) => {
      const now = was[qid] ?? [];
      const next = multi ? (on ? [...now, label] : now.filter((x) => x !== label)) : on ? [label] : [];
      return { ...was, [qid]: next };
    });
    // One answer to a single-choice part: a choice clears the words.
    if (!multi && on) setWords((was) => ({ ...was, [qid]: "" }));
  };

  return (
    <form
      className="question-form"
      data-testid={`form-${decisionId}`}
      onSubmit={(e) => {
        e.preventDefault();
        if (!problem) onAnswer(JSON.stringify(answers));
      }}
    >
      {form.questions.map((q) => (
        <fieldset key={q.id} className="form-question" data-testid={`form-question-${q.id}`}>
          <legend>
            {q.header ? <span className="tag">{q.header}</span> : null} {q.question}
          </legend>
          <p className="small muted">{q.multi_select ? t("inbox.form.chooseAny") : t("inbox.form.chooseOne")}</p>
          {q.choices.map((c) => {
            const on = (chosen[q.id] ?? []).includes(c.label);
            return (
              <label key={c.label} className="form-choice">
                <input
                  type={q.multi_select ? "checkbox" : "radio"}
                  name={`${decisionId}-${q.id}`}
                  checked={on}
                  disabled={locked}
                  onChange={(e) => pick(q.id, c.label, q.multi_select, e.target.checked)}
                  data-testid={`choice-${q.id}-${c.label}`}
                />
                <span>
                  <strong>{c.label}</strong>
                  {c.description ? <span className="small"> — {c.description}</span> : null}
                </span>
              </label>
            );
          })}
          {q.free_text && (
            <input
              aria-label={t("inbox.form.other")}
              placeholder={t("inbox.form.other")}
              value={words[q.id] ?? ""}
              disabled={locked}
              onChange={(e) => {
                const v = e.target.value;
                setWords((was) => ({ ...was, [q.id]: v }));
                if (!q.multi_select && v.trim()) setChosen((was) => ({ ...was, [q.id]: [] }));
              }}
              data-testid={`other-${q.id}`}
            />
          )}
        </fieldset>
      ))}
      <div className="row">
        <button type="submit" className="primary" disabled={locked || problem !== null} data-testid="send-answers">
          {t("inbox.form.send")}
        </button>
        {problem && <span className="small muted">{t("inbox.form.notYet")}</span>}
      </div>
    </form>
  );
}
