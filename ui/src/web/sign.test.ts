// The web companion's signer against the Rust one: the same RFC 8785 bytes (a fixture serde_jcs
// also checks), signatures an independent Ed25519 (Python's `cryptography`) verifies, and the key.
//
// Runs in the default jsdom environment (the shared setup needs `window`): Vitest keeps Node's
// WebCrypto there, whose `crypto.subtle` has Ed25519 (Node 20).
import jcs from "./fixtures/jcs.json";
import envelopes from "./fixtures/envelopes.json";
import { base64url, forgetKey, KEY_NAME, loadOrCreateKey, pendingKey, type DeviceKey, type KeyStore } from "./keys";
import {
  addRuleArgs,
  answerArgs,
  approveEditedArgs,
  canonicalBytes,
  editedIntent,
  commandId,
  InexactNumberError,
  newCommand,
  NotCanonicalError,
  rfc3339,
  ruleId,
  ruleSpec,
  signCommand,
  type DecisionRef,
  type SignedEnvelope,
  type SteerCommand,
} from "./sign";

const text = (b: Uint8Array) => new TextDecoder().decode(b);

function memoryStore(): KeyStore & { map: Map<string, unknown> } {
  const map = new Map<string, unknown>();
  return {
    map,
    get: async (k) => map.get(k),
    set: async (k, v) => void map.set(k, v),
    del: async (k) => void map.delete(k),
  };
}

/** RFC 8032 §7.1 test 1's secret key, as PKCS #8: a fixed key, so signatures are reproducible
 * (Ed25519 is deterministic) and the envelope fixture can be checked byte for byte. */
async function fixedKey(): Promise<DeviceKey> {
  const seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
  const pkcs8 = Uint8Array.from(
    ("302e020100300506032b657004220420" + seed).match(/../g)!.map((h) => parseInt(h, 16)),
  );
  const sk = await crypto.subtle.importKey("pkcs8", pkcs8, { name: "Ed25519" }, false, ["sign"]);
  return {
    publicKey: base64url(Uint8Array.from([
      0xd7, 0x5a, 0x98, 0x01, 0x82, 0xb1, 0x0a, 0xb7, 0xd5, 0x4b, 0xfe, 0xd3, 0xc9, 0x64, 0x07, 0x3a,
      0x0e, 0xe1, 0x72, 0xf3, 0xda, 0xa6, 0x23, 0x25, 0xaf, 0x02, 0x1a, 0x68, 0xf7, 0x07, 0x51, 0x1a,
    ])),
    sign: async (data) => new Uint8Array(await crypto.subtle.sign({ name: "Ed25519" }, sk, Uint8Array.from(data))),
  };
}

// An independent verifier: Python's `cryptography` Ed25519 over its own RFC 8785 canonical form.
// `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)` alone is not RFC 8785
// (it sorts keys by code point, not UTF-16 code unit, and writes floats the Python way); for a
// command — strings, integers, booleans, null — it coincides once keys sort by UTF-16 code units,
// as below (the same canonicaliser as crates/waymark-server/tests/fixtures/sign_command.py).
// It also checks the command's shape as the server's serde does (deny_unknown_fields, the
// required fields, RFC 3339 UTC times).
const VERIFY_PY = String.raw`
import base64, json, sys
from datetime import datetime
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

def canonical(v):
    if v is None: return "null"
    if v is True: return "true"
    if v is False: return "false"
    if isinstance(v, int): return str(v)
    if isinstance(v, str): return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list): return "[" + ",".join(canonical(x) for x in v) + "]"
    if isinstance(v, dict):
        keys = sorted(v, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(v[k]) for k in keys) + "}"
    raise TypeError(type(v))

def unb64(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))

REQUIRED = {"command_id", "operation", "issued_by", "device_id", "issued_at", "expires_at"}
OPTIONAL = {"task_id", "expected_plan_revision", "scope", "args"}

def check(key, env):
    cmd, sig = env["command"], env["signature"]
    if set(env) != {"command", "signature"} or set(sig) != {"alg", "key_id", "sig"}: return "envelope shape"
    if not REQUIRED <= set(cmd) or not set(cmd) <= REQUIRED | OPTIONAL: return "command shape"
    if sig["alg"] != "ed25519" or sig["key_id"] != cmd["device_id"]: return "signature fields"
    for t in ("issued_at", "expires_at"):
        if not cmd[t].endswith("Z") or datetime.fromisoformat(cmd[t]).utcoffset().total_seconds() != 0: return t
    try:
        key.verify(unb64(sig["sig"]), canonical(cmd).encode("utf-8"))
    except InvalidSignature:
        return "bad signature"
    return "ok"

req = json.load(sys.stdin)
key = Ed25519PublicKey.from_public_bytes(unb64(req["public_key"]))
json.dump([check(key, e) for e in req["envelopes"]], sys.stdout)
`;

