import { describe, expect, it } from "vitest";
import { translate } from "../i18n";
import { howClosed } from "../closed";
import { approval, NOW } from "./fixtures";

const t = (k: Parameters<typeof translate>[1], v?: Record<string, string | number>) => translate("en", k, v);

describe("how a decision closed, for a card that was open elsewhere", () => {
  const base = approval().decision;
  const answer = { device_id: "dev_2", device_name: "alice's laptop", step: "answered" as const, at: NOW - 120_000, detail: null };
  const outcome = (option: string, by: string) => ({ option, text: null, by, at: NOW - 120_000, edited_intent: null });

  it("names the device that answered, the option as labelled, and when", () => {
    const d = { ...base, status: "resolved" as const, options: [{ id: "approve", label: "Approve", gives_up: "", cost: null }], outcome: outcome("approve", "user:alice"), deliveries: [answer] };
    expect(howClosed(d, t, NOW)).toBe("Answered on alice's laptop · Approve · 2m ago");
  });

  it("says a rule, the default, the runtime or a void apart", () => {
    const rule = { ...base, status: "resolved" as const, outcome: outcome("approve", "rule:rul_1"), deliveries: [] };
    expect(howClosed(rule, t, NOW)).toMatch(/^Answered by a standing rule · approve/);
    const def = { ...base, status: "expired" as const, outcome: outcome("deny", "default") };
    expect(howClosed(def, t, NOW)).toMatch(/^Nobody answered: deny applied/);
    const rt = { ...base, status: "expired" as const, outcome: outcome("", "runtime") };
    expect(howClosed(rt, t, NOW)).toMatch(/^The runtime decided on its own/);
    const void_ = { ...base, status: "void" as const, outcome: null };
    expect(howClosed(void_, t, NOW)).toMatch(/^No longer asked/);
    // Answered without a device on record (an admin, an older server): who, instead.
    const admin = { ...base, status: "resolved" as const, outcome: outcome("deny", "admin"), deliveries: [] };
    expect(howClosed(admin, t, NOW)).toMatch(/^Answered by admin · deny/);
  });
});
