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