interface SpawnResult {
  status: number | null;
  stdout: string;
  stderr: string;
  error?: Error;
}
type SpawnSync = (cmd: string, args: string[], o: { input: string; encoding: "utf8" }) => SpawnResult;

/** What Python says of each envelope: "ok" or why not. */
async function pythonVerifies(publicKey: string, envs: unknown[]): Promise<string[]> {
  // A computed specifier: the UI's TypeScript has no Node types, and this only runs under Vitest.
  const childProcess = "node:child_process";
  const { spawnSync } = (await import(/* @vite-ignore */ childProcess)) as { spawnSync: SpawnSync };
  const out = spawnSync("python3", ["-c", VERIFY_PY], {
    input: JSON.stringify({ public_key: publicKey, envelopes: envs }),
    encoding: "utf8",
  });
  if (out.error || out.status !== 0) {
    throw new Error(`python3 with the \`cryptography\` package failed: ${out.error?.message ?? out.stderr}`);
  }
  return JSON.parse(out.stdout) as string[];
}

function steer(now = new Date()): SteerCommand {
  return newCommand({
    taskId: "task_842",
    operation: "suspend_and_replan",
    args: { instructions: "不要部署，只写报告 — do not deploy; write the report only 😀" },
    scope: ["deploy_staging", "notify_release"],
    expectedPlanRevision: 7,
    user: "alice",
    deviceId: "dev_1",
    now,
  });
}

describe("canonicalBytes", () => {
  test.each(jcs.cases)("is RFC 8785 as serde_jcs writes it: %s", (input, want) => {
    expect(text(canonicalBytes(JSON.parse(input)))).toBe(want);
  });

  test.each(jcs.inexact)("refuses what the server refuses as inexact: %s", (input) => {
    expect(() => canonicalBytes(JSON.parse(input))).toThrow(InexactNumberError);
  });

  test("refuses integers beyond ±(2^53 − 1), saying where", () => {
    // 2^53 + 1 cannot even be held: JSON.parse rounds it to 2^53, and it is refused as such.
    // Up to 64 bits, as the server reads integers: the largest double below 2^64 is written
    // 18446744073709550000, which is a u64.
    for (const n of [2 ** 53, -(2 ** 53), JSON.parse("9007199254740993"), 2 ** 63, 2 ** 64 - 2048, 1024 - 2 ** 63]) {
      expect(() => canonicalBytes({ n })).toThrow(InexactNumberError);
    }
    const e = (() => {
      try {
        canonicalBytes({ args: { plan: [{ "a/b": -(2 ** 53) }] } });
      } catch (e) {
        return e;
      }
    })();
    expect(e).toBeInstanceOf(InexactNumberError);
    expect((e as InexactNumberError).pointer).toBe("/args/plan/0/a~1b");
    expect((e as InexactNumberError).message).toContain("-9007199254740992");
    expect(() => canonicalBytes({ n: 2n ** 64n })).toThrow(InexactNumberError);

    // The largest safe integers are fine; so are numbers whose digits go beyond 64 bits, which
    // the server reads as doubles (and accepts): -2^63 is written -9223372036854776000.
    expect(
      text(canonicalBytes([Number.MAX_SAFE_INTEGER, -Number.MAX_SAFE_INTEGER, 2 ** 64, -(2 ** 63), 1e20, 1e300])),
    ).toBe("[9007199254740991,-9007199254740991,18446744073709552000,-9223372036854776000,100000000000000000000,1e+300]");
  });

  test("refuses what is not plain JSON", () => {
    for (const v of [NaN, Infinity, { x: -Infinity }, { d: new Date(0) }, [undefined], { f: () => 1 }, 1n, "\ud800"]) {
      expect(() => canonicalBytes(v)).toThrow(NotCanonicalError);
    }
    // Undefined members are left out, as JSON.stringify leaves them out of what is sent.
    expect(text(canonicalBytes({ a: 1, b: undefined }))).toBe('{"a":1}');
  });
});

