// The thread list and the inbox with 10,000 threads: windowed (only a screenful and an overscan
// in the DOM), the total told to assistive technology, rows reached by scrolling, by keyboard
// and by a deep link, variable card heights measured, and the first row where the e2e test
// (src-tauri/tests/e2e.rs) looks for it. jsdom has no layout: the window is the scroll
// container (no stylesheet makes <main> scroll), 1024×768, and sizes fall back to estimates.
import { afterEach, describe, expect, it, vi } from "vitest";
import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import type { InboxItemView, ThreadRowView } from "../bindings";
import { I18nProvider } from "../i18n";
import { THREAD_ROW_ESTIMATE, ThreadsScreen } from "../screens/Threads";
import { CARD_ESTIMATE, InboxScreen } from "../screens/Inbox";
import { DIFF, approval, row, status, task } from "./fixtures";

const N = 10_000;

const mirror = vi.hoisted(() => ({ data: null as unknown, opened: [] as string[] }));

vi.mock("../data", () => ({
  useMirror: () => ({ data: mirror.data, error: null, reload: () => {} }),
  commands: {
    listMachines: async () => [],
    // Cards on screen are reported opened (proof of delivery).
    markOpened: async (ids: string[]) => {
      mirror.opened.push(...ids);
      return ids.length;
    },
  },
  events: {},
  errorText: (e: unknown) => String(e),
  loadText: async () => ({ text: DIFF, size: DIFF.length, truncated: false }),
}));

const rows: ThreadRowView[] = Array.from({ length: N }, (_, i) => ({ ...row, task: { ...task, id: `task_${i}`, title: `${task.title} #${i}` } }));
const items: InboxItemView[] = Array.from({ length: N }, (_, i) => approval({ id: `dec_${i}`, task_id: `task_${i}`, question: `Deploy #${i} to staging?` }));

function threads(n = N) {
  mirror.data = rows.slice(0, n);
  return render(
    <I18nProvider initial="en">
      <ThreadsScreen go={() => {}} status={status()} />
    </I18nProvider>,
  );
}

function inbox(focus?: string) {
  mirror.data = items;
  return render(
    <I18nProvider initial="en">
      <InboxScreen go={() => {}} focus={focus} />
    </I18nProvider>,
  );
}

const threadRows = () => [...document.querySelectorAll<HTMLLIElement>("ul.threads > li.thread-row")];
const cards = () => [...document.querySelectorAll<HTMLElement>("article[data-testid^='decision-']")];
const ids = (els: HTMLElement[]) => els.map((e) => Number(e.dataset.index));

/** Scrolls the window (the scroll container in jsdom) and waits for the list to follow. */
async function scrollTo(top: number) {
  await act(async () => {
    window.scrollTo({ top });
    await new Promise((r) => setTimeout(r, 10));
  });
}

afterEach(() => {
  vi.restoreAllMocks();
  mirror.opened.length = 0;
});

describe("thread list, windowed", () => {
  it("renders a screenful of 10,000 threads, the first on top, and tells the total", () => {
    threads();
    const shown = threadRows();
    // 768 px of view at the estimate, plus the overscan: the count does not matter.
    expect(shown.length).toBeGreaterThan(1);
    expect(shown.length).toBeLessThanOrEqual(Math.ceil(768 / THREAD_ROW_ESTIMATE) + 1 + 4);
    expect(ids(shown)).toEqual(shown.map((_, i) => i));
    // What the e2e test clicks first is the first thread, first in the DOM.
    expect(document.querySelector("button[data-testid^=thread-]")?.getAttribute("data-testid")).toBe("thread-task_0");
    const list = screen.getByRole("list", { name: "Threads" });
    const first = within(list).getAllByRole("listitem")[0];
    expect(first.getAttribute("aria-setsize")).toBe(String(N));
    expect(first.getAttribute("aria-posinset")).toBe("1");
    // The list is as tall as all its rows, so the scrollbar tells the length.
    expect(list.style.height).toBe(`${N * THREAD_ROW_ESTIMATE}px`);
    expect(screen.queryByTestId("thread-task_9999")).toBeNull();
  });

  it("renders every row of a short list", () => {
    threads(3);
    expect(ids(threadRows())).toEqual([0, 1, 2]);
    expect(threadRows()[2].getAttribute("aria-setsize")).toBe("3");
  });

  it("brings later rows in as the list scrolls, and drops the ones scrolled past", async () => {
    threads();
    await scrollTo(5000 * THREAD_ROW_ESTIMATE);
    const shown = ids(threadRows());
    expect(shown).toContain(5000);
    expect(shown).not.toContain(0);
    expect(shown.length).toBeLessThanOrEqual(Math.ceil(768 / THREAD_ROW_ESTIMATE) + 1 + 8);
    expect(screen.getByTestId("thread-task_5000").closest("li")?.getAttribute("aria-posinset")).toBe("5001");
  });

  it("moves between threads with ↑ ↓ Home End, rendering the one it reaches", async () => {
    threads();
    const user = userEvent.setup();
    act(() => screen.getByTestId("thread-task_0").focus());
    await user.keyboard("{ArrowDown}");
    expect(document.activeElement).toBe(screen.getByTestId("thread-task_1"));
    await user.keyboard("{End}");
    const last = screen.getByTestId("thread-task_9999");
    expect(document.activeElement).toBe(last);
    expect(last.closest("li")?.getAttribute("aria-posinset")).toBe(String(N));
    await waitFor(() => expect(ids(threadRows())).toContain(9998));
    expect(threadRows().length).toBeLessThan(30);
    await user.keyboard("{ArrowUp}");
    expect(document.activeElement).toBe(screen.getByTestId("thread-task_9998"));
    await user.keyboard("{Home}");
    expect(document.activeElement).toBe(screen.getByTestId("thread-task_0"));
  });

  it("keeps the focused row rendered when it is scrolled far away", async () => {
    threads();
    act(() => screen.getByTestId("thread-task_1").focus());
    await scrollTo(7000 * THREAD_ROW_ESTIMATE);
    expect(ids(threadRows())).toContain(7000);
    expect(document.activeElement).toBe(screen.getByTestId("thread-task_1"));
    expect(ids(threadRows())).not.toContain(0);
  });
});

