// Escalation in the UI: the inbox card says who was notified and who is next, and the policy
// editor saves what the person set (the server's refusal shown as it is). The shell is mocked.
import { describe, expect, it, vi } from "vitest";
import { render, screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { DelegationView, DeviceView, EscalationPolicyView } from "../bindings";
import { I18nProvider } from "../i18n";
import { EscalationEditor } from "../components/Escalation";
import { Delegates } from "../components/Delegates";
import { InboxCard } from "../components/InboxCard";
import { DIFF, NOW, approval } from "./fixtures";

const shell = vi.hoisted(() => ({
  policy: null as EscalationPolicyView | null,
  saved: [] as (EscalationPolicyView | null)[],
  refuse: null as string | null,
  delegates: {
    user: "alice",
    delegates: [] as DelegationView[],
    delegated_by: [{ user: "carol", since: 0, state: "accepted", accepted_at: 0 }] as DelegationView[],
  },
  delegateCalls: [] as [string, boolean][],
  answers: [] as [string, boolean][],
}));

vi.mock("../data", () => ({
  commands: {
    getDelegates: async () => shell.delegates,
    setDelegate: async (user: string, add: boolean) => {
      shell.delegateCalls.push([user, add]);
      if (user === "nobody") throw new Error("no user `nobody` (not_found)");
      shell.delegates = {
        ...shell.delegates,
        delegates: add ? [...shell.delegates.delegates, { user, since: 0, state: "offered", accepted_at: null }] : shell.delegates.delegates.filter((d) => d.user !== user),
      };
      return shell.delegates;
    },
    answerDelegation: async (owner: string, accept: boolean) => {
      shell.answers.push([owner, accept]);
      const rest = shell.delegates.delegated_by.filter((d) => d.user !== owner);
      shell.delegates = { ...shell.delegates, delegated_by: accept ? [...rest, { user: owner, since: 0, state: "accepted", accepted_at: 1 }] : rest };
      return shell.delegates;
    },
    getEscalation: async () => shell.policy,
    setEscalation: async (p: EscalationPolicyView | null) => {
      if (shell.refuse) throw new Error(shell.refuse);
      shell.saved.push(p);
      shell.policy = p;
      return p;
    },
  },
  errorText: (e: unknown) => (e as Error).message,
  loadText: async () => ({ text: DIFF, size: DIFF.length, truncated: false }),
}));

const device = (id: string, name: string): DeviceView => ({ id, name, user: "alice", scopes: ["view"], this_device: id === "dev_laptop", created_at: NOW, revoked_at: null, last_seen_at: NOW, stale: false });
const ui = (el: React.ReactElement) => render(<I18nProvider initial="en">{el}</I18nProvider>);

describe("escalation", () => {
  it("the card says who was notified and who is next, counting down", () => {
    const item = approval({ escalation: { notified: ["laptop"], next_devices: ["alice's phone"], next_at: NOW + 8 * 60_000, held_until: null, stopped: null, reminded: 0, next_reminder_at: null } });
    ui(<InboxCard item={item} decide={async () => { throw new Error("unused"); }} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    expect(screen.getByTestId("escalation").textContent).toBe("Notified laptop · next: alice's phone in 8:00 if unopened");
  });

  it("the card says how often it was reminded and when the next reminder comes", () => {
    const item = approval({ escalation: { notified: ["laptop"], next_devices: [], next_at: null, held_until: null, stopped: "opened on laptop", reminded: 2, next_reminder_at: NOW + 30 * 60_000 } });
    ui(<InboxCard item={item} decide={async () => { throw new Error("unused"); }} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    expect(screen.getByTestId("escalation").textContent).toBe("Notified laptop · no one further: opened on laptop · reminded 2× · next reminder in 30:00");
  });

  it("the card says when quiet hours hold it and when opening it stopped the rest", () => {
    const held = approval({ escalation: { notified: [], next_devices: ["laptop"], next_at: NOW - 1000, held_until: Date.UTC(2025, 0, 16, 7, 0), stopped: null, reminded: 0, next_reminder_at: null } });
    const { unmount } = ui(<InboxCard item={held} decide={async () => { throw new Error("unused"); }} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    expect(screen.getByTestId("escalation").textContent).toMatch(/^No device notified yet · held by quiet hours until .+ · next: laptop in 0:00 if unopened$/);
    unmount();
    const stopped = approval({ escalation: { notified: ["laptop", "alice's phone"], next_devices: [], next_at: null, held_until: null, stopped: "opened on alice's phone", reminded: 0, next_reminder_at: null } });
    ui(<InboxCard item={stopped} decide={async () => { throw new Error("unused"); }} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    expect(screen.getByTestId("escalation").textContent).toBe("Notified laptop, alice's phone · no one further: opened on alice's phone");
  });

  it("the editor saves the steps and quiet hours set, and shows a refusal as the server said it", async () => {
    shell.policy = null;
    shell.saved = [];
    ui(<EscalationEditor devices={[device("dev_laptop", "laptop"), device("dev_phone", "alice's phone")]} />);
    await screen.findByTestId("escalation-editor");
    expect(screen.getByText(/No policy: every device/)).toBeTruthy();
    await userEvent.click(screen.getByTestId("escalation-add"));
    await userEvent.click(screen.getByLabelText("laptop"));
    await userEvent.click(screen.getByTestId("escalation-add"));
    await userEvent.click(screen.getAllByLabelText("alice's phone")[1]);
    await userEvent.click(screen.getByTestId("escalation-quiet"));
    await userEvent.click(screen.getByTestId("escalation-remind"));
    await userEvent.clear(screen.getByTestId("escalation-remind-every"));
    await userEvent.type(screen.getByTestId("escalation-remind-every"), "45");
    await userEvent.click(screen.getByTestId("escalation-save"));
    await waitFor(() => expect(shell.saved).toHaveLength(1));
    expect(shell.saved[0]?.reminders).toEqual({ every_minutes: 45, at_most: 3 });
    expect(shell.saved[0]?.steps).toEqual([
      { after_minutes: 0, devices: ["dev_laptop"], people: [] },
      { after_minutes: 10, devices: ["dev_phone"], people: [] },
    ]);
    expect(shell.saved[0]?.quiet_hours).toMatchObject({ from: "22:00", to: "07:00" });
    expect(screen.getByRole("status").textContent).toContain("Saved");

    shell.refuse = "step 1: device `dev_phone` (alice's phone) is revoked (validation_failed)";
    await userEvent.click(screen.getByTestId("escalation-save"));
    expect((await screen.findByTestId("escalation-error")).textContent).toContain("is revoked");
    shell.refuse = null;
  });

  it("a step can notify a person the user delegates to, and a saved step keeps the people it names", async () => {
    shell.policy = { steps: [{ after_minutes: 0, devices: ["dev_laptop"], people: ["dave"] }], quiet_hours: null };
    shell.saved = [];
    ui(<EscalationEditor devices={[device("dev_laptop", "laptop")]} people={["bob"]} />);
    await screen.findByTestId("escalation-editor");
    // dave is no longer a delegate, but the saved step still names him: shown, checked, removable.
    expect((screen.getByLabelText("dave (every device of theirs)") as HTMLInputElement).checked).toBe(true);
    await userEvent.click(screen.getByTestId("escalation-add"));
    await userEvent.click(screen.getAllByLabelText("bob (every device of theirs)")[1]);
    await userEvent.click(screen.getByTestId("escalation-save"));
    await waitFor(() => expect(shell.saved).toHaveLength(1));
    expect(shell.saved[0]?.steps).toEqual([
      { after_minutes: 0, devices: ["dev_laptop"], people: ["dave"] },
      { after_minutes: 10, devices: [], people: ["bob"] },
    ]);
  });

  it("delegates: added by name, removed, a refusal shown, and whose decisions this user answers", async () => {
    shell.delegateCalls = [];
    const seen: string[][] = [];
    ui(<Delegates onChange={(n) => seen.push(n)} />);
    expect(await screen.findByText("Nobody else answers your decisions.")).toBeTruthy();
    expect(screen.getByText("You may answer the decisions of: carol")).toBeTruthy();
    await userEvent.type(screen.getByTestId("delegate-name"), " bob ");
    await userEvent.click(screen.getByTestId("delegate-add"));
    await screen.findByTestId("delegate-bob");
    expect(shell.delegateCalls).toEqual([["bob", true]]);
    expect(seen.at(-1)).toEqual(["bob"]);
    await userEvent.type(screen.getByTestId("delegate-name"), "nobody");
    await userEvent.click(screen.getByTestId("delegate-add"));
    expect((await screen.findByTestId("delegates-error")).textContent).toContain("no user `nobody`");
    await userEvent.click(screen.getByRole("button", { name: "Remove" }));
    await waitFor(() => expect(screen.queryByTestId("delegate-bob")).toBeNull());
    expect(seen.at(-1)).toEqual([]);
  });

  it("delegates: an offer waits for its delegate, who accepts or declines it, and may stop answering later", async () => {
    shell.answers = [];
    shell.delegates = {
      user: "alice",
      delegates: [{ user: "bob", since: 0, state: "offered", accepted_at: null }],
      delegated_by: [
        { user: "carol", since: 0, state: "accepted", accepted_at: 0 },
        { user: "dave", since: 0, state: "offered", accepted_at: null },
        { user: "erin", since: 0, state: "offered", accepted_at: null },
      ],
    };
    ui(<Delegates onChange={() => {}} />);
    // The owner's side: bob has not answered yet.
    expect((await screen.findByTestId("delegate-bob")).textContent).toContain("waiting for bob to accept");
    // The delegate's side: dave's and erin's offers, carol's accepted one.
    expect(screen.getByTestId("offer-dave").textContent).toContain("dave asks you to answer their decisions");
    expect(screen.getByText("You may answer the decisions of: carol")).toBeTruthy();
    await userEvent.click(screen.getByTestId("offer-accept-dave"));
    await waitFor(() => expect(screen.queryByTestId("offer-dave")).toBeNull());
    expect(screen.getByText("You may answer the decisions of: carol, dave")).toBeTruthy();
    await userEvent.click(screen.getByTestId("offer-decline-erin"));
    await waitFor(() => expect(screen.queryByTestId("offer-erin")).toBeNull());
    await userEvent.click(screen.getByTestId("answering-leave-carol"));
    await waitFor(() => expect(screen.queryByTestId("answering-carol")).toBeNull());
    expect(shell.answers).toEqual([
      ["dave", true],
      ["erin", false],
      ["carol", false],
    ]);
  });
});
