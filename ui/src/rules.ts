// What "Always allow…" fills in from an approval: the tool, its command or path and the
// directory, read from the intent in each runtime's shape exactly as the server's matcher reads
// it (`waymark_proto::intent_facts`). A twin of that function, kept in step by one fixture both
// sides test (`web/fixtures/intent-facts.json`: `waymark-proto`'s `rules` tests and
// `test/rules.test.tsx`). It only pre-fills a form the person reads and edits before signing;
// the server decides what a rule matches.
import canonicalize from "canonicalize";
import type { NewRuleView, RuleView } from "./bindings";
import type { CallInput, CallFacts as WireCallFacts } from "./web/proto";

/** What a call asks to run on (`waymark_proto::CallInput`, generated). */
export type { CallInput };

/** What a rule can see of an approval's intent (`waymark_proto::CallFacts`, generated), less the
 * task's runtime and machine, which the intent does not hold. */
export type CallFacts = Omit<WireCallFacts, "runtime" | "machine">;

type Obj = Record<string, unknown>;
const obj = (v: unknown): Obj => (v && typeof v === "object" && !Array.isArray(v) ? (v as Obj) : {});
const str = (v: unknown, k: string): string | undefined => {
  const x = obj(v)[k];
  return typeof x === "string" ? x : undefined;
};

/** `bash -lc 'npm test'` → `npm test` (`waymark_proto::unwrap_shell`): unwrapped only when
 * the whole line is one such call with one single-quoted argument holding no quote. */
export function unwrapShell(line: string): string {
  const t = line.trim();
  for (const shell of ["/bin/bash", "/usr/bin/bash", "bash", "/bin/sh", "sh", "/bin/zsh", "zsh"]) {
    for (const flag of ["-lc", "-c"]) {
      const head = `${shell} ${flag} '`;
      if (t.startsWith(head) && t.endsWith("'") && t.length > head.length) {
        const inner = t.slice(head.length, -1);
        if (!inner.includes("'")) return inner;
      }
    }
  }
  return t;
}

function argvLine(a: unknown[]): string {
  return a
    .filter((w): w is string => typeof w === "string")
    .map((w) => (w !== "" && /^[A-Za-z0-9\-_./=:@%+,]+$/.test(w) ? w : `'${w.replaceAll("'", "'\\''")}'`))
    .join(" ");
}

const pathOf = (input: unknown): string | undefined => ["file_path", "notebook_path", "path"].map((k) => str(input, k)).find((p) => p !== undefined);

function changedPaths(item: unknown): CallInput | undefined {
  const changes = obj(item).changes;
  if (!Array.isArray(changes)) return undefined;
  if (changes.length === 1) {
    const p = str(changes[0], "path");
    return p === undefined ? undefined : { kind: "path", text: p };
  }
  const paths = changes.map((c) => str(c, "path")).filter((p): p is string => p !== undefined);
  return paths.length ? { kind: "other", text: paths.join("\n") } : undefined;
}

function statedCwd(call: unknown): string | undefined {
  const content = obj(call).content;
  if (!Array.isArray(content)) return undefined;
  for (const c of content) {
    const text = str(obj(c).content, "text");
    if (text === undefined) return undefined;
    const parts = text.split("[current working directory ");
    if (parts.length > 1) {
      const end = parts[1].indexOf("]");
      if (end >= 0) return parts[1].slice(0, end);
    }
  }
  return undefined;
}

