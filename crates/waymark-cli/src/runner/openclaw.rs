//! Starting and resuming OpenClaw for a runner. OpenClaw's runs live in its gateway, a service
//! its owner runs (the runner neither starts nor stops it; `--openclaw-gateway` names it), so a
//! run is this binary's OpenClaw adapter bound to the task `start_run` made and to a gateway
//! session of the run's own (`agent:<agent>:waymark-run-<task>`): it sends one turn — the
//! prompt, a resume note or a follow-up — into that session with the run's directory as its
//! working directory, follows it to its end, and exits. The session outlives every process, so
//! a resume is always the same session; the gateway's token goes in the environment, never on
//! a command line another user can read.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use waymark_proto::{Work, WorkKind};

/// What a resume without a message of its own sends (an answer to a deferred approval).
pub(crate) const RESUME_PROMPT: &str = "Continue from where you left off.";

/// The gateway this runner starts OpenClaw runs on.
#[derive(Debug, Clone)]
pub(crate) struct OpenClaw {
    /// `ws://127.0.0.1:18789`.
    pub(crate) gateway: String,
    /// The gateway's shared token, if it has one.
    pub(crate) token: Option<String>,
    /// The OpenClaw agent whose sessions the runs are.
    pub(crate) agent: String,
    /// From `openclaw --version`, where the binary is found.
    pub(crate) version: Option<String>,
}

impl OpenClaw {
    /// The gateway named, with the version of `explicit` (else `openclaw` on the PATH) when
    /// one is found; `None` without a gateway: OpenClaw is then not offered.
    pub(crate) async fn find(
        gateway: Option<&str>,
        token: Option<String>,
        agent: &str,
        explicit: Option<&Path>,
    ) -> Option<OpenClaw> {
        let gateway = gateway.filter(|g| !g.is_empty())?.to_owned();
        let bin = match explicit {
            Some(p) => Some(p.to_path_buf()),
            None => super::on_path("openclaw"),
        };
        let version = match bin {
            Some(b) => super::version_of(&b).await.flatten(),
            None => None,
        };
        Some(OpenClaw {
            gateway,
            token: token.filter(|t| !t.is_empty()),
            agent: agent.to_owned(),
            version,
        })
    }
}

/// Where the runner keeps the adapter's gateway device key (and the device token the gateway
/// issues beside it): one identity for every run of this machine.
pub(crate) fn device_key(state_dir: &Path) -> PathBuf {
    state_dir.join("openclaw").join("device.json")
}

/// The adapter's arguments, environment and turn text (on stdin) for a work item.
pub(crate) fn adapter_args(
    oc: &OpenClaw,
    w: &Work,
    dir: &Path,
    state_dir: &Path,
) -> (Vec<OsString>, String, Vec<(&'static str, OsString)>) {
    let args: Vec<OsString> = vec![
        "adapters".into(),
        "openclaw".into(),
        "--gateway".into(),
        oc.gateway.clone().into(),
        "--device-key".into(),
        device_key(state_dir).into(),
        "--task".into(),
        w.task_id.clone().into(),
        "--session-key".into(),
        waymark_adapters::openclaw::run_session_key(&oc.agent, &w.task_id).into(),
        "--cwd".into(),
        dir.into(),
        // Each work item is one turn: a resend of the same item is no second turn.
        "--turn-key".into(),
        format!("waymark-{}", w.id).into(),
        "--message".into(),
        "-".into(),
    ];
    let text = match w.kind {
        WorkKind::Start => w.run.prompt.clone(),
        _ => w
            .resume
            .as_ref()
            .and_then(|r| r.message.clone())
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| RESUME_PROMPT.to_owned()),
    };
    let env = oc
        .token
        .iter()
        .map(|t| ("OPENCLAW_GATEWAY_TOKEN", OsString::from(t)))
        .collect();
    (args, text, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn work(kind: WorkKind, message: Option<&str>) -> Work {
        crate::runner::tests::work_item("openclaw", kind, message)
    }

    #[test]
    fn a_run_is_its_own_session_each_turn_keyed_by_its_work_item_and_the_token_kept_off_the_command_line()
     {
        let oc = OpenClaw {
            gateway: "ws://127.0.0.1:18789".into(),
            token: Some("s3cret".into()),
            agent: "main".into(),
            version: Some("2026.9.6".into()),
        };
        let state = Path::new("/state");
        let (args, text, env) = adapter_args(
            &oc,
            &work(WorkKind::Start, None),
            Path::new("/src/app"),
            state,
        );
        let args: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let at = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .map(|i| args[i + 1].clone())
        };
        assert_eq!(at("--task").as_deref(), Some("task_1"));
        assert_eq!(
            at("--session-key").as_deref(),
            Some("agent:main:waymark-run-task_1")
        );
        assert_eq!(at("--cwd").as_deref(), Some("/src/app"));
        assert_eq!(at("--turn-key").as_deref(), Some("waymark-wrk_1"));
        assert_eq!(at("--message").as_deref(), Some("-"));
        assert_eq!(
            at("--device-key").as_deref(),
            Some("/state/openclaw/device.json")
        );
        assert_eq!(text, "make the test pass", "the prompt goes on stdin");
        assert!(
            !args
                .iter()
                .any(|a| a.contains("s3cret") || a.contains("make the test")),
            "{args:?}"
        );
        assert_eq!(
            env,
            vec![("OPENCLAW_GATEWAY_TOKEN", OsString::from("s3cret"))]
        );

        let (args, text, _) = adapter_args(
            &oc,
            &work(
                WorkKind::Resume,
                Some("Waymark: this session was interrupted"),
            ),
            Path::new("/src/app"),
            state,
        );
        assert_eq!(text, "Waymark: this session was interrupted");
        assert!(
            args.iter().any(|a| a == "agent:main:waymark-run-task_1"),
            "a resume is the same session: {args:?}"
        );
        let (_, text, _) = adapter_args(
            &oc,
            &work(WorkKind::Resume, None),
            Path::new("/src/app"),
            state,
        );
        assert_eq!(text, RESUME_PROMPT);
    }
}
