// Component tests: the screens' building blocks rendered with Testing Library and driven as a
// person would (clicks, keyboard), with fixture data in the shapes the shell sends.
import { describe, expect, it } from "vitest";
import { render, screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { ReactElement } from "react";
import type { ArtifactText, DecideOp, Operation, OutboxView, SeenView, SteerOp } from "../bindings";
import { I18nProvider, translate, type Lang } from "../i18n";
import { en } from "../i18n/en";
import { zh } from "../i18n/zh";
import { InboxCard, type Decide } from "../components/InboxCard";
import { answerMany } from "../components/batch";
import { DiffViewer, LARGE_FILE_LINES } from "../components/DiffViewer";
import { OfflineBanner } from "../components/OfflineBanner";
import { OutboxList } from "../components/Outbox";
import { SteerPanel } from "../components/SteerPanel";
import { ThreadRow } from "../components/ThreadRow";
import { Budget } from "../components/Badges";
import { CheckpointDiff, checkpointChanges } from "../components/CheckpointDiff";
import { DIFF, NOW, approval, checkpoint, outbox, row, status, task } from "./fixtures";

function ui(el: ReactElement, lang: Lang = "en") {
  return render(<I18nProvider initial={lang}>{el}</I18nProvider>);
}

type Call = { id: string; op: DecideOp; option: string | null; text: string | null };

/** The signed operation each answer becomes, as the companion signs it. */
const SIGNED: Record<DecideOp, Operation> = { approve: "approve", deny: "deny", answer: "answer_question", choose: "choose_option", wait: "defer" };

/** Records answers; plays the server's compare-and-set against the plan revision `serverAt`. */
function recorder(serverAt = 1) {
  const calls: Call[] = [];
  const seen: SeenView[] = [];
  const decide = async (id: string, op: DecideOp, option: string | null, text: string | null, s: SeenView): Promise<OutboxView> => {
    calls.push({ id, op, option, text });
    seen.push(s);
    return s.plan_revision === serverAt
      ? outbox({ operation: SIGNED[op], status: "delivered", based_on_revision: s.plan_revision })
      : outbox({ operation: SIGNED[op], status: "conflict", based_on_revision: s.plan_revision, met_revision: serverAt, what_changed: `the plan moved on: you decided at revision ${s.plan_revision}, it is now at revision ${serverAt}` });
  };
  return { calls, seen, decide };
}

const load = async (): Promise<ArtifactText> => ({ text: DIFF, size: DIFF.length, truncated: false });

describe("InboxCard", () => {
  it("shows the intent, its digest, the bound revision, expiry with the default, and receipts with failures", () => {
    const { decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />);
    expect(screen.getByRole("heading", { name: "Deploy a1f2c9d to staging?" })).toBeTruthy();
    expect(screen.getByText("staging")).toBeTruthy();
    expect(screen.getByTestId("intent-digest").textContent).toBe("ab12ab12ab12ab12…");
    expect(screen.getByText(/Bound to plan revision 1/)).toBeTruthy();
    expect(screen.getByTestId("closing").textContent).toBe("deny applies in 30:00");
    expect(screen.getByText("FAILED")).toBeTruthy();
    expect(screen.getByText(/AssertionError: assert 90/)).toBeTruthy();
  });

  it("opens the diff on demand in the diff viewer", async () => {
    const { decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />);
    expect(screen.queryByTestId("diff-viewer")).toBeNull();
    await userEvent.click(screen.getByTestId("show-diff"));
    const viewer = await screen.findByTestId("diff-viewer");
    expect(within(viewer).getByText("1 file(s), +1 −1")).toBeTruthy();
    expect(within(viewer).getByText("checkout/pricing.py")).toBeTruthy();
  });

  it("edits the command before approving: shows what changes, signs the edit with what the card showed", async () => {
    const { calls, decide } = recorder();
    const edits: { id: string; part: unknown; seen: SeenView }[] = [];
    const approveEdited = async (id: string, part: string, seen: SeenView): Promise<OutboxView> => {
      edits.push({ id, part: JSON.parse(part), seen });
      return outbox({ operation: "approve", status: "delivered", based_on_revision: seen.plan_revision });
    };
    const item = approval({
      question: "Claude Code wants to use Bash: rm -rf node_modules",
      intent: { tool: "Bash", input: { command: "rm -rf node_modules", description: "clean" } },
      editable: "/input",
    });
    ui(<InboxCard item={item} decide={decide} approveEdited={approveEdited} load={load} now={NOW} />);
    await userEvent.click(screen.getByTestId("edit"));
    const box = screen.getByTestId("edit-text") as HTMLTextAreaElement;
    expect(box.value).toBe("rm -rf node_modules");
    expect((screen.getByTestId("approve-edited") as HTMLButtonElement).disabled).toBe(true);
    await userEvent.clear(box);
    await userEvent.type(box, "rm -ri node_modules");
    const diff = screen.getByTestId("edit-diff");
    expect(diff.querySelector("del")?.textContent).toBe("rf");
    expect(diff.querySelector("ins")?.textContent).toBe("ri");
    await userEvent.click(screen.getByTestId("approve-edited"));
    expect(calls).toEqual([]);
    expect(edits).toEqual([
      { id: "dec_1", part: { command: "rm -ri node_modules", description: "clean" }, seen: { plan_revision: 1, intent_digest: "sha256:" + "ab12".repeat(16) } },
    ]);
    expect((await screen.findByTestId("decision-result")).textContent).toContain("delivered");
  });

  it("says where the decision stands on each device, and tells when the card is on screen", () => {
    const { decide } = recorder();
    const opened: string[] = [];
    const at = (minutes: number) => NOW - minutes * 60_000;
    const item = approval({
      deliveries: [
        { device_id: "dev_p", device_name: "alice's phone", step: "pushed", at: at(3), detail: "push.example accepted the push" },
        { device_id: "dev_p", device_name: "alice's phone", step: "shown", at: at(2), detail: null },
        { device_id: "dev_l", device_name: "laptop", step: "opened", at: at(1), detail: null },
      ],
    });
    ui(<InboxCard item={item} decide={decide} load={load} now={NOW} onOpened={(id) => opened.push(id)} />);
    expect(screen.getByTestId("deliveries").textContent).toBe("alice's phone: notified 2m ago, not yet opened · laptop: opened 1m ago");
    expect(opened).toEqual(["dec_1"]);
  });

  it("says so when no device has the decision yet", () => {
    const { decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />);
    expect(screen.getByTestId("deliveries").textContent).toBe("Not on any device yet.");
  });

  it("offers no edit where the runtime runs the intent only as asked", () => {
    const { decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} approveEdited={async () => outbox({})} load={load} now={NOW} />);
    expect(screen.queryByTestId("edit")).toBeNull();
  });

  it("answers a question in parts only once every part is answered, as the form's JSON answers", async () => {
    const { calls, decide } = recorder();
    const form = {
      questions: [
        { id: "q1", question: "Which database should I use?", header: "Database", choices: [{ label: "Postgres", description: "a server" }, { label: "SQLite", description: "a file" }], multi_select: false, free_text: true },
        { id: "q2", question: "Which checks should run?", header: "Checks", choices: [{ label: "unit" }, { label: "e2e" }, { label: "lint" }], multi_select: true, free_text: false },
      ],
    };
    const item = approval({ kind: "question", question: "Claude Code asks 2 questions", options: [], default_option: null, intent: { runtime: "claude-code", tool: "AskUserQuestion", form } });
    ui(<InboxCard item={item} decide={decide} load={load} now={NOW} />);
    const send = screen.getByTestId("send-answers") as HTMLButtonElement;
    expect(send.disabled).toBe(true);
    await userEvent.click(screen.getByTestId("choice-q1-SQLite"));
    expect(send.disabled).toBe(true);
    await userEvent.click(screen.getByTestId("choice-q2-unit"));
    await userEvent.click(screen.getByTestId("choice-q2-lint"));
    expect(send.disabled).toBe(false);
    // Words for a single-choice part replace its choice.
    await userEvent.type(screen.getByTestId("other-q1"), "DuckDB");
    await userEvent.click(send);
    expect(calls).toHaveLength(1);
    expect(calls[0].op).toBe("answer");
    expect(JSON.parse(calls[0].text!)).toEqual({ q1: { text: "DuckDB" }, q2: { chosen: ["unit", "lint"] } });
  });

  it("shows a plan as written and keeps planning with the person's feedback", async () => {
    const { calls, decide } = recorder();
    const plan = "# Plan\n\n1. Split the lexer\n2. Keep the public API";
    const item = approval({
      question: "Claude Code's plan is ready: approve it, or keep planning with your feedback",
      options: [
        { id: "approve", label: "Approve plan", gives_up: "", cost: null },
        { id: "deny", label: "Keep planning", gives_up: "", cost: null },
      ],
      intent: { tool: "ExitPlanMode", input: {}, plan },
    });
    ui(<InboxCard item={item} decide={decide} load={load} now={NOW} />);
    expect(screen.getByTestId("plan").textContent).toBe(plan);
    expect(screen.getByTestId("approve").textContent).toBe("Approve plan");
    await userEvent.type(screen.getByTestId("plan-feedback"), "keep the old parser");
    await userEvent.click(screen.getByTestId("deny"));
    expect(calls).toEqual([{ id: "dec_1", op: "deny", option: null, text: "keep the old parser" }]);
  });

  it("approves a plain approval with one click, bound to the decision", async () => {
    const { calls, seen, decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />);
    await userEvent.click(screen.getByTestId("approve"));
    expect(calls).toEqual([{ id: "dec_1", op: "approve", option: null, text: null }]);
    expect(seen).toEqual([{ plan_revision: 1, intent_digest: "sha256:" + "ab12".repeat(16) }]);
    expect((await screen.findByTestId("decision-result")).textContent).toContain("delivered");
  });

  it("asks a second time before approving a risky approval, and cancel sends nothing", async () => {
    const { calls, decide } = recorder();
    ui(<InboxCard item={approval({ risky: true })} decide={decide} load={load} now={NOW} />);
    await userEvent.click(screen.getByTestId("approve"));
    expect(calls).toHaveLength(0);
    expect(screen.getByRole("alertdialog")).toBeTruthy();
    await userEvent.click(screen.getByRole("button", { name: "Cancel" }));
    expect(calls).toHaveLength(0);
    await userEvent.click(screen.getByTestId("approve"));
    await userEvent.click(screen.getByTestId("confirm-approve"));
    expect(calls).toEqual([{ id: "dec_1", op: "approve", option: null, text: null }]);
  });

  it("says how the runtime holds an approval and sends the runtime's own choices bound to the digest", async () => {
    const { calls, decide } = recorder();
    const item = approval({
      durability: "connection_bound",
      options: [
        { id: "approve", label: "Accept", gives_up: "", cost: null },
        { id: "approve_session", label: "Accept for session", gives_up: "Codex stops asking for this command in this session", cost: null },
        { id: "deny", label: "Decline", gives_up: "", cost: null },
        { id: "deny_cancel", label: "Cancel the turn", gives_up: "the whole turn stops", cost: null },
      ],
    });
    ui(<InboxCard item={item} decide={decide} load={load} now={NOW} />);
    expect(screen.getByTestId("durability").textContent).toContain("if it closes, this approval expires");
    expect(screen.getByText("Gives up: the whole turn stops")).toBeTruthy();
    // A choice that grants more than this call says what it changes and needs a second tap.
    await userEvent.click(screen.getByTestId("option-approve_session"));
    expect(calls).toEqual([]);
    const dialog = screen.getByRole("alertdialog");
    expect(dialog.textContent).toContain("changes more than this one call");
    expect(dialog.textContent).toContain("Codex stops asking for this command in this session");
    await userEvent.click(screen.getByTestId("confirm-option"));
    await userEvent.click(screen.getByTestId("option-deny_cancel"));
    expect(calls).toEqual([
      { id: "dec_1", op: "approve", option: "approve_session", text: null },
      { id: "dec_1", op: "deny", option: "deny_cancel", text: null },
    ]);
  });

  it("says the runtime decides when a hook's approval runs out, not our default", () => {
    const hook = approval({ durability: "fail_open_hook", default_option: "deny" });
    const { unmount } = ui(<InboxCard item={hook} decide={recorder().decide} load={load} now={NOW} />);
    expect(screen.getByTestId("closing").textContent).toBe("Claude Code will ask in its own prompt in 30:00");
    unmount();
    const held = approval({ durability: "durable", default_option: "deny" });
    ui(<InboxCard item={held} decide={recorder().decide} load={load} now={NOW} />);
    expect(screen.getByTestId("closing").textContent).toBe("deny applies in 30:00");
  });

  it("counts down to the runtime's own deadline and, once it passed, lets nobody answer", () => {
    const hermes = approval({
      durability: "connection_bound",
      options: [
        { id: "approve", label: "Allow once", gives_up: "", cost: null },
        { id: "deny", label: "Deny", gives_up: "", cost: null },
      ],
      closing: { at: NOW + 42_000, runtime: "Hermes", then: "runtime_denies", option: null },
    });
    const { unmount } = ui(<InboxCard item={hermes} decide={recorder().decide} load={load} now={NOW} />);
    expect(screen.getByTestId("closing").textContent).toBe("Hermes will deny in 0:42: the call does not run");
    expect((screen.getByTestId("approve") as HTMLButtonElement).disabled).toBe(false);
    unmount();
    ui(<InboxCard item={hermes} decide={recorder().decide} load={load} now={NOW + 43_000} />);
    expect(screen.getByTestId("closing").textContent).toBe("Hermes has denied it on its own; the record follows");
    const approve = screen.getByTestId("approve") as HTMLButtonElement;
    expect(approve.disabled).toBe(true);
    expect((screen.getByTestId("deny") as HTMLButtonElement).disabled).toBe(true);
  });

  it("offers a headless Claude Code run's wait, signed bound to the card, and not once the runtime decided", async () => {
    const held = approval({
      durability: "fail_open_hook",
      can_wait: true,
      closing: { at: NOW + 60_000, runtime: "Claude Code", then: "runtime_denies", option: null },
    });
    const r = recorder();
    const { unmount } = ui(<InboxCard item={held} decide={r.decide} load={load} now={NOW} />);
    expect(screen.getByTestId("closing").textContent).toBe("Claude Code will deny in 1:00: the call does not run");
    expect(screen.getByTestId("wait-offer").textContent).toContain("Claude Code can wait for your answer instead");
    await userEvent.click(screen.getByTestId("wait"));
    expect(r.calls).toEqual([{ id: "dec_1", op: "wait", option: null, text: null }]);
    expect(r.seen[0]).toEqual({ plan_revision: 1, intent_digest: held.decision.intent_digest });
    unmount();
    ui(<InboxCard item={held} decide={recorder().decide} load={load} now={NOW + 61_000} />);
    expect(screen.queryByTestId("wait-offer")).toBeNull();
  });

  it("offers no wait where the runtime cannot", () => {
    ui(<InboxCard item={approval({ durability: "fail_open_hook" })} decide={recorder().decide} load={load} now={NOW} />);
    expect(screen.queryByTestId("wait-offer")).toBeNull();
  });

  it("shows a flat object in the intent as key: value pairs, not JSON", () => {
    const item = approval({ kind: "budget", intent: { threshold: 0.8, usage: { tokens: 32300, cost_usd: 0.19, wall_seconds: 7 } }, intent_digest: null });
    ui(<InboxCard item={item} decide={recorder().decide} load={load} now={NOW} />);
    expect(screen.getByText("tokens: 32300 · cost_usd: 0.19 · wall_seconds: 7")).toBeTruthy();
  });

  it("selects an approval with what its card shows, for answering several at once", async () => {
    const picked: [string, SeenView | null][] = [];
    const item = approval({});
    ui(<InboxCard item={item} decide={recorder().decide} load={load} now={NOW} selected={false} onSelect={(id, seen) => picked.push([id, seen])} />);
    await userEvent.click(screen.getByTestId("select"));
    expect(picked).toEqual([[item.decision.id, { plan_revision: item.plan_revision, intent_digest: item.decision.intent_digest }]]);
  });

  it("answers several approvals as separate commands: a conflict on one, a failure on another, the rest still go", async () => {
    const { calls, decide } = recorder(1);
    const a = approval({ id: "dec_a" });
    const b = approval({ id: "dec_b" });
    const c = approval({ id: "dec_c" });
    const r = approval({ id: "dec_r", risky: true });
    const failing: Decide = async (id, op, option, text, seen) => {
      if (id === "dec_c") throw new Error("the outbox is full");
      return decide(id, op, option, text, seen);
    };
    const selected = new Map<string, SeenView>([
      ["dec_a", { plan_revision: 1, intent_digest: a.decision.intent_digest }],
      ["dec_b", { plan_revision: 0, intent_digest: b.decision.intent_digest }], // seen before a replan: conflict
      ["dec_c", { plan_revision: 1, intent_digest: c.decision.intent_digest }],
      ["dec_r", { plan_revision: 1, intent_digest: r.decision.intent_digest }],
      ["dec_gone", { plan_revision: 1, intent_digest: null }],
    ]);
    const out = await answerMany([a, b, c, r], selected, "approve", failing);
    expect(calls.map((x) => x.id)).toEqual(["dec_a", "dec_b"]);
    expect(out.gone).toBe(1);
    expect(out.risky).toBe(1);
    expect(out.failures.map((f) => f.id)).toEqual(["dec_c"]);
    expect([...out.left.keys()].sort()).toEqual(["dec_c", "dec_r"]);
    // Deny takes the risky one too.
    const denied = await answerMany([r], new Map([["dec_r", selected.get("dec_r")!]]), "deny", decide);
    expect(denied.left.size).toBe(0);
    expect(calls.at(-1)).toEqual({ id: "dec_r", op: "deny", option: null, text: null });
  });

  it("shows what each budget option gives up and sends the chosen one", async () => {
    const { calls, decide } = recorder();
    const item = approval({
      kind: "budget",
      question: "The suite is over its time budget",
      intent: null,
      intent_digest: null,
      default_option: "relevant_tests",
      options: [
        { id: "relevant_tests", label: "Run only relevant tests", gives_up: "coverage of unrelated modules", cost: "+4 min" },
        { id: "full_suite", label: "Continue the full suite", gives_up: "40 more minutes", cost: "+40 min, ~$1.40" },
        { id: "stop_patch", label: "Stop and deliver the patch", gives_up: "verification of the last two steps", cost: null },
      ],
    });
    ui(<InboxCard item={item} decide={decide} load={load} now={NOW} />);
    expect(screen.getByText("Gives up: coverage of unrelated modules")).toBeTruthy();
    expect(screen.getByText("Gives up: verification of the last two steps")).toBeTruthy();
    expect(screen.getByText("Cost: +40 min, ~$1.40")).toBeTruthy();
    expect(screen.getByTestId("closing").textContent).toMatch(/^Run only relevant tests applies in /);
    await userEvent.click(screen.getByTestId("option-full_suite"));
    expect(calls).toEqual([{ id: "dec_1", op: "choose", option: "full_suite", text: null }]);
  });

  it("warns when the approval was asked at an older plan revision", () => {
    const { decide } = recorder();
    ui(<InboxCard item={{ ...approval(), plan_revision: 2, stale: true }} decide={decide} load={load} now={NOW} />);
    expect(screen.getByText(/Asked at plan revision 1; the plan is now at revision 2/)).toBeTruthy();
  });

  it("shows a refusal from the shell instead of pretending it was sent", async () => {
    const decide = async (): Promise<OutboxView> => {
      throw { code: "keychain", message: "the device key is not in the kernel keyring" };
    };
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />);
    await userEvent.click(screen.getByTestId("deny"));
    expect((await screen.findByRole("alert")).textContent).toContain("the device key is not in the kernel keyring");
  });
});

