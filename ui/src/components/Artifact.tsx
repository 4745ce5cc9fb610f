// Loads an artifact's text on demand (from the offline cache or the server) and shows it in
// the diff viewer when it is a diff, else as text.
import { useEffect, useState } from "react";
import type { ArtifactText, ArtifactView } from "../bindings";
import { useI18n } from "../i18n";
import { DiffViewer } from "./DiffViewer";

export type LoadText = (sha256: string) => Promise<ArtifactText>;

export function ArtifactBody({ artifact, load }: { artifact: ArtifactView; load: LoadText }) {
  const { t } = useI18n();
  const [state, setState] = useState<{ text?: ArtifactText; error?: string }>({});
  useEffect(() => {
    let live = true;
    load(artifact.sha256).then(
      (text) => live && setState({ text }),
      (e: unknown) => live && setState({ error: (e as { message?: string })?.message ?? String(e) }),
    );
    return () => {
      live = false;
    };
  }, [artifact.sha256, load]);
  if (state.error) return <p className="error">{t("common.error", { message: state.error })}</p>;
  if (!state.text) return <p className="muted">{t("detail.loading")}</p>;
  return artifact.is_diff ? (
    <DiffViewer text={state.text.text} truncated={state.text.truncated} />
  ) : (
    <pre className="text-view">{state.text.text}</pre>
  );
}
