//! Two lanes for connections, so the control path never waits behind people's streams. A
//! commit wakes every open event stream at once; with a thousand of them, those wake-ups fill
//! a runtime's queue, and a worker's control stream or a command woken by the same commit
//! waited behind them (docs/benchmarks.md, steer p99). So a connection that asks for an event
//! stream (`GET /v1/events`) moves to the **people's lane**: a runtime of its own whose threads
//! run at a lower OS priority (nice +10 on Linux), where the fan-out of frames waits for the
//! cores the control path leaves. Everything else — workers, control streams, commands,
//! snapshots — stays on the runtime the server was started on.
//!
//! A connection moves when the head of such a request has been read, whatever came before on
//! it (a browser reuses a kept-alive connection for its `EventSource`): its whole future —
//! hyper's connection, the request's handler, the stream — is handed to the lane between two
//! polls, and the lane's first poll registers its own wake-ups. It never moves back: a
//! stream's response does not end, so the connection carries nothing else after it.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use axum::http::Method;
use prometheus_client::metrics::counter::Counter;
use tokio::runtime::{Handle, Runtime};

/// How much lower the people's lane runs than the control path (`nice`, Linux).
const NICE: i32 = 10;

/// The people's lane: its runtime, shut down (without waiting) when the last connection
/// holding it is gone.
pub(crate) struct PeopleLane {
    runtime: Option<Runtime>,
    handle: Handle,
}

impl PeopleLane {
    /// A runtime of `threads` worker threads named `waymark-people`, each lowering its own
    /// priority as it starts.
    pub(crate) fn start(threads: usize) -> io::Result<PeopleLane> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("waymark-people")
            .on_thread_start(lower_priority)
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        Ok(PeopleLane {
            runtime: Some(runtime),
            handle,
        })
    }

    /// Runs a connection on the lane.
    pub(crate) fn spawn<F>(&self, connection: F)
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.handle.spawn(connection);
    }
}

impl Drop for PeopleLane {
    fn drop(&mut self) {
        // Dropped from async code (the accept loop's end): a blocking shutdown would panic.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// This thread's OS priority, lowered (Linux: `setpriority` on the thread's id; nice values
/// are per thread there). Where it cannot be lowered the lane still runs apart, at the same
/// priority.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        let tid = rustix::thread::gettid();
        let lowered = rustix::process::getpriority_process(Some(tid))
            .and_then(|now| rustix::process::setpriority_process(Some(tid), (now + NICE).min(19)));
        if let Err(e) = lowered {
            tracing::debug!(error = %e, "could not lower the people's lane's priority");
        }
    }
}

/// Whether a request asks for the event stream.
pub(crate) fn is_event_stream(method: &Method, path: &str) -> bool {
    method == Method::GET && path == "/v1/events"
}

/// Serves a connection's future here until it asks for an event stream (`to_people` is set,
/// when its request head was read), then hands it to the lane. Without a lane, here to the end.
pub(crate) async fn serve<F>(
    connection: F,
    to_people: Arc<AtomicBool>,
    lane: Option<Arc<PeopleLane>>,
    moved: &Counter,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let mut connection = Box::pin(connection);
    let Some(lane) = lane else {
        return connection.await;
    };
    let asked = std::future::poll_fn(|cx| {
        if connection.as_mut().poll(cx).is_ready() {
            return Poll::Ready(false);
        }
        if to_people.load(Ordering::Acquire) {
            Poll::Ready(true)
        } else {
            Poll::Pending
        }
    })
    .await;
    if asked {
        moved.inc();
        lane.spawn(connection);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn only_the_event_stream_goes_to_the_people() {
        assert!(is_event_stream(&Method::GET, "/v1/events"));
        assert!(!is_event_stream(&Method::POST, "/v1/events"));
        assert!(!is_event_stream(&Method::GET, "/v1/eventsX"));
        assert!(!is_event_stream(&Method::GET, "/v1/attempts/att_1/control"));
        assert!(!is_event_stream(&Method::GET, "/v1/snapshot"));
    }

    /// A connection served here until it asks, then on the lane: the part after the ask runs on
    /// the lane's thread, and what it waits on still wakes it there.
    #[tokio::test]
    async fn a_connection_moves_when_it_asks_and_finishes_on_the_lane() {
        let lane = Arc::new(PeopleLane::start(1).unwrap());
        let to_people = Arc::new(AtomicBool::new(false));
        let (ask, asked) = tokio::sync::oneshot::channel::<()>();
        let (more, more_rx) = tokio::sync::oneshot::channel::<()>();
        let (done, where_done) = tokio::sync::oneshot::channel();
        let flag = to_people.clone();
        let connection = async move {
            let before = std::thread::current().name().map(str::to_owned);
            asked.await.unwrap();
            flag.store(true, Ordering::Release);
            more_rx.await.unwrap();
            let after = std::thread::current().name().map(str::to_owned);
            done.send((before, after)).unwrap();
        };
        let moved = Counter::default();
        let served = {
            let moved = moved.clone();
            let lane = lane.clone();
            tokio::spawn(async move { serve(connection, to_people, Some(lane), &moved).await })
        };
        ask.send(()).unwrap();
        served.await.unwrap();
        assert_eq!(moved.get(), 1);
        more.send(()).unwrap();
        let (before, after) = tokio::time::timeout(Duration::from_secs(10), where_done)
            .await
            .unwrap()
            .unwrap();
        assert_ne!(before.as_deref(), Some("waymark-people"));
        assert_eq!(after.as_deref(), Some("waymark-people"));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_lane_runs_at_a_lower_priority_and_shuts_down_without_blocking() {
        let lane = PeopleLane::start(1).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        lane.spawn(async move {
            let name = std::thread::current().name().map(str::to_owned);
            let tid = rustix::thread::gettid();
            tx.send((
                name,
                rustix::process::getpriority_process(Some(tid)).unwrap(),
            ))
            .unwrap();
        });
        let (name, nice) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(name.as_deref(), Some("waymark-people"));
        // Lower than the process it runs in (by NICE, up to the lowest priority there is).
        let base = rustix::process::getpriority_process(None).unwrap();
        assert_eq!(nice, (base + NICE).min(19));
        drop(lane);
    }
}
