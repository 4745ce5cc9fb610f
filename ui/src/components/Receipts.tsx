// Test receipts: a fact about a run (parsed JUnit), not a claim in a transcript — totals,
// pass/fail, and each failure with its message.
import type { ReceiptView } from "../bindings";
import { useI18n } from "../i18n";
import { short } from "../format";

export function Receipts({ receipts }: { receipts: ReceiptView[] }) {
  const { t } = useI18n();
  if (receipts.length === 0) return <p className="muted">{t("inbox.noReceipts")}</p>;
  return (
    <ul className="receipts" data-testid="receipts">
      {receipts.map((r) => (
        <li key={r.id} className={r.passed ? "receipt ok" : "receipt bad"}>
          <div className="receipt-head">
            <span className={r.passed ? "pill ok" : "pill bad"}>{r.passed ? t("receipt.passed") : t("receipt.failed")}</span>
            <code className="cmd">{r.command}</code>
            {r.step && <span className="tag">{r.step}</span>}
          </div>
          <div className="muted small">
            {t("receipt.totals", {
              passed: r.totals.passed,
              failed: r.totals.failures + r.totals.errors,
              skipped: r.totals.skipped,
              tests: r.totals.tests,
            })}
            {" · "}
            {t("receipt.exit", { code: r.exit_code })}
            {r.commit && <> · {t("receipt.at", { commit: short(r.commit, 10) })}</>}
          </div>
          {r.failures.length > 0 && (
            <ul className="failures">
              {r.failures.map((f, i) => (
                <li key={i}>
                  <strong>
                    {f.classname ? `${f.classname}.` : ""}
                    {f.name}
                  </strong>{" "}
                  <span className="tag">{f.kind}</span>
                  <pre className="failure-msg">{f.message}</pre>
                </li>
              ))}
            </ul>
          )}
        </li>
      ))}
    </ul>
  );
}
