//! The web companion at `/app/`: the built UI bundle (`scripts/build-ui` makes `ui/dist`,
//! which `scripts/test` runs first), with the headers a browser needs to cache it correctly
//! and to hold it to its own origin.

use reqwest::StatusCode;
use reqwest::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG, LOCATION};

use crate::support::Harness;

#[tokio::test]
async fn the_web_companion_is_served_at_app_with_caching_and_a_content_security_policy() {
    let h = Harness::start().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    let r = http.get(h.url("/app")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[LOCATION], "/app/");

    let r = http.get(h.url("/app/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(
        r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert_eq!(
        r.headers()[CACHE_CONTROL],
        "no-cache",
        "the page is revalidated"
    );
    let csp = r.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "default-src 'self'",
        "'wasm-unsafe-eval'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    let etag = r.headers()[ETAG].clone();
    let page = r.text().await.unwrap();

    // Unchanged: 304 without the body.
    let r = http
        .get(h.url("/app/"))
        .header(reqwest::header::IF_NONE_MATCH, etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);

    // The script the page names is there, relative to /app/, and cached for good (its name is
    // its content's hash).
    let script = page
        .split("src=\"./")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("the page loads a script by a relative URL");
    let r = http
        .get(h.url(&format!("/app/{script}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{script}");
    assert!(
        r.headers()[CONTENT_TYPE]
            .to_str()
            .unwrap()
            .contains("javascript")
    );
    assert_eq!(
        r.headers()[CACHE_CONTROL],
        "public, max-age=31536000, immutable"
    );

    let r = http
        .get(h.url("/app/no-such-file.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    // Not an API route: a path outside /app/ and /v1/ is still the API's 404 problem.
    let r = http.get(h.url("/nothing-here")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// Sends `GET {target}` as written — no client-side normalisation of `..` or `%2F` — and
/// returns the status code and the body.
async fn raw_get(h: &Harness, target: &str) -> (u16, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = h.server.url().trim_start_matches("http://").to_owned();
    let mut s = tokio::net::TcpStream::connect(&authority).await.unwrap();
    s.write_all(
        format!("GET {target} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let head = String::from_utf8_lossy(&out[..out.len().min(64)]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response to {target}: {head}"));
    (status, out)
}

#[tokio::test]
async fn only_files_of_the_bundle_are_served_never_a_path_outside_it() {
    let h = Harness::start().await;
    // The live database is open in this process: before paths were checked, one of these
    // descriptors served it to anyone (`/proc/self/fd/N`, decoded, replaced `ui/dist`).
    let mut targets: Vec<String> = (0..64)
        .flat_map(|fd| {
            [
                format!("/app/%2Fproc%2Fself%2Ffd%2F{fd}"),
                format!("/app//proc/self/fd/{fd}"),
                format!("/app/..%2F..%2F..%2F..%2F..%2F..%2Fproc%2Fself%2Ffd%2F{fd}"),
            ]
        })
        .collect();
    targets.extend(
        [
            "/app/%2Fetc%2Fmtab",
            "/app//etc/mtab",
            "/app/..%2F..%2F..%2F..%2F..%2F..%2Fetc%2Fmtab",
            "/app/../../../../../../etc/mtab",
            "/app/%2e%2e/%2e%2e/%2e%2e/%2e%2e/Cargo.toml",
            "/app/..%5C..%5C..%5CCargo.toml",
            "/app/assets/..%2F..%2F..%2F..%2FCargo.toml",
            "/app/./index.html",
        ]
        .map(String::from),
    );
    for target in &targets {
        let (status, body) = raw_get(&h, target).await;
        let text = String::from_utf8_lossy(&body);
        assert!(
            status == 404 || status == 400,
            "{target} answered {status}: {}",
            &text[..text.len().min(300)]
        );
        for leak in ["SQLite format", "[package]", " / ", "proc /proc"] {
            assert!(!text.contains(leak), "{target} leaked `{leak}`");
        }
    }

    // Every file the bundle holds is still served under its plain name.
    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ui/dist");
    let mut served = 0;
    for entry in walk(&dist) {
        let rel = entry
            .strip_prefix(&dist)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let (status, _) = raw_get(&h, &format!("/app/{rel}")).await;
        assert_eq!(status, 200, "{rel}");
        served += 1;
    }
    assert!(
        served > 3,
        "the bundle is built (scripts/build-ui): {served} files"
    );
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