describe("inbox, windowed", () => {
  it("renders a screenful of 10,000 cards as a feed, the first on top with its evidence", async () => {
    inbox();
    const shown = cards();
    expect(shown.length).toBeGreaterThan(0);
    expect(shown.length).toBeLessThanOrEqual(Math.ceil(768 / CARD_ESTIMATE) + 1 + 2);
    const feed = screen.getByRole("feed", { name: "Decisions waiting for you" });
    expect(feed.getAttribute("aria-busy")).toBe("false");
    const first = shown[0];
    expect(first.dataset.testid).toBe("decision-dec_0");
    expect(first.getAttribute("aria-setsize")).toBe(String(N));
    expect(first.getAttribute("aria-posinset")).toBe("1");
    expect(first.tabIndex).toBe(0);
    // The e2e test reads the first card, its receipts, then opens its diff.
    expect(first.textContent).toContain("staging");
    expect(document.querySelector("[data-testid=receipts]")?.closest("article")).toBe(first);
    expect(document.querySelector("[data-testid=diff-viewer]")).toBeNull();
    await userEvent.click(within(first).getByTestId("show-diff"));
    expect(within(first).getByTestId("diff-viewer")).toBeTruthy();
    expect(document.querySelector("[data-testid=approve]")?.closest("article")).toBe(first);
    // Only the cards drawn are reported opened, in one batch.
    await waitFor(() => expect(mirror.opened.length).toBeGreaterThan(0));
    expect(mirror.opened).toContain("dec_0");
    expect(mirror.opened.length).toBeLessThanOrEqual(shown.length);
  });

  it("places cards by their measured heights, which differ", () => {
    // jsdom has no layout: give cards heights as a browser would measure them.
    vi.spyOn(HTMLElement.prototype, "offsetHeight", "get").mockImplementation(function (this: HTMLElement) {
      return this.tagName === "ARTICLE" ? (Number(this.dataset.index) % 2 === 0 ? 300 : 420) : 0;
    });
    inbox();
    const shown = cards();
    const tops = shown.map((c) => c.style.top);
    expect(tops.slice(0, 3)).toEqual(["0px", "300px", "720px"]);
    // Smaller cards than the estimate: more of them fit in 768 px.
    expect(shown.length).toBeGreaterThanOrEqual(3);
  });

  it("moves between cards with Page Down / Page Up, rendering the ones it reaches", async () => {
    inbox();
    const user = userEvent.setup();
    act(() => cards()[0].focus());
    await user.keyboard("{PageDown}");
    expect(document.activeElement).toBe(screen.getByTestId("decision-dec_1"));
    for (let i = 0; i < 9; i++) await user.keyboard("{PageDown}");
    expect(document.activeElement).toBe(screen.getByTestId("decision-dec_10"));
    await user.keyboard("{PageUp}");
    expect(document.activeElement).toBe(screen.getByTestId("decision-dec_9"));
    await waitFor(() => expect(ids(cards())).not.toContain(0));
    expect(cards().length).toBeLessThan(10);
  });

  it("scrolls a deep-linked decision into view and focuses it", async () => {
    inbox("dec_7000");
    const card = screen.getByTestId("decision-dec_7000");
    expect(document.activeElement).toBe(card);
    expect(card.className).toContain("focused");
    expect(card.getAttribute("aria-posinset")).toBe("7001");
    await waitFor(() => expect(ids(cards())).toContain(7001));
    expect(cards().length).toBeLessThan(10);
  });

  it("keeps a card with an open diff rendered when scrolled away, and lets an idle one go", async () => {
    inbox();
    const outside = document.body.appendChild(document.createElement("button"));
    await userEvent.click(within(screen.getByTestId("decision-dec_0")).getByTestId("show-diff"));
    act(() => outside.focus());
    await scrollTo(3000 * CARD_ESTIMATE);
    expect(ids(cards())).toContain(3000);
    // dec_0 holds an open diff; dec_1 held nothing.
    expect(screen.getByTestId("decision-dec_0")).toBeTruthy();
    expect(within(screen.getByTestId("decision-dec_0")).getByTestId("diff-viewer")).toBeTruthy();
    expect(screen.queryByTestId("decision-dec_1")).toBeNull();
    await userEvent.click(within(screen.getByTestId("decision-dec_0")).getByTestId("show-diff"));
    act(() => outside.focus());
    await scrollTo(3000 * CARD_ESTIMATE + 10);
    await waitFor(() => expect(screen.queryByTestId("decision-dec_0")).toBeNull());
    outside.remove();
  });

  it("says it is busy while the mirror has not answered", () => {
    mirror.data = null;
    render(
      <I18nProvider initial="en">
        <InboxScreen go={() => {}} />
      </I18nProvider>,
    );
    expect(screen.getByRole("feed").getAttribute("aria-busy")).toBe("true");
    fireEvent.keyDown(screen.getByRole("feed"), { key: "PageDown" });
    expect(cards()).toHaveLength(0);
  });
});
