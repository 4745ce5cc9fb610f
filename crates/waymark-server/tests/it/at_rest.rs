//! What the server keeps on disk is its owner's only: the data dir 0700, the database and its
//! WAL files 0600, and pairing codes kept as keyed hashes.

use crate::support::Harness;

#[cfg(unix)]
#[tokio::test]
async fn the_data_dir_and_the_database_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let base = tempfile::tempdir().unwrap();

    // A new dir, made with the usual umask (0755 otherwise).
    let fresh = waymark_server::DataDir::new(base.path().join("new"));
    let store = fresh.open().await.unwrap();
    {
        use waymark_store::Store;
        let mut tx = store.write().await.unwrap();
        tx.insert_server_secret("probe", "x").await.unwrap();
        tx.commit().await.unwrap();
    }
    assert_eq!(mode(fresh.root()), 0o700);
    for f in ["waymark.db", "waymark.db-wal", "waymark.db-shm"] {
        let p = fresh.root().join(f);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{f}");
        }
    }
    assert!(fresh.root().join("waymark.db-wal").exists(), "WAL mode");
    drop(store);

    // An older dir that others could read is tightened.
    let old = base.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    let db = old.join("waymark.db");
    std::fs::write(&db, b"").unwrap();
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
    let dir = waymark_server::DataDir::new(&old);
    drop(dir.open().await.unwrap());
    assert_eq!(mode(&old), 0o700);
    assert_eq!(mode(&db), 0o600);
}

#[tokio::test]
async fn pairing_codes_are_kept_as_keyed_hashes() {
    let h = Harness::start().await;
    let (code, _) = waymark_server::steer::create_pairing(
        &*h.server.state.store,
        "alice",
        &["view".to_owned()],
        600_000,
    )
    .await
    .unwrap();
    let plain =
        waymark_proto::digest::sha256_hex(waymark_server::steer::normalize_code(&code).as_bytes());
    let (sqlite, postgres) = (
        "UPDATE pairing_codes SET code_hash = code_hash WHERE code_hash = ?",
        "UPDATE pairing_codes SET code_hash = code_hash WHERE code_hash = $1",
    );
    assert_eq!(
        h.raw_sql(sqlite, postgres, &plain).await,
        0,
        "not an unkeyed hash"
    );
    let key = waymark_server::steer::pairing_key(&*h.server.state.store)
        .await
        .unwrap();
    let keyed = waymark_server::steer::code_hash(&key, &code);
    assert_eq!(h.raw_sql(sqlite, postgres, &keyed).await, 1);
    // And the code pairs.
    let device = ed25519_dalek::SigningKey::generate(&mut rand::rngs::OsRng);
    let (s, v) = h
        .post(
            "",
            "/v1/devices/pair",
            serde_json::json!({"code": code, "name": "phone",
            "public_key": waymark_proto::signing::public_key_b64(&device.verifying_key())}),
        )
        .await;
    assert_eq!(s, reqwest::StatusCode::CREATED, "{v}");
}
