// Standing rules in the UI: what "Always allow…" reads from each runtime's intent (the fixture
// the Rust `intent_facts` is tested with), the Rules screen (list, revoke, a new rule, the
// second confirmation of a rule that allows risky calls) and the card's pre-filled form.
// The shell is mocked: what it was asked to sign is what the test reads.
import { beforeEach, describe, expect, it, vi } from "vitest";
import { render, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { ReactElement } from "react";
import type { NewRuleView, RuleAddedView, RuleView, RuntimeRuleView } from "../bindings";
import { I18nProvider } from "../i18n";
import fixture from "../web/fixtures/intent-facts.json";
import { blankRule, intentFacts, literalGlob, ruleFromIntent, ruleProblem, unwrapShell } from "../rules";
import { InboxCard } from "../components/InboxCard";
import { RulesScreen } from "../screens/Rules";
import { NOW, approval, outbox } from "./fixtures";

const shell = vi.hoisted(() => ({ rules: [] as unknown[], runtime: [] as unknown[], added: [] as unknown[], revoked: [] as string[], refuse: null as string | null }));

vi.mock("../data", () => ({
  commands: {
    listRules: async () => ({ rules: shell.rules, runtime_rules: shell.runtime }),
    addRule: async (rule: unknown) => {
      if (shell.refuse) throw new Error(shell.refuse);
      shell.added.push(rule);
      return { rule_id: "rul_new", detail: "rule rul_new: allow tool Bash until 22 Jan 2025 12:00 UTC" };
    },
    revokeRule: async (id: string) => {
      shell.revoked.push(id);
      return "revoked";
    },
  },
  errorText: (e: unknown) => (e as Error).message,
}));

function ui(el: ReactElement) {
  return render(<I18nProvider initial="en">{el}</I18nProvider>);
}

function rule(over: Partial<RuleView> = {}): RuleView {
  return {
    id: "rul_1",
    digest: "sha256:" + "a".repeat(64),
    device_name: "alice's phone",
    runtime: null,
    machine: null,
    directory: "/home/alice/src/shop",
    tool: "Bash",
    pattern: "npm test*",
    pattern_kind: "glob",
    answer: "allow",
    note: "tests are fine",
    allow_risky: false,
    created_at: NOW - 86_400_000,
    expires_at: NOW + 6 * 86_400_000,
    revoked_at: null,
    uses: 3,
    last_used_at: NOW - 120_000,
    live: true,
    ...over,
  };
}

beforeEach(() => {
  shell.rules = [];
  shell.runtime = [];
  shell.added = [];
  shell.revoked = [];
  shell.refuse = null;
});

describe("what a rule sees of an intent", () => {
  it("reads every runtime's shape as the server does (the shared fixture)", () => {
    for (const c of fixture.cases) expect(intentFacts(c.intent), c.name).toEqual(c.facts);
  });

  it("unwraps a shell only when it is all there is", () => {
    expect(unwrapShell("/bin/bash -lc 'npm test'")).toBe("npm test");
    expect(unwrapShell("bash -lc 'a' && rm -rf ~")).toBe("bash -lc 'a' && rm -rf ~");
  });

  it("pre-fills a literal pattern, the tool and the directory; other inputs leave the pattern empty", () => {
    const r = ruleFromIntent({ method: "item/commandExecution/requestApproval", params: { command: "ls *.rs", cwd: "/w" } });
    expect(r).toMatchObject({ tool: "commandExecution", pattern: "ls \\*.rs", pattern_kind: "glob", directory: "/w", answer: "allow", days: 7 });
    expect(literalGlob("a?b\\c")).toBe("a\\?b\\\\c");
    expect(ruleFromIntent({ tool: "mcp__db", input: { sql: "x" } }).pattern).toBeNull();
  });

  it("refuses before signing what the terminal refuses", () => {
    expect(ruleProblem({ ...blankRule(), tool: "Bash" })).toBeNull();
    expect(ruleProblem(blankRule())).toBe("empty");
    expect(ruleProblem({ ...blankRule(), answer: "deny" })).toBeNull();
    expect(ruleProblem({ ...blankRule(), tool: "Bash", days: 91 })).toBe("days");
    expect(ruleProblem({ ...blankRule(), tool: "Bash", days: 0 })).toBe("days");
    expect(ruleProblem({ ...blankRule(), tool: "Bash", directory: "~/src" })).toBe("directory");
    expect(ruleProblem({ ...blankRule(), pattern: "cargo (test", pattern_kind: "regex" })).toBe("regex");
  });
});

describe("the Rules screen", () => {
  it("lists each rule's match, answer, expiry, uses and note, and revokes a live one after asking", async () => {
    shell.rules = [rule(), rule({ id: "rul_2", answer: "deny", tool: null, pattern: "git push*", directory: null, note: null, uses: 0, last_used_at: null, machine: "buildbox" }), rule({ id: "rul_3", live: false, revoked_at: NOW - 1000, uses: 0 })];
    ui(<RulesScreen now={NOW} />);
    const cards = await screen.findAllByTestId("rule");
    expect(cards).toHaveLength(3);
    const first = within(cards[0]);
    expect(first.getByText("Allow")).toBeTruthy();
    expect(first.getByTestId("rule-pattern").textContent).toBe("npm test*");
    expect(first.getByText("/home/alice/src/shop")).toBeTruthy();
    expect(first.getByText("“tests are fine”")).toBeTruthy();
    expect(first.getByTestId("rule-uses").textContent).toBe("used 3×, last 2m ago");
    expect(cards[0].textContent).toContain("signed on alice's phone");
    expect(within(cards[1]).getByText("Deny")).toBeTruthy();
    expect(within(cards[1]).getByText("buildbox")).toBeTruthy();
    expect(within(cards[1]).getByTestId("rule-uses").textContent).toBe("not used yet");
    expect(cards[2].dataset.state).toBe("revoked");
    expect(within(cards[2]).queryByTestId("rule-revoke")).toBeNull();

    await userEvent.click(first.getByTestId("rule-revoke"));
    expect(shell.revoked).toEqual([]);
    await userEvent.click(first.getByTestId("rule-revoke-confirm"));
    await waitFor(() => expect(shell.revoked).toEqual(["rul_1"]));
  });

  it("shows the runtimes' own rules beside ours and names a conflict on both cards", async () => {
    const says = "Claude Code on laptop runs these calls without asking (`Bash(npm:*)` in /home/alice/.claude/settings.json), so this deny rule never sees them";
    const own: RuntimeRuleView = {
      machine: "laptop",
      runtime: "claude-code",
      source: "/home/alice/.claude/settings.json",
      text: "Bash(npm:*)",
      effect: "allow",
      tool: "Bash",
      pattern: "npm*",
      directory: null,
      reported_at: NOW - 60_000,
      conflicts: [{ rule_id: "rul_2", says }],
    };
    shell.rules = [rule(), rule({ id: "rul_2", answer: "deny", pattern: "npm publish*", directory: null })];
    shell.runtime = [own, { ...own, text: "prefix_rule(pattern = [\"git\", \"push\"], decision = \"forbidden\")", runtime: "codex", effect: "deny", tool: "commandExecution", pattern: "git push*", directory: "/home/alice/src/shop", conflicts: [] }];
    ui(<RulesScreen now={NOW} />);
    const cards = await screen.findAllByTestId("rule");
    expect(within(cards[0]).queryByTestId("rule-conflict")).toBeNull();
    expect(within(cards[1]).getByTestId("rule-conflict").textContent).toBe(`⚠ ${says}.`);
    const theirs = screen.getAllByTestId("runtime-rule");
    expect(theirs).toHaveLength(2);
    expect(within(theirs[0]).getByText("Runs unasked")).toBeTruthy();
    expect(within(theirs[0]).getByTestId("runtime-rule-text").textContent).toBe("Bash(npm:*)");
    expect(theirs[0].textContent).toContain("on laptop");
    expect(theirs[0].textContent).toContain("everywhere");
    expect(within(theirs[0]).getByTestId("runtime-rule-conflict").textContent).toBe("⚠ Works against your rule: Deny Bash `npm publish*`");
    expect(within(theirs[1]).getByText("Refused")).toBeTruthy();
    expect(theirs[1].textContent).toContain("in /home/alice/src/shop");
    expect(within(theirs[1]).queryByTestId("runtime-rule-conflict")).toBeNull();
  });

  it("shows no runtimes' section when no runner reported one", async () => {
    shell.rules = [rule()];
    ui(<RulesScreen now={NOW} />);
    await screen.findAllByTestId("rule");
    expect(screen.queryByTestId("runtime-rules")).toBeNull();
  });

  it("signs a new rule as typed; one allowing risky calls only after a second yes", async () => {
    ui(<RulesScreen now={NOW} />);
    await screen.findByTestId("rules-empty");
    await userEvent.click(screen.getByTestId("rule-new"));
    const sign = screen.getByTestId("rule-sign") as HTMLButtonElement;
    expect(sign.disabled).toBe(true);
    await userEvent.type(screen.getByTestId("rule-tool"), "Bash");
    await userEvent.type(screen.getByTestId("rule-pattern"), "rm -rf build");
    await userEvent.type(screen.getByTestId("rule-directory"), "/home/alice/src/shop");
    await userEvent.clear(screen.getByTestId("rule-days"));
    await userEvent.type(screen.getByTestId("rule-days"), "3");
    await userEvent.click(screen.getByTestId("rule-allow-risky"));
    expect(screen.getByTestId("rule-summary").textContent).toContain("Allow Bash “rm -rf build” in /home/alice/src/shop until");
    await userEvent.click(screen.getByTestId("rule-sign"));
    expect(shell.added).toEqual([]);
    await userEvent.click(screen.getByTestId("rule-confirm-risky"));
    await waitFor(() => expect(shell.added).toHaveLength(1));
    expect(shell.added[0]).toEqual({ ...blankRule(), tool: "Bash", pattern: "rm -rf build", directory: "/home/alice/src/shop", days: 3, allow_risky: true, confirmed_risky: true } satisfies NewRuleView);
    expect((await screen.findByTestId("rule-made")).textContent).toContain("rule rul_new");
  });

  it("keeps what was typed when the server refuses, and says why", async () => {
    shell.refuse = "no machine `nope` of user `alice`; `waymark machines` lists them";
    ui(<RulesScreen now={NOW} />);
    await userEvent.click(await screen.findByTestId("rule-new"));
    await userEvent.click(screen.getByTestId("rule-answer-deny"));
    await userEvent.type(screen.getByTestId("rule-machine"), "nope");
    await userEvent.click(screen.getByTestId("rule-sign"));
    expect((await screen.findByTestId("rule-error")).textContent).toContain("no machine `nope`");
    expect((screen.getByTestId("rule-machine") as HTMLInputElement).value).toBe("nope");
  });
});

describe("Always allow… on an approval card", () => {
  it("pre-fills the tool, the command and the directory, signs the pattern as edited, and says the rule was made", async () => {
    const added: NewRuleView[] = [];
    const addRule = async (r: NewRuleView): Promise<RuleAddedView> => {
      added.push(r);
      return { rule_id: "rul_abc", detail: "rule rul_abc" };
    };
    const item = approval({ intent: { tool: "Bash", input: { command: "npm test -- --watch=false", cwd: "/home/alice/src/shop" } } });
    ui(<InboxCard item={item} decide={async () => outbox({})} addRule={addRule} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    await userEvent.click(screen.getByTestId("always-allow"));
    expect((screen.getByTestId("rule-tool") as HTMLInputElement).value).toBe("Bash");
    expect((screen.getByTestId("rule-pattern") as HTMLInputElement).value).toBe("npm test -- --watch=false");
    expect((screen.getByTestId("rule-directory") as HTMLInputElement).value).toBe("/home/alice/src/shop");
    expect((screen.getByTestId("rule-days") as HTMLInputElement).value).toBe("7");
    await userEvent.clear(screen.getByTestId("rule-pattern"));
    await userEvent.type(screen.getByTestId("rule-pattern"), "npm test*");
    await userEvent.click(screen.getByTestId("rule-sign"));
    await waitFor(() => expect(added).toHaveLength(1));
    expect(added[0]).toMatchObject({ tool: "Bash", pattern: "npm test*", pattern_kind: "glob", directory: "/home/alice/src/shop", answer: "allow", days: 7, allow_risky: false });
    expect((await screen.findByTestId("rule-made")).textContent).toContain("Rule rul_abc made");
    expect(screen.queryByTestId("always-allow")).toBeNull();
    expect(screen.getByTestId("approve")).toBeTruthy();
  });

  it("is not offered without a way to sign rules", () => {
    ui(<InboxCard item={approval()} decide={async () => outbox({})} load={async () => ({ text: "", size: 0, truncated: false })} now={NOW} />);
    expect(screen.queryByTestId("always-allow")).toBeNull();
  });
});
