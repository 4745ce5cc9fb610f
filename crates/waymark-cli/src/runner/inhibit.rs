//! The opt-in sleep inhibitor (`waymark runner --inhibit-sleep`): while a run is active the
//! runner holds logind's sleep lock — through `systemd-inhibit`, which keeps it for as long as
//! its child lives — so a laptop does not suspend under a run; the lock goes with the last run.
//! Off by default: keeping a machine awake is its owner's choice, and the Machines screen says
//! when a runner does it.

use tokio::process::{Child, Command};

/// What holds the lock: a child that keeps it until it is killed.
const SYSTEMD_INHIBIT: &[&str] = &[
    "systemd-inhibit",
    "--what=sleep:idle",
    "--who=waymark runner",
    "--why=a run is active",
    "--mode=block",
    "sleep",
    "infinity",
];

pub(crate) struct Inhibitor {
    /// The command that holds the lock; `None`: off.
    command: Option<Vec<String>>,
    held: Option<Child>,
    /// Said once, so a machine without logind does not fill the log.
    warned: bool,
}

impl Inhibitor {
    pub(crate) fn new(enabled: bool) -> Inhibitor {
        let command = enabled.then(|| SYSTEMD_INHIBIT.iter().map(|s| (*s).to_owned()).collect());
        Inhibitor::with_command(command)
    }

    pub(crate) fn with_command(command: Option<Vec<String>>) -> Inhibitor {
        Inhibitor {
            command,
            held: None,
            warned: false,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.command.is_some()
    }

    /// Whether the lock is held now.
    #[cfg(test)]
    fn holding(&mut self) -> bool {
        match &mut self.held {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Holds the lock while `active` (runs are under way), lets it go otherwise. A holder that
    /// died (logind went away, or refused) is started again on the next call, and said once.
    pub(crate) async fn hold(&mut self, active: bool) {
        let Some(cmd) = self.command.clone() else {
            return;
        };
        if let Some(c) = &mut self.held
            && !matches!(c.try_wait(), Ok(None))
        {
            if !self.warned {
                tracing::warn!(
                    "the sleep inhibitor ended by itself (is logind running?); the machine may sleep during runs"
                );
                self.warned = true;
            }
            self.held = None;
        }
        match (active, self.held.is_some()) {
            (true, false) => {
                match Command::new(&cmd[0])
                    .args(&cmd[1..])
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .kill_on_drop(true)
                    .spawn()
                {
                    Ok(c) => {
                        tracing::info!("holding the sleep inhibitor while runs are active");
                        self.held = Some(c);
                    }
                    Err(e) if !self.warned => {
                        tracing::warn!(error = %e, "cannot start `{}`; the machine may sleep during runs", cmd[0]);
                        self.warned = true;
                    }
                    Err(_) => {}
                }
            }
            (false, true) => {
                if let Some(mut c) = self.held.take() {
                    let _ = c.kill().await;
                    tracing::info!("no run is active: the sleep inhibitor is released");
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper() -> Option<Vec<String>> {
        Some(vec!["sleep".into(), "600".into()])
    }

    #[tokio::test]
    async fn the_lock_is_held_while_runs_are_active_and_released_with_the_last() {
        let mut i = Inhibitor::with_command(sleeper());
        i.hold(false).await;
        assert!(!i.holding(), "nothing held without a run");
        i.hold(true).await;
        assert!(i.holding());
        let pid = i.held.as_ref().and_then(|c| c.id()).unwrap();
        i.hold(true).await;
        assert_eq!(
            i.held.as_ref().and_then(|c| c.id()),
            Some(pid),
            "one holder, not one per call"
        );
        i.hold(false).await;
        assert!(!i.holding());
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "the holder is gone"
        );
    }

    #[tokio::test]
    async fn a_holder_that_dies_is_started_again_and_off_holds_nothing() {
        let mut i = Inhibitor::with_command(Some(vec!["true".into()]));
        i.hold(true).await;
        if let Some(c) = i.held.as_mut() {
            let _ = c.wait().await;
        }
        assert!(!i.holding(), "`true` ends at once: nothing is held");
        i.hold(true).await;
        assert!(i.warned, "said once that it ended");
        let mut off = Inhibitor::new(false);
        assert!(!off.enabled());
        off.hold(true).await;
        assert!(!off.holding());
    }
}