describe("DiffViewer", () => {
  it("switches between split and unified views", async () => {
    ui(<DiffViewer text={DIFF} initialView="split" />);
    const unified = screen.getByRole("button", { name: "Unified" });
    const split = screen.getByRole("button", { name: "Split" });
    expect(split.getAttribute("aria-pressed")).toBe("true");
    expect(document.querySelector(".diff-split")).not.toBeNull();
    await userEvent.click(unified);
    expect(unified.getAttribute("aria-pressed")).toBe("true");
    expect(document.querySelector(".diff-unified")).not.toBeNull();
  });

  it("collapses a very large file until asked", async () => {
    const lines = Array.from({ length: LARGE_FILE_LINES + 10 }, (_, i) => `+line ${i}`).join("\n");
    const big = `diff --git a/big.txt b/big.txt\nnew file mode 100644\n--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,${LARGE_FILE_LINES + 10} @@\n${lines}\n`;
    ui(<DiffViewer text={big} />);
    expect(screen.getByText(/Large file \(1510 changed lines\)/)).toBeTruthy();
    expect(document.querySelectorAll(".diff-code-insert").length).toBe(0);
    await userEvent.click(screen.getByRole("button", { name: "Show anyway" }));
    expect(document.querySelectorAll(".diff-code-insert").length).toBe(LARGE_FILE_LINES + 10);
  });
});

