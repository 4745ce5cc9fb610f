//! Starting and resuming an ACP agent for a runner (Gemini CLI `gemini --acp`, OpenCode
//! `opencode acp`, GitHub Copilot CLI `copilot --acp`, Hermes Agent `hermes acp`): this binary's
//! own ACP adapter bound to the task `start_run` made, with the machine's token; a start opens
//! a new session and keeps its id on this machine, a resume loads that session again
//! (`session/load`) and prompts in it with the note or the follow-up — the text always on stdin.
//! Each agent's load was measured before it was offered here (`docs/runner.md`).

use std::path::{Path, PathBuf};

use waymark_proto::{Work, WorkKind};

/// The runtime name Gemini CLI runs carry.
pub(crate) const GEMINI: &str = "gemini";

/// What a resume without a message (an answer to a deferred approval) tells the agent.
pub(crate) const RESUME_PROMPT: &str = "Continue from where you left off.";

/// The ACP agents a runner starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Gemini,
    OpenCode,
    Copilot,
    Hermes,
}

impl Kind {
    /// The kind of a run's runtime name, when it is an ACP agent a runner starts.
    pub(crate) fn of(runtime: &str) -> Option<Kind> {
        match runtime {
            GEMINI => Some(Kind::Gemini),
            "opencode" => Some(Kind::OpenCode),
            "copilot" => Some(Kind::Copilot),
            "hermes" => Some(Kind::Hermes),
            _ => None,
        }
    }

    /// The runtime name its runs carry (the adapter's `--runtime`).
    pub(crate) fn runtime(self) -> &'static str {
        match self {
            Kind::Gemini => GEMINI,
            Kind::OpenCode => "opencode",
            Kind::Copilot => "copilot",
            Kind::Hermes => "hermes",
        }
    }

    /// For people.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Gemini => "Gemini CLI",
            Kind::OpenCode => "OpenCode",
            Kind::Copilot => "Copilot CLI",
            Kind::Hermes => "Hermes Agent",
        }
    }

    /// Its command on the PATH (and the runner's flag for its binary).
    pub(crate) fn command(self) -> &'static str {
        match self {
            Kind::Gemini => "gemini",
            Kind::OpenCode => "opencode",
            Kind::Copilot => "copilot",
            Kind::Hermes => "hermes",
        }
    }

    /// What makes the binary speak ACP on its stdio.
    fn acp_args(self) -> &'static [&'static str] {
        match self {
            Kind::Gemini | Kind::Copilot => &["--acp"],
            Kind::OpenCode | Kind::Hermes => &["acp"],
        }
    }
}

/// An ACP agent found on this machine.
#[derive(Debug, Clone)]
pub(crate) struct AcpAgent {
    /// The runtime name tasks carry (`gemini`).
    pub(crate) runtime: &'static str,
    /// For people (`Gemini CLI`).
    pub(crate) name: &'static str,
    pub(crate) bin: PathBuf,
    pub(crate) version: Option<String>,
    /// What makes the binary speak ACP on its stdio (`--acp`).
    acp_args: &'static [&'static str],
}

impl AcpAgent {
    /// The agent of `kind`: `explicit`, else its command on the PATH; its version from
    /// `--version` (`0.61.0`, `1.18.33`, `GitHub Copilot CLI 1.0.102.`, `Hermes Agent v0.19.0`).
    pub(crate) async fn find(kind: Kind, explicit: Option<&Path>) -> Option<AcpAgent> {
        let bin = match explicit {
            Some(p) => p.to_path_buf(),
            None => super::on_path(kind.command())?,
        };
        let version = super::version_of(&bin).await?;
        Some(AcpAgent {
            runtime: kind.runtime(),
            name: kind.name(),
            bin,
            version,
            acp_args: kind.acp_args(),
        })
    }

    /// The agent's command line for the adapter's `--agent-cmd` (run with `sh -c`): `exec`, so
    /// the adapter sees the agent's own end.
    fn command(&self) -> String {
        let mut words = vec![
            "exec".to_owned(),
            super::shell_word(&self.bin.to_string_lossy()),
        ];
        words.extend(self.acp_args.iter().map(|a| (*a).to_owned()));
        words.join(" ")
    }
}

