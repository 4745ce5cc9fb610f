// Edit before approve: where the runtime takes a changed intent (Claude Code's `updatedInput`),
// the person changes the command (or the tool input's JSON), sees what changed against what
// the agent asked, and approves the edit. What is signed is the edited intent with its digest,
// beside the digest of the intent the card showed.
import { diffLines, diffWordsWithSpace } from "diff";
import { useMemo, useState } from "react";
import { useI18n } from "../i18n";

/** The part of `intent` at an RFC 6901 pointer, or undefined. */
export function atPointer(intent: unknown, pointer: string): unknown {
  let v: unknown = intent;
  for (const raw of pointer.split("/").slice(1)) {
    const k = raw.replaceAll("~1", "/").replaceAll("~0", "~");
    if (typeof v !== "object" || v === null || !(k in v)) return undefined;
    v = (v as Record<string, unknown>)[k];
  }
  return v;
}

/** How the part is edited: its `command` string alone when it has one, else its whole JSON. */
function editorOf(part: unknown): { mode: "command" | "json"; text: string } {
  if (part && typeof part === "object" && !Array.isArray(part) && typeof (part as Record<string, unknown>).command === "string") {
    return { mode: "command", text: (part as Record<string, string>).command };
  }
  return { mode: "json", text: JSON.stringify(part, null, 2) };
}

/** The edited part as JSON text, or why the text is not one. */
function editedPart(part: unknown, mode: "command" | "json", text: string): { json: string } | { error: string } {
  if (mode === "command") return { json: JSON.stringify({ ...(part as Record<string, unknown>), command: text }) };
  try {
    return { json: JSON.stringify(JSON.parse(text)) };
  } catch (e) {
    return { error: (e as Error).message };
  }
}

export function EditIntent({
  intent,
  pointer,
  busy,
  onApprove,
  onCancel,
}: {
  intent: unknown;
  pointer: string;
  busy: boolean;
  /** Approves the edited part (JSON text). */
  onApprove: (editedPart: string) => void;
  onCancel: () => void;
}) {
  const { t } = useI18n();
  const part = atPointer(intent, pointer);
  const start = useMemo(() => editorOf(part), [part]);
  const [text, setText] = useState(start.text);
  const out = editedPart(part, start.mode, text);
  const changed = text !== start.text && "json" in out && out.json !== JSON.stringify(part);
  const parts = start.mode === "command" ? diffWordsWithSpace(start.text, text) : diffLines(start.text, text);
  return (
    <div className="confirm edit-intent" role="group" aria-label={t("inbox.edit.title")}>
      <label className="small" htmlFor="edit-intent-text">
        {start.mode === "command" ? t("inbox.edit.command") : t("inbox.edit.json", { pointer })}
      </label>
      <textarea
        id="edit-intent-text"
        data-testid="edit-text"
        rows={start.mode === "command" ? 2 : 6}
        spellCheck={false}
        value={text}
        onChange={(e) => setText(e.target.value)}
        autoFocus
      />
      {"error" in out && (
        <p className="error" role="alert">
          {t("inbox.edit.notJson", { error: out.error })}
        </p>
      )}
      {changed && (
        <pre className="edit-diff" data-testid="edit-diff" aria-label={t("inbox.edit.diff")}>
          {parts.map((p, i) =>
            p.added ? (
              <ins key={i}>{p.value}</ins>
            ) : p.removed ? (
              <del key={i}>{p.value}</del>
            ) : (
              <span key={i}>{p.value}</span>
            ),
          )}
        </pre>
      )}
      <p className="small muted">{t("inbox.edit.note")}</p>
      <div className="row">
        <button type="button" className="primary" disabled={busy || !changed} data-testid="approve-edited" onClick={() => "json" in out && onApprove(out.json)}>
          {t("inbox.edit.approve")}
        </button>
        <button type="button" onClick={onCancel}>
          {t("inbox.cancel")}
        </button>
      </div>
    </div>
  );
}
