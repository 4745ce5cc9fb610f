// Delegates: who else may read this user's tasks and answer their decisions (the second person
// an escalation step can reach), and whose decisions this user may answer. Pausing, cancelling
// and replanning stay with the owner; the server says so when a delegate tries.
import { useEffect, useState } from "react";
import type { DelegatesView } from "../bindings";
import { commands, errorText } from "../data";
import { useI18n } from "../i18n";
import { ago } from "../format";

export function Delegates({ onChange }: { onChange: (names: string[]) => void }) {
  const { t } = useI18n();
  const [view, setView] = useState<DelegatesView | null>(null);
  const [name, setName] = useState("");
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  const show = (v: DelegatesView) => {
    setView(v);
    onChange(v.delegates.map((d) => d.user));
  };

  useEffect(() => {
    let live = true;
    commands
      .getDelegates()
      .then((v) => live && show(v))
      .catch((e) => live && setError(errorText(e)));
    return () => {
      live = false;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps -- loaded once; `show` reports upward
  }, []);

  const change = async (user: string, add: boolean) => {
    setBusy(true);
    setError(null);
    try {
      show(await commands.setDelegate(user, add));
      if (add) setName("");
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="delegates" aria-labelledby="delegates-h" data-testid="delegates">
      <h3 id="delegates-h">{t("delegates.title")}</h3>
      <p className="small muted">{t("delegates.explain")}</p>
      {view && view.delegates.length === 0 && <p className="small">{t("delegates.none")}</p>}
      <ul className="devices">
        {view?.delegates.map((d) => (
          <li key={d.user} data-testid={`delegate-${d.user}`}>
            <strong>{d.user}</strong> <span className="small muted">{t("delegates.since", { when: ago(d.since, t) })}</span>{" "}
            <button type="button" className="link" disabled={busy} onClick={() => void change(d.user, false)}>
              {t("delegates.remove")}
            </button>
          </li>
        ))}
      </ul>
      <form
        className="row"
        onSubmit={(e) => {
          e.preventDefault();
          if (name.trim()) void change(name.trim(), true);
        }}
      >
        <label className="small">
          {t("delegates.user")} <input value={name} onChange={(e) => setName(e.target.value)} autoComplete="off" spellCheck={false} data-testid="delegate-name" />
        </label>
        <button type="submit" className="secondary" disabled={busy || !name.trim()} data-testid="delegate-add">
          {t("delegates.add")}
        </button>
      </form>
      {view && view.delegated_by.length > 0 && <p className="small">{t("delegates.by", { users: view.delegated_by.map((d) => d.user).join(", ") })}</p>}
      {error && (
        <p role="alert" className="error" data-testid="delegates-error">
          {t("common.error", { message: error })}
        </p>
      )}
    </section>
  );
}
