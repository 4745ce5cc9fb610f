//! The Hermes adapter against the REAL Hermes Agent (`hermes-agent[acp]==0.19.0` from PyPI, in
//! a venv that `scripts/setup-debian` makes under `$WAYMARK_RUNTIMES_DIR/hermes`, default
//! `~/.cache/waymark-runtimes/hermes`), a fake model API (`support::fake_model`, Hermes'
//! `custom` provider speaks OpenAI chat completions), a real control plane in-process, and a
//! phone answering with signed commands.
//!
//! Three ACP sessions (`hermes acp`, driven by the adapter) each ask to run `sh -c 'touch …'`
//! (with `approvals: {mode: manual}` Hermes asks for every command it flags, and `sh -c` is
//! one): the approval must reach the inbox with Hermes' own 60 s deadline; approving runs the
//! command (the file appears, the effect is confirmed with a receipt and names the approval),
//! denying does not (the effect is closed as not run), and the third, left unanswered beside
//! the other two, closes expired when Hermes stops waiting and denies (about 60 s). The turn's
//! usage is recorded. Then the read-only mirror of Hermes' `state.db` adds what the live
//! adapter did not see to the same tasks — never a second task, never a refusal.
//!
//! The frames exchanged are written to `$WAYMARK_RECORD_DIR` when it is set (how
//! `fixtures/acp/real/` was recorded). The test fails — never skips — when the runtime is not
//! installed; every process it started is killed when it ends, passing or not.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_model::{FakeModel, Shape, Turn};
use support::{ControlPlane, Phone, within};
use tokio_util::sync::CancellationToken;
use waymark_adapters::acp::AcpArgs;
use waymark_adapters::hermes::{self, HermesAcpArgs, HermesArgs, HermesCommand, MirrorArgs};
use waymark_proto::{Decision, DecisionStatus, EffectStatus, Operation, TaskDetail, TaskState};

/// The version `scripts/setup-debian` installs and this test was written against.
const HERMES_VERSION: &str = "0.19.0";
/// How long one turn may take end to end (Hermes starts in a few seconds).
const TURN: Duration = Duration::from_secs(120);

/// `bin/hermes` of the installed venv, or a failure that says how to install it.
fn hermes_bin() -> PathBuf {
    let base = std::env::var_os("WAYMARK_RUNTIMES_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/waymark-runtimes"))
        })
        .expect("neither WAYMARK_RUNTIMES_DIR nor HOME is set: cannot find the real Hermes");
    let dir = base.join("hermes");
    let bin = dir.join("bin/hermes");
    let stamp = std::fs::read_to_string(dir.join("installed")).unwrap_or_default();
    assert!(
        bin.exists() && stamp.contains(&format!("hermes-agent[acp]=={HERMES_VERSION}")),
        "the real Hermes Agent {HERMES_VERSION} is not installed in `{}` (installed: `{}`) — \
         run `scripts/setup-debian`, which installs it there in a venv \
         (set WAYMARK_RUNTIMES_DIR to use another place)",
        dir.display(),
        stamp.trim(),
    );
    bin
}

