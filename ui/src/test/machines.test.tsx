// Machines and new runs: the machines as their runners report them (online, offline since
// when, what they can start), and the New run form — what it signs, what it refuses before
// signing, and that a refusal keeps what was typed. The shell is mocked.
import { describe, expect, it, vi } from "vitest";
import { render, screen, waitFor } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { MachineView, StartRunView } from "../bindings";
import { I18nProvider } from "../i18n";
import { MachinesScreen } from "../screens/Machines";
import { NewRunScreen, joinBelow } from "../screens/NewRun";
import { MachineNote, runtimeLabel } from "../components/Machine";

const shell = vi.hoisted(() => ({ machines: [] as unknown[], runs: [] as unknown[], answer: "applied" as string }));

vi.mock("../data", () => ({
  commands: {
    listMachines: async () => shell.machines,
    startRun: async (run: unknown) => {
      shell.runs.push(run);
      return {
        task_id: "task_1",
        command: { command_id: "c1", task_id: "task_1", operation: "start_run", based_on_revision: null, status: shell.answer === "applied" ? "delivered" : shell.answer, detail: shell.answer === "applied" ? "started" : "directory `/etc` is not under one laptop allows", met_revision: null, what_changed: null, created_at: 0, delivered_at: 0, acknowledged_at: null },
      };
    },
    listThreads: async () => [],
  },
  errorText: (e: unknown) => (e as Error).message,
  useMirror: () => ({ data: [], error: null, reload: () => {} }),
}));

const OFFLINE_SINCE = Date.UTC(2026, 11, 4, 2, 10);

function machine(over: Partial<MachineView> = {}): MachineView {
  return {
    id: "mch_1",
    name: "laptop",
    online: true,
    last_seen_at: Date.now() - 5000,
    offline_since: null,
    runtimes: [{ runtime: "claude-code", version: "2.1.328" }],
    directories: ["/home/alice/src"],
    inhibits_sleep: false,
    active_tasks: [],
    runner_version: "0.1.0",
    ...over,
  };
}

function ui(node: React.ReactNode) {
  return render(<I18nProvider initial="en">{node}</I18nProvider>);
}

describe("a folder below an allowed directory", () => {
  it("joins, and refuses to leave it", () => {
    expect(joinBelow("/home/alice/src", "")).toBe("/home/alice/src");
    expect(joinBelow("/home/alice/src/", "app/./web/")).toBe("/home/alice/src/app/web");
    expect(joinBelow("/home/alice/src", "../secrets")).toBeNull();
    expect(joinBelow("/home/alice/src", "app/../../x")).toBeNull();
    expect(joinBelow("/home/alice/src", "/etc")).toBeNull();
  });
});

describe("a runtime's label", () => {
  it("says the version once, without the name it repeats", () => {
    expect(runtimeLabel("claude-code", "2.1.328 (Claude Code)")).toBe("Claude Code 2.1.328");
    expect(runtimeLabel("codex", "codex-cli 0.169.0")).toBe("Codex 0.169.0");
    expect(runtimeLabel("gemini", "0.61.0")).toBe("Gemini CLI 0.61.0");
    expect(runtimeLabel("claude-code", null)).toBe("Claude Code");
    expect(runtimeLabel("something-new", "1.0")).toBe("something-new 1.0");
  });
});

describe("machines", () => {
  it("shows each machine's state, runtimes and directories, and says how to add one", async () => {
    shell.machines = [machine({ inhibits_sleep: true }), machine({ id: "mch_2", name: "desk", online: false, offline_since: OFFLINE_SINCE, runtimes: [], directories: [] })];
    ui(<MachinesScreen go={() => {}} />);
    const cards = await screen.findAllByTestId("machine");
    expect(cards).toHaveLength(2);
    expect(cards[0].textContent).toContain("Online");
    expect(cards[0].textContent).toContain("Claude Code 2.1.328");
    expect(cards[0].textContent).toContain("/home/alice/src");
    expect(cards[0].textContent).toContain("Keeps awake while running");
    expect(cards[1].textContent).not.toContain("Keeps awake");
    expect(cards[1].textContent).toContain("Offline since");
    // Nothing to start on a machine that reported no runtime.
    expect((cards[1].querySelector("[data-testid=new-run-here]") as HTMLButtonElement).disabled).toBe(true);

    shell.machines = [];
    ui(<MachinesScreen go={() => {}} />);
    expect((await screen.findByTestId("machines-empty")).textContent).toContain("waymark runner install");
  });

  it("says on a card that an answer waits for a machine that is away", () => {
    ui(<MachineNote machine={machine({ online: false, offline_since: OFFLINE_SINCE })} />);
    expect(screen.getByTestId("machine-away").textContent).toMatch(/^laptop offline since .+ — your answer applies when it is back$/);
  });
});

