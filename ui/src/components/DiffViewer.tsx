// The diff viewer: react-diff-view renders unified and split views from a unified diff. Large
// files start collapsed (rendering thousands of rows at once is what makes a diff view slow),
// and the parse is memoised so switching views does not re-parse.
import { useMemo, useState } from "react";
import { Diff, Hunk, parseDiff, type FileData } from "react-diff-view";
import "react-diff-view/style/index.css";
import { useI18n } from "../i18n";

/** Files with more changed lines than this start collapsed. */
export const LARGE_FILE_LINES = 1500;

function changed(f: FileData): number {
  return f.hunks.reduce((n, h) => n + h.changes.filter((c) => c.type !== "normal").length, 0);
}

function DiffFile({ file, view }: { file: FileData; view: "unified" | "split" }) {
  const { t } = useI18n();
  const n = changed(file);
  const [open, setOpen] = useState(n <= LARGE_FILE_LINES);
  const name = file.type === "delete" ? file.oldPath : file.newPath;
  return (
    <section className="diff-file">
      <header className="diff-file-head">
        <code>{name}</code>
        <span className="muted small">{file.type}</span>
      </header>
      {open ? (
        <Diff viewType={view} diffType={file.type} hunks={file.hunks}>
          {(hunks) => hunks.map((h) => <Hunk key={h.content} hunk={h} />)}
        </Diff>
      ) : (
        <div className="diff-collapsed">
          {t("diff.large", { n })}{" "}
          <button type="button" onClick={() => setOpen(true)}>
            {t("diff.showAnyway")}
          </button>
        </div>
      )}
    </section>
  );
}

export function DiffViewer({ text, truncated, initialView }: { text: string; truncated?: boolean; initialView?: "unified" | "split" }) {
  const { t } = useI18n();
  const narrow = typeof window !== "undefined" && window.matchMedia("(max-width: 640px)").matches;
  const [view, setView] = useState<"unified" | "split">(initialView ?? (narrow ? "unified" : "split"));
  const files = useMemo(() => {
    try {
      return parseDiff(text, { nearbySequences: "zip" });
    } catch {
      return [];
    }
  }, [text]);
  const stats = useMemo(() => {
    let add = 0;
    let del = 0;
    for (const f of files)
      for (const h of f.hunks)
        for (const c of h.changes) {
          if (c.type === "insert") add++;
          else if (c.type === "delete") del++;
        }
    return { add, del };
  }, [files]);
  if (files.length === 0) return <pre className="text-view">{text || t("diff.empty")}</pre>;
  return (
    <div className="diff-viewer" data-testid="diff-viewer">
      <div className="diff-toolbar">
        <span className="muted small">{t("diff.files", { n: files.length, add: stats.add, del: stats.del })}</span>
        <div className="segmented" role="group">
          <button type="button" aria-pressed={view === "unified"} onClick={() => setView("unified")}>
            {t("diff.unified")}
          </button>
          <button type="button" aria-pressed={view === "split"} onClick={() => setView("split")}>
            {t("diff.split")}
          </button>
        </div>
      </div>
      {truncated && <p className="warn small">{t("diff.truncated")}</p>}
      <div className="diff-scroll">
        {files.map((f, i) => (
          <DiffFile key={`${f.oldRevision}-${f.newRevision}-${i}`} file={f} view={view} />
        ))}
      </div>
    </div>
  );
}
