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

async function describe(payload) {
  const fallback = { title: "Waymark", body: "Something needs you — open Waymark to see it.", tag: payload.task_id };
  const session = await readKey("waymark-session");
  if (!session || !session.token || !payload.task_id) return fallback;
  try {
    const res = await fetch(`../v1/tasks/${encodeURIComponent(payload.task_id)}`, { headers: { authorization: `Bearer ${session.token}` } });
    if (!res.ok) return fallback;
    const detail = await res.json();
    const pending = (detail.decisions || []).filter((d) => d.status === "pending");
    const d = pending[pending.length - 1];
    if (payload.type === "decision.requested" && d) {
      const deadline = new Date(d.expires_at);
      const then = d.default_option ? `then ${d.default_option}` : "then it expires";
      return {
        title: d.question,
        body: `${detail.task.title} · plan revision ${d.plan_revision} · ${then} at ${deadline.toLocaleTimeString()}`,
        tag: d.id,
      };
    }
    return { title: detail.task.title, body: `The task is ${String(detail.task.state).replace(/_/g, " ")}.`, tag: payload.task_id };
  } catch {
    return fallback;
  }
}

self.addEventListener("push", (event) => {
  let payload = {};
  try {
    payload = event.data ? event.data.json() : {};
  } catch {
    payload = {};
  }
  event.waitUntil(
    describe(payload).then((n) =>
      self.registration.showNotification(n.title, {
        body: n.body,
        tag: n.tag,
        icon: "icon-192.png",
        data: { task_id: payload.task_id || null },
        actions: [{ action: "open", title: "Open" }],
      }),
    ),
  );
});

self.addEventListener("notificationclick", (event) => {
  event.notification.close();
  const task = event.notification.data && event.notification.data.task_id;
  const target = new URL(task ? `./#/threads/${encodeURIComponent(task)}` : "./#/inbox", self.registration.scope).href;
  event.waitUntil(
    self.clients.matchAll({ type: "window", includeUncontrolled: true }).then((wins) => {
      for (const w of wins) {
        if ("focus" in w) {
          w.navigate(target);
          return w.focus();
        }
      }
      return self.clients.openWindow(target);
    }),
  );
});
