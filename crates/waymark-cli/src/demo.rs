//! `waymark demo`: the seed scenario as a real agent run on this machine. Without `--server`
//! it starts an embedded control plane in a temporary data dir; it always runs the deploy
//! service as a separate process (unless given `--deploy-url`), because a write gateway that
//! lives and dies with its caller proves nothing about crashes. The task has a token budget:
//! the fix crosses 80% and opens a budget decision, answered with `--budget-choice` (through
//! the admin route, like `--approve`) or by a person, or closed by its default on expiry.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use waymark_server::{Config, DataDir};
use waymark_worker::Error as SdkError;
use waymark_worker::demo::{
    self, AutoApprove, BudgetChoice, BudgetPlan, DemoConfig, DemoError, Progress, Scenario,
};

use crate::output::{CliResult, Exit, Failure, emit};
use crate::serve::{admin_failure, serve_failure};

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct DemoArgs {
    #[command(subcommand)]
    command: Option<DemoCommand>,
    /// Control plane URL; without it an embedded one starts in a temporary data dir.
    #[arg(long, env = "WAYMARK_SERVER")]
    server: Option<String>,
    /// Trust only the `--server` certificate with this fingerprint (`sha256:…`, the `TLS:` line
    /// `waymark serve` prints), e.g. a self-signed one.
    #[arg(long, env = waymark_worker::SERVER_FP_ENV)]
    server_fp: Option<String>,
    /// Worker token for `--server` (from `waymark admin worker-token`).
    #[arg(long, env = "WAYMARK_TOKEN")]
    token: Option<String>,
    /// The server's admin token, so that `--approve` can answer the approval itself.
    #[arg(long, env = "WAYMARK_ADMIN_TOKEN")]
    admin_token: Option<String>,
    /// A failure to inject.
    #[arg(long, value_enum, default_value_t = ScenarioArg::Normal)]
    scenario: ScenarioArg,
    /// Answer the deploy approval itself (needs the admin token; embedded mode has it).
    #[arg(long, value_enum)]
    approve: Option<ApproveArg>,
    /// Answer the budget decision itself (needs the admin token); without it a person answers,
    /// or the default (`relevant_tests`) applies when it expires.
    #[arg(long, value_enum)]
    budget_choice: Option<BudgetChoiceArg>,
    /// How long a budget decision waits for an answer before its default applies.
    #[arg(long, default_value_t = 15)]
    budget_decision_seconds: u64,
    /// The task to resume (`--scenario resume`).
    #[arg(long)]
    task: Option<String>,
    /// Where the sample repository goes (default: a new temporary directory, kept).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Use a running deploy service instead of starting one.
    #[arg(long)]
    deploy_url: Option<String>,
    /// Lease length in seconds.
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
}

