import { StrictMode } from "react";
import { createRoot } from "react-dom/client";
import { I18nProvider } from "./i18n";
import { App } from "./App";
import { inApp } from "./data";
import "./styles.css";

// In a browser (the web companion): the service worker keeps the shell for offline use and
// shows pushes. The desktop app has its own notifications and needs none.
if (!inApp && "serviceWorker" in navigator && window.isSecureContext) {
  void navigator.serviceWorker.register("./sw.js").catch(() => {});
}

createRoot(document.getElementById("root")!).render(
  <StrictMode>
    <I18nProvider>
      <App />
    </I18nProvider>
  </StrictMode>,
);
