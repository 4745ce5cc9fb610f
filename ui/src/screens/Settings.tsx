// Settings: language, theme, notifications (muting in the app; push on this device in a
// browser), the control plane, the demo agent.
import { useEffect, useState } from "react";
import type { StatusView } from "../bindings";
import { commands, errorText, inApp, webCompanion } from "../data";
import { useI18n, type Lang } from "../i18n";
import { clock } from "../format";

export type Theme = "system" | "light" | "dark";

export function SettingsScreen({ status, theme, setTheme }: { status: StatusView | null; theme: Theme; setTheme: (t: Theme) => void }) {
  const { t, lang, setLang } = useI18n();
  return (
    <section aria-labelledby="settings-title" className="narrow-page">
      <h2 id="settings-title">{t("settings.title")}</h2>
      <div className="form">
        <label>
          {t("settings.language")}
          <select value={lang} onChange={(e) => setLang(e.target.value as Lang)} data-testid="lang">
            <option value="en">English</option>
            <option value="zh-CN">简体中文</option>
          </select>
        </label>
        <label>
          {t("settings.theme")}
          <select value={theme} onChange={(e) => setTheme(e.target.value as Theme)} data-testid="theme">
            <option value="system">{t("settings.theme.system")}</option>
            <option value="light">{t("settings.theme.light")}</option>
            <option value="dark">{t("settings.theme.dark")}</option>
          </select>
        </label>
      </div>
      <h3>{t("settings.notifications")}</h3>
      {!inApp && status?.paired && <PushOnThisDevice />}
      {!inApp ? null : status?.muted_until ? (
        <p>
          {t("settings.mutedUntil", { time: clock(status.muted_until) })}{" "}
          <button type="button" onClick={() => void commands.muteNotifications(0)}>
            {t("settings.unmute")}
          </button>
        </p>
      ) : (
        <button type="button" onClick={() => void commands.muteNotifications(60)}>
          {t("settings.mute")}
        </button>
      )}
      <h3>{t("settings.mode")}</h3>
      <p>
        {status?.mode === "embedded" ? t("status.embedded") : t("status.remote")}: <code>{status?.server ?? "—"}</code>
      </p>
      {status?.mode === "embedded" && (
        <>
          <button type="button" onClick={() => void commands.startDemo()}>
            {t("settings.demo")}
          </button>
          <p className="small muted">{t("settings.demoHelp")}</p>
        </>
      )}
      {status?.demo && <p className="small">{t("settings.demoStatus", { line: status.demo })}</p>}
    </section>
  );
}

/** The web companion: notifications on this phone or browser, through Web Push. */
function PushOnThisDevice() {
  const { t } = useI18n();
  const [state, setState] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    void webCompanion()
      .then((w) => w.pushState())
      .then(setState, (e) => setError(errorText(e)));
  }, []);
  const enable = async () => {
    setError(null);
    try {
      const w = await webCompanion();
      await w.enablePush();
      setState(await w.pushState());
    } catch (e) {
      setError(errorText(e));
    }
  };
  return (
    <div data-testid="push-settings">
      {state === "on" ? (
        <p className="ok">{t("settings.pushOn")}</p>
      ) : state === "unsupported" || state === "denied" ? (
        <p className="muted">{t(state === "denied" ? "settings.pushDenied" : "settings.pushUnsupported")}</p>
      ) : (
        <button type="button" className="primary" onClick={() => void enable()} data-testid="push-enable">
          {t("settings.pushEnable")}
        </button>
      )}
      <p className="small muted">{t("settings.pushHelp")}</p>
      {error && (
        <p role="alert" className="error">
          {t("common.error", { message: error })}
        </p>
      )}
    </div>
  );
}
