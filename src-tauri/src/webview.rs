//! The web view tuned for an app rather than a browser: WebKitGTK's defaults keep a browser's
//! page and memory caches and composite on the GPU, which costs an idle web process tens of
//! megabytes the app (lists, cards and diffs on one page) has no use for. Public so the blank
//! window of `examples/blank.rs` (the bench's baseline for idle memory) is tuned the same way.

/// Applies the app's web view settings to `window` (Linux; elsewhere the platform's defaults).
/// `WAYMARK_WEBVIEW_ACCELERATED=1` keeps GPU compositing, e.g. to compare.
pub fn tune(window: &tauri::WebviewWindow) {
    #[cfg(target_os = "linux")]
    {
        let accelerated = std::env::var_os("WAYMARK_WEBVIEW_ACCELERATED").is_some();
        let applied = window.with_webview(move |webview| {
            use webkit2gtk::{
                CacheModel, HardwareAccelerationPolicy, SettingsExt, WebContextExt, WebViewExt,
            };
            let view = webview.inner();
            // One document, never navigated away from: no back/forward page cache, no
            // memory cache sized for browsing.
            if let Some(context) = view.context() {
                context.set_cache_model(CacheModel::DocumentViewer);
            }
            if !accelerated && let Some(settings) = WebViewExt::settings(&view) {
                settings.set_hardware_acceleration_policy(HardwareAccelerationPolicy::Never);
            }
        });
        if let Err(e) = applied {
            tracing::warn!(error = %e, "cannot tune the web view; it keeps WebKit's defaults");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = window;
}
