// The web companion imports the migration SQL (`?raw`, import.meta.glob) and the SQLite wasm
// file (`?url`) through Vite; these are Vite's types for them.
/// <reference types="vite/client" />
