//! HTTPS with a certificate made at test time: served to a client that trusts it, refused by
//! one that checks the public CAs, and a plain-HTTP request to the TLS port is told to use
//! `https://`. (Pinning the certificate from a pairing link is the companion's, tested there
//! against this same server.)

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use tokio::io::AsyncReadExt;
use waymark_server::{Config, DataDir, TlsFiles};

use crate::support::test_config;

#[tokio::test]
async fn https_is_served_with_the_given_certificate_and_plain_http_is_told_to_use_https() {
    let dir = tempfile::tempdir().unwrap();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let data = DataDir::new(dir.path().join("data"));
    let running = waymark_server::start(
        &data,
        "127.0.0.1:0".parse().unwrap(),
        Config {
            tls: Some(TlsFiles { cert, key }),
            header_timeout: Duration::from_secs(1),
            ..test_config()
        },
    )
    .await
    .unwrap();
    let fp = waymark_server::tls::fingerprint(made.cert.der());
    assert_eq!(running.fingerprint.as_deref(), Some(fp.as_str()));
    assert!(running.url().starts_with("https://"), "{}", running.url());
    // `waymark admin pair` finds both in the data dir.
    assert_eq!(data.recorded_url(), Some(running.url()));
    assert_eq!(data.recorded_fingerprint(), Some(fp.clone()));

    // A client that trusts this certificate is served.
    let trusting = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let res = trusting
        .get(format!("{}/healthz", running.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // One that checks the public CAs refuses it.
    let e = reqwest::Client::new()
        .get(format!("{}/healthz", running.url()))
        .send()
        .await
        .unwrap_err();
    assert!(e.is_connect(), "{e:?}");
    assert!(format!("{e:?}").contains("UnknownIssuer"), "{e:?}");

    // Plain HTTP to the TLS port gets a plain answer saying what to do.
    let res = reqwest::Client::new()
        .get(format!("http://{}/healthz", running.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(res.headers()["content-type"], "application/problem+json");
    let v: serde_json::Value = res.json().await.unwrap();
    assert_eq!(v["code"], "bad_request");
    assert!(v["detail"].as_str().unwrap().contains("https://"), "{v}");

    // A client that connects and never starts the handshake is dropped at the deadline.
    let mut idle = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), idle.read(&mut buf))
        .await
        .expect("the idle connection stayed open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());

    // Graceful shutdown still works, and the next plain-HTTP start forgets the pin.
    tokio::time::timeout(Duration::from_secs(10), running.shutdown())
        .await
        .expect("shutdown hangs")
        .unwrap();
    let plain = waymark_server::start(&data, "127.0.0.1:0".parse().unwrap(), test_config())
        .await
        .unwrap();
    assert!(plain.url().starts_with("http://"));
    assert_eq!(data.recorded_fingerprint(), None);
    plain.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_that_is_not_the_certificates_stops_the_start_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let a = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let b = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert = dir.path().join("server-cert.pem");
    let key = dir.path().join("other-key.pem");
    std::fs::write(&cert, a.cert.pem()).unwrap();
    std::fs::write(&key, b.signing_key.serialize_pem()).unwrap();
    let e = waymark_server::start(
        &DataDir::new(dir.path().join("data")),
        "127.0.0.1:0".parse().unwrap(),
        Config {
            tls: Some(TlsFiles { cert, key }),
            ..test_config()
        },
    )
    .await
    .err()
    .expect("a mismatched key must not start");
    let msg = e.to_string();
    assert!(matches!(e, waymark_server::ServeError::Tls(_)), "{msg}");
    assert!(
        msg.contains("other-key.pem") && msg.contains("server-cert.pem"),
        "{msg}"
    );
}

/// Over TLS a connection past the cap is closed before the handshake (answering would take the
/// handshake the cap saves); the open connection is served on, and its end frees the slot.
#[tokio::test]
async fn past_the_connection_cap_a_tls_connection_is_closed_and_the_open_one_served() {
    let dir = tempfile::tempdir().unwrap();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let running = waymark_server::start(
        &DataDir::new(dir.path().join("data")),
        "127.0.0.1:0".parse().unwrap(),
        Config {
            tls: Some(TlsFiles { cert, key }),
            max_connections: 1,
            ..test_config()
        },
    )
    .await
    .unwrap();
    let trusting = || {
        reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(made.cert.pem().as_bytes()).unwrap(),
            )
            .build()
            .unwrap()
    };
    let url = format!("{}/healthz", running.url());
    // One client holds the only connection (kept alive in its pool).
    let holder = trusting();
    assert_eq!(
        holder.get(&url).send().await.unwrap().status(),
        StatusCode::OK
    );

    // Another is closed at once, without a byte.
    let mut raw = tokio::net::TcpStream::connect(running.addr).await.unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf))
        .await
        .expect("the connection past the cap stayed open")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let e = trusting().get(&url).send().await.unwrap_err();
    assert!(e.is_connect() || e.is_request(), "{e:?}");

    // The open connection is served on.
    assert_eq!(
        holder.get(&url).send().await.unwrap().status(),
        StatusCode::OK
    );

    // Once it closes, a new client is served.
    drop(holder);
    let mut served = false;
    for _ in 0..100 {
        if let Ok(res) = trusting().get(&url).send().await {
            assert_eq!(res.status(), StatusCode::OK);
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "the closed connection's slot was never freed");
    running.shutdown().await.unwrap();
}
