// First render of the thread list and the inbox with 10,000 threads, in jsdom: the real
// screens (ui/src/screens) and their real components, with the mirror's answer already in
// hand (the shell call is mocked), so the time is React + the DOM building what is shown.
//
//   cd ui && NODE_OPTIONS=--max-old-space-size=6144 npx vitest bench --run src/bench
//
// It prints the first (cold) render of each with 10,000 threads, then tinybench's figures for
// warm renders of 1,000 and of 10,000. Both lists are windowed (src/windowed.ts): a render
// draws the first screenful and an overscan, whatever the count, and each timed render checks
// that it did (the first row on top, a bounded number of rows, the total in aria-setsize).
// jsdom is slower than a browser engine, has no layout (the window is the scroll container,
// 1024×768, and rows take their estimated heights) and runs React's development build, so read
// the figures as an upper bound on the work React and the DOM do, not as the app's paint time.
// Benchmarks report; they assert nothing beyond what was drawn.
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

/** Times one render of `n` rows and checks what it drew: the first row on top, the total told
 * to assistive technology, and no more rows than a screenful and an overscan (a render that drew
 * nothing would be fast; one that drew every row would not be windowed). */
function timed(name: string, draw: (n: number) => ReturnType<typeof render>, selector: string, n = THREADS) {
  const start = performance.now();
  const r = draw(n);
  const ms = performance.now() - start;
  const drawn = [...r.container.querySelectorAll<HTMLElement>(selector)];
  cleanup();
  const first = drawn[0];
  if (!first || first.dataset.index !== "0") throw new Error(`${name}: the first row is not on top`);
  if (first.getAttribute("aria-setsize") !== String(n)) throw new Error(`${name}: aria-setsize ${first.getAttribute("aria-setsize")}, expected ${n}`);
  if (drawn.length > MAX_DRAWN) throw new Error(`${name}: drew ${drawn.length} rows of ${n}, expected a screenful (≤ ${MAX_DRAWN})`);
  return { ms, drawn: drawn.length };
}

const MAX_DRAWN = 30;
const ROW = "li.thread-row";
const CARD = "article[data-testid^='decision-']";
const cold = {
  threads: timed("threads", threads, ROW),
  inbox: timed("inbox", inbox, CARD),
};
console.log(
  `first render, ${THREADS} threads, jsdom, cold: thread list ${cold.threads.ms.toFixed(1)} ms (${cold.threads.drawn} rows drawn), ` +
    `inbox ${cold.inbox.ms.toFixed(1)} ms (${cold.inbox.drawn} cards drawn); target < 100 ms`,
);

describe("warm render (jsdom)", () => {
  const opts = { iterations: 20, warmupIterations: 2, time: 0, warmupTime: 0 };
  bench("thread list, 1,000 threads (ThreadsScreen → ThreadRow)", () => void timed("threads", threads, ROW, 1000), opts);
  bench("thread list, 10,000 threads (ThreadsScreen → ThreadRow)", () => void timed("threads", threads, ROW, THREADS), opts);
  bench("inbox, 1,000 decisions (InboxScreen → InboxCard)", () => void timed("inbox", inbox, CARD, 1000), opts);
  bench("inbox, 10,000 decisions (InboxScreen → InboxCard)", () => void timed("inbox", inbox, CARD, THREADS), opts);
});
