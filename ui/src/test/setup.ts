// Testing Library cleans up between tests; jsdom lacks matchMedia, which the theme reads, and
// does not scroll: window.scrollTo moves window.scrollY and fires "scroll" afterwards, as a
// browser does, so windowed lists (../windowed.ts) can be scrolled in tests.
import { afterEach } from "vitest";
import { cleanup } from "@testing-library/react";

let scrollY = 0;

afterEach(() => {
  cleanup();
  scrollY = 0;
});

if (!window.matchMedia) {
  window.matchMedia = (query: string) =>
    ({
      matches: false,
      media: query,
      onchange: null,
      addEventListener: () => {},
      removeEventListener: () => {},
      addListener: () => {},
      removeListener: () => {},
      dispatchEvent: () => false,
    }) as MediaQueryList;
}

// The document is taller than any list in the tests (jsdom's is 0 px: nothing could scroll).
Object.defineProperty(document.documentElement, "scrollHeight", { configurable: true, get: () => 1e9 });
Object.defineProperty(window, "scrollY", { configurable: true, get: () => scrollY });
Object.defineProperty(window, "pageYOffset", { configurable: true, get: () => scrollY });
window.scrollTo = ((a?: ScrollToOptions | number, b?: number) => {
  const top = typeof a === "number" ? b : a?.top;
  if (top == null || Math.max(0, top) === scrollY) return;
  scrollY = Math.max(0, top);
  setTimeout(() => window.dispatchEvent(new Event("scroll")), 0);
}) as typeof window.scrollTo;
