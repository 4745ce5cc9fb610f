//! The web companion: the app's UI bundle (`ui/dist`, the same screens as the desktop app)
//! served at `/app/`, so a phone's browser can pair, review and steer. Built files are
//! embedded in release builds and read from `ui/dist` in debug builds. Embedded, they are
//! deflated (rust-embed's `compression`: 2.1 MB → ≈ 0.8 MB of the binary) and inflated on each
//! request; the hashed assets are cached by the browser for good, so that is rare.

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Redirect, Response};

#[derive(rust_embed::Embed)]
#[folder = "../../ui/dist/"]
#[allow_missing = true]
struct Bundle;

/// What the page may load: its own origin only; WebAssembly for the SQLite mirror; inline
/// style attributes (React sets them); no frames, plugins, or forms posting elsewhere.
const CSP: &str = "default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; \
    style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; \
    worker-src 'self' blob:; manifest-src 'self'; object-src 'none'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// `/app` → `/app/`, so the bundle's relative URLs resolve under it.
pub(crate) async fn redirect() -> Redirect {
    Redirect::permanent("/app/")
}

/// `/app/`: the page.
pub(crate) async fn index(headers: HeaderMap) -> Response {
    file("index.html", &headers)
}

/// `/app/{*path}`: the bundle's files.
///
/// The path is taken from the request as sent, not decoded: in debug builds rust-embed reads
/// `ui/dist` from disk, and a decoded `%2Fproc%2Fself%2Ffd%2F9` would name a file outside the
/// bundle (the live database). Only a plain relative bundle path is looked up, in every build.
pub(crate) async fn asset(uri: Uri, headers: HeaderMap) -> Response {
    match uri.path().strip_prefix("/app/").filter(|p| bundle_path(p)) {
        Some(path) => file(path, &headers),
        None => (StatusCode::NOT_FOUND, "no such file in the web companion").into_response(),
    }
}

/// A path the bundle can hold: segments of letters, digits, `-`, `_` and `.`, none empty and
/// none starting with a dot — so no leading `/`, no `\`, no `.` or `..`, no hidden files, and
/// no percent-encoding at all (Vite names nothing that needs it).
fn bundle_path(path: &str) -> bool {
    !path.is_empty()
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && !segment.starts_with('.')
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
}

fn file(path: &str, request: &HeaderMap) -> Response {
    let Some(f) = Bundle::get(path) else {
        return if Bundle::get("index.html").is_none() {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "the web companion is not built into this server: run `scripts/build-ui`, then \
                 build waymark again",
            )
                .into_response()
        } else {
            (StatusCode::NOT_FOUND, "no such file in the web companion").into_response()
        };
    };
    let hash: String = f
        .metadata
        .sha256_hash()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let etag = format!("\"{hash}\"");
    let mut out = if request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag))
    {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = f.data.into_owned().into_response();
        if let Ok(v) = HeaderValue::from_str(f.metadata.mimetype()) {
            r.headers_mut().insert(header::CONTENT_TYPE, v);
        }
        r
    };
    let h = out.headers_mut();
    // Vite names what it builds under `assets/` by content hash: such a file never changes.
    // Everything else (the page, the manifest, the service worker) is revalidated each time.
    let cache = if path.starts_with("assets/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    if let Ok(v) = HeaderValue::from_str(&etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::bundle_path;

    #[test]
    fn only_plain_relative_bundle_paths_are_looked_up() {
        for ok in [
            "index.html",
            "assets/index-Bx1_a.js",
            "sw.js",
            "icons/icon-192.png",
        ] {
            assert!(bundle_path(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/mtab",
            "%2Fetc%2Fmtab",
            "..%2F..%2Fetc%2Fmtab",
            "../Cargo.toml",
            "assets/../../Cargo.toml",
            "./index.html",
            "%2e%2e/x",
            "assets//x.js",
            "assets\\x.js",
            ".env",
            "assets/",
            "%2Fproc%2Fself%2Ffd%2F9",
        ] {
            assert!(!bundle_path(bad), "{bad}");
        }
    }
}
