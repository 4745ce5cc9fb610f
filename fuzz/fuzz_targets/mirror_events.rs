//! The companion's side of the event stream: arbitrary bytes as the SSE body, decoded by the
//! sync engine's own decoder (`waymark_companion::decode_events`, over `eventsource-stream`),
//! cut into chunks anywhere, batched and applied to a real SQLite mirror the way
//! `Companion::stream` does. Never panics, and never corrupts the mirror: a batch that applies
//! advances the cursor to its last event and applying it again changes nothing; a batch that
//! fails changes nothing; and afterwards every thread, the inbox and the outbox still read.
#![no_main]

use std::sync::OnceLock;

use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use waymark_companion::{Error, Mirror, decode_events};
use waymark_proto::Event;

struct Harness {
    rt: tokio::runtime::Runtime,
    mirror: Mirror,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        // Prefer memory-backed storage: the mirror syncs on every commit.
        let dir = tempfile::Builder::new()
            .prefix("waymark-fuzz-mirror")
            .tempdir_in(if std::path::Path::new("/dev/shm").is_dir() {
                "/dev/shm"
            } else {
                "/tmp"
            })
            .or_else(|_| tempfile::tempdir())
            .expect("a temp dir");
        let mirror = rt
            .block_on(Mirror::open(&dir.path().join("mirror.db")))
            .expect("the mirror opens");
        Harness {
            rt,
            mirror,
            _dir: dir,
        }
    })
}

/// Everything the mirror shows, as text: threads, each thread in full, the inbox, the outbox.
/// Any read error is corruption.
async fn state(m: &Mirror) -> String {
    let threads = m.threads().await.expect("the thread list reads");
    let mut out = serde_json::to_string(&threads).expect("JSON");
    let mut ids: Vec<&str> = threads.iter().map(|t| t.task.id.as_str()).collect();
    ids.sort_unstable();
    for id in ids {
        let detail = m
            .thread(id)
            .await
            .expect("a thread reads")
            .expect("a listed thread exists");
        out.push_str(&serde_json::to_string(&detail).expect("JSON"));
        for d in &detail.decisions {
            m.decision(&d.id).await.expect("a decision reads");
        }
    }
    let inbox = m.inbox().await.expect("the inbox reads");
    out.push_str(&serde_json::to_string(&inbox).expect("JSON"));
    let outbox = m.outbox(None).await.expect("the outbox reads");
    out.push_str(&serde_json::to_string(&outbox).expect("JSON"));
    m.blobs_to_prefetch()
        .await
        .expect("the prefetch list reads");
    out
}

async fn flush(m: &Mirror, batch: &mut Vec<Event>) {
    let Some(last) = batch.last() else {
        return;
    };
    let before_cursor = m.cursor().await.expect("the cursor reads");
    let before = state(m).await;
    match m.apply(batch).await {
        Ok(()) => {
            let want = before_cursor.unwrap_or(0).max(last.cursor);
            assert_eq!(m.cursor().await.expect("the cursor reads"), Some(want));
            let after = state(m).await;
            m.apply(batch)
                .await
                .expect("a batch that applied applies again");
            assert_eq!(
                state(m).await,
                after,
                "applying a batch twice changed the mirror"
            );
        }
        Err(Error::Mirror(_)) => {
            assert_eq!(m.cursor().await.expect("the cursor reads"), before_cursor);
            assert_eq!(state(m).await, before, "a failed batch changed the mirror");
        }
        Err(e) => panic!("apply failed with a non-mirror error: {e}"),
    }
    batch.clear();
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let h = harness();
    h.rt.block_on(async {
        let m = &h.mirror;
        // Each input starts from an empty mirror at cursor 0. (This reset once failed with
        // `database is locked` behind a failed batch's rollback: see `Mirror::write_tx`.)
        m.replace_all(0, &[]).await.expect("the mirror resets");
        let chunk = usize::from(cut).max(1);
        let chunks: Vec<Result<Vec<u8>, std::convert::Infallible>> =
            body.chunks(chunk).map(|c| Ok(c.to_vec())).collect();
        let mut events = Box::pin(decode_events(
            futures::stream::iter(chunks),
            "http://fuzz.invalid".into(),
        ));
        let mut batch = Vec::new();
        while let Some(item) = events.next().await {
            match item {
                Ok(ev) => {
                    batch.push(ev);
                    if batch.len() >= 256 {
                        flush(m, &mut batch).await;
                    }
                }
                // The sync engine applies what it has, then stops on a bad event.
                Err(_) => break,
            }
        }
        flush(m, &mut batch).await;
        state(m).await;
    });
});
