// Answering several approvals at once: each is still its own signed command, bound to the
// revision and digest its card showed when it was selected, sent one after another so that a
// conflict or an error on one leaves the others to go through.
import type { InboxItemView, SeenView } from "../bindings";
import type { Decide } from "./InboxCard";

export type BatchOutcome = {
  /** What stays selected: risky approvals (Approve leaves them to their own confirmation)
   * and those whose send failed. */
  left: Map<string, SeenView>;
  /** Counts of those left out, and each failure, for the person. */
  gone: number;
  risky: number;
  failures: { id: string; question: string; error: unknown }[];
};

export async function answerMany(pending: readonly InboxItemView[], selected: ReadonlyMap<string, SeenView>, op: "approve" | "deny", decide: Decide): Promise<BatchOutcome> {
  const byId = new Map(pending.map((i) => [i.decision.id, i]));
  const out: BatchOutcome = { left: new Map(), gone: 0, risky: 0, failures: [] };
  for (const [id, seen] of selected) {
    const item = byId.get(id);
    if (!item) {
      out.gone += 1;
      continue;
    }
    if (op === "approve" && item.decision.risky) {
      out.risky += 1;
      out.left.set(id, seen);
      continue;
    }
    try {
      await decide(id, op, null, null, seen);
    } catch (error) {
      out.failures.push({ id, question: item.decision.question, error });
      out.left.set(id, seen);
    }
  }
  return out;
}
