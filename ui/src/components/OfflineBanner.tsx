// The offline banner: when the stream is down the screens show the local mirror, so say so,
// with when it was last current and how many commands wait in the outbox.
import type { StatusView } from "../bindings";
import { useI18n } from "../i18n";
import { ago } from "../format";

export function OfflineBanner({ status, retry, pair, now = Date.now() }: { status: StatusView; retry: () => void; pair: () => void; now?: number }) {
  const { t } = useI18n();
  if (status.mode === "starting") return null;
  if (!status.paired)
    return (
      <div className="banner info" role="status">
        {status.last_error ? t("banner.error", { error: status.last_error }) : t("banner.notPaired")}{" "}
        <button type="button" onClick={pair}>
          {t("banner.pairNow")}
        </button>
      </div>
    );
  if (status.connected) return null;
  return (
    <div className="banner offline" role="status" data-testid="offline-banner">
      <strong>{status.reconnecting_since ? t("status.reconnecting") : t("status.offline")}</strong>{" "}
      {status.last_sync_at ? t("banner.offline", { ago: ago(status.last_sync_at, t, now) }) : t("banner.offlineNever")}
      {status.queued > 0 && <> {t("banner.queued", { n: status.queued })}</>}
      {status.last_error && <span className="small muted banner-error">{status.last_error}</span>}{" "}
      <button type="button" onClick={retry}>
        {t("banner.retry")}
      </button>
    </div>
  );
}
