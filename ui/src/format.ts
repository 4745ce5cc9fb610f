// Small formatting helpers shared by the screens (pure; unit-tested).
import type { T } from "./i18n";

export function span(ms: number): string {
  const s = Math.max(0, Math.round(Math.abs(ms) / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

export function ago(at: number | null | undefined, t: T, now = Date.now()): string {
  if (at == null) return t("time.never");
  if (now - at < 5000) return t("time.now");
  return now >= at ? t("time.ago", { t: span(now - at) }) : t("time.in", { t: span(at - now) });
}

export function until(at: number, t: T, now = Date.now()): string {
  return at >= now ? t("time.in", { t: span(at - now) }) : t("time.ago", { t: span(now - at) });
}

/** A countdown: `0:42`, `9:55`, `1:02:03`; never negative (`countdown` in waymark-proto). */
export function countdown(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  const h = Math.floor(s / 3600);
  const m = Math.floor(s / 60) % 60;
  const ss = String(s % 60).padStart(2, "0");
  return h > 0 ? `${h}:${String(m).padStart(2, "0")}:${ss}` : `${m}:${ss}`;
}

export function short(digest: string | null | undefined, n = 12): string {
  if (!digest) return "";
  return digest.replace(/^sha256:/, "").slice(0, n);
}

export function clock(ms: number): string {
  return new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
}

export function seconds(s: number): string {
  return span(s * 1000);
}