/// The environment a runner's Gemini CLI gets beyond its own. Gemini CLI 0.61's session
/// cleanup, on by default, deletes every file of a session when it finds one file of that session
/// it cannot resume — and each process that loads a session leaves such a file (the record it
/// starts before it loads) — so the second resume of a run would find its session gone
/// ("Invalid session identifier"). The runner's Gemini CLI runs with system settings of the
/// runner's own that turn the cleanup off (`general.sessionRetention.enabled: false`; system
/// settings, because Gemini CLI lets a user's `general` hide lower ones), unless the owner has
/// system settings (`GEMINI_CLI_SYSTEM_SETTINGS_PATH`, `/etc/gemini-cli/settings.json`).
/// Gemini CLI reads such a file only where no directory above it is writable by others: the
/// runner's state dir (0700, under the owner's home) is such a place.
pub(crate) fn extra_env(
    agent: &AcpAgent,
    state_dir: &Path,
) -> std::io::Result<Vec<(&'static str, std::ffi::OsString)>> {
    const SETTINGS: &str = "GEMINI_CLI_SYSTEM_SETTINGS_PATH";
    if agent.runtime != GEMINI
        || std::env::var_os(SETTINGS).is_some()
        || Path::new("/etc/gemini-cli/settings.json").exists()
    {
        return Ok(Vec::new());
    }
    let path = state_dir.join("acp").join("gemini-system-settings.json");
    std::fs::write(
        &path,
        br#"{"general": {"sessionRetention": {"enabled": false}}}"#,
    )?;
    Ok(vec![(SETTINGS, path.into_os_string())])
}

/// Where the runner keeps the ACP session id of a task's run. An agent loads a session only
/// where it keeps it (Gemini CLI: under its home, by project), so the id is kept on this
/// machine too, and outlives the process (a follow-up may come days later).
pub(crate) fn session_file(state_dir: &Path, task: &str) -> PathBuf {
    state_dir.join("acp").join(format!("{task}.session"))
}

/// The recorded session of a task's run, if the adapter got as far as `session/new`.
pub(crate) fn recorded_session(state_dir: &Path, task: &str) -> Option<String> {
    super::recorded_id(&session_file(state_dir, task))
}

/// When a resume may load the session. Gemini CLI 0.61 keeps a session in a file named by the
/// minute its first process started and the session id's first eight characters, and every new
/// process — one that loads a session too — first starts a record of its own under the same
/// kind of name; in the minute the session began, that is the session's own file, whose history
/// the new record wipes (`session/load` then answers "Invalid session identifier", and the
/// session is gone for good). So a Gemini CLI session is loaded no earlier than the minute after
/// the one it began in (its id file was written then); other agents at once.
pub(crate) fn load_not_before(
    agent: &AcpAgent,
    state_dir: &Path,
    task: &str,
    now: chrono::DateTime<chrono::Utc>,
) -> Option<chrono::DateTime<chrono::Utc>> {
    use chrono::{DurationRound, TimeDelta};
    if agent.runtime != GEMINI {
        return None;
    }
    let began: chrono::DateTime<chrono::Utc> = std::fs::metadata(session_file(state_dir, task))
        .and_then(|m| m.modified())
        .ok()?
        .into();
    let minute = TimeDelta::minutes(1);
    let next = began.duration_trunc(minute).ok()? + minute + TimeDelta::seconds(1);
    (now < next).then_some(next)
}

