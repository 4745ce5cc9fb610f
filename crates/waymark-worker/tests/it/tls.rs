//! A worker pinned to the server's certificate, against a real `waymark serve` over TLS with a
//! self-signed certificate: the right fingerprint connects (plain calls, an attempt with its
//! heartbeat and control stream), a wrong one is refused before anything is sent, and without
//! a pin the public CAs refuse it with a hint.

use std::time::{Duration, Instant};

use waymark_proto::CreateTask;
use waymark_server::{Config, DataDir, Running, TlsFiles};
use waymark_worker::{AttemptOptions, Client, Error, SERVER_FP_ENV};

struct Tls {
    _dir: tempfile::TempDir,
    server: Running,
    token: String,
    fp: String,
}

async fn tls_server() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    let server = waymark_server::start(
        &DataDir::new(dir.path().join("server")),
        "127.0.0.1:0".parse().unwrap(),
        Config {
            tls: Some(TlsFiles { cert, key }),
            ..Config::default()
        },
    )
    .await
    .unwrap();
    let (token, _) =
        waymark_server::admin::create_worker_token(&*server.state.store, "agent", None)
            .await
            .unwrap();
    let fp = server
        .fingerprint
        .clone()
        .expect("a TLS server has a fingerprint");
    assert_eq!(fp, waymark_tls_pin_fp(made.cert.der()));
    Tls {
        _dir: dir,
        server,
        token,
        fp,
    }
}

/// The fingerprint as the server computes it (what `waymark serve` prints).
fn waymark_tls_pin_fp(der: &[u8]) -> String {
    waymark_server::tls::fingerprint(der)
}

async fn task_count(s: &Tls) -> usize {
    let mut tx = s.server.state.store.read().await.unwrap();
    tx.list_tasks(None).await.unwrap().len()
}

fn new_task(title: &str) -> CreateTask {
    CreateTask {
        title: title.into(),
        goal: String::new(),
        runtime: None,
        budget: Default::default(),
        plan: Vec::new(),
        materials: Default::default(),
        external_key: None,
    }
}

#[tokio::test]
async fn the_right_fingerprint_connects_and_a_wrong_one_is_refused_before_anything_is_sent() {
    let s = tls_server().await;
    let url = s.server.url();
    assert!(url.starts_with("https://"), "{url}");

    // Pinned by the fingerprint `waymark serve` prints (any case): served.
    let pinned = Client::builder(&url, s.token.clone())
        .pin(s.fp.to_uppercase().replace("SHA256:", "sha256:"))
        .build()
        .unwrap();
    assert_eq!(pinned.pin(), Some(s.fp.as_str()));
    pinned.health().await.unwrap();
    let task = pinned.create_task(&new_task("pinned")).await.unwrap();
    // An attempt: its heartbeat and control stream ride the same pinned client.
    let run = pinned
        .start_attempt(&task.id, AttemptOptions::new("pinned-worker"))
        .await
        .unwrap();
    run.messages(vec![waymark_proto::NewMessage {
        role: "assistant".into(),
        text: "over a pinned connection".into(),
    }])
    .await
    .unwrap();
    assert_eq!(task_count(&s).await, 1);

    // Pinned to another certificate: refused at once, not retried, nothing sent.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let wrong_fp = waymark_tls_pin_fp(other.cert.der());
    let wrong = Client::builder(&url, s.token.clone())
        .pin(wrong_fp.clone())
        .build()
        .unwrap();
    let started = Instant::now();
    let e = wrong
        .create_task(&new_task("must not exist"))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "a mismatch is not retried: {:?}",
        started.elapsed()
    );
    match &e {
        Error::CertificateMismatch { pinned, presented } => {
            assert_eq!(pinned, &wrong_fp);
            assert_eq!(presented, &s.fp);
        }
        other => panic!("expected a certificate mismatch, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(msg.contains("nothing was sent"), "{msg}");
    assert!(msg.contains(SERVER_FP_ENV), "{msg}");
    assert!(msg.contains(&s.fp) && msg.contains(&wrong_fp), "{msg}");
    assert!(matches!(
        wrong.health().await,
        Err(Error::CertificateMismatch { .. })
    ));
    assert_eq!(
        task_count(&s).await,
        1,
        "the refused request reached the server"
    );

    // Without a pin the public CAs refuse the self-signed certificate, and the error says
    // how to pin it.
    let unpinned = Client::new(&url, s.token.clone()).unwrap();
    let e = unpinned.health().await.unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert!(e.to_string().contains(SERVER_FP_ENV), "{e}");

    drop(run);
    s.server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_pin_must_be_a_fingerprint_of_an_https_server() {
    let e = Client::builder("https://127.0.0.1:1", "wmk_w_x")
        .pin("sha256:abc")
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("64 hex digits"), "{e}");

    let fp = format!("sha256:{}", "ab".repeat(32));
    let e = Client::builder("http://127.0.0.1:1", "wmk_w_x")
        .pin(fp.clone())
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("https://"), "{e}");

    let c = Client::builder("https://127.0.0.1:1", "wmk_w_x")
        .pin(fp.clone())
        .build()
        .unwrap();
    assert_eq!(c.pin(), Some(fp.as_str()));
    assert_eq!(
        Client::new("https://127.0.0.1:1", "wmk_w_x").unwrap().pin(),
        None
    );
}
