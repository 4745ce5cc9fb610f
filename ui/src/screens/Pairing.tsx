// Pairing: paste a link (or a server URL and a code); the device list.
import { useEffect, useRef, useState } from "react";
import type { StatusView } from "../bindings";
import { commands, errorText, useMirror } from "../data";
import { useI18n } from "../i18n";
import { ago } from "../format";
import { EscalationEditor } from "../components/Escalation";
import { Delegates } from "../components/Delegates";

export function PairingScreen({ status, initialLink, pairNow, done }: { status: StatusView | null; initialLink?: string | null; pairNow?: boolean; done?: () => void }) {
  const { t } = useI18n();
  const [link, setLink] = useState(initialLink ?? "");
  const [code, setCode] = useState("");
  const [people, setPeople] = useState<string[]>([]);
  const [name, setName] = useState("");
  const [busy, setBusy] = useState(false);
  const [msg, setMsg] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const devices = useMirror(() => (status?.paired ? commands.listDevices() : Promise.resolve([])), [status?.paired, status?.device_id], true);
  const submit = async () => {
    setBusy(true);
    setError(null);
    setMsg(null);
    try {
      const s = await commands.pairDevice(link.trim(), code.trim() || null, name.trim() || null);
      setMsg(t("pairing.paired", { device: s.device_id ?? "", user: s.user ?? "", server: s.server ?? "" }));
      setLink("");
      setCode("");
      // On to the inbox after a moment to read the result — unless the person went elsewhere
      // meanwhile (a later jump would take them from what they opened).
      const here = window.location.hash;
      if (done) window.setTimeout(() => window.location.hash === here && done(), 1500);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };
  // Arrived by a pairing link (a scanned QR code): pair at once, once — unless this device is
  // paired already; then ask, since pairing again replaces that pairing here.
  const started = useRef(false);
  const [confirming, setConfirming] = useState(false);
  const known = status !== null && status.mode !== "starting";
  useEffect(() => {
    if (pairNow && known && !started.current && link.trim()) {
      started.current = true;
      if (status?.paired) setConfirming(true);
      else void submit();
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [pairNow, known]);
  return (
    <section aria-labelledby="pair-title" className="narrow-page">
      <h2 id="pair-title">{t("pairing.title")}</h2>
      <p className="muted small">{t("pairing.help")}</p>
      {confirming && (
        <div role="alertdialog" aria-labelledby="repair-ask" className="card kind-approval" data-testid="repair-ask">
          <p id="repair-ask">{t("pairing.replaceAsk", { device: status?.device_id ?? "", user: status?.user ?? "", server: status?.server ?? "" })}</p>
          <div className="row">
            <button
              type="button"
              className="primary"
              data-testid="repair-yes"
              onClick={() => {
                setConfirming(false);
                void submit();
              }}
            >
              {t("pairing.replaceYes")}
            </button>
            <button
              type="button"
              data-testid="repair-no"
              onClick={() => {
                setConfirming(false);
                setLink("");
                done?.();
              }}
            >
              {t("pairing.replaceNo")}
            </button>
          </div>
        </div>
      )}
      <form
        className="form"
        onSubmit={(e) => {
          e.preventDefault();
          if (link.trim()) void submit();
        }}
      >
        <label>
          {t("pairing.link")}
          <input value={link} onChange={(e) => setLink(e.target.value)} placeholder="waymark://pair?server=…&code=…" data-testid="pair-link" autoComplete="off" spellCheck={false} />
        </label>
        <label>
          {t("pairing.code")}
          <input value={code} onChange={(e) => setCode(e.target.value)} placeholder="ABCD-EFGH" autoComplete="off" spellCheck={false} />
        </label>
        <label>
          {t("pairing.name")}
          <input value={name} onChange={(e) => setName(e.target.value)} placeholder="Waymark app" />
        </label>
        <button type="submit" className="primary" disabled={busy || !link.trim()} data-testid="pair-submit">
          {t("pairing.submit")}
        </button>
      </form>
      {msg && (
        <p role="status" className="ok" data-testid="pair-result">
          {msg}
        </p>
      )}
      {error && (
        <p role="alert" className="error">
          {t("common.error", { message: error })}
        </p>
      )}
      {status?.keystore && <p className="small muted">{t("pairing.key", { where: status.keystore })}</p>}
      <h3>{t("pairing.devices")}</h3>
      {status?.mode === "remote" && <p className="small muted">{t("pairing.remoteNote")}</p>}
      <ul className="devices">
        {devices.data?.map((d) => (
          <li key={d.id}>
            <strong>{d.name}</strong> {d.this_device && <span className="pill ok">{t("pairing.thisDevice")}</span>}
            {d.revoked_at != null && <span className="pill bad">{t("pairing.revoked")}</span>}
            {d.revoked_at == null && d.stale && (
              <span className="pill warn" data-testid="device-stale">
                {t("pairing.stale")}
              </span>
            )}
            <div className="small muted">
              {d.id} · {d.user} · {d.scopes.join(", ")}
              {d.created_at != null && ` · ${ago(d.created_at, t)}`}
              {d.last_seen_at != null && ` · ${t("pairing.lastSeen", { when: ago(d.last_seen_at, t) })}`}
            </div>
          </li>
        ))}
      </ul>
      {status?.paired && <Delegates onChange={setPeople} />}
      {status?.paired && devices.data && <EscalationEditor devices={devices.data} people={people} />}
    </section>
  );
}