describe("OfflineBanner and outbox", () => {
  it("says offline with the last sync time and the queued commands", () => {
    ui(<OfflineBanner status={status({ connected: false, queued: 1, last_sync_at: NOW - 5 * 60_000 })} retry={() => {}} pair={() => {}} now={NOW} />);
    const banner = screen.getByTestId("offline-banner");
    expect(banner.textContent).toContain("last synced 5m ago");
    expect(banner.textContent).toContain("1 command(s) queued");
  });

  it("is absent while the stream is open", () => {
    ui(<OfflineBanner status={status()} retry={() => {}} pair={() => {}} now={NOW} />);
    expect(screen.queryByTestId("offline-banner")).toBeNull();
  });

  it("shows each command's state and, for a conflict, what changed", () => {
    ui(
      <OutboxList
        now={NOW}
        entries={[
          outbox(),
          outbox({ command_id: "cmd_2", operation: "approve", status: "conflict", met_revision: 2, what_changed: "you decided at plan revision 1; the plan is now at revision 2 (running)" }),
          outbox({ command_id: "cmd_3", operation: "resume", status: "acknowledged" }),
        ]}
      />,
    );
    expect(screen.getByText("queued")).toBeTruthy();
    expect(screen.getByText("acknowledged")).toBeTruthy();
    expect(screen.getByText("conflict")).toBeTruthy();
    expect(screen.getByText(/the plan is now at revision 2/)).toBeTruthy();
    expect(screen.getByTestId("outbox-approve").dataset.status).toBe("conflict");
  });
});

