// Fixtures as data: the shapes the shell sends (typed by the generated bindings), with the
// values the demo agent's run produces.
import type { CheckpointView, InboxItemView, OutboxView, ReceiptView, StatusView, TaskView, ThreadRowView } from "../bindings";

export const NOW = Date.UTC(2025, 0, 15, 12, 0, 0);

export const DIFF = `diff --git a/checkout/pricing.py b/checkout/pricing.py
index 3b18e51..a1f2c9d 100644
--- a/checkout/pricing.py
+++ b/checkout/pricing.py
@@ -1,5 +1,5 @@
 def total(items, discount_percent=0):
     subtotal = sum(i.price * i.qty for i in items)
-    return subtotal - discount_percent
+    return subtotal * (100 - discount_percent) / 100
 
 
`;

export const failingReceipt: ReceiptView = {
  id: "rcpt_1",
  step: "reproduce",
  command: "python3 -m pytest --junitxml=junit.xml",
  exit_code: 1,
  commit: "3b18e51aa0c1d2e3f4",
  totals: { tests: 4, passed: 3, failures: 1, errors: 0, skipped: 0 },
  failures: [{ suite: "pytest", classname: "tests.test_pricing", name: "test_ten_percent_promo", kind: "failure", message: "AssertionError: assert 90 == 90.0 - 10" }],
  duration_seconds: 0.2,
  passed: false,
  junit_sha256: "aa".repeat(32),
  created_at: NOW - 120_000,
};

export const passingReceipt: ReceiptView = {
  ...failingReceipt,
  id: "rcpt_2",
  step: "verify",
  exit_code: 0,
  totals: { tests: 4, passed: 4, failures: 0, errors: 0, skipped: 0 },
  failures: [],
  passed: true,
};

export function approval(over: Partial<InboxItemView["decision"]> = {}): InboxItemView {
  const base: Omit<InboxItemView["decision"], "closing"> = {
      id: "dec_1",
      task_id: "task_1",
      kind: "approval",
      status: "pending",
      step: "deploy_staging",
      question: "Deploy a1f2c9d to staging?",
      options: [],
      default_option: "deny",
      intent: { target: "staging", service: "checkout-service", commit: "a1f2c9d" },
      intent_digest: "sha256:" + "ab12".repeat(16),
      effect_id: "eff_1",
      plan_revision: 1,
      risky: false,
      expires_at: NOW + 30 * 60_000,
      created_at: NOW - 60_000,
      outcome: null,
      durability: null,
      delivery: null,
      delivery_detail: null,
      editable: null,
      can_wait: false,
      deliveries: [],
      escalation: null,
      ...over,
  };
  // As `Decision::closing` derives it where the test gives none: a hook's deadline is Claude
  // Code's, else our default applies at our expiry.
  const closing: InboxItemView["decision"]["closing"] =
    over.closing ??
    (base.durability === "fail_open_hook"
      ? { at: base.expires_at, runtime: "Claude Code", then: "runtime_asks_itself", option: null }
      : base.default_option != null
        ? { at: base.expires_at, runtime: null, then: "default", option: base.default_option }
        : { at: base.expires_at, runtime: null, then: "no_default", option: null });
  return {
    decision: { ...base, closing },
    task_title: "Fix the failing checkout discount test and deploy to staging",
    on_behalf_of: null,
    plan_revision: 1,
    stale: false,
    diffs: [{ id: "art_1", sha256: "cd".repeat(32), name: "fix.diff", media_type: "text/x-diff", size: DIFF.length, step: "fix", is_diff: true, created_at: NOW - 90_000 }],
    receipts: [failingReceipt, passingReceipt],
  };
}

export const task: TaskView = {
  id: "task_1",
  title: "Fix the failing checkout discount test and deploy to staging",
  goal: "ALERT",
  runtime: "waymark-demo",
  state: "waiting_approval",
  terminal: false,
  plan_revision: 1,
  fence: 1,
  budget: { max_wall_seconds: 3600, max_tokens: null, max_cost_usd: null, elapsed_seconds: 900, used_tokens: 0, used_cost_usd: 0 },
  repo: "/tmp/checkout-service",
  commit: "3b18e51",
  outcome_summary: null,
  machine_id: null,
  created_at: NOW - 900_000,
  updated_at: NOW - 60_000,
};

export function checkpoint(sequence: number, over: Partial<CheckpointView> = {}): CheckpointView {
  return {
    sequence,
    attempt_id: "att_1",
    fence: 1,
    reason: "step_completed",
    plan_revision: 1,
    completed_steps: [],
    pending_step: null,
    effects: [],
    summary: null,
    commit: "3b18e51",
    digest: `sha256:${String(sequence).repeat(64).slice(0, 64)}`,
    prev_digest: null,
    created_at: NOW - (10 - sequence) * 60_000,
    ...over,
  };
}

export const row: ThreadRowView = {
  task,
  pending_decisions: 1,
  unknown_effects: 0,
  last_checkpoint: checkpoint(4, { reason: "human_wait" }),
  stages: [
    { step: "reproduce", title: "Reproduce the failing test", status: "done", verified: true },
    { step: "fix", title: "Patch the bug", status: "done", verified: false },
    { step: "verify", title: "Re-run the suite", status: "done", verified: true },
    { step: "deploy_staging", title: "Deploy to staging (needs approval)", status: "in_flight", verified: false },
  ],
  pinned: false,
  on_behalf_of: null,
};

export function outbox(over: Partial<OutboxView> = {}): OutboxView {
  return {
    command_id: "cmd_1",
    task_id: "task_1",
    operation: "pause",
    based_on_revision: 1,
    status: "queued",
    detail: null,
    met_revision: null,
    what_changed: null,
    created_at: NOW - 30_000,
    delivered_at: null,
    acknowledged_at: null,
    ...over,
  };
}

export function status(over: Partial<StatusView> = {}): StatusView {
  return {
    mode: "remote",
    paired: true,
    server: "http://127.0.0.1:7300",
    device_id: "dev_1",
    user: "alice",
    scopes: ["view", "steer", "approve"],
    connected: true,
    server_reachable: true,
    last_sync_at: NOW - 5 * 60_000,
    last_event_at: NOW - 5 * 60_000,
    reconnecting_since: null,
    last_error: null,
    queued: 0,
    pending_decisions: 1,
    muted_until: null,
    demo: null,
    keystore: "the Secret Service keychain",
    ...over,
  };
}