describe("newCommand", () => {
  test("has the Rust serde shape: absent fields omitted, UUIDv7 id, chrono's times, 24 h", () => {
    const now = new Date(Date.UTC(2025, 0, 2, 3, 4, 5, 678));
    const cmd = steer(now);
    expect(cmd).toEqual({
      command_id: expect.stringMatching(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/),
      task_id: "task_842",
      expected_plan_revision: 7,
      operation: "suspend_and_replan",
      scope: ["deploy_staging", "notify_release"],
      args: { instructions: "不要部署，只写报告 — do not deploy; write the report only 😀" },
      issued_by: "user:alice",
      device_id: "dev_1",
      issued_at: "2025-01-02T03:04:05.678Z",
      expires_at: "2025-01-03T03:04:05.678Z",
    });
    // The id's first 48 bits are the unix milliseconds.
    expect(parseInt(cmd.command_id.replace(/-/g, "").slice(0, 12), 16)).toBe(now.getTime());

    const open = newCommand({
      taskId: null,
      operation: "open_session",
      args: null,
      scope: [],
      expectedPlanRevision: null,
      user: "alice",
      deviceId: "dev_1",
      now: new Date(Date.UTC(2025, 0, 2, 3, 4, 5)),
    });
    expect(Object.keys(open).sort()).toEqual(
      ["command_id", "device_id", "expires_at", "issued_at", "issued_by", "operation"],
    );
    // chrono writes no fraction on a whole second; an open_session lives 2 minutes.
    expect([open.issued_at, open.expires_at]).toEqual(["2025-01-02T03:04:05Z", "2025-01-02T03:06:05Z"]);
  });

  test("refuses a plan revision that was never shown", () => {
    for (const rev of [0, -1, 1.5]) {
      expect(() =>
        newCommand({ taskId: "t", operation: "pause", expectedPlanRevision: rev, user: "a", deviceId: "d" }),
      ).toThrow(/never shown/);
    }
  });

  test("command ids are unique and sort by time", () => {
    const ids = Array.from({ length: 50 }, (_, i) => commandId(new Date(1_700_000_000_000 + i)));
    expect(new Set(ids).size).toBe(50);
    expect([...ids].sort()).toEqual(ids);
    expect(rfc3339(new Date(0))).toBe("1970-01-01T00:00:00Z");
  });
});

