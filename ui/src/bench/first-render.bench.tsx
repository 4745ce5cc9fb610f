// First render of the thread list and the inbox with 10,000 threads, in jsdom: the real
// screens (ui/src/screens) and their real components, with the mirror's answer already in
// hand (the shell call is mocked), so the time is React + the DOM building every row.
//
//   cd ui && NODE_OPTIONS=--max-old-space-size=6144 npx vitest bench --run src/bench
//
// (10,000 inbox cards in jsdom need more than node's default heap.) It prints the first (cold)
// render of each with 10,000 threads, then tinybench's figures for warm renders of 1,000 (the
// cost grows with the rows: nothing is virtualised). jsdom is slower than a browser engine and
// has no layout, so read the figures as the work React and the DOM do, not as the app's paint
// time. Benchmarks report; they assert nothing.
import { bench, describe, vi } from "vitest";
import { render, cleanup } from "@testing-library/react";
import type { InboxItemView, ThreadRowView } from "../bindings";
import { I18nProvider } from "../i18n";
import { ThreadsScreen } from "../screens/Threads";
import { InboxScreen } from "../screens/Inbox";
import { approval, row, status, task } from "../test/fixtures";

const THREADS = 10_000;

const mirror = vi.hoisted(() => ({ data: null as unknown }));

vi.mock("../data", () => ({
  useMirror: () => ({ data: mirror.data, error: null, reload: () => {} }),
  commands: {},
  events: {},
  errorText: (e: unknown) => String(e),
  loadText: async () => ({ text: "", size: 0, truncated: false }),
}));

const rows: ThreadRowView[] = Array.from({ length: THREADS }, (_, i) => ({
  ...row,
  task: { ...task, id: `task_${i}`, title: `${task.title} #${i}`, state: i % 3 === 0 ? "running" : task.state },
  pending_decisions: i % 2,
}));

const items: InboxItemView[] = Array.from({ length: THREADS }, (_, i) => {
  const a = approval({ id: `dec_${i}`, task_id: `task_${i}` });
  return { ...a, task_title: `${a.task_title} #${i}` };
});

function threads(n = THREADS) {
  mirror.data = rows.slice(0, n);
  return render(
    <I18nProvider initial="en">
      <ThreadsScreen go={() => {}} status={status()} />
    </I18nProvider>,
  );
}

function inbox(n = THREADS) {
  mirror.data = items.slice(0, n);
  return render(
    <I18nProvider initial="en">
      <InboxScreen go={() => {}} />
    </I18nProvider>,
  );
}

/** Times one render of `n` rows and checks it drew them all (a render that drew nothing would
 * be fast). */
function timed(name: string, draw: (n: number) => ReturnType<typeof render>, selector: string, n = THREADS) {
  const start = performance.now();
  const r = draw(n);
  const ms = performance.now() - start;
  const drawn = r.container.querySelectorAll(selector).length;
  cleanup();
  if (drawn !== n) throw new Error(`${name}: drew ${drawn} rows, expected ${n}`);
  return ms;
}

const ROW = "li.thread-row";
const CARD = "article[data-testid^='decision-']";
const cold = {
  threads: timed("threads", threads, ROW),
  inbox: timed("inbox", inbox, CARD),
};
const perRow = (ms: number) => ((ms / THREADS) * 1000).toFixed(0);
console.log(
  `first render, ${THREADS} threads, jsdom, cold: thread list ${cold.threads.toFixed(0)} ms (${perRow(cold.threads)} µs a row), ` +
    `inbox ${cold.inbox.toFixed(0)} ms (${perRow(cold.inbox)} µs a card); target < 100 ms`,
);

describe("warm render with 1,000 threads (jsdom)", () => {
  const opts = { iterations: 5, warmupIterations: 1, time: 0, warmupTime: 0 };
  bench("thread list (ThreadsScreen → ThreadRow ×1,000)", () => void timed("threads", threads, ROW, 1000), opts);
  bench("inbox (InboxScreen → InboxCard ×1,000)", () => void timed("inbox", inbox, CARD, 1000), opts);
});
