// The shell of the UI: routes (in the URL hash, so a reload keeps the place), the status the
// banner and navigation show, the theme, and where the tray, notifications and deep links
// send the person.
import { useCallback, useEffect, useState } from "react";
import type { StatusView } from "./bindings";
import { commands, events } from "./data";
import { useI18n } from "./i18n";
import { OfflineBanner } from "./components/OfflineBanner";
import { InboxScreen } from "./screens/Inbox";
import { ThreadsScreen } from "./screens/Threads";
import { ThreadDetailScreen } from "./screens/ThreadDetail";
import { OutboxScreen } from "./screens/Outbox";
import { MachinesScreen } from "./screens/Machines";
import { NewRunScreen } from "./screens/NewRun";
import { PairingScreen } from "./screens/Pairing";
import { RulesScreen } from "./screens/Rules";
import { SettingsScreen, type Theme } from "./screens/Settings";

function currentRoute(): string {
  return window.location.hash.replace(/^#/, "") || "/inbox";
}

function useTheme(): [Theme, (t: Theme) => void] {
  const [theme, setTheme] = useState<Theme>(() => (localStorage.getItem("waymark.theme") as Theme) || "system");
  useEffect(() => {
    localStorage.setItem("waymark.theme", theme);
    if (theme === "system") document.documentElement.removeAttribute("data-theme");
    else document.documentElement.setAttribute("data-theme", theme);
  }, [theme]);
  return [theme, setTheme];
}

export function App() {
  const { t } = useI18n();
  const [route, setRoute] = useState(currentRoute);
  const [status, setStatus] = useState<StatusView | null>(null);
  const [confirm, setConfirm] = useState<string | null>(null);
  const [link, setLink] = useState<string | null>(null);
  const [theme, setTheme] = useTheme();

  const go = useCallback((r: string) => {
    window.location.hash = r;
    setRoute(r);
  }, []);

  useEffect(() => {
    const onHash = () => setRoute(currentRoute());
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);

  useEffect(() => {
    const refresh = () => void commands.getStatus().then(setStatus, () => {});
    refresh();
    const timer = window.setInterval(refresh, 15000);
    const offs = [
      events.statusChanged.listen(refresh),
      events.navigate.listen((e) => {
        setConfirm(e.payload.confirm);
        if (e.payload.link) setLink(e.payload.link);
        go(e.payload.route);
      }),
    ];
    void commands.takePendingRoute().then((n) => {
      if (n) {
        setConfirm(n.confirm);
        if (n.link) setLink(n.link);
        go(n.route);
      }
    });
    return () => {
      window.clearInterval(timer);
      for (const o of offs) void o.then((f) => f());
    };
  }, [go]);

  const parts = route.split("/").filter(Boolean);
  const top = parts[0] ?? "inbox";
  let screen;
  if (top === "inbox") {
    // `/inbox/{decision}?action=NONCE`: a notification's Approve / Deny, handed over by the
    // service worker (web companion) under that nonce.
    const [focus, query] = (parts[1] ?? "").split("?");
    const nonce = new URLSearchParams(query ?? "").get("action");
    screen = <InboxScreen key={parts[1] ?? ""} focus={focus || undefined} confirm={confirm} actionNonce={nonce} go={go} />;
  }
  else if (top === "threads" && parts[1]) screen = <ThreadDetailScreen id={parts[1]} go={go} />;
  else if (top === "threads") screen = <ThreadsScreen go={go} status={status} />;
  else if (top === "outbox") screen = <OutboxScreen />;
  // `/machines/new[/NAME]`: a new run (on that machine).
  else if (top === "machines" && parts[1] === "new") screen = <NewRunScreen key={parts[2] ?? ""} machine={parts[2] ? decodeURIComponent(parts[2]) : undefined} go={go} />;
  else if (top === "machines") screen = <MachinesScreen go={go} />;
  else if (top === "rules") screen = <RulesScreen />;
  else if (top === "pairing") screen = <PairingScreen key={link ?? ""} status={status} initialLink={link} />;
  // The web companion's pairing link (`<server>/app/#/pair?code=…`, a QR code's target): pairs
  // on arrival.
  else if (top.startsWith("pair?")) screen = <PairingScreen key="arrived" status={status} initialLink={window.location.href} pairNow done={() => go("/inbox")} />;
  else screen = <SettingsScreen status={status} theme={theme} setTheme={setTheme} />;

  const nav: [string, string, number | null][] = [
    ["inbox", t("nav.inbox"), status?.pending_decisions ?? null],
    ["threads", t("nav.threads"), null],
    ["machines", t("nav.machines"), null],
    ["rules", t("nav.rules"), null],
    ["outbox", t("nav.outbox"), status?.queued ?? null],
    ["pairing", t("nav.pairing"), null],
    ["settings", t("nav.settings"), null],
  ];
  const linkState = !status || status.mode === "starting" ? t("status.starting") : !status.paired ? t("status.notPaired") : status.connected ? t("status.live") : t("status.offline");

  return (
    <div className="app">
      <a className="skip" href="#main">
        {t("nav.main")}
      </a>
      <nav className="nav" aria-label={t("nav.main")}>
        <div className="brand">
          <span className="logo" aria-hidden="true">
            ⚑
          </span>{" "}
          {t("app.name")}
        </div>
        <ul>
          {nav.map(([id, label, count]) => (
            <li key={id}>
              <a href={`#/${id}`} className={top === id ? "active" : ""} aria-current={top === id ? "page" : undefined} data-testid={`nav-${id}`} onClick={() => setConfirm(null)}>
                <span>{label}</span>
                {count != null && count > 0 && <span className="count">{count}</span>}
              </a>
            </li>
          ))}
        </ul>
        <div className={`nav-status ${status?.connected ? "ok" : "bad"}`} data-testid="nav-status">
          <span className="dot" aria-hidden="true" /> {linkState}
          {status?.mode === "embedded" && <span className="small muted"> · {t("status.embedded")}</span>}
        </div>
      </nav>
      <main id="main" className="main" tabIndex={-1}>
        {status && <OfflineBanner status={status} retry={() => void commands.syncNow().catch(() => {})} pair={() => go("/pairing")} />}
        {screen}
      </main>
    </div>
  );
}