describe("signCommand", () => {
  test("an independent Ed25519 verifies it; any change after signing breaks it", async () => {
    const store = memoryStore();
    const key = await loadOrCreateKey(store);
    const env = await signCommand(key, steer());
    expect(env.signature).toEqual({ alg: "ed25519", key_id: "dev_1", sig: expect.stringMatching(/^[A-Za-z0-9_-]{86}$/) });

    const changed = (f: (c: Record<string, unknown>) => void): SignedEnvelope => {
      const e = structuredClone(env);
      f(e.command as unknown as Record<string, unknown>);
      return e;
    };
    const tampered: Record<string, SignedEnvelope> = {
      command_id: changed((c) => (c.command_id = commandId())),
      task_id: changed((c) => (c.task_id = "task_843")),
      expected_plan_revision: changed((c) => (c.expected_plan_revision = 8)),
      operation: changed((c) => (c.operation = "cancel")),
      scope: changed((c) => (c.scope = ["deploy_staging"])),
      args: changed((c) => (c.args = { instructions: "deploy" })),
      issued_by: changed((c) => (c.issued_by = "user:mallory")),
      issued_at: changed((c) => (c.issued_at = "2025-01-02T03:04:05Z")),
      expires_at: changed((c) => (c.expires_at = "2099-01-01T00:00:00Z")),
      "task_id removed": changed((c) => delete c.task_id),
      "a field added": changed((c) => (c.smuggled = true)),
    };
    const flipped = structuredClone(env);
    flipped.signature.sig = (flipped.signature.sig[0] === "A" ? "B" : "A") + flipped.signature.sig.slice(1);
    const other = await signCommand(await loadOrCreateKey(memoryStore()), env.command);

    const said = await pythonVerifies(key.publicKey, [env, ...Object.values(tampered), flipped, other]);
    expect(said[0]).toBe("ok");
    expect(Object.fromEntries(Object.keys(tampered).map((k, i) => [k, said[i + 1]]))).toEqual(
      Object.fromEntries(Object.keys(tampered).map((k) => [k, k === "a field added" ? "command shape" : "bad signature"])),
    );
    expect(said.slice(-2)).toEqual(["bad signature", "bad signature"]);

    // The device id is signed too: the key id follows it, and the old signature does not.
    const moved = changed((c) => (c.device_id = "dev_2"));
    moved.signature.key_id = "dev_2";
    expect(await pythonVerifies(key.publicKey, [moved])).toEqual(["bad signature"]);
  });

  test("an integer beyond 2^53 − 1 is refused before anything is signed", async () => {
    let signed = 0;
    const key: DeviceKey = { publicKey: "", sign: async () => (signed++, new Uint8Array(64)) };
    const cmd = { ...steer(), args: { plan: [{ n: 2 ** 53 + 2 }] } };
    await expect(signCommand(key, cmd)).rejects.toThrow(InexactNumberError);
    await expect(signCommand(key, { ...steer(), expected_plan_revision: 2 ** 53 })).rejects.toThrow(
      InexactNumberError,
    );
    expect(signed).toBe(0);
  });

  // The same envelopes are verified by the server's own verifier (waymark_proto::signing::verify)
  // and parsed back by its serde types in crates/waymark-proto/src/signing.rs.
  test("makes, with a fixed key, exactly the envelopes the Rust verifier is tested with", async () => {
    const key = await fixedKey();
    expect(key.publicKey).toBe(envelopes.public_key);
    for (const env of envelopes.envelopes) {
      const command = env.command as SteerCommand;
      const mine = newCommand({
        taskId: command.task_id ?? null,
        operation: command.operation,
        args: command.args ?? null,
        scope: command.scope,
        expectedPlanRevision: command.expected_plan_revision ?? null,
        user: command.issued_by.replace(/^user:/, ""),
        deviceId: command.device_id,
        now: new Date(command.issued_at),
      });
      expect({ ...mine, command_id: command.command_id }).toEqual(command);
      expect(await signCommand(key, command)).toEqual(env);
    }
    expect(await pythonVerifies(envelopes.public_key, envelopes.envelopes)).toEqual(["ok", "ok"]);
  });
});

