//! Starting and resuming Codex for a runner: this binary's own Codex adapter (`waymark adapters
//! codex`, which drives `codex app-server`) bound to the task `start_run` made, with the
//! machine's token; the prompt or the resume message on stdin (never on a command line another
//! user can read), and the thread's id kept in the runner's state dir so a resume finds it.

use std::path::{Path, PathBuf};

use waymark_proto::{Work, WorkKind};

/// The Codex found on this machine.
#[derive(Debug, Clone)]
pub(crate) struct Codex {
    pub(crate) bin: PathBuf,
    pub(crate) version: Option<String>,
}

impl Codex {
    /// `explicit`, else `codex` on the PATH; its version from `codex --version`
    /// (`codex-cli 0.169.0`).
    pub(crate) async fn find(explicit: Option<&Path>) -> Option<Codex> {
        let bin = match explicit {
            Some(p) => p.to_path_buf(),
            None => super::on_path("codex")?,
        };
        let version = super::version_of(&bin).await?;
        Some(Codex { bin, version })
    }
}

/// Where the runner keeps the Codex thread id of a task's run: beside the thread's own record.
/// A thread resumes only where its rollout is (this machine's `CODEX_HOME`), so its id is kept
/// on this machine too, and outlives the process (a follow-up may come days later).
pub(crate) fn thread_file(state_dir: &Path, task: &str) -> PathBuf {
    state_dir.join("codex").join(format!("{task}.thread"))
}

/// The recorded thread of a task's run, if the adapter got as far as `thread/start`.
pub(crate) fn recorded_thread(state_dir: &Path, task: &str) -> Option<String> {
    super::recorded_id(&thread_file(state_dir, task))
}

/// The adapter's arguments for a work item: a new thread with the prompt (`start`), or the
/// recorded thread resumed with a new turn (`resume`); the text of the turn goes on stdin.
/// `Err`: a resume with no thread recorded.
pub(crate) fn adapter_args(
    codex: &Codex,
    w: &Work,
    dir: &Path,
    state_dir: &Path,
) -> Result<(Vec<std::ffi::OsString>, String), String> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "adapters".into(),
        "codex".into(),
        "--app-server-cmd".into(),
        format!(
            "{} app-server",
            super::shell_word(&codex.bin.to_string_lossy())
        )
        .into(),
        "--cwd".into(),
        dir.into(),
        "--task".into(),
        w.task_id.clone().into(),
        "--worker".into(),
        "waymark-runner".into(),
    ];
    let text = match w.kind {
        WorkKind::Start => {
            args.extend([
                "--thread-file".into(),
                thread_file(state_dir, &w.task_id).into(),
                "--prompt".into(),
                "-".into(),
            ]);
            if w.run.plan {
                args.push("--plan".into());
            }
            w.run.prompt.clone()
        }
        _ => {
            let thread = recorded_thread(state_dir, &w.task_id).ok_or_else(|| {
                format!(
                    "no Codex thread was recorded for this run (expected in {}): the run never got as far as `thread/start` here",
                    thread_file(state_dir, &w.task_id).display()
                )
            })?;
            args.extend([
                "--thread".into(),
                thread.into(),
                "--message".into(),
                "-".into(),
            ]);
            // No message (an answer to a deferred approval): the adapter's own "continue".
            w.resume
                .as_ref()
                .and_then(|r| r.message.clone())
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| waymark_adapters::codex::RESUME_PROMPT.to_owned())
        }
    };
    Ok((args, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(kind: WorkKind, message: Option<&str>) -> Work {
        crate::runner::tests::work_item("codex", kind, message)
    }

    fn words(args: &[std::ffi::OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_start_records_its_thread_and_a_resume_continues_the_recorded_one_with_its_message() {
        let state = tempfile::tempdir().unwrap();
        let codex = Codex {
            bin: "/opt/my tools/codex".into(),
            version: Some("0.169.0".into()),
        };
        let dir = Path::new("/src/app");
        let (args, text) =
            adapter_args(&codex, &work(WorkKind::Start, None), dir, state.path()).unwrap();
        let args = words(&args);
        assert_eq!(text, "make the test pass", "the prompt goes on stdin");
        assert!(
            !args.iter().any(|a| a.contains("make the test")),
            "{args:?}"
        );
        let at = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(
            at("--app-server-cmd").as_deref(),
            Some("'/opt/my tools/codex' app-server")
        );
        assert_eq!(at("--task").as_deref(), Some("task_1"));
        assert_eq!(at("--prompt").as_deref(), Some("-"));
        assert!(!args.iter().any(|a| a == "--plan"), "{args:?}");
        let mut planned = work(WorkKind::Start, None);
        planned.run.plan = true;
        let (plan_args, _) = adapter_args(&codex, &planned, dir, state.path()).unwrap();
        assert!(
            words(&plan_args).iter().any(|a| a == "--plan"),
            "plan first: {plan_args:?}"
        );
        let file = PathBuf::from(at("--thread-file").unwrap());
        assert_eq!(file, thread_file(state.path(), "task_1"));

        let resume = work(
            WorkKind::Resume,
            Some("Waymark: this session was interrupted"),
        );
        let err = adapter_args(&codex, &resume, dir, state.path()).unwrap_err();
        assert!(err.contains("no Codex thread was recorded"), "{err}");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "019a-thread\n").unwrap();
        let (args, text) = adapter_args(&codex, &resume, dir, state.path()).unwrap();
        let args = words(&args);
        let at = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(at("--thread").as_deref(), Some("019a-thread"));
        assert_eq!(at("--message").as_deref(), Some("-"));
        assert_eq!(at("--task").as_deref(), Some("task_1"));
        assert!(at("--prompt").is_none() && at("--thread-file").is_none());
        assert!(
            !args.iter().any(|a| a == "--plan"),
            "a resume is in the default mode"
        );
        assert_eq!(text, "Waymark: this session was interrupted");
        let (_, text) =
            adapter_args(&codex, &work(WorkKind::Resume, None), dir, state.path()).unwrap();
        assert_eq!(text, waymark_adapters::codex::RESUME_PROMPT);
    }
}
