// The i18n layer: every visible string goes through `t(key, vars)`. English and Simplified
// Chinese; the choice is kept in localStorage and defaults to the system language.
import { createContext, useContext, useMemo, useState, type ReactNode } from "react";
import { en, type Key } from "./en";
import { zh } from "./zh";

export type Lang = "en" | "zh-CN";
const tables: Record<Lang, Record<Key, string>> = { en, "zh-CN": zh };

export function detectLang(): Lang {
  const saved = typeof localStorage !== "undefined" ? localStorage.getItem("waymark.lang") : null;
  if (saved === "en" || saved === "zh-CN") return saved;
  return typeof navigator !== "undefined" && navigator.language.toLowerCase().startsWith("zh") ? "zh-CN" : "en";
}

export type Vars = Record<string, string | number>;
export type T = (key: Key, vars?: Vars) => string;

export function translate(lang: Lang, key: Key, vars?: Vars): string {
  const s = tables[lang][key] ?? en[key];
  return vars ? s.replace(/\{(\w+)\}/g, (m, k: string) => (k in vars ? String(vars[k]) : m)) : s;
}

interface Ctx {
  lang: Lang;
  setLang: (l: Lang) => void;
  t: T;
}

const I18n = createContext<Ctx>({ lang: "en", setLang: () => {}, t: (k, v) => translate("en", k, v) });

export function I18nProvider({ children, initial }: { children: ReactNode; initial?: Lang }) {
  const [lang, setLangState] = useState<Lang>(initial ?? detectLang());
  const value = useMemo<Ctx>(
    () => ({
      lang,
      setLang: (l) => {
        localStorage.setItem("waymark.lang", l);
        document.documentElement.lang = l;
        setLangState(l);
      },
      t: (k, v) => translate(lang, k, v),
    }),
    [lang],
  );
  return <I18n.Provider value={value}>{children}</I18n.Provider>;
}

export function useI18n(): Ctx {
  return useContext(I18n);
}