describe("a sync that moves the plan between render and tap", () => {
  const moved = { ...approval({ risky: true, plan_revision: 1 }), plan_revision: 2, stale: true };

  it("signs a risky approval's confirmation with what it asked about, and shows the conflict", async () => {
    const { seen, decide } = recorder(2);
    const { rerender } = ui(<InboxCard item={approval({ risky: true })} decide={decide} load={load} now={NOW} />);
    await userEvent.click(screen.getByTestId("approve"));
    expect(screen.getByRole("alertdialog").textContent).toContain("at plan revision 1");
    // The mirror moves on while the confirmation is open.
    rerender(
      <I18nProvider initial="en">
        <InboxCard item={{ ...moved, decision: { ...moved.decision, intent_digest: "sha256:" + "cd34".repeat(16) } }} decide={decide} load={load} now={NOW} />
      </I18nProvider>,
    );
    expect(screen.getByTestId("confirm-moved").textContent).toContain("revision 2");
    expect(screen.getByRole("alertdialog").textContent).toContain("at plan revision 1");
    await userEvent.click(screen.getByTestId("confirm-approve"));
    expect(seen).toEqual([{ plan_revision: 1, intent_digest: "sha256:" + "ab12".repeat(16) }]);
    const result = await screen.findByTestId("decision-result");
    expect(result.textContent).toContain("conflict");
    expect(result.textContent).toContain("now at revision 2");
  });

  it("signs a replan's confirmation with the revision it asked about, and shows the conflict", async () => {
    const calls: number[] = [];
    const steer = async (_id: string, op: SteerOp, _i: string | null, _s: string[], rev: number) => {
      calls.push(rev);
      return rev === 2 ? outbox({ operation: op, status: "delivered", based_on_revision: rev }) : outbox({ operation: op, status: "conflict", based_on_revision: rev, met_revision: 2, what_changed: "the plan moved on: it is now at revision 2" });
    };
    const { rerender } = ui(<SteerPanel task={task} steps={row.stages} steer={steer} />);
    await userEvent.click(screen.getByTestId("steer-replan"));
    await userEvent.type(screen.getByRole("textbox"), "report only");
    await userEvent.click(screen.getByRole("button", { name: "Send" }));
    expect(screen.getByText(/Replan at revision 1\?/)).toBeTruthy();
    rerender(
      <I18nProvider initial="en">
        <SteerPanel task={{ ...task, plan_revision: 2 }} steps={row.stages} steer={steer} />
      </I18nProvider>,
    );
    expect(screen.getByText(/Replan at revision 1\?/)).toBeTruthy();
    expect(screen.getByTestId("steer-moved").textContent).toContain("revision 2");
    await userEvent.click(screen.getByTestId("steer-confirm"));
    expect(calls).toEqual([1]);
    expect((await screen.findByTestId("steer-result")).textContent).toContain("now at revision 2");
    // A tap after the new revision is on screen is signed with it.
    await userEvent.click(screen.getByTestId("steer-pause"));
    expect(calls).toEqual([1, 2]);
  });
});