#[derive(Debug, Subcommand)]
enum DemoCommand {
    /// The reference deploy service (a write gateway honouring idempotency keys and fences).
    #[command(hide = true)]
    DeployService {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The state file (deploys, refusals, highest fences), written durably.
        #[arg(long)]
        state: PathBuf,
        /// Exit when stdin closes (the parent that started it has gone).
        #[arg(long, hide = true)]
        exit_with_stdin: bool,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ScenarioArg {
    /// The whole run.
    Normal,
    /// Exit right after the deploy service committed, before the receipt is recorded.
    CrashAfterCommit,
    /// Stop heartbeating before deploying; the late deploy is refused.
    HangPastLease,
    /// Attach to `--task`, start a new attempt, reconcile and continue.
    Resume,
    /// The promo service the tests call keeps timing out: past the retry bound the patch is
    /// delivered partially, listing what was and was not verified.
    FlakyTests,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum BudgetChoiceArg {
    /// Run only the tests touching the changed file.
    #[value(name = "relevant_tests")]
    RelevantTests,
    /// Run the whole suite.
    #[value(name = "full_suite")]
    FullSuite,
    /// Stop and deliver the patch with the checks already done (`partially_delivered`).
    #[value(name = "deliver_patch")]
    DeliverPatch,
    /// Answer nothing: the stated default applies when the decision expires.
    Default,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ApproveArg {
    /// Approve the deploy.
    Yes,
    /// Deny it (finishes `partially_delivered` with a report).
    No,
    /// Stop and only write the report (finishes `completed`).
    Report,
}

fn usage(message: impl Into<String>) -> Failure {
    Failure::new(Exit::Usage, "usage", message)
}

fn demo_failure(e: DemoError) -> Failure {
    let message = e.to_string();
    match e {
        DemoError::Sdk(SdkError::Unreachable { .. }) => {
            Failure::new(Exit::Unreachable, "unreachable", message)
        }
        DemoError::Sdk(SdkError::Fenced { .. }) => Failure::new(Exit::Refused, "fenced", message),
        DemoError::Sdk(SdkError::LeaseLost { .. }) => {
            Failure::new(Exit::Refused, "lease_lost", message)
        }
        DemoError::Sdk(SdkError::LeaseHeld { .. }) => {
            Failure::new(Exit::Refused, "lease_held", message)
        }
        DemoError::Sdk(SdkError::Cancelled) => Failure::new(Exit::Refused, "cancelled", message),
        DemoError::Sdk(SdkError::EffectUnknown { .. }) => {
            Failure::new(Exit::Refused, "effect_unknown", message)
        }
        DemoError::Sdk(_) => Failure::new(Exit::Refused, "refused", message),
        DemoError::Tool { .. } => Failure::new(Exit::Refused, "tool_failed", message),
        DemoError::DeployService(_) => Failure::new(Exit::Refused, "deploy_service", message),
        DemoError::Resume(_) => Failure::new(Exit::Refused, "cannot_resume", message),
    }
}

fn io_failure(what: &str) -> impl Fn(std::io::Error) -> Failure + '_ {
    move |e| Failure::new(Exit::Refused, "io", format!("{what}: {e}"))
}

pub(crate) async fn run(args: DemoArgs, json: bool) -> CliResult {
    if let Some(DemoCommand::DeployService {
        listen,
        state,
        exit_with_stdin,
    }) = args.command
    {
        return deploy_service(listen, state, exit_with_stdin, json).await;
    }
    let scenario = match args.scenario {
        ScenarioArg::Normal => Scenario::Normal,
        ScenarioArg::CrashAfterCommit => Scenario::CrashAfterCommit,
        ScenarioArg::HangPastLease => Scenario::HangPastLease,
        ScenarioArg::Resume => Scenario::Resume,
        ScenarioArg::FlakyTests => Scenario::FlakyTests,
    };
    match (scenario, &args.task) {
        (Scenario::Resume, None) => {
            return Err(usage(
                "`--scenario resume` needs the task to resume: add `--task TASK_ID`",
            ));
        }
        (Scenario::Resume, Some(_)) if args.server.is_none() => {
            return Err(usage(
                "`--scenario resume` attaches to a task on a running control plane: add `--server URL --token TOKEN`",
            ));
        }
        (s, Some(_)) if s != Scenario::Resume => {
            return Err(usage("`--task` goes with `--scenario resume`"));
        }
        _ => {}
    }
    if args.server.is_some() && args.token.is_none() {
        return Err(usage(
            "`--server` needs a worker token: add `--token`, made with `waymark admin worker-token --name demo`",
        ));
    }
    if let Some(fp) = &args.server_fp
        && let Err(e) = waymark_tls_pin::parse_pin(fp)
    {
        return Err(usage(format!("`--server-fp` / `WAYMARK_SERVER_FP`: {e}")));
    }
    if args.lease_seconds == 0 {
        return Err(usage("`--lease-seconds` must be at least 1"));
    }
    if args.budget_decision_seconds == 0 {
        return Err(usage("`--budget-decision-seconds` must be at least 1"));
    }
    let workdir = match args.workdir.clone() {
        Some(w) => {
            std::fs::create_dir_all(&w).map_err(io_failure("cannot create the workdir"))?;
            w
        }
        None => demo::new_workdir().map_err(io_failure("cannot create a temporary workdir"))?,
    };
    let say = |text: String| {
        if !json {
            println!("{text}");
        }
    };

    // The control plane: the one given, or an embedded one.
    let mut embedded = None;
    let (server, token, admin_token) = match (&args.server, &args.token) {
        (Some(s), Some(t)) => (s.clone(), t.clone(), args.admin_token.clone()),
        _ => {
            let data = DataDir::new(workdir.join("server"));
            let running = waymark_server::start(
                &data,
                "127.0.0.1:0".parse().expect("an address"),
                Config::default(),
            )
            .await
            .map_err(serve_failure)?;
            let (token, _) = waymark_server::admin::create_worker_token(
                &*running.state.store,
                "demo-agent",
                None,
            )
            .await
            .map_err(admin_failure)?;
            let url = running.url();
            say(format!(
                "embedded control plane  {url}  (data dir {}, admin token in {})",
                data.root().display(),
                data.admin_token_file().display()
            ));
            let admin = running.admin_token.clone();
            embedded = Some(running);
            (url, token, Some(admin))
        }
    };

    // The deploy service: the one given, or a child process of this binary.
    let mut child = None;
    let deploy_url = match &args.deploy_url {
        Some(u) => u.clone(),
        None => {
            let state = workdir.join("deploys.json");
            let (c, url) = spawn_deploy_service(&state).await?;
            say(format!(
                "deploy service          {url}  (pid {}, state {})",
                c.id().unwrap_or_default(),
                state.display()
            ));
            child = Some(c);
            url
        }
    };
    say(format!("workdir                 {}", workdir.display()));
    say(String::new());

    let reporter: demo::Reporter = Arc::new(move |p: Progress| {
        if !json {
            println!("{:>10}  {}", p.step, p.text);
        }
    });
    let cfg = DemoConfig {
        server: server.clone(),
        server_fp: if embedded.is_some() {
            None
        } else {
            args.server_fp.clone()
        },
        token,
        admin_token,
        deploy_url,
        workdir: workdir.clone(),
        scenario,
        approve: args.approve.map(|a| match a {
            ApproveArg::Yes => AutoApprove::Yes,
            ApproveArg::No => AutoApprove::No,
            ApproveArg::Report => AutoApprove::Report,
        }),
        task: args.task.clone(),
        lease: Duration::from_secs(args.lease_seconds),
        worker: format!("demo@{}", std::process::id()),
    };
    let plan = BudgetPlan {
        choice: args.budget_choice.map(|c| match c {
            BudgetChoiceArg::RelevantTests => BudgetChoice::RelevantTests,
            BudgetChoiceArg::FullSuite => BudgetChoice::FullSuite,
            BudgetChoiceArg::DeliverPatch => BudgetChoice::DeliverPatch,
            BudgetChoiceArg::Default => BudgetChoice::Default,
        }),
        decision_wait: Duration::from_secs(args.budget_decision_seconds),
    };
    let result = demo::run_with(cfg, plan, reporter).await;
    if let Some(mut c) = child {
        let _ = c.start_kill();
        let _ = c.wait().await;
    }
    if let Some(running) = embedded {
        let _ = running.shutdown().await;
        if result.is_ok() && !json {
            println!(
                "\nthe embedded control plane has stopped; its record stays in {} — look again with `waymark serve --data-dir {}`",
                workdir.join("server").display(),
                workdir.join("server").display()
            );
        }
    }
    let summary = result.map_err(demo_failure)?;
    let value = serde_json::to_value(&summary).unwrap_or_default();
    emit(json, &value, || {
        let spent = match summary.usage.tokens {
            0 => String::new(),
            t => format!(" · {} tokens, ${:.2}", grouped(t), summary.usage.cost_usd),
        };
        format!(
            "\n{} {} — {}\n  task {} · repo {}{spent}",
            match summary.outcome {
                waymark_proto::FinishOutcome::Completed => "✔",
                _ => "•",
            },
            summary.outcome,
            // A partial delivery's lists, indented under the outcome.
            summary.summary.replace('\n', "\n  "),
            summary.task_id,
            summary.repo.display()
        )
    });
    Ok(())
}

/// `35200` → `35,200`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Starts `waymark demo deploy-service` as a child of this binary; returns it and its URL.
async fn spawn_deploy_service(state: &Path) -> Result<(tokio::process::Child, String), Failure> {
    let exe = std::env::current_exe().map_err(io_failure(
        "cannot find this program to start the deploy service",
    ))?;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "--json",
            "demo",
            "deploy-service",
            "--exit-with-stdin",
            "--state",
        ])
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(io_failure("cannot start the deploy service"))?;
    let stdout = child.stdout.take().expect("piped");
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(10),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    let url = serde_json::from_str::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v["listening"].as_str().map(str::to_owned));
    match (read, url) {
        (Ok(Ok(_)), Some(url)) => Ok((child, url)),
        _ => {
            let _ = child.start_kill();
            Err(Failure::new(
                Exit::Refused,
                "deploy_service",
                format!(
                    "the deploy service did not start (it said {line:?}); run it yourself with `waymark demo deploy-service --state FILE` and pass `--deploy-url`"
                ),
            ))
        }
    }
}

async fn deploy_service(
    listen: SocketAddr,
    state: PathBuf,
    exit_with_stdin: bool,
    json: bool,
) -> CliResult {
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        Failure::new(
            Exit::Refused,
            "bind_failed",
            format!("cannot listen on {listen}: {e} — pick another address with `--listen`"),
        )
    })?;
    let addr = listener
        .local_addr()
        .map_err(io_failure("cannot read the bound address"))?;
    // Load before announcing, so a corrupt state file is reported instead of served.
    waymark_worker::deploy_service::DeployLog::load(&state).map_err(io_failure(&format!(
        "cannot read the state file {}",
        state.display()
    )))?;
    emit(
        json,
        &serde_json::json!({"listening": format!("http://{addr}"), "state": state}),
        || {
            format!(
                "deploy service listening on http://{addr} (state {})",
                state.display()
            )
        },
    );
    let parent_gone = async {
        if exit_with_stdin {
            let mut sink = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut sink).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = waymark_worker::deploy_service::serve(listener, state.clone()) => r.map_err(io_failure("the deploy service stopped")),
        _ = parent_gone => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
    }
}