describe("answerArgs", () => {
  const approval: DecisionRef = {
    id: "dec_1",
    kind: "approval",
    options: [{ id: "approve" }, { id: "approve_session" }, { id: "deny" }, { id: "deny_always" }],
  };
  const question: DecisionRef = { id: "dec_2", kind: "question", options: [{ id: "a" }, { id: "b" }] };
  const budget: DecisionRef = { id: "dec_3", kind: "budget", options: [{ id: "raise" }, { id: "stop" }] };
  const seen = { plan_revision: 3, intent_digest: "sha256:ab" };

  test("a question in parts: its answers bound to the form's digest, bad ones refused as the server would", () => {
    const form = { questions: [{ id: "q1", question: "Which database?", choices: [{ label: "Postgres" }, { label: "SQLite" }], multi_select: false, free_text: true }] };
    const asked: DecisionRef = { id: "dec_4", kind: "question", options: [], intent: { tool: "AskUserQuestion", form }, intent_digest: "sha256:f0" };
    expect(answerArgs(asked, "answer_question", null, JSON.stringify({ q1: { chosen: ["SQLite"] } }), seen)).toEqual({
      operation: "answer_question",
      args: { decision_id: "dec_4", intent_digest: "sha256:f0", answers: { q1: { chosen: ["SQLite"] } } },
    });
    expect(() => answerArgs(asked, "answer_question", null, JSON.stringify({ q1: { chosen: ["MySQL"] } }), seen)).toThrow("`MySQL` is not a choice of question `q1`");
    expect(() => answerArgs(asked, "answer_question", null, JSON.stringify({ q1: { chosen: ["SQLite", "Postgres"] } }), seen)).toThrow("takes one choice, not 2");
    expect(() => answerArgs(asked, "answer_question", null, JSON.stringify({}), seen)).toThrow("question `q1` is not answered");
    expect(() => answerArgs(asked, "answer_question", null, "SQLite", seen)).toThrow("are JSON");
  });

  test("mirrors Companion::answer", () => {
    expect(answerArgs(approval, "approve", null, null, seen)).toEqual({
      operation: "approve",
      args: { decision_id: "dec_1", intent_digest: "sha256:ab" },
    });
    // A runtime's own choice on an approval stays an approve or a deny, bound to the digest.
    expect(answerArgs(approval, "choose_option", "deny_always", "not today", seen)).toEqual({
      operation: "deny",
      args: { decision_id: "dec_1", intent_digest: "sha256:ab", option: "deny_always", text: "not today" },
    });
    expect(answerArgs(approval, "choose_option", "approve_session", null, seen).operation).toBe("approve");
    expect(answerArgs(budget, "choose_option", "raise", null, seen)).toEqual({
      operation: "choose_option",
      args: { decision_id: "dec_3", option: "raise" },
    });
    expect(answerArgs(question, "answer_question", null, null, seen)).toEqual({
      operation: "answer_question",
      args: { decision_id: "dec_2", text: "" },
    });
    expect(answerArgs(question, "answer_question", "b", "because", seen)).toEqual({
      operation: "answer_question",
      args: { decision_id: "dec_2", text: "because", option: "b" },
    });
  });

  test("refuses what the Rust companion refuses", () => {
    expect(() => answerArgs(question, "approve", null, null, seen)).toThrow(/question decision/);
    expect(() => answerArgs(approval, "approve", null, null, { plan_revision: 3, intent_digest: null })).toThrow(
      /intent digest/,
    );
    expect(() => answerArgs(approval, "deny", "maybe", null, seen)).toThrow(/not an option of `dec_1`/);
    expect(() => answerArgs(budget, "choose_option", null, null, seen)).toThrow(/name an option/);
    expect(() => answerArgs(budget, "choose_option", "more", null, seen)).toThrow(/choose one of raise, stop/);
  });
});

describe("approveEditedArgs", () => {
  const asked = { id: "dec_1", intent: { tool: "Bash", input: { command: "rm -rf node_modules" } }, editable: "/input" };
  const seen = { plan_revision: 3, intent_digest: "sha256:ab" };

  test("signs the edited intent with the digest the Rust companion computes", async () => {
    // The same value and digest `waymark_companion::steer` tests assert.
    expect(await approveEditedArgs(asked, { command: "rm -ri node_modules" }, seen)).toEqual({
      decision_id: "dec_1",
      intent_digest: "sha256:ab",
      edited_intent: { tool: "Bash", input: { command: "rm -ri node_modules" } },
      edited_intent_digest: "sha256:08d4c0d1f5d6421984ae74107d184cef9dd474add66b0b0000d79ef78e1028c1",
    });
    expect(asked.intent.input.command).toBe("rm -rf node_modules");
  });

  test("refuses what the Rust companion refuses", async () => {
    expect(() => editedIntent({ ...asked, editable: null }, {})).toThrow(/only as asked/);
    expect(() => editedIntent(asked, "rm -ri node_modules")).toThrow(/keep its JSON type \(it is object\)/);
    expect(() => editedIntent({ ...asked, editable: "/nothing" }, {})).toThrow(/nothing at `\/nothing`/);
    await expect(approveEditedArgs(asked, {}, { plan_revision: 3, intent_digest: null })).rejects.toThrow(/intent digest/);
  });
});

