//! Control commands handed from the request that applied them to this replica's control
//! streams in memory, so a worker sees a steer without a database read on its path (under a
//! busy fan-out that read was most of the steer's p99: `docs/benchmarks.md`).
//!
//! A command is staged before its transaction commits and marked once the commit returns:
//! committed, or aborted when the commit failed (or the request went away first). A stream
//! woken by the commit waits for that mark, never shows what did not commit, and takes a
//! command only when it is the next of its task's (`seq` one past the last it showed); every
//! other case — another replica's command, one it missed, a full table — is the database
//! read, as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use waymark_proto::ControlCommand;

/// Tasks whose latest command is kept, at most; past it, settled ones are dropped (their
/// streams read the database).
const CAPACITY: usize = 4096;

/// Where a staged command's transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Pending,
    Committed,
    Aborted,
}

/// The latest command applied on this replica, per task.
#[derive(Default)]
pub struct Handoffs {
    by_task: Mutex<HashMap<String, Arc<Handoff>>>,
}

/// One staged command.
pub struct Handoff {
    pub command: ControlCommand,
    outcome: watch::Sender<Outcome>,
}

impl Handoff {
    /// Waits until its transaction is settled; whether it committed.
    pub async fn committed(&self) -> bool {
        let mut rx = self.outcome.subscribe();
        match rx.wait_for(|o| *o != Outcome::Pending).await {
            Ok(o) => *o == Outcome::Committed,
            Err(_) => false,
        }
    }
}

/// Staged commands: [`Staged::committed`] once the commit returned; dropped without it, they
/// are marked aborted.
pub struct Staged(Vec<Arc<Handoff>>);

impl Staged {
    /// The transaction committed: streams may show the commands.
    pub fn committed(self) {
        for h in &self.0 {
            h.outcome.send_replace(Outcome::Committed);
        }
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for h in &self.0 {
            // Only a command still pending: `committed` has marked the others.
            h.outcome.send_if_modified(|o| {
                let pending = *o == Outcome::Pending;
                if pending {
                    *o = Outcome::Aborted;
                }
                pending
            });
        }
    }
}

impl Handoffs {
    /// Stages `commands` of `task_id` (in the order they applied) before their commit.
    pub fn stage(&self, task_id: &str, commands: Vec<ControlCommand>) -> Staged {
        if commands.is_empty() {
            return Staged(Vec::new());
        }
        let staged: Vec<Arc<Handoff>> = commands
            .into_iter()
            .map(|command| {
                Arc::new(Handoff {
                    command,
                    outcome: watch::channel(Outcome::Pending).0,
                })
            })
            .collect();
        let mut by_task = self.by_task.lock().unwrap_or_else(|e| e.into_inner());
        if by_task.len() >= CAPACITY && !by_task.contains_key(task_id) {
            by_task.retain(|_, h| *h.outcome.borrow() == Outcome::Pending);
        }
        if let Some(last) = staged.last() {
            by_task.insert(task_id.to_owned(), last.clone());
        }
        Staged(staged)
    }

    /// The latest command staged for `task_id` on this replica, if it is kept.
    pub fn latest(&self, task_id: &str) -> Option<Arc<Handoff>> {
        self.by_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(task_id)
            .cloned()
    }

    /// How many tasks have a command kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_task.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use waymark_proto::Operation;

    fn command(seq: i64) -> ControlCommand {
        ControlCommand {
            command_id: format!("cmd_{seq}"),
            operation: Operation::Pause,
            args: json!({}),
            plan_revision: 1,
            applied_at: chrono::DateTime::UNIX_EPOCH,
            seq,
        }
    }

    #[tokio::test]
    async fn a_command_is_shown_only_once_its_commit_returned_and_never_after_a_failed_one() {
        let h = Handoffs::default();
        let staged = h.stage("task_a", vec![command(1)]);
        let latest = h.latest("task_a").unwrap();
        let waiting = tokio::spawn({
            let latest = latest.clone();
            async move { latest.committed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "pending until the commit returns");
        staged.committed();
        assert!(waiting.await.unwrap());

        let failed = h.stage("task_a", vec![command(2)]);
        let latest = h.latest("task_a").unwrap();
        assert_eq!(latest.command.seq, 2, "the newest replaces the older");
        drop(failed);
        assert!(!latest.committed().await, "dropped uncommitted: aborted");
        assert!(h.latest("task_b").is_none());
    }

    #[tokio::test]
    async fn past_its_capacity_the_table_keeps_only_commands_still_pending() {
        let h = Handoffs::default();
        let mut pending = Vec::new();
        for i in 0..CAPACITY {
            let s = h.stage(&format!("task_{i}"), vec![command(1)]);
            if i % 2 == 0 {
                s.committed();
            } else {
                pending.push(s);
            }
        }
        assert_eq!(h.len(), CAPACITY);
        let _s = h.stage("task_new", vec![command(1)]);
        assert_eq!(h.len(), CAPACITY / 2 + 1, "settled ones dropped");
        assert!(h.latest("task_1").is_some() && h.latest("task_0").is_none());
        drop(pending);
    }
}
