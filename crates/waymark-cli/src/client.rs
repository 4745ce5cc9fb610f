//! The terminal client (SPEC §10): pairing, sync, threads, inbox, outbox and steering, all on
//! `waymark-companion` — the same core the app runs on. Reads answer from the local mirror, so
//! they work offline.

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};
use waymark_companion::{Companion, Error, OutboxEntry, Seen, StageStatus};
use waymark_proto::{
    Delegates, Delegation, DelegationState, Device, EscalationPolicy, EscalationStep, Operation,
    QuietHours, Reminders,
};

use crate::output::{CliResult, Exit, Failure, emit};

#[derive(Debug, Args)]
pub(crate) struct PairArgs {
    /// The `waymark://pair?server=…&code=…` link (or the server URL with `--code`).
    link: String,
    /// The one-time code, when the link carries none.
    #[arg(long)]
    code: Option<String>,
    /// The server's TLS certificate fingerprint (`sha256:…`) to pin, when the link carries none.
    #[arg(long)]
    fp: Option<String>,
    /// A name for this device.
    #[arg(long)]
    name: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SyncArgs {
    /// Keep following the server, reconnecting as needed (Ctrl-C stops).
    #[arg(long)]
    follow: bool,
}

#[derive(Debug, Args)]
pub(crate) struct EscalationArgs {
    /// A step, in order: `MINUTES=WHO[,WHO…]`, minutes after the step before (the first:
    /// after the decision opens); each WHO a device by id or name (`waymark escalation` lists
    /// them) or `@USER`, a person you delegate to (`waymark delegates`), all of whose devices
    /// are notified. E.g. `--step 0=laptop --step 10="alice's phone" --step 20=@bob`.
    #[arg(long, value_name = "MINUTES=WHO", conflicts_with = "clear")]
    step: Vec<String>,
    /// Quiet hours, local time `HH:MM-HH:MM` (e.g. `22:00-07:00`): a step due inside them waits
    /// until they end, unless the decision is risky or closes before then. Needs `--time-zone`.
    #[arg(
        long,
        value_name = "FROM-TO",
        requires = "step",
        requires = "time_zone"
    )]
    quiet: Option<String>,
    /// The quiet hours' IANA time zone, e.g. `Europe/Berlin`.
    #[arg(long, value_name = "ZONE", requires = "quiet")]
    time_zone: Option<String>,
    /// Remind a decision nobody has answered: `EVERYxTIMES` — the devices notified so far are
    /// notified again EVERY minutes after the last notification (at least 5), at most TIMES
    /// times (1–12); e.g. `--remind 30x3`. Quiet hours hold reminders like steps.
    #[arg(long, value_name = "EVERYxTIMES", requires = "step")]
    remind: Option<String>,
    /// Remove the policy: every device with a push channel is notified at once.
    #[arg(long)]
    clear: bool,
}

