// The web companion's service worker: keeps the app shell for offline use (the data lives in
// the SQLite mirror, not here), and turns a content-free Web Push into a notification with
// what is asked, fetched over the device's own read session. It never caches the API.
"use strict";

const SHELL = "waymark-shell-v1";

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(SHELL).then((c) => c.addAll(["./", "./manifest.webmanifest", "./icon-192.png"])).then(() => self.skipWaiting()));
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== SHELL).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

self.addEventListener("fetch", (event) => {
  const req = event.request;
  const url = new URL(req.url);
  const scope = new URL(self.registration.scope);
  if (req.method !== "GET" || url.origin !== scope.origin || !url.pathname.startsWith(scope.pathname)) return;
  if (req.mode === "navigate") {
    // The page: the network first (a new version shows at once), the kept copy offline.
    event.respondWith(
      fetch(req)
        .then((res) => {
          const copy = res.clone();
          if (res.ok) caches.open(SHELL).then((c) => c.put("./", copy));
          return res;
        })
        .catch(() => caches.match("./").then((r) => r || Response.error())),
    );
    return;
  }
  if (url.pathname.startsWith(scope.pathname + "assets/")) {
    // Named by their content's hash: a kept copy is always right.
    event.respondWith(
      caches.match(req).then(
        (hit) =>
          hit ||
          fetch(req).then((res) => {
            const copy = res.clone();
            if (res.ok) caches.open(SHELL).then((c) => c.put(req, copy));
            return res;
          }),
      ),
    );
  }
});

/** The page keeps the device's read session here (idb-keyval's default store). */
function readKey(key) {
  return new Promise((resolve) => {
    const open = indexedDB.open("keyval-store");
    open.onerror = () => resolve(undefined);
    open.onupgradeneeded = () => open.result.createObjectStore("keyval");
    open.onsuccess = () => {
      try {
        const get = open.result.transaction("keyval", "readonly").objectStore("keyval").get(key);
        get.onsuccess = () => resolve(get.result);
        get.onerror = () => resolve(undefined);
      } catch {
        resolve(undefined);
      }
    };
  });
}

/** A line of what an intent asks: its first few fields, as `key=value`. */
function intentLine(intent) {
  if (!intent || typeof intent !== "object") return "";
  return Object.entries(intent)
    .slice(0, 3)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(", ");
}

/** The newest test receipt, in a line (`TaskDetail.test_receipts`, `TestTotals`). */
function receiptLine(receipts) {
  const list = Array.isArray(receipts) ? receipts : [];
  const r = list[list.length - 1];
  if (!r || !r.totals) return "";
  const t = r.totals;
  const failed = (t.failures || 0) + (t.errors || 0);
  return `Tests: ${t.passed || 0} passed, ${failed} failed${t.skipped ? `, ${t.skipped} skipped` : ""}`;
}

/** The newest diff the task attached, in a line. */
function diffLine(artifacts) {
  const list = (Array.isArray(artifacts) ? artifacts : []).filter((a) => a && (a.media_type === "text/x-diff" || /\.(diff|patch)$/.test(a.name || "")));
  const a = list[list.length - 1];
  return a ? `Diff: ${a.name} (${a.size} bytes)` : "";
}

/** Writes a key where the page's idb-keyval reads it. */
function writeKey(key, value) {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open("keyval-store");
    open.onerror = () => reject(open.error);
    open.onupgradeneeded = () => open.result.createObjectStore("keyval");
    open.onsuccess = () => {
      const tx = open.result.transaction("keyval", "readwrite");
      tx.objectStore("keyval").put(value, key);
      tx.oncomplete = () => resolve();
      tx.onerror = () => reject(tx.error);
    };
  });
}

