// How a decision closed, in one line for people: where it was answered (the device that
// answered it, from its proof of delivery), by a standing rule, by its default, by the runtime,
// or voided — for a card that was open when it closed somewhere else, and the app's and the
// phone's notices.
import type { DecisionView } from "./bindings";
import { ago } from "./format";
import type { T } from "./i18n";

/** The line: "Answered on alice's laptop · Approve · 2 min ago". */
export function howClosed(d: DecisionView, t: T, now = Date.now()): string {
  const o = d.outcome;
  const chosen = d.options.find((x) => x.id === o?.option)?.label ?? o?.option ?? "";
  const when = ago(o?.at ?? null, t, now);
  const answered = d.deliveries.filter((x) => x.step === "answered").pop();
  if (d.status === "resolved" && o?.by.startsWith("rule:")) return t("closed.rule", { what: chosen, when });
  if (d.status === "resolved") {
    return answered ? t("closed.answeredOn", { device: answered.device_name, what: chosen, when }) : t("closed.answered", { by: o?.by ?? "", what: chosen, when });
  }
  if (d.status === "expired") return o?.by === "runtime" ? t("closed.runtime", { when }) : t("closed.default", { what: chosen || t("closed.nothing"), when });
  return t("closed.void", { when });
}