#[derive(Debug, Args)]
#[group(multiple = false)]
pub(crate) struct DelegatesArgs {
    /// Offer this user to read your tasks and answer their decisions from their own devices;
    /// they see nothing until they accept (`--accept YOU` on their side).
    #[arg(long, value_name = "USER")]
    add: Option<String>,
    /// End that: they no longer see your tasks (an offer not yet accepted is taken back).
    #[arg(long, value_name = "USER")]
    remove: Option<String>,
    /// Accept this user's offer: from now on you read their tasks and answer their decisions.
    #[arg(long, value_name = "OWNER")]
    accept: Option<String>,
    /// Decline this user's offer, or stop answering their decisions if you had accepted.
    #[arg(long, value_name = "OWNER")]
    decline: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct RulesArgs {
    #[command(subcommand)]
    cmd: Option<RulesCommand>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RulesCommand {
    /// Make a rule: signed on this device, it answers every matching approval of yours at once
    /// (nobody is asked) until it expires or is revoked. Deny rules win over allow rules.
    Add {
        /// Allow what it matches.
        #[arg(long, conflicts_with = "deny", required_unless_present = "deny")]
        allow: bool,
        /// Deny what it matches.
        #[arg(long)]
        deny: bool,
        /// The tool, as the runtime names it (`Bash`, `Write`, Codex `commandExecution`, ACP
        /// `execute`, OpenClaw `exec`).
        #[arg(long)]
        tool: Option<String>,
        /// A glob over the call's command or path (`npm test *`: a wildcard never matches `;`,
        /// `&`, `|`, `$`… in an allow rule); with `--regex`, a regular expression that must
        /// match all of it.
        #[arg(long)]
        pattern: Option<String>,
        /// `--pattern` is a regular expression.
        #[arg(long, requires = "pattern")]
        regex: bool,
        /// The directory the call runs in, or one above it (`~` and relative paths are made
        /// absolute here; a glob such as `/srv/*/app` works too).
        #[arg(long = "dir", value_name = "DIR")]
        directory: Option<String>,
        /// Only for this runtime (`claude-code`, `codex`, `gemini`, `openclaw`…).
        #[arg(long)]
        runtime: Option<String>,
        /// Only on this machine (`waymark machines`).
        #[arg(long)]
        machine: Option<String>,
        /// How long it lasts, in days: 1 to 90.
        #[arg(long, default_value_t = waymark_proto::RULE_DEFAULT_DAYS)]
        days: u32,
        /// Why, for whoever reads it later.
        #[arg(long)]
        note: Option<String>,
        /// Also allow calls the server's risk policy marks risky (`rm -rf`, force pushes,
        /// `sudo`…). Asks a second time unless `--yes`.
        #[arg(long, requires = "allow")]
        allow_risky: bool,
        /// Skip the second confirmation of `--allow-risky`.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// End a rule at once: the next approval no longer meets it.
    Revoke {
        /// The rule's id (`waymark rules` lists them).
        id: String,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum SteerOp {
    Pause,
    Resume,
    Cancel,
    TakeOver,
}

#[derive(Debug, Subcommand)]
pub(crate) enum ClientCommand {
    /// Make this machine a device of a server (the key stays in the OS keychain).
    Pair(PairArgs),
    /// Bring the local mirror up to date and deliver queued commands.
    Sync(SyncArgs),
    /// Threads, what needs attention first (offline: from the mirror).
    Threads,
    /// One thread in full: stages, checkpoints, effects, decisions, artifacts, receipts.
    Show {
        /// Task id.
        task: String,
    },
    /// Pending decisions, most urgent first.
    Inbox,
    /// Commands signed on this device and where each stands.
    Outbox,
    /// Who is notified of a new decision, in what order, and when not to wake anyone: show the
    /// policy (with this user's devices), set it, or clear it (then every device is notified
    /// at once).
    Escalation(EscalationArgs),
    /// Who else may answer your decisions (a second person an escalation step can reach), and
    /// whose you may answer: show, `--add USER`, `--remove USER`; offers made to you:
    /// `--accept OWNER`, `--decline OWNER`. A delegate reads your tasks and approves, denies,
    /// answers or chooses once they accepted; pausing, cancelling and replanning stay yours.
    Delegates(DelegatesArgs),
    /// This user's machines with a runner: online or since when offline, their runtimes and
    /// the directories runs may use.
    Machines,
    /// Standing rules: list them with their uses and expiry, `add` one, `revoke` one.
    Rules(RulesArgs),
    /// Start a run on one of your machines (a signed command; the machine's runner starts the
    /// runtime in the directory, if its owner allowed it there).
    Run {
        /// The machine (`waymark machines` lists them).
        #[arg(long)]
        machine: String,
        /// The runtime (`claude-code`, `codex`, `gemini`, `opencode`, `copilot`, `hermes`, `openclaw`: what the
        /// machine's runner found).
        #[arg(long, default_value = "claude-code")]
        runtime: String,
        /// The directory on that machine (absolute; one it allows, or under one).
        #[arg(long = "dir", value_name = "DIR")]
        directory: String,
        /// Tools whose calls need an approval (a regex of tool names, e.g. `Bash|Write`);
        /// without it, the runtime's own permission prompts come to the inbox.
        #[arg(long)]
        gate: Option<String>,
        /// The task's title (default: the prompt's first line).
        #[arg(long)]
        title: Option<String>,
        /// Plan first: the runtime starts in its plan mode and asks for the plan's approval
        /// (a plan card) before it changes anything (Claude Code, Codex).
        #[arg(long)]
        plan: bool,
        /// What the agent is asked to do.
        prompt: String,
    },
    /// Approve an approval (bound to its intent digest and plan revision).
    Approve {
        /// Decision id.
        decision: String,
        /// Which of the approval's own ways to approve (`approve_always`, `approve_rule`…, as
        /// `waymark inbox` lists them); without it, plain `approve`.
        #[arg(long, value_name = "OPTION")]
        option: Option<String>,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
        /// The intent digest you were shown (`waymark inbox`; its first 8+ hex digits will do);
        /// without it, the mirror's. Another intent is refused before anything is signed.
        #[arg(long, value_name = "SHA256")]
        intent_digest: Option<String>,
        /// Approve this command instead of the one asked (where the runtime takes an edit,
        /// `editable` in `waymark inbox`; Claude Code does): e.g. `--edit-command 'rm -rf build -n'`.
        #[arg(long, value_name = "COMMAND", conflicts_with = "edit_input")]
        edit_command: Option<String>,
        /// Approve this JSON in place of the intent's editable part (e.g. a tool's whole input).
        #[arg(long, value_name = "JSON")]
        edit_input: Option<String>,
    },
    /// Deny an approval.
    Deny {
        /// Decision id.
        decision: String,
        /// Why, in words the agent is told (for a plan: what to plan differently).
        #[arg(long, value_name = "WORDS")]
        note: Option<String>,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
        /// The intent digest you were shown (`waymark inbox`; its first 8+ hex digits will do);
        /// without it, the mirror's. Another intent is refused before anything is signed.
        #[arg(long, value_name = "SHA256")]
        intent_digest: Option<String>,
    },
    /// Ask the runtime holding an approval to wait for your answer across its exit instead of
    /// deciding at its deadline (Claude Code in a `claude -p` run: the run stops, and the call
    /// waits without a deadline; resume the session once you decided). `waymark inbox` says
    /// which approvals allow it.
    Defer {
        /// Decision id.
        decision: String,
        /// The plan revision you were shown; without it, the mirror's (printed).
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
        /// The intent digest you were shown; without it, the mirror's.
        #[arg(long, value_name = "SHA256")]
        intent_digest: Option<String>,
    },
    /// Answer a question: in words, or — for a question in parts (Claude Code's
    /// `AskUserQuestion`) — by choosing each part's labels and/or giving your own words.
    Answer {
        /// Decision id.
        decision: String,
        /// The answer in words (for a question in one part: your own words for it).
        text: Option<String>,
        /// For a question in parts: `QID=LABEL` chooses a label of question QID (repeat it for
        /// each label of a multi-select question); with one question, `LABEL` alone.
        #[arg(long, value_name = "QID=LABEL")]
        choose: Vec<String>,
        /// For a question in parts: `QID=WORDS` answers question QID in your own words.
        #[arg(long, value_name = "QID=WORDS")]
        say: Vec<String>,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
    },
    /// Choose an option of a decision (budget and others).
    Choose {
        /// Decision id.
        decision: String,
        /// Option id.
        option: String,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
    },
    /// Pause, resume, cancel or take over a task.
    Steer {
        /// Task id.
        task: String,
        /// What to do.
        #[arg(value_enum)]
        op: SteerOp,
        /// Skip the confirmation for cancel and take-over.
        #[arg(long, short = 'y')]
        yes: bool,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
    },
    /// Replan a task with new instructions (old approvals become void).
    Replan {
        /// Task id.
        task: String,
        /// What the agent should do now.
        #[arg(long)]
        instructions: String,
        /// Plan steps to suspend (comma-separated).
        #[arg(long, value_delimiter = ',')]
        suspend: Vec<String>,
        /// The plan revision you were shown (`waymark show`, `waymark inbox`); without it, the
        /// mirror's current one is used and printed. A plan that moved on is a conflict.
        #[arg(long, value_name = "N")]
        expected_revision: Option<i64>,
    },
}

/// What an empty view says on a machine that was never paired (an empty mirror there is no
/// news about the server).
const NOT_PAIRED: &str = "this machine is not paired with a server yet — run `waymark pair LINK` with a link from `waymark admin pair`";
fn failure(e: Error) -> Failure {
    let (exit, code) = match &e {
        Error::Unreachable(_) => (Exit::Unreachable, "unreachable"),
        Error::CertificateMismatch { .. } => (Exit::Refused, "certificate_mismatch"),
        Error::Invalid(_) => (Exit::Usage, "invalid"),
        Error::NotFound(_) => (Exit::Refused, "not_found"),
        Error::NotPaired => (Exit::Refused, "not_paired"),
        Error::NoKeychain(_) | Error::NoDeviceKey(_) => (Exit::Refused, "keychain"),
        Error::BlobMissing(_) => (Exit::Unreachable, "blob_missing"),
        Error::Refused { .. } => (Exit::Refused, "refused"),
        _ => (Exit::Refused, "error"),
    };
    Failure::new(exit, code, e.to_string())
}

fn ago(ms: i64) -> String {
    let secs = (chrono::Utc::now().timestamp_millis() - ms) / 1000;
    match secs {
        s if s < 60 => format!("{s}s ago"),
        s if s < 3600 => format!("{}m ago", s / 60),
        s if s < 86400 => format!("{}h ago", s / 3600),
        s => format!("{}d ago", s / 86400),
    }
}

fn short(s: &str, n: usize) -> String {
    let s = s.trim_start_matches("sha256:");
    s.chars().take(n).collect()
}

fn outbox_line(e: &OutboxEntry) -> String {
    let mut line = format!(
        "{:<12} {:<18} {} rev {}  {}",
        e.status,
        e.operation,
        e.task_id,
        e.based_on_revision.map_or("-".into(), |r| r.to_string()),
        ago(e.created_at)
    );
    if let Some(w) = &e.what_changed {
        line.push_str(&format!("\n             {w}"));
    }
    line
}

/// `--remind EVERYxTIMES`.
fn reminders_from(r: &str) -> Result<Reminders, Error> {
    let bad = || {
        Error::Invalid(format!(
            "`--remind {r}`: write EVERYxTIMES, minutes between reminders and how many, e.g. `--remind 30x3`"
        ))
    };
    let (every, times) = r.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok(Reminders {
        every_minutes: every.trim().parse().map_err(|_| bad())?,
        at_most: times.trim().parse().map_err(|_| bad())?,
    })
}

/// The policy the flags describe, devices named by id or by name.
fn policy_from(args: &EscalationArgs, devices: &[Device]) -> Result<EscalationPolicy, Error> {
    let live: Vec<&Device> = devices.iter().filter(|d| d.revoked_at.is_none()).collect();
    let find = |name: &str| -> Result<String, Error> {
        let name = name.trim();
        let hits: Vec<&&Device> = live
            .iter()
            .filter(|d| d.id == name || d.name == name)
            .collect();
        match hits.as_slice() {
            [d] => Ok(d.id.clone()),
            [] => Err(Error::Invalid(format!(
                "no device `{name}`: use an id or a name that `waymark escalation` lists"
            ))),
            _ => Err(Error::Invalid(format!(
                "{} devices are named `{name}`: use the id",
                hits.len()
            ))),
        }
    };
    let mut steps = Vec::new();
    for s in &args.step {
        let (minutes, names) = s.split_once('=').ok_or_else(|| {
            Error::Invalid(format!(
                "`--step {s}`: write MINUTES=DEVICE[,DEVICE…], e.g. `--step 10=phone`"
            ))
        })?;
        let after_minutes = minutes.trim().parse::<u32>().map_err(|_| {
            Error::Invalid(format!(
                "`--step {s}`: `{minutes}` is not a number of minutes"
            ))
        })?;
        let (mut devices, mut people) = (Vec::new(), Vec::new());
        for who in names.split(',') {
            match who.trim().strip_prefix('@') {
                Some(person) if !person.is_empty() => people.push(person.to_owned()),
                Some(_) => {
                    return Err(Error::Invalid(format!(
                        "`--step {s}`: write a person as `@USER`, e.g. `@bob`"
                    )));
                }
                None => devices.push(find(who)?),
            }
        }
        steps.push(EscalationStep {
            after_minutes,
            devices,
            people,
        });
    }
    let quiet_hours = match (&args.quiet, &args.time_zone) {
        (Some(q), Some(tz)) => {
            let (from, to) = q.split_once('-').ok_or_else(|| {
                Error::Invalid(format!(
                    "`--quiet {q}`: write FROM-TO in local time, e.g. `22:00-07:00`"
                ))
            })?;
            Some(QuietHours {
                from: from.trim().to_owned(),
                to: to.trim().to_owned(),
                time_zone: tz.clone(),
            })
        }
        _ => None,
    };
    let reminders = args.remind.as_deref().map(reminders_from).transpose()?;
    Ok(EscalationPolicy {
        steps,
        quiet_hours,
        reminders,
    })
}

fn render_delegates(d: &Delegates) -> String {
    let day = |t: &chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d").to_string();
    let list = |v: &[Delegation], state: DelegationState| {
        v.iter()
            .filter(|x| x.state == state)
            .map(|x| match (state, &x.accepted_at) {
                (DelegationState::Accepted, Some(at)) => format!("{} (since {})", x.user, day(at)),
                (DelegationState::Accepted, None) => {
                    format!("{} (since {})", x.user, day(&x.since))
                }
                (DelegationState::Offered, _) => format!("{} (offered {})", x.user, day(&x.since)),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    if d.delegates.is_empty() {
        line(format!(
            "nobody else answers {}'s decisions (`waymark delegates --add USER`)",
            d.user
        ));
    }
    let given = list(&d.delegates, DelegationState::Accepted);
    if !given.is_empty() {
        line(format!(
            "may read {}'s tasks and answer their decisions: {given}",
            d.user
        ));
    }
    let waiting = list(&d.delegates, DelegationState::Offered);
    if !waiting.is_empty() {
        line(format!("waiting to accept {}'s offer: {waiting}", d.user));
    }
    let taken = list(&d.delegated_by, DelegationState::Accepted);
    if !taken.is_empty() {
        line(format!("{} may answer the decisions of: {taken}", d.user));
    }
    let asked = list(&d.delegated_by, DelegationState::Offered);
    if !asked.is_empty() {
        line(format!(
            "offers {} has not answered: {asked} (`waymark delegates --accept OWNER` or `--decline OWNER`)",
            d.user
        ));
    }
    out.trim_end().to_owned()
}

fn render_escalation(policy: Option<&EscalationPolicy>, devices: &[Device]) -> String {
    let name = |id: &str| {
        devices
            .iter()
            .find(|d| d.id == id)
            .map_or(id.to_owned(), |d| d.name.clone())
    };
    let mut out = String::new();
    match policy {
        None => out.push_str(
            "no escalation policy: every device with a push channel is notified at once\n",
        ),
        Some(p) => {
            out.push_str("escalation:\n");
            let mut at = 0u32;
            for (i, s) in p.steps.iter().enumerate() {
                at += s.after_minutes;
                let who: Vec<String> = s
                    .devices
                    .iter()
                    .map(|d| name(d))
                    .chain(
                        s.people
                            .iter()
                            .map(|p| format!("@{p} (every device of theirs)")),
                    )
                    .collect();
                out.push_str(&format!(
                    "  {}. {} → {}\n",
                    i + 1,
                    if i == 0 && at == 0 {
                        "at once".to_owned()
                    } else {
                        format!("after {at} min unopened")
                    },
                    who.join(", ")
                ));
            }
            out.push_str(
                "  at the deadline: the decision's default applies (or its runtime decides)\n",
            );
            if let Some(q) = &p.quiet_hours {
                out.push_str(&format!(
                    "  quiet hours: {}–{} {} (risky decisions, and ones that close before they end, still go out)\n",
                    q.from, q.to, q.time_zone
                ));
            }
        }
    }
    out.push_str("devices:\n");
    for d in devices.iter().filter(|d| d.revoked_at.is_none()) {
        out.push_str(&format!(
            "  {}  {}{}\n",
            d.id,
            d.name,
            if d.stale { " (stale)" } else { "" }
        ));
    }
    out.trim_end().to_owned()
}

fn confirm(question: &str) -> bool {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return false;
    }
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).is_ok() && matches!(line.trim(), "y" | "Y" | "yes")
}

pub(crate) async fn run(cmd: ClientCommand, json: bool) -> CliResult {
    let home = waymark_companion::default_home();
    let c = Companion::open(&home).await.map_err(failure)?;
    match cmd {
        ClientCommand::Pair(a) => {
            let mut link = match a.code {
                Some(code) => waymark_companion::PairingLink {
                    server: a.link.clone(),
                    code,
                    pin: None,
                },
                None => waymark_companion::parse_pairing_link(&a.link).map_err(failure)?,
            };
            if let Some(fp) = a.fp {
                if link
                    .pin
                    .as_ref()
                    .is_some_and(|p| !p.eq_ignore_ascii_case(&fp))
                {
                    return Err(Failure::new(
                        Exit::Usage,
                        "invalid",
                        "`--fp` differs from the fingerprint in the link — use the link as given",
                    ));
                }
                link.pin = Some(fp);
            }
            let name = a.name.unwrap_or_else(|| {
                std::env::var("HOSTNAME")
                    .ok()
                    .filter(|h| !h.is_empty())
                    .unwrap_or_else(|| "terminal".into())
            });
            let id = c.pair_link(&link, &name).await.map_err(failure)?;
            let backend = waymark_companion::Keystore::open(&home)
                .map(|k| k.backend().describe())
                .unwrap_or("the keychain");
            emit(json, &serde_json::to_value(&id).unwrap_or_default(), || {
                let pinned = id
                    .pin
                    .as_deref()
                    .map(|p| format!("\n  only the server certificate {p} is trusted"))
                    .unwrap_or_default();
                format!(
                    "paired as {} for `{}` ({}) with {}{pinned}\n  the device key is in {backend}; run `waymark sync`",
                    id.device_id,
                    id.user,
                    id.scopes.join(","),
                    id.server
                )
            });
            Ok(())
        }
        ClientCommand::Sync(a) if a.follow => {
            let (tx, rx) = tokio::sync::watch::channel(false);
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                let _ = tx.send(true);
            });
            // Events print as they come; the notifications they deserve (the same content
            // model as the app's) print once each, after the batch is in the mirror. The
            // threads to look at coalesce (bounded; past the bound: every thread), so a slow
            // terminal never holds sync back and never queues without end.
            let c = std::sync::Arc::new(c);
            let touched = std::sync::Arc::new(waymark_companion::Touched::default());
            let printer = {
                let c = c.clone();
                let touched = touched.clone();
                tokio::spawn(async move {
                    loop {
                        let tasks = match touched.next().await {
                            waymark_companion::Look::Tasks(ids) => ids,
                            waymark_companion::Look::All | waymark_companion::Look::Overflowed => c
                                .mirror()
                                .threads()
                                .await
                                .map(|rows| rows.into_iter().map(|r| r.task.id).collect())
                                .unwrap_or_default(),
                        };
                        for task in tasks {
                            for n in c.notifications(&task, true).await.unwrap_or_default() {
                                if json {
                                    println!("{}", serde_json::json!({"notification": n}));
                                } else {
                                    println!("▶ {}\n  {}", n.title, n.body.replace('\n', "\n  "));
                                }
                            }
                        }
                    }
                })
            };
            let print = move |batch: &[waymark_proto::Event]| {
                for ev in batch {
                    if json {
                        println!("{}", serde_json::to_string(ev).unwrap_or_default());
                    } else {
                        println!("{:>8}  {:<20} {}", ev.cursor, ev.kind.as_str(), ev.task_id);
                    }
                }
                touched.tasks(batch.iter().map(|ev| ev.task_id.as_str()));
            };
            let r = c.follow(rx, &print).await.map_err(failure);
            printer.abort();
            r
        }
        ClientCommand::Sync(_) => {
            let progress = (!json).then(|| progress(c.mirror().clone()));
            let r = c.sync_once().await;
            if let Some(p) = progress {
                p.abort();
            }
            let r = r.map_err(failure)?;
            emit(json, &serde_json::to_value(&r).unwrap_or_default(), || {
                let mut s = format!(
                    "synced to cursor {}: {} event(s){}{}",
                    r.cursor,
                    r.events,
                    if r.snapshot { ", fresh snapshot" } else { "" },
                    if r.prefetched > 0 {
                        format!(", {} blob(s) cached for offline review", r.prefetched)
                    } else {
                        String::new()
                    }
                );
                for e in &r.delivered {
                    s.push_str(&format!("\n  delivered: {}", outbox_line(e)));
                }
                s
            });
            Ok(())
        }
        ClientCommand::Threads => {
            let rows = c.mirror().threads().await.map_err(failure)?;
            let unpaired = rows.is_empty() && c.identity().await.ok().flatten().is_none();
            let health = c.mirror().meta("last_event_at").await.ok().flatten();
            emit(
                json,
                &serde_json::to_value(&rows).unwrap_or_default(),
                || {
                    if unpaired {
                        return format!("no threads: {NOT_PAIRED}");
                    }
                    if rows.is_empty() {
                        return "no threads in the mirror — run `waymark sync`".into();
                    }
                    let mut out = String::new();
                    if let Some(h) = health.and_then(|h| h.parse::<i64>().ok()) {
                        out.push_str(&format!("(mirror current to an event from {})\n", ago(h)));
                    }
                    for r in &rows {
                        let done = r
                            .stages
                            .iter()
                            .filter(|s| s.status == StageStatus::Done)
                            .count();
                        let flag = match (r.pending_decisions, r.unknown_effects) {
                            (0, 0) => String::new(),
                            (p, 0) => format!("  ⚑ {p} decision(s)"),
                            (0, u) => format!("  ? {u} unknown effect(s)"),
                            (p, u) => format!("  ⚑ {p} decision(s), ? {u} unknown"),
                        };
                        out.push_str(&format!(
                            "{:<19} rev {:<3} {}/{} stages  {}{}\n    {}\n",
                            r.task.state.as_str(),
                            r.task.plan_revision,
                            done,
                            r.stages.len(),
                            r.task.title,
                            flag,
                            r.task.id
                        ));
                    }
                    out.trim_end().to_owned()
                },
            );
            Ok(())
        }
        ClientCommand::Show { task } => {
            let t = c
                .mirror()
                .thread(&task)
                .await
                .map_err(failure)?
                .ok_or_else(|| {
                    failure(Error::NotFound(format!(
                        "no task `{task}` in the mirror — run `waymark sync` or `waymark threads`"
                    )))
                })?;
            emit(json, &serde_json::to_value(&t).unwrap_or_default(), || {
                render_thread(&t)
            });
            Ok(())
        }
        ClientCommand::Inbox => {
            let items = c.mirror().inbox().await.map_err(failure)?;
            let me = c.identity().await.ok().flatten().map(|i| i.user);
            let unpaired = items.is_empty() && me.is_none();
            emit(
                json,
                &serde_json::to_value(&items).unwrap_or_default(),
                || {
                    if unpaired {
                        return format!("nothing waits for you here: {NOT_PAIRED}");
                    }
                    if items.is_empty() {
                        return "nothing waits for you".into();
                    }
                    let mut out = String::new();
                    for i in &items {
                        let d = &i.decision;
                        // A decision delegated by another user says whose it is.
                        let whose = match &me {
                            Some(me) if !i.task_owner.is_empty() && i.task_owner != *me => {
                                format!(", for {}", i.task_owner)
                            }
                            _ => String::new(),
                        };
                        out.push_str(&format!(
                            "{} [{}] {}\n  task: {} (rev {}{whose})\n",
                            d.id, d.kind, d.question, i.task_title, i.plan_revision
                        ));
                        if let Some(form) = &d.form {
                            for q in &form.questions {
                                let how = match (q.multi_select, q.free_text) {
                                    (true, true) => "choose any, or say",
                                    (true, false) => "choose any",
                                    (false, true) => "choose one, or say",
                                    (false, false) => "choose one",
                                };
                                out.push_str(&format!("  {}: {} ({how})\n", q.id, q.question));
                                for c in &q.choices {
                                    let about = c
                                        .description
                                        .as_deref()
                                        .map(|x| format!(" — {x}"))
                                        .unwrap_or_default();
                                    out.push_str(&format!("    · {}{about}\n", c.label));
                                }
                            }
                        } else if let Some(digest) = &d.intent_digest {
                            out.push_str(&format!(
                                "  intent: {} digest {}…\n",
                                d.intent.as_ref().map(|v| v.to_string()).unwrap_or_default(),
                                short(digest, 12)
                            ));
                        }
                        if d.plan_revision != i.plan_revision {
                            out.push_str(&format!(
                                "  ! asked at revision {}: stale\n",
                                d.plan_revision
                            ));
                        }
                        for o in &d.options {
                            out.push_str(&format!(
                                "  - {:<16} {}{}\n",
                                o.id,
                                o.label,
                                if o.gives_up.is_empty() {
                                    String::new()
                                } else {
                                    format!(" — gives up {}", o.gives_up)
                                }
                            ));
                        }
                        // The earlier of the runtime's own deadline and ours, and what happens.
                        let closing = d.closing();
                        out.push_str(&format!(
                            "  {} ({})\n",
                            closing.describe(chrono::Utc::now()),
                            closing.at.format("%Y-%m-%d %H:%M:%S UTC"),
                        ));
                        out.push_str(&format!("  {}\n", delivery_line(&d.deliveries)));
                        if let Some(e) = &d.escalation {
                            out.push_str(&format!("  escalation: {}\n", e.describe()));
                        }
                        for r in &i.receipts {
                            out.push_str(&format!(
                                "  receipt: `{}` exit {} — {} passed, {} failed\n",
                                r.command,
                                r.exit_code,
                                r.totals.passed,
                                r.totals.failures + r.totals.errors
                            ));
                        }
                        for a in &i.diffs {
                            out.push_str(&format!(
                                "  diff: {} ({} bytes, {}…)\n",
                                a.name,
                                a.size,
                                short(&a.sha256, 12)
                            ));
                        }
                        let verbs = if d.kind == waymark_proto::DecisionKind::Approval {
                            let edit = match &d.editable {
                                Some(p) => format!(
                                    " | waymark approve {} --edit-command CMD (or --edit-input JSON for `{p}`)",
                                    d.id
                                ),
                                None => String::new(),
                            };
                            // A headless Claude Code run can be asked to wait for the answer.
                            let wait = if d.runtime_deadline.as_ref().is_some_and(|r| r.can_wait) {
                                format!(
                                    " | waymark defer {} (the run stops; the call waits for you)",
                                    d.id
                                )
                            } else {
                                String::new()
                            };
                            format!("waymark approve {0} | waymark deny {0}{edit}{wait}", d.id)
                        } else if d.form.is_some() {
                            format!(
                                "waymark answer {} --choose QID=LABEL [--say QID=WORDS]",
                                d.id
                            )
                        } else if d.options.is_empty() {
                            format!("waymark answer {} \"WORDS\"", d.id)
                        } else {
                            format!("waymark choose {} OPTION", d.id)
                        };
                        out.push_str(&format!("  → {verbs}\n\n"));
                    }
                    out.trim_end().to_owned()
                },
            );
            Ok(())
        }
        ClientCommand::Escalation(args) => {
            let devices = c.devices().await.map_err(failure)?;
            let policy = if args.clear {
                c.set_escalation(None).await.map_err(failure)?
            } else if args.step.is_empty() {
                c.escalation().await.map_err(failure)?
            } else {
                let wanted = policy_from(&args, &devices).map_err(failure)?;
                c.set_escalation(Some(&wanted)).await.map_err(failure)?
            };
            emit(
                json,
                &serde_json::json!({"policy": policy, "devices": devices}),
                || render_escalation(policy.as_ref(), &devices),
            );
            Ok(())
        }
        ClientCommand::Delegates(args) => {
            let d = if let Some(u) = &args.add {
                c.set_delegate(u, true).await
            } else if let Some(u) = &args.remove {
                c.set_delegate(u, false).await
            } else if let Some(owner) = &args.accept {
                let before = c.delegates().await.map_err(failure)?;
                if before
                    .delegated_by
                    .iter()
                    .any(|x| &x.user == owner && x.state == DelegationState::Accepted)
                {
                    eprintln!("already accepted: you answer {owner}'s decisions");
                }
                c.accept_delegation(owner).await
            } else if let Some(owner) = &args.decline {
                c.decline_delegation(owner).await
            } else {
                c.delegates().await
            }
            .map_err(failure)?;
            emit(json, &serde_json::to_value(&d).unwrap_or_default(), || {
                render_delegates(&d)
            });
            Ok(())
        }
        ClientCommand::Rules(args) => rules(&c, json, args).await,
        ClientCommand::Machines => {
            let list = c.machines().await.map_err(failure)?;
            emit(
                json,
                &serde_json::to_value(&list).unwrap_or_default(),
                || render_machines(&list),
            );
            Ok(())
        }
        ClientCommand::Run {
            machine,
            runtime,
            directory,
            gate,
            title,
            plan,
            prompt,
        } => {
            let run = waymark_companion::StartRun {
                machine,
                runtime,
                directory,
                prompt,
                title,
                gate,
                plan,
            };
            let (task, entry) = c.start_run(&run).await.map_err(failure)?;
            if entry.status == waymark_companion::OutboxStatus::Queued {
                return Err(failure(waymark_companion::Error::Unreachable(format!(
                    "the run {task} is queued and will be started on the next sync"
                ))));
            }
            let result = entry.result.clone();
            let status = result.as_ref().map(|r| r.status);
            let value = serde_json::json!({"task_id": task, "outbox": entry});
            match status {
                Some(waymark_proto::CommandStatus::Rejected) => Err(Failure::new(
                    Exit::Refused,
                    "rejected",
                    result.map(|r| r.detail).unwrap_or_default(),
                )),
                _ => {
                    emit(json, &value, || {
                        format!(
                            "{task}: {}",
                            result.map(|r| r.detail).unwrap_or_else(|| "queued".into())
                        )
                    });
                    Ok(())
                }
            }
        }
        ClientCommand::Outbox => {
            let entries = c.mirror().outbox(None).await.map_err(failure)?;
            emit(
                json,
                &serde_json::to_value(&entries).unwrap_or_default(),
                || {
                    if entries.is_empty() {
                        "the outbox is empty".into()
                    } else {
                        entries
                            .iter()
                            .map(outbox_line)
                            .collect::<Vec<_>>()
                            .join("\n")
                    }
                },
            );
            Ok(())
        }
        ClientCommand::Approve {
            decision,
            option,
            expected_revision,
            intent_digest,
            edit_command,
            edit_input,
        } => {
            let shown = (expected_revision, intent_digest);
            if edit_command.is_none() && edit_input.is_none() {
                let option = option.as_deref();
                return decide(&c, json, &decision, Operation::Approve, option, None, shown).await;
            }
            if option.is_some() {
                return Err(Failure::new(
                    Exit::Usage,
                    "usage",
                    "`--option` and an edit do not go together: an edited intent is approved once",
                ));
            }
            approve_edited(&c, json, &decision, edit_command, edit_input, shown).await
        }
        ClientCommand::Deny {
            decision,
            note,
            expected_revision,
            intent_digest,
        } => {
            let shown = (expected_revision, intent_digest);
            let note = note.as_deref().filter(|n| !n.trim().is_empty());
            decide(&c, json, &decision, Operation::Deny, None, note, shown).await
        }
        ClientCommand::Defer {
            decision,
            expected_revision,
            intent_digest,
        } => {
            let shown = (expected_revision, intent_digest);
            decide(&c, json, &decision, Operation::Defer, None, None, shown).await
        }
        ClientCommand::Answer {
            decision,
            text,
            choose,
            say,
            expected_revision,
        } => {
            let shown = (expected_revision, None);
            let form = c
                .mirror()
                .decision(&decision)
                .await
                .map_err(failure)?
                .and_then(|d| d.form);
            if let Some(form) = form {
                let answers = form_answers(&form, &choose, &say, text.as_deref())?;
                let seen = seen_decision(&c, &decision, shown.0, None).await?;
                return report_seen(
                    json,
                    &seen,
                    c.answer_form(&decision, answers, &seen.seen).await,
                );
            }
            if !choose.is_empty() || !say.is_empty() {
                return Err(Failure::new(
                    Exit::Usage,
                    "usage",
                    format!(
                        "`{decision}` is not a question in parts: answer it in words, without `--choose`/`--say`"
                    ),
                ));
            }
            let Some(text) = text else {
                return Err(Failure::new(
                    Exit::Usage,
                    "usage",
                    "say the answer: `waymark answer DECISION \"words\"`",
                ));
            };
            let op = Operation::AnswerQuestion;
            decide(&c, json, &decision, op, None, Some(&text), shown).await
        }
        ClientCommand::Choose {
            decision,
            option,
            expected_revision,
        } => {
            let shown = (expected_revision, None);
            let op = Operation::ChooseOption;
            decide(&c, json, &decision, op, Some(&option), None, shown).await
        }
        ClientCommand::Steer {
            task,
            op,
            yes,
            expected_revision,
        } => {
            let op = match op {
                SteerOp::Pause => Operation::Pause,
                SteerOp::Resume => Operation::Resume,
                SteerOp::Cancel => Operation::Cancel,
                SteerOp::TakeOver => Operation::TakeOver,
            };
            let seen = seen_task(&c, &task, expected_revision).await?;
            if matches!(op, Operation::Cancel | Operation::TakeOver)
                && !yes
                && !confirm(&format!(
                    "{} task {task} (plan revision {})?",
                    op.as_str().replace('_', " "),
                    seen.seen.plan_revision
                ))
            {
                return Err(Failure::new(
                    Exit::Refused,
                    "not_confirmed",
                    format!(
                        "not confirmed; pass `--yes` to {} without asking",
                        op.as_str()
                    ),
                ));
            }
            report_seen(
                json,
                &seen,
                c.command(&task, op, json!({}), vec![], seen.seen.plan_revision)
                    .await,
            )
        }
        ClientCommand::Replan {
            task,
            instructions,
            suspend,
            expected_revision,
        } => {
            let op = if suspend.is_empty() {
                Operation::Replan
            } else {
                Operation::SuspendAndReplan
            };
            let seen = seen_task(&c, &task, expected_revision).await?;
            report_seen(
                json,
                &seen,
                c.command(
                    &task,
                    op,
                    json!({"instructions": instructions}),
                    suspend,
                    seen.seen.plan_revision,
                )
                .await,
            )
        }
    }
}

/// What a command is signed with, and whether the person named it or the mirror supplied it.
struct SeenHere {
    seen: Seen,
    /// `flag` (the person named it) or `mirror` (read when the command was made).
    from: &'static str,
}

/// The revision named by `--expected-revision`, else the mirror's now (said on output).
async fn seen_task(c: &Companion, task: &str, flag: Option<i64>) -> Result<SeenHere, Failure> {
    if let Some(r) = flag {
        return Ok(SeenHere {
            seen: Seen::revision(r),
            from: "flag",
        });
    }
    let t = c
        .mirror()
        .task(task)
        .await
        .map_err(failure)?
        .ok_or_else(|| {
            failure(Error::NotFound(format!(
                "no task `{task}` in the mirror — run `waymark sync`"
            )))
        })?;
    Ok(SeenHere {
        seen: Seen::revision(t.plan_revision),
        from: "mirror",
    })
}

/// Answers a decision with what the person named (`--expected-revision`, `--intent-digest`),
/// else what the mirror holds now, and says which.
/// A form's answers from `--choose QID=LABEL`, `--say QID=WORDS` and, for a form of one
/// question, a bare label or positional words. Checked before anything is signed.
fn form_answers(
    form: &waymark_proto::QuestionForm,
    choose: &[String],
    say: &[String],
    text: Option<&str>,
) -> Result<std::collections::BTreeMap<String, waymark_proto::FormAnswer>, Failure> {
    let only = match form.questions.as_slice() {
        [one] => Some(one.id.clone()),
        _ => None,
    };
    let usage = |why: String| Failure::new(Exit::Usage, "usage", why);
    let split = |given: &str| -> Result<(String, String), Failure> {
        match (given.split_once('='), &only) {
            (Some((q, v)), _) if form.questions.iter().any(|x| x.id == q) => {
                Ok((q.to_owned(), v.to_owned()))
            }
            (_, Some(q)) => Ok((q.clone(), given.to_owned())),
            (_, None) => Err(usage(format!(
                "`{given}`: say which question, as QID=…; the questions are {}",
                form.questions
                    .iter()
                    .map(|q| format!("{} ({})", q.id, q.question))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    };
    let mut answers: std::collections::BTreeMap<String, waymark_proto::FormAnswer> =
        std::collections::BTreeMap::new();
    for c in choose {
        let (q, label) = split(c)?;
        answers.entry(q).or_default().chosen.push(label);
    }
    for w in say {
        let (q, words) = split(w)?;
        answers.entry(q).or_default().text = Some(words);
    }
    if let Some(t) = text {
        let Some(q) = &only else {
            return Err(usage(
                "this question has several parts: answer each with `--choose QID=LABEL` or `--say QID=WORDS`".into(),
            ));
        };
        answers.entry(q.clone()).or_default().text = Some(t.to_owned());
    }
    form.check_answers(&answers).map_err(usage)?;
    Ok(answers)
}

async fn decide(
    c: &Companion,
    json: bool,
    decision: &str,
    op: Operation,
    option: Option<&str>,
    text: Option<&str>,
    (revision, digest): (Option<i64>, Option<String>),
) -> CliResult {
    let seen = seen_decision(c, decision, revision, digest).await?;
    report_seen(
        json,
        &seen,
        c.answer(decision, op, option, text, &seen.seen).await,
    )
}

/// Where a decision stands on each device, at its furthest step: "delivered: alice's phone
/// shown 14:02 (not opened) · laptop opened 14:03", or that no device has it yet.
fn delivery_line(deliveries: &[waymark_proto::DeviceDelivery]) -> String {
    use waymark_proto::DeliveryStep;
    let rank = |s: DeliveryStep| match s {
        DeliveryStep::Pushed => 0,
        DeliveryStep::Fetched => 1,
        DeliveryStep::Shown => 2,
        DeliveryStep::Opened => 3,
        DeliveryStep::Answered => 4,
    };
    let mut furthest: Vec<&waymark_proto::DeviceDelivery> = Vec::new();
    for d in deliveries {
        match furthest.iter_mut().find(|x| x.device_id == d.device_id) {
            Some(x) if rank(d.step) > rank(x.step) => *x = d,
            Some(_) => {}
            None => furthest.push(d),
        }
    }
    if furthest.is_empty() {
        return "delivered: to no device yet".into();
    }
    let each: Vec<String> = furthest
        .iter()
        .map(|d| {
            let open = if rank(d.step) < rank(DeliveryStep::Opened) {
                " (not opened)"
            } else {
                ""
            };
            format!(
                "{} {} {}{open}",
                d.device_name,
                d.step,
                d.at.format("%H:%M UTC")
            )
        })
        .collect();
    format!("delivered: {}", each.join(" · "))
}

/// `approve --edit-command / --edit-input`: the intent's editable part replaced, the change
/// shown on stderr, then signed with both digests.
async fn approve_edited(
    c: &Companion,
    json: bool,
    decision: &str,
    command: Option<String>,
    input: Option<String>,
    shown: (Option<i64>, Option<String>),
) -> CliResult {
    let seen = seen_decision(c, decision, shown.0, shown.1).await?;
    let d = c
        .mirror()
        .decision(decision)
        .await
        .map_err(failure)?
        .ok_or_else(|| failure(Error::NotFound(format!("no decision `{decision}`"))))?;
    let asked = d
        .editable
        .as_deref()
        .and_then(|p| d.intent.as_ref()?.pointer(p))
        .cloned()
        .unwrap_or(Value::Null);
    let part = match (command, input) {
        (Some(cmd), _) => {
            let mut part = asked.clone();
            match part.get_mut("command") {
                Some(slot @ Value::String(_)) => *slot = json!(cmd),
                _ => {
                    return Err(failure(Error::Invalid(format!(
                        "`{decision}` has no command to edit{}: use `--edit-input JSON`",
                        d.editable
                            .as_deref()
                            .map_or(String::new(), |p| format!(" at `{p}`"))
                    ))));
                }
            }
            part
        }
        (None, Some(text)) => serde_json::from_str(&text).map_err(|e| {
            failure(Error::Invalid(format!(
                "`--edit-input` is not JSON ({e}): give the whole new value, e.g. '{{\"command\": \"ls -n\"}}'"
            )))
        })?,
        (None, None) => unreachable!("called only with an edit"),
    };
    waymark_companion::edited_intent(&d, part.clone()).map_err(failure)?;
    if !json {
        eprintln!("approving an edited intent:");
        for line in changed_lines(&asked, &part) {
            eprintln!("  {line}");
        }
    }
    report_seen(
        json,
        &seen,
        c.approve_edited(decision, part, None, &seen.seen).await,
    )
}

/// `- key: was` / `+ key: now` for each top-level key that differs (the whole value when it
/// is not an object).
fn changed_lines(was: &Value, now: &Value) -> Vec<String> {
    let show = |v: Option<&Value>| match v {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "(absent)".into(),
    };
    match (was, now) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter()
                .filter(|k| a.get(*k) != b.get(*k))
                .flat_map(|k| {
                    [
                        format!("- {k}: {}", show(a.get(k))),
                        format!("+ {k}: {}", show(b.get(k))),
                    ]
                })
                .collect()
        }
        _ => vec![
            format!("- {}", show(Some(was))),
            format!("+ {}", show(Some(now))),
        ],
    }
}

/// A decision's revision (its task's) and intent digest: as named, else the mirror's now.
async fn seen_decision(
    c: &Companion,
    decision: &str,
    revision: Option<i64>,
    digest: Option<String>,
) -> Result<SeenHere, Failure> {
    let d = c
        .mirror()
        .decision(decision)
        .await
        .map_err(failure)?
        .ok_or_else(|| {
            failure(Error::NotFound(format!(
                "no decision `{decision}` in the mirror — run `waymark sync`"
            )))
        })?;
    let mut here = seen_task(c, &d.task_id, revision).await?;
    here.seen.intent_digest = match (digest, d.intent_digest) {
        (None, held) => held,
        // `waymark inbox` prints the digest's first hex digits: a prefix of the one held
        // names it; anything else means the intent is not the one the person read.
        (Some(named), Some(held)) if digest_names(&named, &held) => Some(held),
        (Some(named), held) => {
            return Err(Failure::new(
                Exit::Refused,
                "intent_changed",
                format!(
                    "`{decision}` asks about intent {} now, not {named}: review it again (`waymark inbox`)",
                    held.as_deref().map_or("(none)".into(), |h| short(h, 12))
                ),
            ));
        }
    };
    Ok(here)
}

/// Whether `named` (a full `sha256:…` digest or at least 8 of its hex digits, as `waymark
/// inbox` prints them) names `held`.
fn digest_names(named: &str, held: &str) -> bool {
    let named = named
        .trim()
        .trim_start_matches("sha256:")
        .to_ascii_lowercase();
    let held = held.trim_start_matches("sha256:");
    named.len() >= 8 && named.chars().all(|c| c.is_ascii_hexdigit()) && held.starts_with(&named)
}

/// Prints a command's outcome and maps it to an exit code, saying which revision (and digest)
/// was signed: on stderr for people when the mirror supplied it, as `signed_with` in `--json`.
fn report_seen(json: bool, seen: &SeenHere, r: Result<OutboxEntry, Error>) -> CliResult {
    if !json && seen.from == "mirror" {
        eprintln!(
            "signed at plan revision {} (the mirror's now; `--expected-revision N` names the one you saw)",
            seen.seen.plan_revision
        );
    }
    let e = r.map_err(failure)?;
    let mut v = serde_json::to_value(&e).unwrap_or_default();
    v["signed_with"] = json!({
        "plan_revision": seen.seen.plan_revision,
        "intent_digest": seen.seen.intent_digest,
        "from": seen.from,
    });
    emit(json, &v, || outbox_line(&e));
    // A conflict, rejection or expiry is a refusal (exit code), with what changed.
    match e.status.as_str() {
        "conflict" | "rejected" | "expired" => Err(Failure::new(
            Exit::Refused,
            "refused",
            e.what_changed
                .clone()
                .unwrap_or_else(|| format!("the command was {}", e.status)),
        )),
        _ => Ok(()),
    }
}

fn render_thread(t: &waymark_companion::ThreadDetail) -> String {
    let mut o = format!(
        "{}\n  {} · {} · plan revision {}\n",
        t.task.title, t.task.id, t.task.state, t.task.plan_revision
    );
    if !t.task.goal.is_empty() {
        o.push_str(&format!("  goal: {}\n", t.task.goal));
    }
    if let Some(s) = &t.task.outcome_summary {
        o.push_str(&format!("  outcome: {s}\n"));
    }
    let u = &t.task.usage;
    o.push_str(&format!(
        "  usage: {} tokens, ${:.2}, {}s\n\nstages\n",
        u.tokens, u.cost_usd, u.wall_seconds
    ));
    for s in &t.stages {
        let mark = match s.status {
            StageStatus::Done if s.verified => "✔",
            StageStatus::Done => "✓",
            StageStatus::InFlight => "▶",
            StageStatus::Pending => "·",
        };
        o.push_str(&format!("  {mark} {} {}\n", s.step, s.title));
    }
    o.push_str("\ncheckpoints\n");
    for c in &t.checkpoints {
        o.push_str(&format!(
            "  #{:<3} {:<16} {} {}\n",
            c.sequence,
            c.body.reason,
            c.body.summary.as_deref().unwrap_or(""),
            short(&c.digest, 10)
        ));
    }
    if !t.effects.is_empty() {
        o.push_str("\neffects\n");
        for e in &t.effects {
            let warn = if e.status == waymark_proto::EffectStatus::Unknown {
                "  ← outcome unknown: not guessed"
            } else {
                ""
            };
            o.push_str(&format!(
                "  {:<18} {} `{}`{warn}\n",
                e.status.as_str(),
                e.kind,
                e.idempotency_key
            ));
            if let Some(f) = &e.flag {
                o.push_str(&format!("  {:<18} {f}\n", ""));
            }
        }
    }
    if !t.decisions.is_empty() {
        o.push_str("\ndecisions\n");
        for d in &t.decisions {
            let outcome = d
                .outcome
                .as_ref()
                .map(|x| {
                    format!(
                        " → {} by {}",
                        x.option.as_deref().or(x.text.as_deref()).unwrap_or("-"),
                        x.by
                    )
                })
                .unwrap_or_default();
            o.push_str(&format!(
                "  {:<9} [{}] {}{outcome}\n",
                d.status.as_str(),
                d.kind,
                d.question
            ));
        }
    }
    if !t.receipts.is_empty() {
        o.push_str("\ntest receipts\n");
        for r in &t.receipts {
            o.push_str(&format!(
                "  {} `{}` exit {}: {} passed, {} failed, {} skipped\n",
                if r.passed { "PASS" } else { "FAIL" },
                r.command,
                r.exit_code,
                r.totals.passed,
                r.totals.failures + r.totals.errors,
                r.totals.skipped
            ));
            for f in &r.failures {
                o.push_str(&format!("       {}: {}\n", f.name, f.message));
            }
        }
    }
    if !t.artifacts.is_empty() {
        o.push_str("\nartifacts\n");
        for a in &t.artifacts {
            o.push_str(&format!(
                "  {:<28} {:<18} {:>8} B  {}\n",
                a.name,
                a.media_type,
                a.size,
                short(&a.sha256, 12)
            ));
        }
    }
    if !t.messages.is_empty() {
        o.push_str("\nmessages\n");
        for m in t.messages.iter().rev().take(10).rev() {
            o.push_str(&format!("  {:<9} {}\n", m.role, m.text));
        }
    }
    if !t.outbox.is_empty() {
        o.push_str("\nyour commands\n");
        for e in &t.outbox {
            o.push_str(&format!("  {}\n", outbox_line(e)));
        }
    }
    o.trim_end().to_owned()
}

/// A spinner on a terminal when a sync takes more than a moment, showing how far the mirror
/// has come; nothing when stderr is not a terminal.
fn progress(mirror: waymark_companion::Mirror) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        use std::io::IsTerminal;
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
        if !std::io::stderr().is_terminal() {
            return;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        let _clear = ClearOnDrop(bar.clone());
        loop {
            let at = mirror.cursor().await.ok().flatten().unwrap_or(0);
            let cached = mirror
                .blobs_to_prefetch()
                .await
                .map(|b| b.len())
                .unwrap_or(0);
            bar.set_message(if cached > 0 {
                format!("syncing: mirror at cursor {at}, {cached} artifact(s) to cache for offline review")
            } else {
                format!("syncing: mirror at cursor {at}")
            });
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    })
}

/// Clears the spinner when the sync ends (its task is aborted).
struct ClearOnDrop(indicatif::ProgressBar);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

fn render_machines(list: &waymark_proto::MachineList) -> String {
    if list.machines.is_empty() {
        return "no machines: on each machine that holds code, run `waymark runner --allow DIR` with a runner token (`waymark admin runner-token --machine NAME`)".into();
    }
    list.machines
        .iter()
        .map(|m| {
            let state = if m.online {
                "online".to_owned()
            } else {
                match m.offline_since {
                    Some(t) => format!("offline since {}", t.format("%Y-%m-%d %H:%M UTC")),
                    None => "never seen".to_owned(),
                }
            };
            let runtimes = m
                .runtimes
                .iter()
                .map(|r| match &r.version {
                    Some(v) => format!("{} {v}", r.runtime),
                    None => r.runtime.clone(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            format!(
                "{}  {state}  runtimes: {}  allows: {}  active: {}",
                m.name,
                if runtimes.is_empty() {
                    "none".into()
                } else {
                    runtimes
                },
                if m.directories.is_empty() {
                    "nothing".into()
                } else {
                    m.directories.join(", ")
                },
                m.active_tasks.len()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `~`, `~/…` and relative directories made absolute on this device, as a shell would.
fn absolute_dir(dir: &str) -> Result<String, Failure> {
    let usage = |m: String| Failure::new(Exit::Usage, "usage", m);
    let home = || {
        std::env::var("HOME")
            .map_err(|_| usage("`~` needs `HOME`; give the directory in full".into()))
    };
    let joined = if dir == "~" {
        home()?
    } else if let Some(rest) = dir.strip_prefix("~/") {
        format!("{}/{rest}", home()?.trim_end_matches('/'))
    } else if dir.starts_with('/') {
        dir.to_owned()
    } else {
        let here = std::env::current_dir()
            .map_err(|e| usage(format!("`--dir {dir}`: {e}; give the directory in full")))?;
        format!("{}/{dir}", here.display())
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// The spec `waymark rules add` signs, checked here first so that a mistake costs no command.
fn rule_spec(cmd: &RulesCommand) -> Result<waymark_proto::RuleSpec, Failure> {
    let RulesCommand::Add {
        allow: _,
        deny,
        tool,
        pattern,
        regex,
        directory,
        runtime,
        machine,
        days,
        note,
        allow_risky,
        yes: _,
    } = cmd
    else {
        unreachable!("only `add` makes a spec")
    };
    let usage = |m: String| Failure::new(Exit::Usage, "usage", m);
    if *days == 0 || *days > waymark_proto::RULE_MAX_DAYS {
        return Err(usage(format!(
            "`--days {days}`: a rule lasts 1 to {} days",
            waymark_proto::RULE_MAX_DAYS
        )));
    }
    if !deny && tool.is_none() && pattern.is_none() {
        return Err(usage(
            "an allow rule needs `--tool` or `--pattern`: one that allows every call is not a rule"
                .into(),
        ));
    }
    if let Some(p) = pattern.as_deref().filter(|_| *regex)
        && let Err(e) = ::regex::Regex::new(&format!("^(?:{p})$"))
    {
        return Err(usage(format!(
            "`--pattern` is not a regular expression: {e}"
        )));
    }
    let directory = directory.as_deref().map(absolute_dir).transpose()?;
    Ok(waymark_proto::RuleSpec {
        matches: waymark_proto::RuleMatch {
            runtime: runtime.clone(),
            machine: machine.clone(),
            directory,
            tool: tool.clone(),
            input: pattern.as_ref().map(|p| waymark_proto::InputPattern {
                kind: if *regex {
                    waymark_proto::PatternKind::Regex
                } else {
                    waymark_proto::PatternKind::Glob
                },
                pattern: p.clone(),
            }),
        },
        answer: if *deny {
            waymark_proto::RuleAnswer::Deny
        } else {
            waymark_proto::RuleAnswer::Allow
        },
        // Whole seconds: the signed time reads the same in every client.
        expires_at: chrono::DateTime::from_timestamp(
            chrono::Utc::now().timestamp() + i64::from(*days) * 86_400,
            0,
        ),
        note: note.clone(),
        allow_risky: *allow_risky,
    })
}

async fn rules(c: &Companion, json: bool, args: RulesArgs) -> CliResult {
    let refused = |r: &waymark_proto::CommandResult| {
        Failure::new(
            Exit::Refused,
            r.reason.map_or("rejected", |x| x.as_str()),
            r.detail.clone(),
        )
    };
    match args.cmd {
        None => {
            let list = c.rules().await.map_err(failure)?;
            emit(
                json,
                &serde_json::to_value(&list).unwrap_or_default(),
                || render_rules(&list),
            );
            Ok(())
        }
        Some(cmd @ RulesCommand::Add { .. }) => {
            let spec = rule_spec(&cmd)?;
            let RulesCommand::Add { yes, .. } = cmd else {
                unreachable!()
            };
            let mut confirmed_risky = false;
            if spec.allow_risky {
                confirmed_risky = yes
                    || confirm(&format!(
                        "this rule also allows calls marked risky (rm -rf, force pushes, sudo…): {} — allow them without asking?",
                        describe_rule(&spec.matches)
                    ));
                if !confirmed_risky {
                    return Err(Failure::new(
                        Exit::Refused,
                        "not_confirmed",
                        "not confirmed; pass `--yes` to allow risky calls without asking",
                    ));
                }
            }
            let rule = waymark_companion::NewRule {
                spec,
                confirmed_risky,
            };
            let (id, res) = c.add_rule(&rule).await.map_err(failure)?;
            if res.status != waymark_proto::CommandStatus::Applied {
                return Err(refused(&res));
            }
            emit(json, &json!({"rule_id": id, "result": res}), || {
                res.detail.clone()
            });
            Ok(())
        }
        Some(RulesCommand::Revoke { id }) => {
            let res = c.revoke_rule(&id).await.map_err(failure)?;
            if res.status != waymark_proto::CommandStatus::Applied {
                return Err(refused(&res));
            }
            emit(json, &json!({"rule_id": id, "result": res}), || {
                res.detail.clone()
            });
            Ok(())
        }
    }
}

/// A rule's match in a line.
fn describe_rule(m: &waymark_proto::RuleMatch) -> String {
    let mut parts = Vec::new();
    match (&m.tool, &m.input) {
        (Some(t), Some(p)) => parts.push(format!("{t} `{}`", p.pattern)),
        (Some(t), None) => parts.push(format!("every {t} call")),
        (None, Some(p)) => parts.push(format!("`{}`", p.pattern)),
        (None, None) => parts.push("every call".into()),
    }
    if m.input
        .as_ref()
        .is_some_and(|p| p.kind == waymark_proto::PatternKind::Regex)
    {
        parts[0] = format!("{} (regex)", parts[0]);
    }
    if let Some(d) = &m.directory {
        parts.push(format!("in {d}"));
    }
    if let Some(r) = &m.runtime {
        parts.push(format!("of {r}"));
    }
    if let Some(x) = &m.machine {
        parts.push(format!("on {x}"));
    }
    parts.join(" ")
}

fn render_rules(list: &waymark_proto::RuleList) -> String {
    let mut out = if list.rules.is_empty() {
        "no rules: every approval asks a person (`waymark rules add --help`)\n".to_owned()
    } else {
        render_our_rules(list)
    };
    if !list.runtime_rules.is_empty() {
        out.push_str("\nthe runtimes' own rules (they act before Waymark is asked):\n");
        for r in &list.runtime_rules {
            out.push_str(&format!(
                "{} {:<5} {} `{}`\n  in {}\n",
                r.machine, r.rule.effect, r.rule.runtime, r.rule.text, r.rule.source
            ));
            for c in &r.conflicts {
                out.push_str(&format!("  conflict with {}: {}\n", c.rule_id, c.says));
            }
        }
    }
    out.trim_end().to_owned()
}

fn render_our_rules(list: &waymark_proto::RuleList) -> String {
    let now = chrono::Utc::now();
    let mut out = String::new();
    for r in &list.rules {
        let state = match (&r.revoked_at, r.live) {
            (Some(at), _) => format!("revoked {}", at.format("%Y-%m-%d %H:%M")),
            (None, false) => format!("expired {}", r.expires_at.format("%Y-%m-%d %H:%M")),
            (None, true) => {
                let days = (r.expires_at - now).num_hours() as f64 / 24.0;
                format!(
                    "until {} ({days:.0}d)",
                    r.expires_at.format("%Y-%m-%d %H:%M")
                )
            }
        };
        out.push_str(&format!(
            "{} {:<5} {}{}\n  {} use{} · {state} · signed on {}{}\n",
            r.id,
            r.answer,
            describe_rule(&r.matches),
            if r.allow_risky {
                " (risky calls too)"
            } else {
                ""
            },
            r.uses,
            if r.uses == 1 { "" } else { "s" },
            r.device_name,
            r.note
                .as_ref()
                .map(|n| format!("\n  note: {n}"))
                .unwrap_or_default(),
        ));
    }
    out
}