async function describe(payload) {
  const fallback = { title: "Waymark", body: "Something needs you — open Waymark to see it.", tag: payload.task_id, data: { task_id: payload.task_id || null }, actions: [] };
  const session = await readKey("waymark-session");
  if (!session || !session.token || !payload.task_id) return fallback;
  try {
    const res = await fetch(`../v1/tasks/${encodeURIComponent(payload.task_id)}`, { headers: { authorization: `Bearer ${session.token}` } });
    if (!res.ok) return fallback;
    const detail = await res.json();
    const pending = (detail.decisions || []).filter((d) => d.status === "pending");
    const d = pending[pending.length - 1];
    // Another user's task (they delegated their decisions to this one) says whose it is.
    const whose = session.user && detail.task.owner && detail.task.owner !== session.user ? `For ${detail.task.owner}: ` : "";
    if ((payload.type === "decision.requested" || payload.type === "decision.escalated") && d) {
      const deadline = new Date(d.expires_at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
      // A hook that times out fails open: the runtime decides then, not our default.
      const then =
        d.durability === "fail_open_hook"
          ? `the runtime decides on its own at ${deadline} if nobody answers`
          : d.default_option
            ? `${d.default_option} at ${deadline} if nobody answers`
            : `expires at ${deadline}`;
      const lines = [detail.task.title, intentLine(d.intent), diffLine(detail.artifacts), receiptLine(detail.test_receipts), `Plan revision ${d.plan_revision} · ${then}`].filter(Boolean);
      // Only an approval the policy does not mark risky is answered from the notification;
      // a risky one opens its full card.
      const quick = d.kind === "approval" && !d.risky;
      return {
        title: whose + d.question,
        body: lines.join("\n"),
        tag: d.id,
        data: { task_id: payload.task_id, decision_id: d.id, plan_revision: d.plan_revision, intent_digest: d.intent_digest || null },
        actions: quick
          ? [
              { action: "approve", title: "Approve" },
              { action: "deny", title: "Deny" },
            ]
          : [{ action: "open", title: "Open" }],
      };
    }
    return { title: detail.task.title, body: `The task is ${String(detail.task.state).replace(/_/g, " ")}.`, tag: payload.task_id, data: { task_id: payload.task_id }, actions: [] };
  } catch (e) {
    // Still tell the person something needs them; say why the details are missing.
    console.warn("waymark: could not describe the push", e);
    return fallback;
  }
}

/** Proof of delivery: tells the server this device fetched, showed or opened a decision, with
 * the page's read session. Never in the way of the notification itself. */
async function receipt(decisionId, steps) {
  const session = await readKey("waymark-session");
  if (!decisionId || !session || !session.token || !session.device_id) return;
  try {
    await fetch(`../v1/devices/${encodeURIComponent(session.device_id)}/receipts`, {
      method: "POST",
      headers: { authorization: `Bearer ${session.token}`, "content-type": "application/json" },
      body: JSON.stringify({ receipts: steps.map((step) => ({ decision_id: decisionId, step })) }),
    });
  } catch (e) {
    console.info("waymark: could not report the notification's receipt", e);
  }
}

/** The decision's question and what closed it, in a line: "Answered on alice's laptop ·
 * Approve", "Nobody answered: Deny applied", … — fetched over the device's session like
 * `describe`; nothing when it cannot be fetched. */
async function closedLine(payload) {
  const session = await readKey("waymark-session");
  if (!session || !session.token || !payload.task_id) return null;
  try {
    const res = await fetch(`../v1/tasks/${encodeURIComponent(payload.task_id)}`, { headers: { authorization: `Bearer ${session.token}` } });
    if (!res.ok) return null;
    const detail = await res.json();
    const d = (detail.decisions || []).find((x) => x.id === payload.decision_id);
    if (!d) return null;
    const o = d.outcome || {};
    const chosen = (d.options || []).find((x) => x.id === o.option);
    const what = chosen ? chosen.label : o.option || "";
    const answered = (d.deliveries || []).filter((x) => x.step === "answered").pop();
    const line =
      d.status === "resolved" && String(o.by || "").startsWith("rule:")
        ? `Answered by a standing rule${what ? ` · ${what}` : ""}`
        : d.status === "resolved"
          ? `Answered${answered ? ` on ${answered.device_name}` : ""}${what ? ` · ${what}` : ""}`
          : d.status === "expired"
            ? o.by === "runtime"
              ? "The runtime decided on its own"
              : `Nobody answered: ${what ? `${what} applied` : "it expired"}`
            : "No longer asked (the plan moved on or the task ended)";
    return { question: d.question, line };
  } catch (e) {
    console.info("waymark: could not say how the decision closed", e);
    return null;
  }
}

/** A decision closed (answered on another device, by a rule, expired, or the runtime
 * decided): its notification is replaced, quietly and without buttons, by one saying so —
 * every push must show something (Safari revokes subscriptions whose pushes show nothing) —
 * and where none was showing any more, the replacement is closed at once. */
async function withdraw(payload) {
  const tag = payload.decision_id;
  const showing = await self.registration.getNotifications({ tag });
  const said = await closedLine(payload);
  await self.registration.showNotification(said ? said.line : "Answered elsewhere", {
    body: said ? `${said.question}\nNothing to do here any more.` : "Nothing to do here any more.",
    tag,
    silent: true,
    renotify: false,
    icon: "icon-192.png",
    data: { task_id: payload.task_id || null, decision_id: tag, closed: true },
    actions: [],
  });
  if (showing.length === 0) {
    for (const n of await self.registration.getNotifications({ tag })) n.close();
  }
}

self.addEventListener("push", (event) => {
  let payload = {};
  try {
    payload = event.data ? event.data.json() : {};
  } catch {
    payload = {};
  }
  if (payload.type === "decision.closed" && typeof payload.decision_id === "string") {
    event.waitUntil(withdraw(payload));
    return;
  }
  event.waitUntil(
    describe(payload).then((n) =>
      self.registration
        .showNotification(n.title, {
          body: n.body,
          tag: n.tag,
          // A step or a reminder of a decision already shown alerts again, in its place.
          renotify: payload.type === "decision.escalated" && Boolean(n.tag),
          icon: "icon-192.png",
          data: n.data,
          actions: n.actions,
        })
        .then(() => receipt(n.data.decision_id, ["fetched", "shown"])),
    ),
  );
});

/** Where a click leads. An Approve / Deny is handed to the page through IndexedDB under a
 * one-time nonce, with what the notification showed (plan revision, intent digest): the page
 * signs exactly that, and a link from anywhere else, which cannot know the nonce, answers
 * nothing. */
async function target(action, data) {
  const d = data || {};
  // A withdrawn notification leads to the task, where the answer is.
  if (d.closed && d.task_id) return `./#/threads/${encodeURIComponent(d.task_id)}`;
  if (d.decision_id && (action === "approve" || action === "deny")) {
    const nonce = crypto.randomUUID();
    await writeKey("waymark-action", { nonce, op: action, decision_id: d.decision_id, plan_revision: d.plan_revision, intent_digest: d.intent_digest || null, at: Date.now() });
    return `./#/inbox/${encodeURIComponent(d.decision_id)}?action=${nonce}`;
  }
  if (d.decision_id) return `./#/inbox/${encodeURIComponent(d.decision_id)}`;
  if (d.task_id) return `./#/threads/${encodeURIComponent(d.task_id)}`;
  return "./#/inbox";
}

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const data = event.notification.data || {};
  event.waitUntil(
    Promise.all([data.closed ? null : receipt(data.decision_id, ["opened"]), target(event.action, data)]).then(([, path]) => {
      const url = new URL(path, self.registration.scope).href;
      return self.clients.matchAll({ type: "window", includeUncontrolled: true }).then((wins) => {
        for (const w of wins) {
          if ("focus" in w) return w.navigate(url).then((c) => (c || w).focus());
        }
        return self.clients.openWindow(url);
      });
    }),
  );
});
