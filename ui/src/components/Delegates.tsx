// Delegates: who else may read this user's tasks and answer their decisions (the second person
// an escalation step can reach), and whose decisions this user may answer. A delegation is an
// offer until its delegate accepts it (issue 32): the owner's list says "waiting for bob to
// accept", and the delegate sees the offer here with Accept and Decline; an accepted one can be
// left the same way. Pausing, cancelling and replanning stay with the owner; the server says
// so when a delegate tries.
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

  // Escalation steps may name anyone offered: the server skips them until they accept.
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

  const act = async (f: () => Promise<DelegatesView>, after?: () => void) => {
    setBusy(true);
    setError(null);
    try {
      show(await f());
      after?.();
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  };
  const change = (user: string, add: boolean) => act(() => commands.setDelegate(user, add), add ? () => setName("") : undefined);
  const answer = (owner: string, accept: boolean) => act(() => commands.answerDelegation(owner, accept));

  const offers = view?.delegated_by.filter((d) => d.state === "offered") ?? [];
  const answered = view?.delegated_by.filter((d) => d.state === "accepted") ?? [];

  return (
    <section className="delegates" aria-labelledby="delegates-h" data-testid="delegates">
      <h3 id="delegates-h">{t("delegates.title")}</h3>
      <p className="small muted">{t("delegates.explain")}</p>
      {offers.length > 0 && (
        <ul className="devices offers">
          {offers.map((o) => (
            <li key={o.user} data-testid={`offer-${o.user}`}>
              <span>{t("delegates.offer", { user: o.user })}</span>{" "}
              <span className="small muted">{ago(o.since, t)}</span>{" "}
              <button type="button" className="secondary" disabled={busy} onClick={() => void answer(o.user, true)} data-testid={`offer-accept-${o.user}`}>
                {t("delegates.accept")}
              </button>{" "}
              <button type="button" className="link" disabled={busy} onClick={() => void answer(o.user, false)} data-testid={`offer-decline-${o.user}`}>
                {t("delegates.decline")}
              </button>
            </li>
          ))}
        </ul>
      )}
      {view && view.delegates.length === 0 && <p className="small">{t("delegates.none")}</p>}
      <ul className="devices">
        {view?.delegates.map((d) => (
          <li key={d.user} data-testid={`delegate-${d.user}`} data-state={d.state}>
            <strong>{d.user}</strong>{" "}
            <span className="small muted">{d.state === "offered" ? t("delegates.waiting", { user: d.user }) : t("delegates.since", { when: ago(d.accepted_at ?? d.since, t) })}</span>{" "}
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
      {answered.length > 0 && (
        <>
          <p className="small">{t("delegates.by", { users: answered.map((d) => d.user).join(", ") })}</p>
          <ul className="devices">
            {answered.map((d) => (
              <li key={d.user} data-testid={`answering-${d.user}`}>
                <span className="small">{d.user}</span>{" "}
                <button type="button" className="link" disabled={busy} onClick={() => void answer(d.user, false)} data-testid={`answering-leave-${d.user}`}>
                  {t("delegates.leave")}
                </button>
              </li>
            ))}
          </ul>
        </>
      )}
      {error && (
        <p role="alert" className="error" data-testid="delegates-error">
          {t("common.error", { message: error })}
        </p>
      )}
    </section>
  );
}