/// A private Hermes: its own HOME and HERMES_HOME, configured for the fake model only. Dropping
/// it kills every process still running with this HERMES_HOME (Hermes and the shells it ran).
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new(model: &FakeModel) -> Home {
        let dir = tempfile::tempdir().unwrap();
        let home = Home { dir };
        for d in ["hermes", "work", "tmp", "frames"] {
            std::fs::create_dir_all(home.path(d)).unwrap();
        }
        // What each setting is for: docs/adapters/hermes.md.
        let config = format!(
            "model:\n  provider: custom\n  base_url: {}\n  default: {}\n  api_key: dummy\n\
             approvals:\n  mode: manual\n",
            model.base_url,
            support::fake_model::MODEL
        );
        std::fs::write(home.path("hermes/config.yaml"), config).unwrap();
        home
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn hermes_home(&self) -> PathBuf {
        self.path("hermes")
    }

    /// `hermes acp` under this home, its frames copied to `frames/<name>.{in,out}.jsonl`.
    fn agent_cmd(&self, bin: &Path, name: &str) -> String {
        let q = |p: PathBuf| format!("'{}'", p.display());
        format!(
            "tee {in_} | env HOME={home} HERMES_HOME={hh} TMPDIR={tmp} NO_COLOR=1 {bin} acp 2>>{err} | tee {out}",
            in_ = q(self.path(&format!("frames/{name}.in.jsonl"))),
            out = q(self.path(&format!("frames/{name}.out.jsonl"))),
            err = q(self.path(&format!("frames/{name}.stderr"))),
            home = q(self.dir.path().to_owned()),
            hh = q(self.hermes_home()),
            tmp = q(self.path("tmp")),
            bin = q(bin.to_owned()),
        )
    }

    /// The frames of a session, both directions, in the order each side wrote them.
    #[allow(dead_code)]
    fn frames(&self, name: &str) -> (Vec<Value>, Vec<Value>) {
        let read = |dir: &str| {
            std::fs::read_to_string(self.path(&format!("frames/{name}.{dir}.jsonl")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect()
        };
        (read("in"), read("out"))
    }

    fn stderr(&self, name: &str) -> String {
        let text = std::fs::read_to_string(self.path(&format!("frames/{name}.stderr")))
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Copies the frames to `$WAYMARK_RECORD_DIR` when set.
    fn record(&self, name: &str) {
        let Some(dir) = std::env::var_os("WAYMARK_RECORD_DIR") else {
            return;
        };
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for side in ["in", "out"] {
            let from = self.path(&format!("frames/{name}.{side}.jsonl"));
            let _ = std::fs::copy(&from, dir.join(format!("hermes-{name}.{side}.jsonl")));
        }
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        let needle = format!("HERMES_HOME={}", self.hermes_home().display());
        support::kill_processes_with_env(&needle);
    }
}

/// The Hermes tasks, newest last.
async fn hermes_tasks(cp: &ControlPlane) -> Vec<(String, String)> {
    let (status, snap) = cp.admin_get("/v1/snapshot").await;
    assert_eq!(status, 200, "{snap}");
    let mut tasks: Vec<(i64, String, String)> = snap["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.get("task").unwrap_or(t))
        .filter(|t| t["runtime"] == "hermes")
        .map(|t| {
            (
                t["created_at"].as_str().map_or(0, |s| {
                    chrono::DateTime::parse_from_rfc3339(s)
                        .map(|d| d.timestamp_millis())
                        .unwrap_or(0)
                }),
                t["id"].as_str().unwrap().to_owned(),
                t["external_key"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    tasks.sort();
    tasks.into_iter().map(|(_, id, key)| (id, key)).collect()
}

fn start_turn(
    cp: &ControlPlane,
    home: &Home,
    bin: &Path,
    name: &str,
    prompt: &str,
) -> tokio::task::JoinHandle<Result<(), hermes::HermesError>> {
    let args = HermesArgs {
        command: HermesCommand::Acp(HermesAcpArgs {
            agent_cmd: home.agent_cmd(bin, name),
            cwd: Some(home.path("work")),
            prompt: prompt.into(),
            title: None,
            worker: "waymark-hermes".into(),
            approval_expires_in: None,
        }),
    };
    tokio::spawn(hermes::run(
        args,
        cp.client.clone(),
        CancellationToken::new(),
    ))
}

/// The pending approval of a Hermes task for the command that names `file`: (task, decision).
async fn new_approval(
    cp: &ControlPlane,
    file: &Path,
    context: impl Fn() -> String,
) -> (String, Decision) {
    let needle = file.display().to_string();
    within(TURN, "a Hermes approval in the inbox", context, || async {
        for (task, _) in hermes_tasks(cp).await {
            if let Some(d) = cp.detail(&task).await.decisions.into_iter().find(|d| {
                d.status == DecisionStatus::Pending
                    && d.intent.as_ref().is_some_and(|i| {
                        i["toolCall"]["rawInput"]["command"]
                            .as_str()
                            .is_some_and(|c| c.contains(&needle))
                    })
            }) {
                return Some((task, d));
            }
        }
        None
    })
    .await
}

async fn answer(phone: &Phone, cp: &ControlPlane, task: &str, d: &Decision, op: Operation) {
    let revision = cp.detail(task).await.task.plan_revision;
    let args = json!({"decision_id": d.id, "intent_digest": d.intent_digest});
    phone.command(task, revision, op, args).await;
}

async fn ended(
    h: tokio::task::JoinHandle<Result<(), hermes::HermesError>>,
    home: &Home,
    name: &str,
) {
    match tokio::time::timeout(TURN, h).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => panic!("the adapter failed: {e}\n{}", home.stderr(name)),
        Ok(Err(e)) => panic!("the adapter panicked: {e}"),
        Err(_) => panic!(
            "the turn did not end within {TURN:?}\n{}",
            home.stderr(name)
        ),
    }
}

fn dump(d: &TaskDetail) -> String {
    format!(
        "messages: {:#?}\neffects: {:#?}\ndecisions: {:#?}",
        d.messages
            .iter()
            .map(|m| format!("{}: {}", m.role, m.text))
            .collect::<Vec<_>>(),
        d.effects
            .iter()
            .map(|e| (&e.idempotency_key, e.status, &e.intent, &e.receipt))
            .collect::<Vec<_>>(),
        d.decisions
            .iter()
            .map(|d| (&d.id, d.status, &d.outcome))
            .collect::<Vec<_>>(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_hermes_approvals_reach_the_inbox_with_its_deadline_and_the_mirror_adds_to_the_same_task()
 {
    let started = Instant::now();
    let bin = hermes_bin();
    let cp = ControlPlane::start("alice-hermes").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let approved_file = scratch.path().join("approved");
    let denied_file = scratch.path().join("denied");
    let unanswered_file = scratch.path().join("unanswered");
    let model = FakeModel::start_with(
        vec![
            Turn {
                prompt: "waymark turn one".into(),
                command: format!("sh -c 'touch {}'", approved_file.display()),
                answer: "Created the file.".into(),
            },
            Turn {
                prompt: "waymark turn two".into(),
                command: format!("sh -c 'touch {}'", denied_file.display()),
                answer: "The command was not run.".into(),
            },
            Turn {
                prompt: "waymark turn three".into(),
                command: format!("sh -c 'touch {}'", unanswered_file.display()),
                answer: "Nobody answered.".into(),
            },
        ],
        Shape::TERMINAL,
    )
    .await;
    let home = Home::new(&model);

    // ---- turn three, left unanswered: Hermes' own 60 s run beside the other two ----
    let three = start_turn(
        &cp,
        &home,
        &bin,
        "three",
        "waymark turn three: nobody answers",
    );

    // ---- turn one: approved ----
    let one = start_turn(&cp, &home, &bin, "one", "waymark turn one: make the file");
    let (task_one, d) = new_approval(&cp, &approved_file, || home.stderr("one")).await;
    let inbox_at = started.elapsed();
    // Hermes' own deadline, not our hour: it denies on its own after 60 s, and the card says so.
    let runtime = d.runtime_deadline.clone().expect("Hermes' own deadline");
    let deadline = (runtime.at - d.created_at).num_milliseconds();
    assert!(
        (59_000..=60_000).contains(&deadline),
        "the approval shows Hermes stopping after 60 s, not after {deadline} ms"
    );
    assert_eq!(d.closing().runtime.as_deref(), Some("Hermes"));
    let closes = (d.expires_at - d.created_at).num_milliseconds();
    assert!(
        (64_000..=65_000).contains(&closes),
        "our expiry is a grace after Hermes' deadline, not our hour: {closes} ms"
    );
    assert!(
        d.options.iter().any(|o| o.id == "approve_session"),
        "Hermes' own options are offered: {:?}",
        d.options
    );
    let approved_at = Instant::now();
    answer(&phone, &cp, &task_one, &d, Operation::Approve).await;
    ended(one, &home, "one").await;
    let turn_one = approved_at.elapsed();
    home.record("one");
    assert!(approved_file.exists(), "the approved command ran");
    let detail = cp.detail(&task_one).await;
    let session_one = detail
        .task
        .external_key
        .clone()
        .expect("the session id is the key");
    let effect = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d.id.as_str())
        .unwrap_or_else(|| panic!("the tool call names its approval\n{}", dump(&detail)));
    assert_eq!(effect.status, EffectStatus::Confirmed, "{}", dump(&detail));
    let receipt = effect.receipt.as_ref().expect("a receipt").to_string();
    assert!(
        receipt.contains("exit_code"),
        "the receipt is Hermes' result: {receipt}"
    );
    assert!(
        detail.task.usage.tokens > 0,
        "the turn's usage is recorded: {:?}",
        detail.task.usage
    );
    assert!(
        detail
            .messages
            .iter()
            .any(|m| m.role == "assistant" && m.text.contains("Created the file.")),
        "{}",
        dump(&detail)
    );
    assert!(
        detail
            .decisions
            .iter()
            .all(|x| x.status != DecisionStatus::Pending),
        "{}",
        dump(&detail)
    );

    // ---- turn two: denied ----
    let two = start_turn(
        &cp,
        &home,
        &bin,
        "two",
        "waymark turn two: make the other file",
    );
    let (task_two, d2) = new_approval(&cp, &denied_file, || home.stderr("two")).await;
    answer(&phone, &cp, &task_two, &d2, Operation::Deny).await;
    ended(two, &home, "two").await;
    home.record("two");
    assert!(!denied_file.exists(), "the denied command did not run");
    let detail = cp.detail(&task_two).await;
    let effect = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d2.id.as_str())
        .unwrap_or_else(|| panic!("the denied call has an effect\n{}", dump(&detail)));
    assert_eq!(
        effect.status,
        EffectStatus::Failed,
        "a denied call is closed as not run, never left intended or confirmed\n{}",
        dump(&detail)
    );

    // ---- turn three: Hermes stops waiting after 60 s and denies; so does the inbox ----
    let (task_three, d3) = new_approval(&cp, &unanswered_file, || home.stderr("three")).await;
    ended(three, &home, "three").await;
    home.record("three");
    assert!(
        !unanswered_file.exists(),
        "Hermes denied the unanswered command"
    );
    let detail = cp.detail(&task_three).await;
    let d3 = detail.decisions.iter().find(|x| x.id == d3.id).unwrap();
    assert_eq!(d3.status, DecisionStatus::Expired, "{}", dump(&detail));
    let closed = d3.outcome.as_ref().expect("closed").at;
    let open_for = (closed - d3.created_at).num_milliseconds();
    assert!(
        (55_000..=61_000).contains(&open_for),
        "the approval closed when Hermes stopped waiting (60 s), after {open_for} ms"
    );
    let effect = detail
        .effects
        .iter()
        .find(|e| e.intent["approval"] == d3.id.as_str())
        .unwrap_or_else(|| panic!("the unanswered call has an effect\n{}", dump(&detail)));
    assert_eq!(effect.status, EffectStatus::Failed, "{}", dump(&detail));

    // ---- the mirror of state.db adds to the same tasks ----
    let db = home.hermes_home().join("state.db");
    record_state_db(&db);
    let before = cp.detail(&task_one).await;
    let mirror = hermes::mirror(
        MirrorArgs {
            state_db: db.clone(),
            once: true,
            follow: false,
            interval_ms: 2000,
            state_file: Some(home.path("mirror.json")),
            worker: "waymark-hermes-mirror".into(),
        },
        cp.client.clone(),
        CancellationToken::new(),
    );
    tokio::time::timeout(Duration::from_secs(60), mirror)
        .await
        .expect("the mirror pass ends")
        .expect("the mirror mirrors the ACP sessions, refusing none");
    let tasks = hermes_tasks(&cp).await;
    assert_eq!(
        tasks.len(),
        3,
        "one task per session, never a second: {tasks:?}"
    );
    assert_eq!(
        cp.tasks_of("hermes", &session_one).await,
        vec![task_one.clone()]
    );
    let after = cp.detail(&task_one).await;
    eprintln!("after the mirror: {}", dump(&after));
    assert!(
        after.messages.len() > before.messages.len(),
        "the mirror added what the live adapter did not see\n{}",
        dump(&after)
    );
    let count = |d: &TaskDetail, role: &str, text: &str| {
        d.messages
            .iter()
            .filter(|m| m.role == role && m.text.contains(text))
            .count()
    };
    assert_eq!(
        count(&after, "user", "waymark turn one"),
        1,
        "the prompt is not recorded twice\n{}",
        dump(&after)
    );
    assert_eq!(
        count(&after, "assistant", "Created the file."),
        1,
        "{}",
        dump(&after)
    );
    assert_eq!(
        after.effects.len(),
        before.effects.len(),
        "the tool call is not recorded twice\n{}",
        dump(&after)
    );
    assert!(
        after
            .attempts
            .iter()
            .any(|a| a.worker == "waymark-hermes-mirror"),
        "the mirror ran as an attempt of the same task"
    );
    assert_ne!(after.task.state, TaskState::Failed);
    eprintln!(
        "approval in the inbox at {inbox_at:?}; approved turn ended {turn_one:?} after the answer; all done in {:?}",
        started.elapsed()
    );
}

/// Hermes is killed while its command approval waits in the inbox (well inside its own 60 s
/// wait): the approval expires by the runtime with no option, the call is closed as not run,
/// a late approve is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_hermes_killed_under_a_pending_approval_expires_it_and_the_call_did_not_run() {
    let bin = hermes_bin();
    let cp = ControlPlane::start("alice-hermes").await;
    let phone = cp.phone().await;
    let scratch = tempfile::tempdir().unwrap();
    let file = scratch.path().join("killed");
    let model = FakeModel::start_with(
        vec![Turn {
            prompt: "waymark turn killed".into(),
            command: format!("sh -c 'touch {}'", file.display()),
            answer: "This answer never comes.".into(),
        }],
        Shape::TERMINAL,
    )
    .await;
    let home = Home::new(&model);
    let args = AcpArgs {
        agent_cmd: home.agent_cmd(&bin, "killed"),
        cwd: Some(home.path("work")),
        prompt: "waymark turn killed: make the file".into(),
        runtime: "hermes".into(),
        title: None,
        worker: "waymark-hermes".into(),
        approval_expires_in: None,
        bind: Default::default(),
    };
    let env = format!("HERMES_HOME={}", home.hermes_home().display());
    let kill = || {
        support::kill_processes_with_env(&env);
        // The recording `tee`s and their shell, which hold the adapter's pipe.
        support::kill_processes_naming(&home.dir.path().display().to_string());
    };
    support::real_acp::killed_under_a_pending_approval(
        &cp,
        &phone,
        args,
        kill,
        &file,
        TURN,
        |d, _| {
            // Hermes' own 60 s, shown as its deadline.
            let r = d.runtime_deadline.as_ref().expect("Hermes' deadline");
            let deadline = (r.at - d.created_at).num_milliseconds();
            assert!((59_000..=60_000).contains(&deadline), "{deadline}");
        },
    )
    .await;
}

/// Writes state.db's schema and rows to `$WAYMARK_RECORD_DIR/hermes-state.txt` when set.
fn record_state_db(db: &Path) {
    let Some(dir) = std::env::var_os("WAYMARK_RECORD_DIR") else {
        return;
    };
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys,json\n\
             c=sqlite3.connect('file:'+sys.argv[1]+'?mode=ro',uri=True)\n\
             print('user_version',c.execute('pragma user_version').fetchone()[0])\n\
             for (n,q) in c.execute(\"select name,sql from sqlite_master where type='table' and name in ('sessions','messages','schema_version')\"): print(q)\n\
             for t in ('schema_version','sessions','messages'):\n\
             \tcur=c.execute('select * from '+t)\n\
             \tcols=[d[0] for d in cur.description]\n\
             \tfor r in cur: print(t, json.dumps(dict(zip(cols,r)), default=str))\n",
        )
        .arg(db)
        .output()
        .expect("python3 reads state.db");
    std::fs::write(
        PathBuf::from(dir).join("hermes-state.txt"),
        [out.stdout, out.stderr].concat(),
    )
    .unwrap();
}
