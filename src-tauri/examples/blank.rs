//! A blank Tauri window, the baseline of the app's idle memory (`scripts/bench-app`,
//! docs/benchmarks.md): the app's own configuration (window size, CSP, identifier) and web-view
//! settings (`waymark_app::webview::tune`), but an empty page instead of the UI, and nothing
//! else — no companion, no control plane, no tray, no plugins. Whatever the app holds at idle
//! beyond this window is the app's own.
//!
//! `cargo build --profile app -p waymark-app --example blank` (the bench builds it with the
//! app, in the same profile); not shipped.

use std::borrow::Cow;

use tauri::Manager;
use tauri::utils::assets::{AssetKey, AssetsIter, CspHash};

/// The page served for every path: a document with nothing in it.
const PAGE: &[u8] = b"<!doctype html><html><head><meta charset=\"utf-8\"><title>blank</title></head><body></body></html>";

/// Serves `PAGE` in place of the UI bundle the configuration names.
struct Blank;

impl<R: tauri::Runtime> tauri::Assets<R> for Blank {
    fn get(&self, _key: &AssetKey) -> Option<Cow<'_, [u8]>> {
        Some(Cow::Borrowed(PAGE))
    }

    fn iter(&self) -> Box<AssetsIter<'_>> {
        Box::new(std::iter::once((
            Cow::Borrowed("/index.html"),
            Cow::Borrowed(PAGE),
        )))
    }

    fn csp_hashes(&self, _html_path: &AssetKey) -> Box<dyn Iterator<Item = CspHash<'_>> + '_> {
        Box::new(std::iter::empty())
    }
}

fn main() {
    let mut context = tauri::generate_context!();
    context.set_assets(Box::new(Blank));
    let result = tauri::Builder::default()
        .setup(|app| {
            if let Some(window) = app.get_webview_window("main") {
                waymark_app::webview::tune(&window);
            }
            Ok(())
        })
        .run(context);
    if let Err(e) = result {
        eprintln!("error: the blank window could not start: {e}");
        std::process::exit(1);
    }
}