/** `waymark_proto::intent_facts`, for the intent's own parts. */
export function intentFacts(intent: unknown): CallFacts {
  const f: CallFacts = {};
  const set = (k: "tool" | "directory", v: string | undefined) => {
    if (v !== undefined) f[k] = v;
  };
  const method = str(intent, "method");
  if (method !== undefined) {
    const params = obj(intent).params;
    const parts = method.split("/");
    f.tool = parts.length === 3 && parts[0] === "item" ? parts[1] : method;
    set("directory", str(params, "cwd"));
    const command = obj(params).command;
    const input = typeof command === "string" ? { kind: "command" as const, text: unwrapShell(command) } : Array.isArray(command) ? { kind: "command" as const, text: unwrapShell(argvLine(command)) } : changedPaths(obj(intent).item);
    if (input) f.input = input;
    return f;
  }
  const call = obj(intent).toolCall;
  if (call !== undefined) {
    set("tool", str(call, "kind"));
    const raw = obj(call).rawInput;
    const locations = obj(call).locations;
    const location = Array.isArray(locations) && locations.length === 1 ? str(locations[0], "path") : undefined;
    const command = str(raw, "command");
    const path = location ?? pathOf(raw);
    const title = str(call, "title");
    if (command !== undefined) f.input = { kind: "command", text: unwrapShell(command) };
    else if (path !== undefined) f.input = { kind: "path", text: path };
    else if (f.tool === "execute") {
      if (title !== undefined) f.input = { kind: "command", text: unwrapShell(title) };
    } else if (title !== undefined) f.input = { kind: "other", text: title };
    set("directory", str(raw, "cwd") ?? statedCwd(call));
    return f;
  }
  if (str(intent, "approval") === "exec") {
    const req = obj(intent).request;
    f.tool = "exec";
    set("directory", str(req, "cwd"));
    const command = str(req, "command") ?? str(obj(req).systemRunPlan, "commandText");
    if (command !== undefined) f.input = { kind: "command", text: unwrapShell(command) };
    return f;
  }
  set("tool", str(intent, "tool") ?? str(intent, "kind"));
  const i = obj(intent);
  const nested = [i.input, i.args].find((v) => v !== undefined);
  const own = !(nested && typeof nested === "object" && !Array.isArray(nested));
  const input = own ? intent : nested;
  set("directory", str(input, "cwd") ?? str(intent, "cwd"));
  const command = str(input, "command");
  const path = pathOf(input);
  const url = str(input, "url");
  if (command !== undefined) f.input = { kind: "command", text: unwrapShell(command) };
  else if (path !== undefined) f.input = { kind: "path", text: path };
  else if (url !== undefined) f.input = { kind: "other", text: url };
  else if (!own) {
    const text = canonicalize(input);
    if (text !== undefined) f.input = { kind: "other", text };
  }
  return f;
}

/** A glob that matches `text` as written: `*`, `?` and `\` escaped. */
export function literalGlob(text: string): string {
  return text.replace(/[\\*?]/g, (c) => `\\${c}`);
}

/** The add-rule form pre-filled from an approval's intent: its tool, its command or path as a
 * literal glob (the person widens it, say `npm test*`, before signing), its directory. */
export function ruleFromIntent(intent: unknown, base: NewRuleView = blankRule()): NewRuleView {
  const f = intentFacts(intent);
  const pattern = f.input && f.input.kind !== "other" ? literalGlob(f.input.text) : null;
  return { ...base, tool: f.tool ?? null, pattern, pattern_kind: "glob", directory: f.directory ?? null, answer: "allow" };
}

/** An empty form: allow, for a week. */
export function blankRule(): NewRuleView {
  return { runtime: null, machine: null, directory: null, tool: null, pattern: null, pattern_kind: "glob", answer: "allow", days: 7, note: null, allow_risky: false, confirmed_risky: false };
}

/** Why the form cannot be signed yet (the checks the terminal makes before signing), or null. */
export function ruleProblem(r: NewRuleView): "days" | "empty" | "directory" | "regex" | null {
  if (!Number.isInteger(r.days) || r.days < 1 || r.days > 90) return "days";
  const has = (v: string | null) => v != null && v.trim() !== "";
  if (r.answer === "allow" && !has(r.tool) && !has(r.pattern)) return "empty";
  if (has(r.directory) && !r.directory!.trim().startsWith("/")) return "directory";
  if (r.pattern_kind === "regex" && has(r.pattern)) {
    try {
      new RegExp(`^(?:${r.pattern})$`, "u");
    } catch {
      return "regex";
    }
  }
  return null;
}

/** The parts of a rule's match that are set, as `[name, value]` (for one line per rule). */
export function matchParts(r: Pick<RuleView, "tool" | "pattern" | "pattern_kind" | "directory" | "runtime" | "machine">): [string, string][] {
  const parts: [string, string][] = [];
  if (r.tool) parts.push(["tool", r.tool]);
  if (r.pattern) parts.push([r.pattern_kind === "regex" ? "regex" : "pattern", r.pattern]);
  if (r.directory) parts.push(["directory", r.directory]);
  if (r.runtime) parts.push(["runtime", r.runtime]);
  if (r.machine) parts.push(["machine", r.machine]);
  return parts;
}