describe("a new run", () => {
  it("signs what the summary shows: machine, runtime, directory, prompt and gate", async () => {
    shell.machines = [machine()];
    shell.runs = [];
    shell.answer = "applied";
    let went = "";
    ui(<NewRunScreen go={(r) => (went = r)} />);
    await waitFor(() => expect((screen.getByTestId("run-directory") as HTMLSelectElement).value).toBe("/home/alice/src"));
    const start = screen.getByTestId("run-start") as HTMLButtonElement;
    expect(start.disabled).toBe(true);
    await userEvent.type(screen.getByTestId("run-below"), "app");
    await userEvent.type(screen.getByTestId("run-prompt"), "make the flaky test pass");
    await userEvent.type(screen.getByTestId("run-gate"), "Bash|Write");
    expect(screen.getByTestId("run-summary").textContent).toBe("You sign: run Claude Code in /home/alice/src/app on laptop with this prompt. Calls of Bash|Write wait for your approval.");
    await userEvent.click(start);
    await screen.findByTestId("run-started");
    expect(shell.runs).toEqual([{ machine: "laptop", runtime: "claude-code", directory: "/home/alice/src/app", prompt: "make the flaky test pass", title: null, gate: "Bash|Write", plan: false } satisfies StartRunView]);
    await userEvent.click(screen.getByTestId("open-run"));
    expect(went).toBe("/threads/task_1");
  });

  it("signs plan first where the runtime has a plan mode, and offers it nowhere else", async () => {
    shell.machines = [machine({ runtimes: [{ runtime: "claude-code", version: "2.1.328" }, { runtime: "gemini", version: "0.61.0" }] })];
    shell.runs = [];
    shell.answer = "applied";
    ui(<NewRunScreen go={() => {}} />);
    await waitFor(() => expect((screen.getByTestId("run-directory") as HTMLSelectElement).value).toBe("/home/alice/src"));
    await userEvent.type(screen.getByTestId("run-prompt"), "move billing to the new API");
    await userEvent.click(screen.getByTestId("run-plan"));
    expect(screen.getByTestId("run-summary").textContent).toContain("It plans first and asks you to approve the plan before it changes anything.");
    await userEvent.selectOptions(screen.getByTestId("run-runtime"), "gemini");
    expect(screen.queryByTestId("run-plan")).toBeNull();
    expect(screen.getByTestId("run-summary").textContent).not.toContain("plans first");
    await userEvent.selectOptions(screen.getByTestId("run-runtime"), "claude-code");
    await userEvent.click(screen.getByTestId("run-start"));
    await screen.findByTestId("run-started");
    expect(shell.runs).toEqual([{ machine: "laptop", runtime: "claude-code", directory: "/home/alice/src", prompt: "move billing to the new API", title: null, gate: null, plan: true } satisfies StartRunView]);
  });

  it("refuses before signing what would leave the directory or is no pattern", async () => {
    shell.machines = [machine()];
    shell.runs = [];
    ui(<NewRunScreen go={() => {}} />);
    await waitFor(() => expect((screen.getByTestId("run-directory") as HTMLSelectElement).value).toBe("/home/alice/src"));
    await userEvent.type(screen.getByTestId("run-prompt"), "x");
    await userEvent.type(screen.getByTestId("run-below"), "../../etc");
    await userEvent.type(screen.getByTestId("run-gate"), "Bash(");
    const problems = screen.getByTestId("run-problems").textContent ?? "";
    expect(problems).toContain("must stay below the allowed directory");
    expect(problems).toContain("not a valid regular expression");
    expect((screen.getByTestId("run-start") as HTMLButtonElement).disabled).toBe(true);
    expect(shell.runs).toEqual([]);
  });

  it("shows the server's refusal and keeps what was typed", async () => {
    shell.machines = [machine({ online: false, offline_since: OFFLINE_SINCE })];
    shell.runs = [];
    shell.answer = "rejected";
    ui(<NewRunScreen machine="laptop" go={() => {}} />);
    await waitFor(() => expect((screen.getByTestId("run-runtime") as HTMLSelectElement).value).toBe("claude-code"));
    expect(screen.getByText(/The run starts when laptop is back/)).toBeTruthy();
    await userEvent.type(screen.getByTestId("run-prompt"), "tidy /etc");
    await userEvent.click(screen.getByTestId("run-start"));
    expect((await screen.findByTestId("run-error")).textContent).toBe("Not started: directory `/etc` is not under one laptop allows");
    expect((screen.getByTestId("run-prompt") as HTMLTextAreaElement).value).toBe("tidy /etc");
    expect(shell.runs).toHaveLength(1);
  });
});