describe("the device key", () => {
  test("is made once, kept, and forgotten; its private half cannot be read out", async () => {
    const store = memoryStore();
    const a = await loadOrCreateKey(store);
    const b = await loadOrCreateKey(store);
    expect(b.publicKey).toBe(a.publicKey);
    expect(a.publicKey).toMatch(/^[A-Za-z0-9_-]{43}$/); // 32 bytes, no padding

    const pair = store.map.get(KEY_NAME) as CryptoKeyPair;
    expect(pair.privateKey.extractable).toBe(false);
    await expect(crypto.subtle.exportKey("pkcs8", pair.privateKey)).rejects.toThrow();
    await expect(crypto.subtle.exportKey("jwk", pair.privateKey)).rejects.toThrow();

    // Signatures from the stored key verify with the public key it reports.
    const data = new TextEncoder().encode("waymark");
    const sig = await b.sign(data);
    expect(sig.length).toBe(64);
    const raw = Uint8Array.from(atob(a.publicKey.replace(/-/g, "+").replace(/_/g, "/") + "="), (c) => c.charCodeAt(0));
    const pk = await crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, true, ["verify"]);
    expect(await crypto.subtle.verify({ name: "Ed25519" }, pk, sig, data)).toBe(true);

    await forgetKey(store);
    expect(store.map.has(KEY_NAME)).toBe(false);
    const c = await loadOrCreateKey(store);
    expect(c.publicKey).not.toBe(a.publicKey);
  });

  test("a key for a new pairing replaces the paired one only once kept (the server accepted it)", async () => {
    const store = memoryStore();
    const paired = await loadOrCreateKey(store);
    const next = await pendingKey(store);
    expect(next.publicKey).not.toBe(paired.publicKey);
    // Not kept (the code was refused, or the link opened by mistake): the pairing stands.
    expect((await loadOrCreateKey(store)).publicKey).toBe(paired.publicKey);
    await next.keep();
    expect((await loadOrCreateKey(store)).publicKey).toBe(next.publicKey);
  });

  test("a stored value that is not a key pair is not silently replaced", async () => {
    const store = memoryStore();
    store.map.set(KEY_NAME, { privateKey: "nope" });
    await expect(loadOrCreateKey(store)).rejects.toThrow(/pair this device again/);
  });

  test("says which browsers can make one", async () => {
    try {
      vi.stubGlobal("crypto", {
        subtle: { generateKey: () => Promise.reject(new DOMException("Unrecognized name.", "NotSupportedError")) },
      });
      await expect(loadOrCreateKey(memoryStore())).rejects.toThrow(
        /this browser cannot make an Ed25519 device key; use a current Chrome, Edge, Firefox or Safari/,
      );
      vi.stubGlobal("crypto", {});
      await expect(loadOrCreateKey(memoryStore())).rejects.toThrow(/over https:\/\//);
    } finally {
      vi.unstubAllGlobals();
    }
  });
});

describe("addRuleArgs", () => {
  const base = { runtime: null, machine: null, directory: " /home/alice/src/shop ", tool: "Bash", pattern: "npm test*", pattern_kind: "glob" as const, answer: "allow" as const, days: 7, note: "", allow_risky: false, confirmed_risky: false };
  const at = new Date("2026-12-05T00:31:12.345Z");

  test("the rule as serde writes RuleSpec: blank parts left out, whole-second expiry `days` on", async () => {
    expect(ruleSpec(base, at)).toEqual({ match: { directory: "/home/alice/src/shop", tool: "Bash", input: { kind: "glob", pattern: "npm test*" } }, answer: "allow", expires_at: "2026-12-12T00:31:12Z" });
    const args = await addRuleArgs(base, "rul_" + "0".repeat(32), at);
    expect(Object.keys(args).sort()).toEqual(["rule", "rule_id"]);
    expect(ruleId()).toMatch(/^rul_[0-9a-f]{32}$/);
  });

  test("a rule allowing risky calls repeats its digest once confirmed twice, as the server checks", async () => {
    const risky = { ...base, pattern: "rm -rf build", allow_risky: true };
    await expect(addRuleArgs(risky, undefined, at)).rejects.toThrow(/confirmed a second time/);
    await expect(addRuleArgs({ ...risky, answer: "deny", confirmed_risky: true }, undefined, at)).rejects.toThrow(/only an allow rule/);
    const args = await addRuleArgs({ ...risky, confirmed_risky: true }, undefined, at);
    expect((args.rule as { allow_risky?: boolean }).allow_risky).toBe(true);
    // sha256 of the rule's RFC 8785 bytes, written out by hand.
    const canonical = '{"allow_risky":true,"answer":"allow","expires_at":"2026-12-12T00:31:12Z","match":{"directory":"/home/alice/src/shop","input":{"kind":"glob","pattern":"rm -rf build"},"tool":"Bash"}}';
    expect(text(canonicalBytes(args.rule))).toBe(canonical);
    const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(canonical)));
    expect(args.confirm_risky).toBe(`sha256:${Array.from(hash, (b) => b.toString(16).padStart(2, "0")).join("")}`);
  });
});
