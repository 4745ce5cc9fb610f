// Windowed lists: only the rows in view, plus an overscan, are in the DOM, so a list's first
// render costs the same with 10 rows as with 10,000 (issue 11). Built on @tanstack/react-virtual,
// with what the app's lists need on top:
//
// * The scroll container is found from the list itself: the app's <main> (the only thing that
//   scrolls, at desktop and at phone width), or the window where no ancestor scrolls (jsdom,
//   where no stylesheet is loaded). The list's offset inside it (headers, the offline banner,
//   the inbox's "sent" notes above it) is the virtualizer's scroll margin, and the CSS `row-gap`
//   of the list is its gap, so the stylesheet still decides the spacing.
// * Rows are measured as they render (inbox cards differ in height, and grow when a diff is
//   opened); where there is no layout (jsdom: every size is 0) the estimate stands in, and until
//   the container has been measured the window's size is assumed, so the first screenful is in
//   the very first render, in a browser and in tests alike.
// * Rows stay rendered while they matter off-screen: the one holding keyboard focus (a row
//   scrolled away does not take the focus with it) and any the caller names (an inbox card with
//   an open diff, a typed answer or a confirmation in progress).
// * Keyboard: `focusIndex` scrolls a row in (rendering it first if needed) and focuses it, for
//   arrow-key navigation in a list and Page Up / Page Down in a feed.
import { useCallback, useLayoutEffect, useMemo, useRef, useState, type CSSProperties, type FocusEvent, type KeyboardEvent } from "react";
import {
  defaultRangeExtractor,
  elementScroll,
  measureElement as measureWithLayout,
  observeElementOffset,
  observeElementRect,
  observeWindowOffset,
  observeWindowRect,
  useVirtualizer,
  type Range,
  type Rect,
  type VirtualItem,
  type Virtualizer,
} from "@tanstack/react-virtual";

type Scroller = Element | Window;
type AnyVirtualizer = Virtualizer<Element, HTMLElement>;

const isWindow = (s: unknown): s is Window => s != null && (s as Window).window === s;

/** The nearest ancestor that scrolls vertically, else the window. */
export function scrollParent(el: Element): Scroller {
  for (let p = el.parentElement; p; p = p.parentElement) {
    const { overflowY } = getComputedStyle(p);
    if (overflowY === "auto" || overflowY === "scroll" || overflowY === "overlay") return p;
  }
  return window;
}

const scrollTopOf = (s: Scroller) => (isWindow(s) ? s.scrollY : s.scrollTop);

/** The viewport assumed before the container is measured, or where nothing has a size (jsdom). */
const assumedViewport = (): Rect => ({ width: window.innerWidth || 1024, height: window.innerHeight || 768 });

// The library's observers for an element or for the window, whichever the list scrolls in.
// (Its React hook is typed for one or the other; the virtualizer itself handles both.)
const observeRect = (v: AnyVirtualizer, cb: (rect: Rect) => void) => {
  const report = (rect: Rect) => cb(rect.height > 0 ? rect : assumedViewport());
  return isWindow(v.scrollElement) ? observeWindowRect(v as unknown as Virtualizer<Window, HTMLElement>, report) : observeElementRect(v, report);
};

const observeOffset = (v: AnyVirtualizer, cb: (offset: number, isScrolling: boolean) => void) =>
  isWindow(v.scrollElement) ? observeWindowOffset(v as unknown as Virtualizer<Window, HTMLElement>, cb) : observeElementOffset(v, cb);

/** A measured size, or the estimate where layout gives none (jsdom). */
const measure = (el: HTMLElement, entry: ResizeObserverEntry | undefined, v: AnyVirtualizer) => {
  const size = measureWithLayout(el, entry, v);
  return size > 0 ? size : v.options.estimateSize(v.indexFromElement(el));
};

const NONE: readonly never[] = [];

/** Props for a rendered row's root element. */
export type RowProps = {
  ref: (el: HTMLElement | null) => void;
  "data-index": number;
  "aria-posinset": number;
  "aria-setsize": number;
  style: CSSProperties;
};