/// The adapter's arguments for a work item: a new session with the prompt (`start`), or the
/// recorded session loaded with a new turn (`resume`); the turn's text goes on stdin.
/// `Err`: a resume with no session recorded.
pub(crate) fn adapter_args(
    agent: &AcpAgent,
    w: &Work,
    dir: &Path,
    state_dir: &Path,
) -> Result<(Vec<std::ffi::OsString>, String), String> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "adapters".into(),
        "acp".into(),
        "--agent-cmd".into(),
        agent.command().into(),
        "--cwd".into(),
        dir.into(),
        "--runtime".into(),
        agent.runtime.into(),
        "--task".into(),
        w.task_id.clone().into(),
        "--worker".into(),
        "waymark-runner".into(),
        "--prompt".into(),
        "-".into(),
    ];
    let text = match w.kind {
        WorkKind::Start => {
            args.extend([
                "--session-file".into(),
                session_file(state_dir, &w.task_id).into(),
            ]);
            w.run.prompt.clone()
        }
        _ => {
            let session = recorded_session(state_dir, &w.task_id).ok_or_else(|| {
                format!(
                    "no {} session was recorded for this run (expected in {}): the run never got as far as `session/new` here",
                    agent.name,
                    session_file(state_dir, &w.task_id).display()
                )
            })?;
            // The session file again: where the agent no longer holds the session, the
            // adapter opens a new one (saying so) and records its id for the next resume.
            args.extend([
                "--session".into(),
                session.into(),
                "--session-file".into(),
                session_file(state_dir, &w.task_id).into(),
            ]);
            if let Some(at) = load_not_before(agent, state_dir, &w.task_id, chrono::Utc::now()) {
                args.extend(["--not-before".into(), at.to_rfc3339().into()]);
            }
            w.resume
                .as_ref()
                .and_then(|r| r.message.clone())
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| RESUME_PROMPT.to_owned())
        }
    };
    Ok((args, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(kind: WorkKind, message: Option<&str>) -> Work {
        crate::runner::tests::work_item(GEMINI, kind, message)
    }

    #[test]
    fn a_start_records_its_session_and_a_resume_loads_the_recorded_one_with_its_message() {
        let state = tempfile::tempdir().unwrap();
        let agent = AcpAgent {
            runtime: GEMINI,
            name: "Gemini CLI",
            bin: "/opt/my tools/gemini".into(),
            version: Some("0.61.0".into()),
            acp_args: &["--acp"],
        };
        let dir = Path::new("/src/app");
        let words = |args: &[std::ffi::OsString]| -> Vec<String> {
            args.iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let (args, text) =
            adapter_args(&agent, &work(WorkKind::Start, None), dir, state.path()).unwrap();
        let args = words(&args);
        let at = |args: &[String], flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(text, "make the test pass", "the prompt goes on stdin");
        assert!(
            !args.iter().any(|a| a.contains("make the test")),
            "{args:?}"
        );
        assert_eq!(
            at(&args, "--agent-cmd").as_deref(),
            Some("exec '/opt/my tools/gemini' --acp")
        );
        assert_eq!(at(&args, "--runtime").as_deref(), Some("gemini"));
        assert_eq!(at(&args, "--task").as_deref(), Some("task_1"));
        assert_eq!(at(&args, "--prompt").as_deref(), Some("-"));
        let file = PathBuf::from(at(&args, "--session-file").unwrap());
        assert_eq!(file, session_file(state.path(), "task_1"));
        assert!(at(&args, "--session").is_none());

        let resume = work(
            WorkKind::Resume,
            Some("Waymark: this session was interrupted"),
        );
        let err = adapter_args(&agent, &resume, dir, state.path()).unwrap_err();
        assert!(err.contains("no Gemini CLI session was recorded"), "{err}");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "7c1f-session\n").unwrap();
        let (args, text) = adapter_args(&agent, &resume, dir, state.path()).unwrap();
        let args = words(&args);
        assert_eq!(at(&args, "--session").as_deref(), Some("7c1f-session"));
        assert_eq!(at(&args, "--task").as_deref(), Some("task_1"));
        assert_eq!(
            at(&args, "--session-file").map(PathBuf::from),
            Some(file.clone()),
            "a new session, should the agent have lost this one, is recorded there"
        );
        assert_eq!(text, "Waymark: this session was interrupted");
        let (_, text) =
            adapter_args(&agent, &work(WorkKind::Resume, None), dir, state.path()).unwrap();
        assert_eq!(text, RESUME_PROMPT);
    }

    #[test]
    fn a_gemini_session_is_loaded_no_earlier_than_the_minute_after_it_began() {
        use chrono::TimeZone;
        let state = tempfile::tempdir().unwrap();
        let agent = AcpAgent {
            runtime: GEMINI,
            name: "Gemini CLI",
            bin: "/usr/bin/gemini".into(),
            version: None,
            acp_args: &["--acp"],
        };
        let file = session_file(state.path(), "task_1");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "7c1f\n").unwrap();
        let began = chrono::Utc
            .with_ymd_and_hms(2026, 12, 4, 20, 58, 13)
            .unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(began.into())
            .unwrap();
        let at = |h, m, s| chrono::Utc.with_ymd_and_hms(2026, 12, 4, h, m, s).unwrap();
        assert_eq!(
            load_not_before(&agent, state.path(), "task_1", at(20, 58, 40)),
            Some(at(20, 59, 1)),
            "in the minute it began: the next one"
        );
        assert_eq!(
            load_not_before(&agent, state.path(), "task_1", at(20, 59, 2)),
            None
        );
        assert_eq!(
            load_not_before(&agent, state.path(), "task_2", at(20, 58, 40)),
            None
        );
        let other = AcpAgent {
            runtime: "opencode",
            ..agent
        };
        assert_eq!(
            load_not_before(&other, state.path(), "task_1", at(20, 58, 40)),
            None
        );
    }
}