describe("SteerPanel", () => {
  function steerer() {
    const calls: { op: SteerOp; instructions: string | null; suspend: string[]; rev: number }[] = [];
    const steer = async (_id: string, op: SteerOp, instructions: string | null, suspend: string[], rev: number) => {
      calls.push({ op, instructions, suspend, rev });
      return outbox({ operation: op });
    };
    return { calls, steer };
  }

  it("shows the plan revision a command is based on and pauses without a confirmation", async () => {
    const { calls, steer } = steerer();
    ui(<SteerPanel task={task} steps={row.stages} steer={steer} />);
    expect(screen.getByTestId("steer-revision").textContent).toContain("plan revision 1");
    await userEvent.click(screen.getByTestId("steer-pause"));
    expect(calls.map((c) => c.op)).toEqual(["pause"]);
    expect((await screen.findByTestId("steer-result")).textContent).toContain("Queued");
  });

  it("confirms before cancelling", async () => {
    const { calls, steer } = steerer();
    ui(<SteerPanel task={task} steps={row.stages} steer={steer} />);
    await userEvent.click(screen.getByTestId("steer-cancel"));
    expect(calls).toHaveLength(0);
    await userEvent.click(screen.getByTestId("steer-confirm"));
    expect(calls.map((c) => c.op)).toEqual(["cancel"]);
  });

  it("replans with instructions and the steps to suspend, after confirming", async () => {
    const { calls, steer } = steerer();
    ui(<SteerPanel task={task} steps={row.stages} steer={steer} />);
    await userEvent.click(screen.getByTestId("steer-replan"));
    await userEvent.type(screen.getByRole("textbox"), "do not deploy; write the report only");
    await userEvent.click(screen.getByRole("checkbox", { name: "Deploy to staging (needs approval)" }));
    await userEvent.click(screen.getByRole("button", { name: "Send" }));
    expect(screen.getByText(/Replan at revision 1\? Pending approvals become void/)).toBeTruthy();
    await userEvent.click(screen.getByTestId("steer-confirm"));
    expect(calls).toEqual([{ op: "replan", instructions: "do not deploy; write the report only", suspend: ["deploy_staging"], rev: 1 }]);
  });

  it("offers resume for a paused task and nothing for a finished one", () => {
    const { steer } = steerer();
    const { unmount } = ui(<SteerPanel task={{ ...task, state: "paused" }} steps={row.stages} steer={steer} />);
    expect(screen.getByTestId("steer-resume")).toBeTruthy();
    expect(screen.queryByTestId("steer-pause")).toBeNull();
    unmount();
    ui(<SteerPanel task={{ ...task, state: "completed", terminal: true }} steps={row.stages} steer={steer} />);
    expect(screen.getByText(/This run has ended \(completed\)/)).toBeTruthy();
  });
});

