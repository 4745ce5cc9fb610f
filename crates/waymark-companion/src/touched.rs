//! Which threads to look at again after sync applied events (notifications, the tray, a
//! terminal's printout). Signals, not a queue: marking a thread twice before it is looked at
//! is marking it once, and past [`Touched::new`]'s bound the set collapses into "look at
//! every thread" ([`Look::Overflowed`]) — memory stays bounded and nothing is lost, since
//! looking at every thread covers every thread that was marked. Marking never waits, so the
//! sync engine is never held back by a slow consumer.

use std::collections::BTreeSet;
use std::sync::Mutex;

use tokio::sync::Notify;

/// Threads to look at, as [`Touched::next`] hands them over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Look {
    /// Every thread, as asked by [`Touched::all`] (after a snapshot or a reconnect).
    All,
    /// Every thread, because more were marked than the bound: each may have changed.
    Overflowed,
    /// These threads, each once, in id order.
    Tasks(Vec<String>),
}

/// A bounded, coalescing set of threads to look at, shared by the sync callback (marking) and
/// one consumer (taking).
#[derive(Debug)]
pub struct Touched {
    cap: usize,
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    tasks: BTreeSet<String>,
    all: bool,
    overflowed: bool,
}

impl Touched {
    /// The bound the app and the terminal client use.
    pub const DEFAULT_CAP: usize = 1024;

    /// Holds up to `cap` distinct thread ids (at least one) before collapsing into [`Look::All`].
    pub fn new(cap: usize) -> Self {
        Touched {
            cap: cap.max(1),
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks threads to look at. Never waits.
    pub fn tasks<'a>(&self, ids: impl IntoIterator<Item = &'a str>) {
        {
            let mut s = self.lock();
            if s.all || s.overflowed {
                return;
            }
            for id in ids {
                if s.tasks.len() >= self.cap && !s.tasks.contains(id) {
                    tracing::debug!(
                        cap = self.cap,
                        "more threads changed than are tracked one by one; looking at all of them"
                    );
                    s.tasks.clear();
                    s.overflowed = true;
                    break;
                }
                s.tasks.insert(id.to_owned());
            }
        }
        self.wake.notify_one();
    }

    /// Marks every thread (after a snapshot or a reconnect). Never waits.
    pub fn all(&self) {
        {
            let mut s = self.lock();
            s.tasks.clear();
            s.all = true;
        }
        self.wake.notify_one();
    }

    /// Takes what is marked, if anything.
    pub fn take(&self) -> Option<Look> {
        let mut s = self.lock();
        if std::mem::take(&mut s.all) {
            s.tasks.clear();
            s.overflowed = false;
            return Some(Look::All);
        }
        if std::mem::take(&mut s.overflowed) {
            return Some(Look::Overflowed);
        }
        if s.tasks.is_empty() {
            return None;
        }
        Some(Look::Tasks(
            std::mem::take(&mut s.tasks).into_iter().collect(),
        ))
    }

    /// Takes what is marked, waiting until something is.
    pub async fn next(&self) -> Look {
        loop {
            if let Some(look) = self.take() {
                return look;
            }
            // A mark between `take` and here leaves a permit, so this returns at once.
            self.wake.notified().await;
        }
    }

    /// How many thread ids are held (at most the bound).
    pub fn len(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Whether nothing is marked.
    pub fn is_empty(&self) -> bool {
        let s = self.lock();
        !s.all && !s.overflowed && s.tasks.is_empty()
    }
}

impl Default for Touched {
    fn default() -> Self {
        Touched::new(Touched::DEFAULT_CAP)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn marks_coalesce_and_come_out_once_each() {
        let t = Touched::new(8);
        assert_eq!(t.take(), None);
        t.tasks(["b", "a", "b"]);
        t.tasks(["a", "c"]);
        assert_eq!(t.len(), 3);
        assert_eq!(
            t.take(),
            Some(Look::Tasks(vec!["a".into(), "b".into(), "c".into()]))
        );
        assert_eq!(t.take(), None);
        assert!(t.is_empty());
    }

    /// Past the bound the set collapses into `All`: memory stays at the bound, and looking at
    /// every thread covers each one marked.
    #[test]
    fn past_the_bound_the_set_becomes_all_and_stays_bounded() {
        let t = Touched::new(4);
        t.tasks(["t1", "t2", "t3", "t4"]);
        assert_eq!(t.len(), 4);
        // Marking one already held is no growth.
        t.tasks(["t2"]);
        assert_eq!(t.len(), 4);
        t.tasks(["t5"]);
        assert_eq!(t.len(), 0, "the set is dropped, not grown");
        for i in 0..10_000 {
            t.tasks([format!("more-{i}").as_str()]);
            assert_eq!(t.len(), 0);
        }
        assert_eq!(t.take(), Some(Look::Overflowed));
        assert_eq!(t.take(), None);
        // Afterwards marks are tracked one by one again.
        t.tasks(["t9"]);
        assert_eq!(t.take(), Some(Look::Tasks(vec!["t9".into()])));
        // `all` wins over what was marked, and over an overflow.
        t.tasks(["x"]);
        t.all();
        t.tasks(["y"]);
        assert_eq!(t.take(), Some(Look::All));
        t.tasks(["1", "2", "3", "4", "5"]);
        t.all();
        assert_eq!(t.take(), Some(Look::All));
        assert_eq!(t.take(), None);
    }

    /// Many producers against one slow consumer: every id marked is handed over, or an `All`
    /// covers it, and the held set never exceeds the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn nothing_is_lost_under_load_and_memory_stays_bounded() {
        for cap in [16, 1_000_000] {
            let t = Arc::new(Touched::new(cap));
            let producers: Vec<_> = (0..4)
                .map(|p| {
                    let t = t.clone();
                    std::thread::spawn(move || {
                        for i in 0..5_000 {
                            t.tasks([format!("p{p}-{i}").as_str()]);
                            assert!(t.len() <= cap);
                        }
                    })
                })
                .collect();
            let consumer = {
                let t = t.clone();
                tokio::spawn(async move {
                    let mut seen = HashSet::new();
                    let mut all = false;
                    loop {
                        match tokio::time::timeout(Duration::from_millis(500), t.next()).await {
                            Err(_) => return (seen, all),
                            Ok(Look::All) => panic!("nobody asked for `All`"),
                            Ok(Look::Overflowed) => all = true,
                            Ok(Look::Tasks(ids)) => seen.extend(ids),
                        }
                        // A slow consumer.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
            };
            for p in producers {
                p.join().unwrap();
            }
            let (seen, all) = consumer.await.unwrap();
            if cap == 16 {
                assert!(
                    all,
                    "20,000 marks past a bound of 16 collapse into `Overflowed`"
                );
            } else {
                assert!(!all);
                assert_eq!(seen.len(), 20_000, "every mark was handed over");
            }
            assert!(t.is_empty());
        }
    }

    #[tokio::test]
    async fn next_waits_for_a_mark() {
        let t = Arc::new(Touched::default());
        let waiter = {
            let t = t.clone();
            tokio::spawn(async move { t.next().await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        t.tasks(["task_1"]);
        let look = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the mark")
            .unwrap();
        assert_eq!(look, Look::Tasks(vec!["task_1".into()]));
    }
}
