// Settings: language, theme, muting notifications, the control plane, the demo agent.
import type { StatusView } from "../bindings";
import { commands } from "../data";
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
      {status?.muted_until ? (
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
