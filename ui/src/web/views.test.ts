// The web companion's views against the app's: every case in fixtures/views.json is a mirror
// answer from the recorded conformance run (or one with a field changed to reach another
// branch) and the view src-tauri/src/views.rs makes of it (src-tauri/src/view_cases.rs, written
// by `cargo run -p waymark-app --example bindings -- write`). views.ts must make the same one,
// so the same React screens show the same thing in the app and on a phone.
import cases from "./fixtures/views.json";
import type { InboxItem, ThreadDetail, ThreadRow } from "./mirror";
import { inboxItemView, threadDetailView, threadRowView } from "./views";

type Case = { name: string; view: string; me: string | null; input: unknown; expected: unknown };
const { now, cases: all } = cases as unknown as { now: number; cases: Case[] };

/** The view `views.ts` makes of a case's input. */
function shape(c: Case): unknown {
  switch (c.view) {
    case "thread_row":
      return threadRowView(c.input as ThreadRow, now, c.me);
    case "inbox_item":
      return inboxItemView(c.input as InboxItem, c.me);
    case "thread_detail":
      return threadDetailView(c.input as ThreadDetail, now);
    default:
      throw new Error(`case ${c.name}: no view named ${c.view}`);
  }
}

/** JSON as it crosses the app's IPC: an `undefined` field is not sent at all. */
function asSent(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v));
}

test("the cases cover every view and the branches the run did not reach", () => {
  expect(new Set(all.map((c) => c.view))).toEqual(new Set(["thread_row", "inbox_item", "thread_detail"]));
  expect(all.length).toBeGreaterThanOrEqual(20);
});

test.each(all.map((c) => [c.name, c] as const))("%s", (_name, c) => {
  // toStrictEqual: a field views.rs sends as null must not be missing here, nor the reverse.
  expect(asSent(shape(c))).toStrictEqual(c.expected);
});
