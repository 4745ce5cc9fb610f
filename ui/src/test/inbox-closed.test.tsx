// A card open on this device whose decision closes elsewhere (another device, a rule, the
// default, the runtime) does not just vanish: the inbox says how it closed. One answered here
// says what was sent instead, never "answered elsewhere".
import { describe, expect, it, vi } from "vitest";
import { render, screen, waitFor } from "@testing-library/react";
import type { InboxItemView } from "../bindings";
import { I18nProvider } from "../i18n";
import { InboxScreen } from "../screens/Inbox";
import { approval, NOW } from "./fixtures";

const mirror = vi.hoisted(() => ({ data: null as unknown, threads: new Map<string, unknown>() }));

vi.mock("../data", () => ({
  useMirror: () => ({ data: mirror.data, error: null, reload: () => {} }),
  commands: {
    listMachines: async () => [],
    markOpened: async (ids: string[]) => ids.length,
    getThread: async (id: string) => mirror.threads.get(id),
  },
  events: {},
  errorText: (e: unknown) => String(e),
  loadText: async () => ({ text: "", size: 0, truncated: false }),
}));

function show(items: InboxItemView[]) {
  mirror.data = items;
  return (
    <I18nProvider initial="en">
      <InboxScreen go={() => {}} />
    </I18nProvider>
  );
}

describe("a decision that closes while its card is shown", () => {
  it("is replaced by how it closed: where it was answered, what, and when", async () => {
    const open = approval({ id: "dec_9", task_id: "task_9", question: "Deploy to staging?" });
    const closed = {
      ...open.decision,
      status: "resolved" as const,
      options: [{ id: "approve", label: "Approve", gives_up: "", cost: null }],
      outcome: { option: "approve", text: null, by: "user:alice", at: NOW, edited_intent: null },
      deliveries: [{ device_id: "dev_2", device_name: "alice's laptop", step: "answered" as const, at: NOW, detail: null }],
    };
    mirror.threads.set("task_9", { decisions: [closed] });
    const { rerender } = render(show([open]));
    expect(screen.getByText("Deploy to staging?")).toBeTruthy();
    rerender(show([]));
    await waitFor(() => expect(screen.getByTestId("closed-elsewhere").textContent).toMatch(/^Deploy to staging\? — Answered on alice's laptop · Approve · /));
  });

  it("says nothing for a decision still pending in its thread (the mirror moved it, nothing closed)", async () => {
    const open = approval({ id: "dec_8", task_id: "task_8" });
    mirror.threads.set("task_8", { decisions: [open.decision] });
    const { rerender } = render(show([open]));
    rerender(show([]));
    await new Promise((r) => setTimeout(r, 20));
    expect(screen.queryByTestId("closed-elsewhere")).toBeNull();
  });
});