describe("Threads", () => {
  it("shows progress as stages done, never a percentage, with the budget and the last checkpoint", () => {
    ui(<ThreadRow row={row} open={() => {}} now={NOW} />);
    expect(screen.getAllByText("3 of 4 stages done").length).toBeGreaterThan(0);
    expect(document.body.textContent).not.toMatch(/\d+%/);
    expect(screen.getByText("1 decision(s) waiting")).toBeTruthy();
    expect(screen.getByText(/Checkpoint #4 \(human_wait\)/)).toBeTruthy();
    expect(screen.getByRole("meter", { name: "Time" }).getAttribute("aria-valuenow")).toBe("900");
  });

  it("says whose a delegated thread is, and nothing for one's own", () => {
    const { unmount } = ui(<ThreadRow row={row} open={() => {}} now={NOW} />);
    expect(screen.queryByTestId("thread-on-behalf-of")).toBeNull();
    unmount();
    ui(<ThreadRow row={{ ...row, on_behalf_of: "alice" }} open={() => {}} now={NOW} />);
    expect(screen.getByTestId("thread-on-behalf-of").textContent).toBe("for alice");
  });

  it("says so when a task has no budget limits", () => {
    ui(<Budget budget={{ ...task.budget, max_wall_seconds: null }} />);
    expect(screen.getByText("No budget limits")).toBeTruthy();
  });
});

describe("CheckpointDiff", () => {
  const a = checkpoint(2, { completed_steps: [{ step: "reproduce", artifact_digests: [], verified: true }], effects: [{ effect_id: "eff_1", status: "intended" }] });
  const b = checkpoint(5, {
    completed_steps: [
      { step: "reproduce", artifact_digests: [], verified: true },
      { step: "fix", artifact_digests: ["sha256:cd"], verified: false },
    ],
    commit: "a1f2c9d",
    pending_step: { step: "deploy_staging", intent_digest: null, idempotency_key: "k", approval_id: "dec_1" },
    effects: [{ effect_id: "eff_1", status: "unknown" }],
  });

  it("finds steps completed in between, the commit, the step in flight and effect changes", () => {
    const ch = checkpointChanges(a, b);
    expect(ch.steps.map((s) => s.step)).toEqual(["fix"]);
    expect(ch.commit).toEqual(["3b18e51", "a1f2c9d"]);
    expect(ch.pending).toEqual(["—", "deploy_staging"]);
    expect(ch.effects).toEqual([{ id: "eff_1", from: "intended", to: "unknown" }]);
    expect(ch.revision).toBeNull();
  });

  it("renders the bodies as a diff", () => {
    ui(<CheckpointDiff a={a} b={b} />);
    expect(screen.getByText("Effect eff_1: intended → unknown")).toBeTruthy();
    expect(screen.getByTestId("diff-viewer")).toBeTruthy();
  });
});

describe("i18n", () => {
  it("translates every English key into Simplified Chinese", () => {
    const missing = Object.keys(en).filter((k) => !(k in zh) || !zh[k as keyof typeof en].trim());
    expect(missing).toEqual([]);
    for (const k of Object.keys(en) as (keyof typeof en)[]) {
      const vars = (s: string) => [...s.matchAll(/\{(\w+)\}/g)].map((m) => m[1]).sort();
      expect({ k, v: vars(zh[k]) }).toEqual({ k, v: vars(en[k]) });
    }
  });

  it("renders a card in Chinese", () => {
    const { decide } = recorder();
    ui(<InboxCard item={approval()} decide={decide} load={load} now={NOW} />, "zh-CN");
    expect(screen.getByTestId("approve").textContent).toBe("批准");
    expect(screen.getByText(/绑定到计划版本 1/)).toBeTruthy();
    expect(translate("zh-CN", "banner.queued", { n: 2 })).toBe("2 条命令已排队；恢复连接后只投递一次。");
  });
});