export type Windowed = {
  /** The rows to render now, in order. */
  rows: VirtualItem[];
  /** Spread on the list element. */
  listProps: {
    ref: (el: HTMLElement | null) => void;
    style: CSSProperties;
    onFocus: (e: FocusEvent<HTMLElement>) => void;
    onBlur: (e: FocusEvent<HTMLElement>) => void;
  };
  /** Spread on a row's root element. */
  rowProps: (row: VirtualItem) => RowProps;
  /** Scrolls row `index` into view (rendering it first if needed) and focuses it. */
  focusIndex: (index: number, align?: "auto" | "start") => void;
  /** Moves focus between rows for a key press, if it is one the list handles. */
  onKeyDown: (e: KeyboardEvent<HTMLElement>) => void;
  virtualizer: AnyVirtualizer;
};

export function useWindowed({
  count,
  getKey,
  estimateSize,
  overscan,
  keep = NONE,
  focusSelector,
  keys,
}: {
  count: number;
  /** A row's stable identity: measured sizes and focus follow it when the list changes. */
  getKey: (index: number) => string;
  /** A row's height before it is measured (px). */
  estimateSize: (index: number) => number;
  /** Rows rendered beyond each edge of the view. */
  overscan: number;
  /** Keys of rows to keep rendered wherever the list is scrolled. */
  keep?: readonly string[];
  /** What to focus inside a row (else the row itself). */
  focusSelector?: string;
  /** "list": ↑ ↓ Home End move between rows' `focusSelector`; "feed": Page Up / Page Down move
   * between rows from anywhere inside one (the ARIA feed pattern). */
  keys: "list" | "feed";
}): Windowed {
  const list = useRef<HTMLElement | null>(null);
  const scroller = useRef<{ list: Element; scroller: Scroller } | null>(null);
  const getScrollElement = useCallback(() => {
    const el = list.current;
    if (!el) return null;
    if (scroller.current?.list !== el) scroller.current = { list: el, scroller: scrollParent(el) };
    // Typed as an element for the hook; the observers above tell the window apart.
    return scroller.current.scroller as Element;
  }, []);

  // Where the list starts in its scroll container, and the gap between rows (from the CSS).
  // Read after every render, before paint: what sits above the list (the offline banner, the
  // inbox's sent notes) changes with renders of the screen or the app, and a resize re-renders
  // through the virtualizer. It sets state only when a value moved.
  const [layout, setLayout] = useState({ margin: 0, gap: 0 });
  // eslint-disable-next-line react-hooks/exhaustive-deps
  useLayoutEffect(() => {
    const el = list.current;
    const s = el && getScrollElement();
    // No client rects: no layout to read (jsdom), where the list starts at 0.
    if (!el || !s || el.getClientRects().length === 0) return;
    const top = isWindow(s) ? 0 : s.getBoundingClientRect().top - s.clientTop;
    const margin = Math.round(el.getBoundingClientRect().top - top + scrollTopOf(s));
    const gap = parseFloat(getComputedStyle(el).rowGap) || 0;
    if (margin !== layout.margin || gap !== layout.gap) setLayout({ margin, gap });
  });

  // The row holding focus, by key, and the rows kept rendered wherever the list is scrolled.
  const [focusedKey, setFocusedKey] = useState<string | null>(null);
  const keepKeys = useMemo(() => (focusedKey == null ? keep : [...keep, focusedKey]), [keep, focusedKey]);
  const needIndex = keepKeys.length > 0;
  const indexOfKey = useMemo(() => {
    if (!needIndex) return null;
    const m = new Map<string, number>();
    for (let i = 0; i < count; i++) m.set(getKey(i), i);
    return m;
  }, [needIndex, count, getKey]);
  const kept = useMemo(() => {
    if (!indexOfKey) return NONE;
    const out = new Set<number>();
    for (const k of keepKeys) {
      const i = indexOfKey.get(k);
      if (i != null) out.add(i);
    }
    return [...out].sort((a, b) => a - b);
  }, [keepKeys, indexOfKey]);
  const rangeExtractor = useCallback(
    (range: Range) => {
      const shown = defaultRangeExtractor(range);
      if (kept.length === 0) return shown;
      return [...new Set([...shown, ...kept])].sort((a, b) => a - b);
    },
    [kept],
  );

  const [initialRect] = useState(assumedViewport);
  const virtualizer = useVirtualizer<Element, HTMLElement>({
    count,
    getScrollElement,
    estimateSize,
    getItemKey: getKey,
    overscan,
    gap: layout.gap,
    scrollMargin: layout.margin,
    initialRect,
    // Room for a focused row's ring when it is scrolled to an edge.
    scrollPaddingStart: 16,
    scrollPaddingEnd: 16,
    observeElementRect: observeRect,
    observeElementOffset: observeOffset,
    scrollToFn: elementScroll,
    measureElement: measure,
    rangeExtractor,
  });

  // Focus that waits for its row to be rendered.
  const pendingFocus = useRef<number | null>(null);
  const focusRendered = useCallback(() => {
    const index = pendingFocus.current;
    const el = index == null ? null : list.current?.querySelector<HTMLElement>(`:scope > [data-index="${index}"]`);
    if (!el) return;
    pendingFocus.current = null;
    ((focusSelector && el.querySelector<HTMLElement>(focusSelector)) || el).focus({ preventScroll: true });
  }, [focusSelector]);
  useLayoutEffect(focusRendered);

  const focusIndex = useCallback(
    (index: number, align: "auto" | "start" = "auto") => {
      if (index < 0 || index >= count) return;
      pendingFocus.current = index;
      setFocusedKey(getKey(index));
      // The first row: back to the very top, with the screen's header.
      if (index === 0) virtualizer.scrollToOffset(0);
      else virtualizer.scrollToIndex(index, { align });
      focusRendered();
    },
    [count, getKey, virtualizer, focusRendered],
  );

  const rowOf = (target: EventTarget | null) => {
    const row = target instanceof Element ? target.closest<HTMLElement>("[data-index]") : null;
    return row && row.parentElement === list.current ? row : null;
  };

  const onKeyDown = (e: KeyboardEvent<HTMLElement>) => {
    if (e.altKey || e.metaKey || e.ctrlKey || e.shiftKey) return;
    const row = rowOf(e.target);
    if (!row) return;
    const index = Number(row.dataset.index);
    let to: number | null = null;
    if (keys === "feed") {
      if (e.key === "PageDown") to = index + 1;
      else if (e.key === "PageUp") to = index - 1;
    } else if (!focusSelector || (e.target as Element).matches(focusSelector)) {
      if (e.key === "ArrowDown") to = index + 1;
      else if (e.key === "ArrowUp") to = index - 1;
      else if (e.key === "Home") to = 0;
      else if (e.key === "End") to = count - 1;
    }
    if (to == null) return;
    e.preventDefault();
    focusIndex(Math.max(0, Math.min(count - 1, to)));
  };

  const listRef = useCallback((el: HTMLElement | null) => {
    list.current = el;
  }, []);

  const margin = layout.margin;
  return {
    rows: virtualizer.getVirtualItems(),
    listProps: {
      ref: listRef,
      style: { position: "relative", display: "block", height: virtualizer.getTotalSize() },
      onFocus: (e) => {
        const row = rowOf(e.target);
        if (row) setFocusedKey(getKey(Number(row.dataset.index)));
      },
      onBlur: (e) => {
        // Focus went elsewhere in the page (not to nowhere, as when the window loses focus
        // and the browser gives it back to the same element later).
        const to = e.relatedTarget as Node | null;
        if (to && !list.current?.contains(to)) setFocusedKey(null);
      },
    },
    rowProps: (row) => ({
      ref: virtualizer.measureElement,
      "data-index": row.index,
      "aria-posinset": row.index + 1,
      "aria-setsize": count,
      style: { position: "absolute", top: row.start - margin, left: 0, width: "100%" },
    }),
    focusIndex,
    onKeyDown,
    virtualizer,
  };
}
