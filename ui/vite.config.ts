// Vite builds ui/dist, which the Tauri shell embeds (src-tauri/tauri.conf.json `frontendDist`)
// and the control plane serves at `/app/` (the web companion): asset URLs are relative (`base`)
// so the one bundle works at either root.
// Vitest runs the component tests in jsdom.
import { defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";

export default defineConfig({
  plugins: [react()],
  base: "./",
  clearScreen: false,
  // The web mirror's schema is migrations/companion, outside ui/ (web/migrations.ts).
  server: { port: 1420, strictPort: true, fs: { allow: [".."] } },
  build: { target: "es2022", outDir: "dist", emptyOutDir: true, chunkSizeWarningLimit: 1500 },
  test: {
    environment: "jsdom",
    globals: true,
    setupFiles: ["./src/test/setup.ts"],
    css: false,
  },
});
