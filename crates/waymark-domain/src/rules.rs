//! Standing rules (issue 31 §2): a person's signed answer to the approvals that match it.
//!
//! What must hold, and where:
//!
//! * **a rule never allows more than its pattern** — [`Matcher::matches`]: every part a rule
//!   names must match the call's facts ([`facts_in`], read with `waymark_proto::intent_facts`);
//!   a fact the call lacks never matches a part that names it; in an `allow` rule a glob's
//!   wildcard never crosses a shell control character, and a path or directory that is not
//!   plain (`.`, `..`, `//`) matches nothing;
//! * **an expired or revoked rule answers nothing**, by the transaction's clock — [`ruling`];
//! * **deny wins**: a matching deny rule answers before any allow rule, and deny rules are read
//!   broadly (wildcards cross everything, a command is also tried piece by piece, a path also
//!   as `..` would resolve) — [`ruling`], [`Matcher::matches`];
//! * **risky needs explicit double confirmation**: an approval the risk policy (or its worker)
//!   marks risky is allowed only by a rule made with `allow_risky` whose command named its
//!   expiry and repeated the rule's digest in `args.confirm_risky` — [`add_rule`], [`ruling`].
//!
//! [`ruling`] and [`Matcher`] are pure (property tests below); [`answer_by_rule`] applies them
//! inside the transaction that opens an approval (`decisions::request_approval`), which then
//! records the approval answered — nobody is notified, nothing escalates.

use globset::{GlobBuilder, GlobMatcher};
use regex::{Regex, RegexBuilder};
use serde_json::Value;
use waymark_proto::*;
use waymark_store::*;

use crate::Context;
use crate::caller::{Caller, CallerKind};
use crate::convert;
use crate::core::whose;
use crate::core::{Tx, clip};
use crate::devices::{Rejection, Verified, has_scope, reject};
use crate::error::{ApiError, ApiResult};

/// What a wildcard of an `allow` glob over a command may match: anything but the characters
/// that let a shell run a second command or redirect the first.
const SAFE_WILDCARD: &str = r"[^;&|<>$`()\n\r]";
/// What a wildcard of a `deny` glob matches: anything.
const ANY: &str = r"(?s:.)";
/// Longest pattern, directory or note.
const MAX_TEXT: usize = 500;

/// A rule's match, compiled. Built from a spec the server accepted ([`Matcher::new`] refuses
/// the rest with a message for people).
#[derive(Debug, Clone)]
pub struct Matcher {
    spec: RuleSpec,
    directory: Option<(GlobMatcher, GlobMatcher)>,
    input: Option<InputMatcher>,
}

#[derive(Debug, Clone)]
enum InputMatcher {
    Glob {
        /// Over a command or other text, wildcards stopping at shell control characters.
        narrow: Regex,
        /// The same, wildcards matching anything (deny rules).
        broad: Regex,
        /// Over a path: `*` within a name, `**` across them.
        path: GlobMatcher,
    },
    Regex(Regex),
}

impl Matcher {
    /// Compiles a spec's patterns; `Err` says what is wrong, for the person who signed it.
    pub fn new(spec: &RuleSpec) -> Result<Matcher, String> {
        let m = &spec.matches;
        let directory = match &m.directory {
            None => None,
            Some(d) => {
                if !d.starts_with('/') || d.len() > MAX_TEXT {
                    return Err(format!(
                        "`match.directory` must be an absolute path of at most {MAX_TEXT} characters (`{}`); a `~` is expanded on the device that signs",
                        clip(d, 80)
                    ));
                }
                let base = if d.len() > 1 {
                    d.trim_end_matches('/')
                } else {
                    d
                };
                let under = if base == "/" {
                    "/**".to_owned()
                } else {
                    format!("{base}/**")
                };
                Some((path_glob(base)?, path_glob(&under)?))
            }
        };
        let input = match &m.input {
            None => None,
            Some(p) => {
                if p.pattern.is_empty() || p.pattern.chars().count() > MAX_TEXT {
                    return Err(format!(
                        "`match.input.pattern` must be 1 to {MAX_TEXT} characters"
                    ));
                }
                Some(match p.kind {
                    PatternKind::Glob => InputMatcher::Glob {
                        narrow: glob_regex(&p.pattern, SAFE_WILDCARD)?,
                        broad: glob_regex(&p.pattern, ANY)?,
                        path: path_glob(&p.pattern)?,
                    },
                    PatternKind::Regex => InputMatcher::Regex(
                        RegexBuilder::new(&format!("^(?:{})$", p.pattern))
                            .size_limit(1 << 20)
                            .build()
                            .map_err(|e| {
                                format!("`match.input.pattern` is not a regular expression: {e}")
                            })?,
                    ),
                })
            }
        };
        Ok(Matcher {
            spec: spec.clone(),
            directory,
            input,
        })
    }

    /// Whether every part the rule names matches the call. Read narrowly for an `allow` rule,
    /// broadly for a `deny` rule.
    pub fn matches(&self, f: &CallFacts) -> bool {
        let m = &self.spec.matches;
        let deny = self.spec.answer == RuleAnswer::Deny;
        let same = |want: &Option<String>, have: &Option<String>| match want {
            None => true,
            Some(w) => have.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(w)),
        };
        if !same(&m.runtime, &f.runtime) || !same(&m.tool, &f.tool) {
            return false;
        }
        if let Some(machine) = &m.machine
            && f.machine.as_deref() != Some(machine.as_str())
        {
            return false;
        }
        if let Some((at, under)) = &self.directory {
            let Some(dir) = &f.directory else {
                return false;
            };
            let hit = |d: &str| at.is_match(d) || under.is_match(d);
            let dir = trim_slash(dir);
            let ok = if deny {
                hit(dir) || normalized(dir).is_some_and(|n| hit(&n))
            } else {
                plain_absolute(dir) && hit(dir)
            };
            if !ok {
                return false;
            }
        }
        if let Some(im) = &self.input {
            let Some(input) = &f.input else {
                return false;
            };
            let text = input.text();
            let ok = match (im, input, deny) {
                (InputMatcher::Glob { path, .. }, CallInput::Path(p), false) => {
                    plain_absolute(p) && path.is_match(p)
                }
                (InputMatcher::Glob { path, .. }, CallInput::Path(p), true) => {
                    path.is_match(p) || normalized(p).is_some_and(|n| path.is_match(n))
                }
                (InputMatcher::Glob { narrow, .. }, _, false) => narrow.is_match(text),
                (InputMatcher::Glob { broad, .. }, _, true) => {
                    broad.is_match(text) || pieces(text).any(|p| broad.is_match(p))
                }
                (InputMatcher::Regex(re), _, false) => re.is_match(text),
                (InputMatcher::Regex(re), _, true) => {
                    re.is_match(text) || pieces(text).any(|p| re.is_match(p))
                }
            };
            if !ok {
                return false;
            }
        }
        true
    }
}

/// A stored rule with its compiled match.
#[derive(Debug, Clone)]
pub struct LiveRule {
    pub row: RuleRow,
    pub matcher: Matcher,
}

/// The rule that answers a call at `now`, if any: among the rules neither revoked nor expired
/// (nor made after `now`), a matching deny rule first; else a matching allow rule — which,
/// for a risky call, must allow risky calls. Oldest first within each, as listed.
pub fn ruling<'a>(
    rules: &'a [LiveRule],
    facts: &CallFacts,
    risky: bool,
    now: i64,
) -> Option<&'a LiveRule> {
    let matching: Vec<&LiveRule> = rules
        .iter()
        .filter(|r| r.row.revoked_at.is_none() && r.row.expires_at > now && r.row.created_at <= now)
        .filter(|r| r.matcher.matches(facts))
        .collect();
    if let Some(d) = matching.iter().find(|r| r.row.answer == RuleAnswer::Deny) {
        return Some(d);
    }
    matching
        .into_iter()
        .find(|r| r.row.answer == RuleAnswer::Allow && (!risky || r.matcher.spec.allow_risky))
}

/// What a rule sees of an approval of `task`: the intent's facts, the task's runtime and
/// machine, and its directory — as the runtime reported it (in the intent, else `cwd`), else
/// the directory its runner started it in.
pub async fn facts_in(
    tx: &mut Tx,
    task: &TaskRow,
    intent: &Value,
    cwd: Option<&str>,
) -> ApiResult<CallFacts> {
    let mut f = intent_facts(intent);
    f.runtime = task.runtime.clone();
    if let Some(id) = &task.machine_id {
        f.machine = tx.machine(id).await?.map(|m| m.name);
    }
    if f.directory.is_none() {
        f.directory = cwd.map(str::to_owned);
    }
    if f.directory.is_none() && task.machine_id.is_some() {
        f.directory = tx
            .task_work(&task.id)
            .await?
            .iter()
            .find(|w| w.kind == WorkKind::Start)
            .and_then(|w| w.args.pointer("/run/directory"))
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    Ok(f)
}

/// Answers an approval about to open by its owner's rules, if one matches: counts the use and
/// returns the outcome to record (`by` names the rule; the outcome carries its id and
/// digest). `None`: no rule answers it, and a person is asked as usual.
pub async fn answer_by_rule(
    tx: &mut Tx,
    task: &TaskRow,
    intent: &Value,
    cwd: Option<&str>,
    risky: bool,
) -> ApiResult<Option<DecisionOutcome>> {
    let now = tx.now;
    let rows = tx
        .list_rules(&task.owner_id, Some(now), RULE_MAX_LIVE as i64)
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut rules = Vec::with_capacity(rows.len());
    for row in rows.into_iter().rev() {
        let spec: RuleSpec = convert::json(&row.spec, "rule")?;
        match Matcher::new(&spec) {
            Ok(matcher) => rules.push(LiveRule { row, matcher }),
            // Accepted once, so it compiles; a rule that no longer does answers nothing.
            Err(e) => tracing::warn!(rule = %row.id, error = %e, "a stored rule does not compile"),
        }
    }
    let facts = facts_in(tx, task, intent, cwd).await?;
    let Some(rule) = ruling(&rules, &facts, risky, now) else {
        return Ok(None);
    };
    let row = &rule.row;
    tx.count_rule_use(&row.id, now).await?;
    let device = tx
        .device(&row.device_id)
        .await?
        .map_or_else(|| row.device_id.clone(), |d| d.name);
    let (option, verb) = match row.answer {
        RuleAnswer::Allow => ("approve", "allowed"),
        RuleAnswer::Deny => ("deny", "denied"),
    };
    let until = convert::dt(row.expires_at).format("%-d %b %Y");
    let mut text = format!("{verb} by rule {} ({device}, until {until})", row.id);
    if let Some(n) = &rule.matcher.spec.note {
        text.push_str(&format!(": {n}"));
    }
    tracing::info!(task = %task.id, rule = %row.id, answer = %row.answer, "an approval answered by a standing rule");
    Ok(Some(DecisionOutcome {
        option: Some(option.into()),
        text: Some(text),
        by: format!("rule:{}", row.id),
        at: tx.now_utc(),
        edited_intent: None,
        edited_intent_digest: None,
        answers: None,
        rule: Some(RuleRef {
            id: row.id.clone(),
            digest: row.digest.clone(),
            answer: row.answer,
        }),
    }))
}

/// `add_rule`, inside the command's transaction: checks the rule (`args.rule`), its expiry and,
/// for a rule that allows risky calls, the second confirmation; stores it as the signing
/// device's user's. Returns the words for the result's `detail`.
pub async fn add_rule(tx: &mut Tx, v: &Verified) -> ApiResult<Result<String, Rejection>> {
    let cmd = &v.command;
    let bad = |d: String| Ok(Err(reject(RejectReason::InvalidCommand, d)));
    if !has_scope(&v.device, "approve") {
        return Ok(Err(reject(
            RejectReason::MissingScope,
            "a rule answers approvals, so `add_rule` needs the `approve` scope; pair with it",
        )));
    }
    if cmd.task_id.is_some() {
        return bad(
            "`add_rule` names no task: a rule answers every matching approval of yours".into(),
        );
    }
    let Some(raw) = cmd.args.get("rule") else {
        return bad("`args.rule` is required: `{match, answer, expires_at?, note?}`".into());
    };
    let mut spec: RuleSpec = match serde_json::from_value(raw.clone()) {
        Ok(s) => s,
        Err(e) => return bad(format!("`args.rule`: {e}")),
    };
    if let Err(e) = Matcher::new(&spec) {
        return bad(e);
    }
    let m = &spec.matches;
    for (name, value, max) in [
        ("runtime", &m.runtime, 64),
        ("machine", &m.machine, 64),
        ("tool", &m.tool, 128),
    ] {
        if let Some(x) = value
            && (x.trim().is_empty() || x.chars().count() > max)
        {
            return bad(format!("`match.{name}` must be 1 to {max} characters"));
        }
    }
    if spec.answer == RuleAnswer::Allow && m.tool.is_none() && m.input.is_none() {
        return bad(
            "an allow rule must name a `tool` or an input pattern: one that allows every call is not a rule"
                .into(),
        );
    }
    if let Some(n) = &spec.note
        && n.chars().count() > MAX_TEXT
    {
        return bad(format!("`note` must be at most {MAX_TEXT} characters"));
    }
    if let Some(name) = &m.machine
        && tx.machine_by_name(&v.user.id, name).await?.is_none()
    {
        return Ok(Err(reject(
            RejectReason::UnknownMachine,
            format!(
                "no machine `{}` of user `{}`; `waymark machines` lists them",
                clip(name, 64),
                v.user.name
            ),
        )));
    }
    let now = tx.now;
    let most = now + i64::from(RULE_MAX_DAYS) * 86_400_000;
    let expires_at = match spec.expires_at {
        None => now + i64::from(RULE_DEFAULT_DAYS) * 86_400_000,
        Some(at) => {
            let at = at.timestamp_millis();
            if at <= now {
                return bad("`expires_at` has passed: a rule must expire in the future".into());
            }
            // A minute of grace for the device's clock and the way here.
            if at > most + 60_000 {
                return bad(format!(
                    "a rule lives at most {RULE_MAX_DAYS} days: `expires_at` is {} days away; choose an earlier date",
                    (at - now + 86_399_999) / 86_400_000
                ));
            }
            at
        }
    };
    if spec.allow_risky {
        if spec.answer != RuleAnswer::Allow {
            return bad("`allow_risky` goes with `answer: allow`".into());
        }
        if spec.expires_at.is_none() {
            return bad(
                "a rule that allows risky calls must name its `expires_at`, so that the digest confirmed is the rule's"
                    .into(),
            );
        }
        let digest = match waymark_proto::digest::json_digest(raw) {
            Ok(d) => d,
            Err(e) => return bad(format!("`args.rule`: {e}")),
        };
        if cmd.args.get("confirm_risky").and_then(Value::as_str) != Some(digest.as_str()) {
            return Ok(Err(reject(
                RejectReason::DigestMismatch,
                format!(
                    "a rule that allows risky calls is confirmed twice: repeat its digest ({digest}) in `args.confirm_risky`"
                ),
            )));
        }
    }
    let live = tx
        .list_rules(&v.user.id, Some(now), RULE_MAX_LIVE as i64)
        .await?;
    if live.len() >= RULE_MAX_LIVE {
        return bad(format!(
            "`{}` has {RULE_MAX_LIVE} live rules; revoke some first",
            v.user.name
        ));
    }
    let id = match cmd.args.get("rule_id") {
        None => ids::rule(),
        Some(Value::String(id)) if well_formed_id(id) => {
            if tx.rule(id).await?.is_some() {
                return bad(format!("a rule `{id}` exists; a new rule needs a new id"));
            }
            id.clone()
        }
        Some(_) => return bad("`args.rule_id` must be `rul_` and 32 lower-case hex digits".into()),
    };
    // Stored and digested as signed, with the expiry the server chose when it named none.
    let mut stored = raw.clone();
    if spec.expires_at.is_none() {
        spec.expires_at = Some(convert::dt(expires_at));
        stored["expires_at"] = serde_json::to_value(spec.expires_at).unwrap_or_default();
    }
    let digest = match waymark_proto::digest::json_digest(&stored) {
        Ok(d) => d,
        Err(e) => return bad(format!("`args.rule`: {e}")),
    };
    tx.insert_rule(&RuleRow {
        id: id.clone(),
        owner_id: v.user.id.clone(),
        device_id: v.device.id.clone(),
        command_id: cmd.command_id.clone(),
        spec: stored,
        digest,
        answer: spec.answer,
        created_at: now,
        expires_at,
        revoked_at: None,
        revoked_by: None,
        uses: 0,
        last_used_at: None,
    })
    .await?;
    Ok(Ok(format!(
        "rule {id}: {} {} until {}",
        spec.answer,
        describe(&spec.matches),
        convert::dt(expires_at).format("%-d %b %Y %H:%M UTC")
    )))
}

/// `revoke_rule`: ends one of the signing user's rules at once (`args.rule_id`).
pub async fn revoke_rule(tx: &mut Tx, v: &Verified) -> ApiResult<Result<String, Rejection>> {
    let cmd = &v.command;
    if !has_scope(&v.device, "approve") {
        return Ok(Err(reject(
            RejectReason::MissingScope,
            "`revoke_rule` needs the `approve` scope; pair with it",
        )));
    }
    let Some(id) = cmd.args.get("rule_id").and_then(Value::as_str) else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            "`args.rule_id` is required",
        )));
    };
    let Some(rule) = tx.rule(id).await?.filter(|r| r.owner_id == v.user.id) else {
        return Ok(Err(reject(
            RejectReason::InvalidCommand,
            format!(
                "no rule `{}` of user `{}`; `waymark rules` lists them",
                clip(id, 80),
                v.user.name
            ),
        )));
    };
    if rule.revoked_at.is_some() {
        return Ok(Err(reject(
            RejectReason::InvalidState,
            format!("rule `{id}` was revoked before"),
        )));
    }
    let now = tx.now;
    tx.revoke_rule(id, now, &v.device.id).await?;
    Ok(Ok(if rule.expires_at <= now {
        format!("rule {id} revoked (it had expired already)")
    } else {
        format!("rule {id} revoked: the next approval no longer meets it")
    }))
}

/// `GET /v1/rules`: a user's rules, newest first — the device's own user's (a delegate sees
/// only their own: rules are the owner's standing answers, not a delegated decision), or, for
/// the admin, the user named.
pub async fn list(st: &Context, caller: &Caller, user: Option<String>) -> ApiResult<RuleList> {
    let mut tx = Tx::read(st).await?;
    let u = match (caller.kind, user.as_deref()) {
        (CallerKind::Device, Some(_)) => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "a device lists its own user's rules; `user` is for admins",
            ));
        }
        (CallerKind::Device | CallerKind::Admin, _) => {
            whose(&mut tx, caller, user.as_deref()).await?
        }
        (CallerKind::Worker, _) => {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                "rules are a person's: list them from a paired device (or an admin token)",
            ));
        }
    };
    let rows = tx.list_rules(&u.id, None, RULE_MAX_LIVE as i64).await?;
    let mut rules = Vec::with_capacity(rows.len());
    // The live ones, compiled, for the conflicts with the runtimes' own rules.
    let mut live = Vec::new();
    for r in rows {
        let spec: RuleSpec = convert::json(&r.spec, "rule")?;
        let is_live = r.revoked_at.is_none() && r.expires_at > tx.now;
        if is_live && let Ok(m) = Matcher::new(&spec) {
            live.push((r.id.clone(), m));
        }
        let device_name = tx
            .device(&r.device_id)
            .await?
            .map_or_else(|| r.device_id.clone(), |d| d.name);
        rules.push(Rule {
            live: is_live,
            id: r.id,
            digest: r.digest,
            owner: u.name.clone(),
            device_id: r.device_id,
            device_name,
            matches: spec.matches,
            answer: r.answer,
            note: spec.note,
            allow_risky: spec.allow_risky,
            command_id: r.command_id,
            created_at: convert::dt(r.created_at),
            expires_at: convert::dt(r.expires_at),
            revoked_at: r.revoked_at.map(convert::dt),
            revoked_by: r.revoked_by,
            uses: r.uses,
            last_used_at: r.last_used_at.map(convert::dt),
        });
    }
    let runtime_rules = runtime_rules(&mut tx, &u.id, &live).await?;
    Ok(RuleList {
        rules,
        runtime_rules,
    })
}

/// The runtimes' own rules on `owner`'s machines, each with the live rules it works against.
async fn runtime_rules(
    tx: &mut Tx,
    owner: &str,
    ours: &[(String, Matcher)],
) -> ApiResult<Vec<ListedRuntimeRule>> {
    let mut out = Vec::new();
    for m in tx.list_machines(Some(&[owner.to_owned()])).await? {
        let Some(info) = crate::convert::machine_info(&m) else {
            continue;
        };
        for rule in info.runtime_rules {
            let conflicts = ours
                .iter()
                .filter_map(|(id, ours)| {
                    conflict(ours, &rule, &m.name).map(|says| RuleConflict {
                        rule_id: id.clone(),
                        says,
                    })
                })
                .collect();
            out.push(ListedRuntimeRule {
                machine: m.name.clone(),
                reported_at: m.registered_at.map(convert::dt),
                rule,
                conflicts,
            });
        }
    }
    Ok(out)
}

/// What a runner reports of the runtimes' own rules, checked: at most [`RUNTIME_RULES_MAX`],
/// each naming its runtime (in `match.runtime` too) and saying something. What a person's
/// settings may hold is kept, not refused — a long text is clipped, and a pattern Waymark
/// cannot compile is listed as such (an `ask`, matching nothing in particular) — so that one
/// odd rule in a file never keeps a runner from registering.
pub fn check_runtime_rules(rules: &mut [RuntimeRule]) -> ApiResult<()> {
    use crate::core::{check_text, invalid};
    if rules.len() > RUNTIME_RULES_MAX {
        return Err(invalid(format!(
            "at most {RUNTIME_RULES_MAX} runtime rules"
        )));
    }
    for (i, r) in rules.iter_mut().enumerate() {
        let at = |field: &str| format!("runtime_rules[{i}].{field}");
        check_text(&at("runtime"), &r.runtime, 64, true)?;
        if r.source.trim().is_empty() || r.text.trim().is_empty() {
            return Err(invalid(format!(
                "`{}` and `{}` must not be empty",
                at("source"),
                at("text")
            )));
        }
        if r.matches.runtime.as_deref() != Some(r.runtime.as_str()) {
            return Err(invalid(format!(
                "`{}` must name the rule's runtime `{}`",
                at("match.runtime"),
                clip(&r.runtime, 64)
            )));
        }
        r.source = clip(&r.source, MAX_TEXT);
        r.text = clip(&r.text, MAX_TEXT);
        if let Err(e) = Matcher::new(&own_spec(r)) {
            r.text = clip(&format!("{} (not matched: {e})", r.text), MAX_TEXT);
            r.effect = OwnEffect::Ask;
            r.matches = RuleMatch {
                runtime: Some(r.runtime.clone()),
                ..RuleMatch::default()
            };
        }
    }
    Ok(())
}

/// A runtime's rule as a Waymark rule would say it (an `ask` reads as `allow`: it only
/// decides how the match is read).
fn own_spec(r: &RuntimeRule) -> RuleSpec {
    RuleSpec {
        matches: r.matches.clone(),
        answer: match r.effect {
            OwnEffect::Deny => RuleAnswer::Deny,
            OwnEffect::Allow | OwnEffect::Ask => RuleAnswer::Allow,
        },
        expires_at: None,
        note: None,
        allow_risky: false,
    }
}

/// Whether one of our rules and a runtime's own rule (on `machine`) may cover a call in
/// common with different answers — our deny against calls the runtime runs unasked, our allow
/// against calls it refuses — and if so, what that means, for people. Pure.
///
/// Two patterns' overlap is undecidable in general; each side is tried on the calls the
/// other's literal text describes (its wildcards read as nothing and as a word), which finds
/// every overlap between the literal prefixes people write (`npm test` and `npm test*`,
/// `Bash(npm:*)` and `npm test --watch`) and names the rest as "may".
pub fn conflict(ours: &Matcher, theirs: &RuntimeRule, machine: &str) -> Option<String> {
    let who = runtime_name(&theirs.runtime);
    let what = match (ours.spec.answer, theirs.effect) {
        (RuleAnswer::Deny, OwnEffect::Allow) => format!(
            "{who} on {machine} runs these calls without asking (`{}` in {}), so this deny rule never sees them",
            clip(&theirs.text, 120),
            clip(&theirs.source, 120)
        ),
        (RuleAnswer::Allow, OwnEffect::Deny) => format!(
            "{who} on {machine} refuses these calls before asking (`{}` in {}), so this allow rule never answers them",
            clip(&theirs.text, 120),
            clip(&theirs.source, 120)
        ),
        _ => return None,
    };
    let their = Matcher::new(&own_spec(theirs)).ok()?;
    let o = &ours.spec.matches;
    let t = &theirs.matches;
    // Scope that can never meet: another runtime, machine or tool.
    let differ = |a: &Option<String>, b: &Option<String>| matches!((a, b), (Some(a), Some(b)) if !a.eq_ignore_ascii_case(b));
    if differ(&o.runtime, &t.runtime)
        || differ(&o.tool, &t.tool)
        || o.machine.as_deref().is_some_and(|m| m != machine)
    {
        return None;
    }
    samples(o, t, machine)
        .iter()
        .any(|f| their.matches(f) && ours.matches(f))
        .then_some(what)
}

/// The calls either match's literal text describes: every directory either names with every
/// input either names (a side that names none of a part leaves it to the other).
fn samples(a: &RuleMatch, b: &RuleMatch, machine: &str) -> Vec<CallFacts> {
    let runtime = a.runtime.clone().or_else(|| b.runtime.clone());
    let tool = a.tool.clone().or_else(|| b.tool.clone());
    let mut dirs: Vec<Option<String>> = [&a.directory, &b.directory]
        .into_iter()
        .flatten()
        .flat_map(|d| literal_variants(d))
        .map(|d| {
            let d = d.trim_end_matches('/');
            Some(if d.is_empty() {
                "/".to_owned()
            } else {
                d.to_owned()
            })
        })
        .collect();
    if dirs.is_empty() {
        dirs.push(Some("/".into()));
    }
    let mut inputs: Vec<Option<CallInput>> = [&a.input, &b.input]
        .into_iter()
        .flatten()
        .flat_map(|p| literal_variants(&p.pattern))
        .map(|text| {
            Some(if text.starts_with('/') {
                CallInput::Path(text)
            } else {
                CallInput::Command(text)
            })
        })
        .collect();
    if inputs.is_empty() {
        inputs.push(None);
    }
    let mut out = Vec::with_capacity(dirs.len() * inputs.len());
    for d in &dirs {
        for i in &inputs {
            out.push(CallFacts {
                runtime: runtime.clone(),
                machine: Some(machine.to_owned()),
                directory: d.clone(),
                tool: tool.clone(),
                input: i.clone(),
            });
        }
    }
    out
}

/// A glob's literal readings: each wildcard (`*`, `**`, `?`) as nothing and as a word, escapes
/// resolved. A regular expression is read as its text.
fn literal_variants(pattern: &str) -> Vec<String> {
    let mut empty = String::new();
    let mut word = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                while chars.peek() == Some(&'*') {
                    chars.next();
                }
                word.push('x');
            }
            '?' => {
                empty.push('x');
                word.push('x');
            }
            '\\' => {
                if let Some(n) = chars.next() {
                    empty.push(n);
                    word.push(n);
                }
            }
            c => {
                empty.push(c);
                word.push(c);
            }
        }
    }
    if empty == word {
        vec![empty]
    } else {
        vec![empty, word]
    }
}

/// A runtime's name for people.
fn runtime_name(runtime: &str) -> &str {
    match runtime {
        "claude-code" => "Claude Code",
        "codex" => "Codex",
        "gemini" => "Gemini CLI",
        "hermes" => "Hermes",
        "openclaw" => "OpenClaw",
        "opencode" => "OpenCode",
        "copilot" => "Copilot CLI",
        other => other,
    }
}

/// A rule's match in a line, for people.
pub fn describe(m: &RuleMatch) -> String {
    let mut parts = Vec::new();
    match (&m.tool, &m.input) {
        (Some(t), Some(p)) => parts.push(format!("{t} `{}`", p.pattern)),
        (Some(t), None) => parts.push(format!("every {t} call")),
        (None, Some(p)) => parts.push(format!("`{}`", p.pattern)),
        (None, None) => parts.push("every call".into()),
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

fn well_formed_id(id: &str) -> bool {
    id.strip_prefix("rul_").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A glob over a command or text as an anchored regex: `*` and `?` are `wildcard` (any run,
/// one), `\` escapes, everything else is itself.
fn glob_regex(pattern: &str, wildcard: &str) -> Result<Regex, String> {
    let mut re = String::from("^");
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '*' => {
                re.push_str(wildcard);
                re.push('*');
            }
            '?' => re.push_str(wildcard),
            '\\' => match chars.next() {
                Some(n) => re.push_str(&regex::escape(&n.to_string())),
                None => return Err("`match.input.pattern` ends with a lone `\\`".into()),
            },
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    RegexBuilder::new(&re)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| format!("`match.input.pattern`: {e}"))
}

fn path_glob(pattern: &str) -> Result<GlobMatcher, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("`{}` is not a glob: {e}", clip(pattern, 80)))
}

fn trim_slash(p: &str) -> &str {
    if p.len() > 1 {
        p.trim_end_matches('/')
    } else {
        p
    }
}

/// An absolute path with no `.`, `..` or empty component: what it says is where it is.
fn plain_absolute(p: &str) -> bool {
    p.starts_with('/')
        && (p == "/"
            || p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != ".."))
}

/// An absolute path with `.`, `..` and empty components resolved as the kernel would without
/// links; `None` when it is not absolute.
fn normalized(p: &str) -> Option<String> {
    if !p.starts_with('/') {
        return None;
    }
    let mut out: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    Some(format!("/{}", out.join("/")))
}

/// The commands a shell line runs one after another or together: split at `;`, `&`, `|` and
/// newlines (a deny rule is tried on each).
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    text.split([';', '&', '|', '\n', '\r'])
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(answer: RuleAnswer, m: RuleMatch) -> RuleSpec {
        RuleSpec {
            matches: m,
            answer,
            expires_at: None,
            note: None,
            allow_risky: false,
        }
    }

    fn glob(p: &str) -> Option<InputPattern> {
        Some(InputPattern {
            kind: PatternKind::Glob,
            pattern: p.into(),
        })
    }

    fn live(id: &str, s: RuleSpec, created_at: i64, expires_at: i64) -> LiveRule {
        LiveRule {
            matcher: Matcher::new(&s).unwrap(),
            row: RuleRow {
                id: id.into(),
                owner_id: "usr_a".into(),
                device_id: "dev_1".into(),
                command_id: "c".into(),
                spec: serde_json::to_value(&s).unwrap(),
                digest: "sha256:x".into(),
                answer: s.answer,
                created_at,
                expires_at,
                revoked_at: None,
                revoked_by: None,
                uses: 0,
                last_used_at: None,
            },
        }
    }

    fn bash(cmd: &str, dir: &str) -> CallFacts {
        CallFacts {
            runtime: Some("claude-code".into()),
            machine: Some("laptop".into()),
            directory: Some(dir.into()),
            tool: Some("Bash".into()),
            input: Some(CallInput::Command(cmd.into())),
        }
    }

    fn npm_test(answer: RuleAnswer, pattern: &str) -> Matcher {
        Matcher::new(&spec(
            answer,
            RuleMatch {
                tool: Some("Bash".into()),
                directory: Some("/home/alice/src/shop".into()),
                input: glob(pattern),
                ..RuleMatch::default()
            },
        ))
        .unwrap()
    }

    #[test]
    fn an_allow_rule_matches_its_command_in_its_directory_and_nothing_around_it() {
        let m = npm_test(RuleAnswer::Allow, "npm test *");
        assert!(m.matches(&bash("npm test --watch", "/home/alice/src/shop")));
        assert!(m.matches(&bash("npm test -- a", "/home/alice/src/shop/web")));
        for (cmd, dir) in [
            ("npm test; rm -rf ~", "/home/alice/src/shop"),
            ("npm test && curl x | sh", "/home/alice/src/shop"),
            ("npm test $(rm -rf ~)", "/home/alice/src/shop"),
            ("npm test --watch", "/home/alice/src/shopping"),
            ("npm test --watch", "/home/alice/src/shop/../../.ssh"),
            ("npm test --watch", "/home/alice/src"),
        ] {
            assert!(!m.matches(&bash(cmd, dir)), "{cmd} in {dir}");
        }
        let mut other = bash("npm test --watch", "/home/alice/src/shop");
        other.tool = Some("Write".into());
        assert!(!m.matches(&other), "another tool");
        other.tool = None;
        assert!(!m.matches(&other), "no tool");
        let mut nowhere = bash("npm test --watch", "/");
        nowhere.directory = None;
        assert!(!m.matches(&nowhere), "a directory it cannot see");
    }

    #[test]
    fn a_deny_rule_reads_broadly_piece_by_piece_and_through_dotdot() {
        let m = Matcher::new(&spec(
            RuleAnswer::Deny,
            RuleMatch {
                tool: Some("bash".into()),
                input: glob("rm *"),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        assert!(m.matches(&bash("npm test && rm -rf build", "/x")));
        assert!(m.matches(&bash("rm a; echo $(b)", "/x")));
        assert!(!m.matches(&bash("npm test", "/x")));
        let secrets = Matcher::new(&spec(
            RuleAnswer::Deny,
            RuleMatch {
                input: glob("/home/alice/.ssh/**"),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        let read = |p: &str| CallFacts {
            tool: Some("Read".into()),
            input: Some(CallInput::Path(p.into())),
            ..CallFacts::default()
        };
        assert!(secrets.matches(&read("/home/alice/src/../.ssh/id_ed25519")));
        assert!(!secrets.matches(&read("/home/alice/src/app.rs")));
    }

    #[test]
    fn a_path_glob_stays_in_its_directory_unless_it_says_so() {
        let m = Matcher::new(&spec(
            RuleAnswer::Allow,
            RuleMatch {
                tool: Some("Write".into()),
                input: glob("/home/alice/src/shop/*.md"),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        let write = |p: &str| CallFacts {
            tool: Some("Write".into()),
            input: Some(CallInput::Path(p.into())),
            ..CallFacts::default()
        };
        assert!(m.matches(&write("/home/alice/src/shop/README.md")));
        assert!(!m.matches(&write("/home/alice/src/shop/docs/a.md")));
        assert!(!m.matches(&write("/home/alice/src/shop/../../x.md")));
    }

    #[test]
    fn bad_patterns_and_relative_directories_are_refused_with_what_to_do() {
        let bad = |m: RuleMatch| Matcher::new(&spec(RuleAnswer::Allow, m)).unwrap_err();
        let e = bad(RuleMatch {
            input: Some(InputPattern {
                kind: PatternKind::Regex,
                pattern: "npm (test".into(),
            }),
            ..RuleMatch::default()
        });
        assert!(e.contains("not a regular expression"), "{e}");
        let e = bad(RuleMatch {
            directory: Some("~/src/shop".into()),
            ..RuleMatch::default()
        });
        assert!(e.contains("absolute"), "{e}");
    }

    #[test]
    fn the_tool_and_runtime_match_in_any_case_and_a_regex_matches_whole() {
        let m = Matcher::new(&spec(
            RuleAnswer::Allow,
            RuleMatch {
                runtime: Some("Claude-Code".into()),
                tool: Some("BASH".into()),
                input: Some(InputPattern {
                    kind: PatternKind::Regex,
                    pattern: "cargo (test|build)".into(),
                }),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        assert!(m.matches(&bash("cargo test", "/x")));
        assert!(!m.matches(&bash("cargo test && cargo publish", "/x")));
        let mut codex = bash("cargo test", "/x");
        codex.runtime = Some("codex".into());
        assert!(!m.matches(&codex));
    }

    /// The first recorded frame of `file` whose text holds `needle`, as JSON.
    fn recorded(file: &str, needle: &str) -> Value {
        let path = format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let line = text
            .lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in {path}"));
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn facts_are_read_from_each_runtimes_recorded_intents() {
        // Claude Code 2.1.328's `PermissionRequest`, as the hook makes it an intent; its
        // `cwd` rides beside it (`RequestApproval::cwd`).
        let hook: Value = serde_json::from_str(include_str!(
            "../../waymark-server/tests/fixtures/claude-code/permission_request.json"
        ))
        .unwrap();
        let f = intent_facts(
            &serde_json::json!({"tool": hook["tool_name"], "input": hook["tool_input"]}),
        );
        assert_eq!(f.tool.as_deref(), Some("Bash"));
        assert_eq!(
            f.input,
            Some(CallInput::Command("rm -rf node_modules".into()))
        );
        assert_eq!(f.directory, None);

        // Codex 0.169: a command, unwrapped from its `bash -lc`, in the directory it names.
        let frame = recorded(
            "waymark-adapters/fixtures/codex/real/codex-0.169.0-turn-two.recording.jsonl",
            "item/commandExecution/requestApproval",
        );
        let m = &frame["message"];
        let f = intent_facts(&serde_json::json!({"method": m["method"], "params": m["params"]}));
        assert_eq!(f.tool.as_deref(), Some("commandExecution"));
        assert_eq!(
            f.input,
            Some(CallInput::Command("touch /tmp/.tmpVshMnX/declined".into()))
        );
        assert_eq!(f.directory.as_deref(), Some("/tmp/.tmpxh9zOP/work"));

        // Codex: a file change names no path itself; its item does.
        let file = "waymark-adapters/fixtures/codex/real/codex-0.169.0-patch-one.recording.jsonl";
        let ask = recorded(file, "item/fileChange/requestApproval");
        let item = recorded(file, "\"type\":\"fileChange\"");
        let f = intent_facts(&serde_json::json!({
            "method": ask["message"]["method"],
            "params": ask["message"]["params"],
            "item": item["message"]["params"]["item"],
        }));
        assert_eq!(f.tool.as_deref(), Some("fileChange"));
        assert_eq!(
            f.input,
            Some(CallInput::Path("/tmp/.tmpuXU3L5/approved.txt".into()))
        );

        // ACP: Gemini CLI 0.61 sends no raw input — its title is the command, and it states the
        // directory in the call's content.
        let gemini = recorded(
            "waymark-adapters/fixtures/acp/real/gemini-0.61.0-approve.out.jsonl",
            "session/request_permission",
        );
        let f = intent_facts(&gemini["params"]);
        assert_eq!(f.tool.as_deref(), Some("execute"));
        assert_eq!(
            f.input,
            Some(CallInput::Command("touch /tmp/.tmptt9d19/approved".into()))
        );
        assert_eq!(f.directory.as_deref(), Some("/tmp/.tmpFk7dRk/work"));
        // Hermes 0.19 wraps its command in `sh -c`.
        let hermes = recorded(
            "waymark-adapters/fixtures/acp/real/hermes-0.19.0-approve.out.jsonl",
            "session/request_permission",
        );
        let f = intent_facts(&hermes["params"]);
        assert_eq!(
            f.input,
            Some(CallInput::Command("touch /tmp/.tmpnzJ40v/approved".into()))
        );
        // OpenCode 1.18 sends its raw input.
        let opencode = recorded(
            "waymark-adapters/fixtures/opencode/real/opencode-1.18.33.jsonl",
            "session/request_permission",
        );
        let f = intent_facts(&opencode["message"]["params"]);
        assert_eq!(
            (f.tool.as_deref(), f.input),
            (
                Some("execute"),
                Some(CallInput::Command("touch /tmp/oc/work/approve".into()))
            )
        );

        // OpenClaw 2026.9.6's exec approval, as its adapter makes it an intent.
        let ev = recorded(
            "waymark-adapters/fixtures/openclaw/real/openclaw-2026.9.6.jsonl",
            "\"event\": \"exec.approval.requested\"",
        );
        let f = intent_facts(&serde_json::json!({
            "runtime": "openclaw",
            "approval": "exec",
            "id": ev["frame"]["payload"]["id"],
            "request": ev["frame"]["payload"]["request"],
        }));
        assert_eq!(f.tool.as_deref(), Some("exec"));
        assert_eq!(
            f.input,
            Some(CallInput::Command("touch /tmp/ocx/work/touched".into()))
        );
        assert_eq!(f.directory.as_deref(), Some("/tmp/ocx/work"));
    }

    // --- properties -------------------------------------------------------------------------

    /// Commands made of words and the characters that matter to a shell.
    fn command() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-z]{1,6}",
                Just(" ".to_owned()),
                Just("-".to_owned()),
                Just(";".to_owned()),
                Just("&&".to_owned()),
                Just("|".to_owned()),
                Just("$(".to_owned()),
                Just(")".to_owned()),
                Just("`".to_owned()),
                Just(">".to_owned()),
                Just("*".to_owned()),
                Just("\n".to_owned()),
            ],
            0..12,
        )
        .prop_map(|v| v.concat())
    }

    /// Globs made of words, spaces and wildcards.
    fn pattern() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                "[a-z]{1,4}",
                Just(" ".to_owned()),
                Just("*".to_owned()),
                Just("?".to_owned()),
            ],
            1..6,
        )
        .prop_map(|v| v.concat())
    }

    fn answer() -> impl Strategy<Value = RuleAnswer> {
        prop_oneof![Just(RuleAnswer::Allow), Just(RuleAnswer::Deny)]
    }

    fn shell_control(c: char) -> bool {
        ";&|<>$`()\n\r".contains(c)
    }

    proptest! {
        /// No allow rule allows more than its pattern: what it matches, the plain reading of
        /// the glob matches too, and a shell control character in the command is one the
        /// pattern itself holds — a wildcard never supplies it.
        #[test]
        fn no_allow_rule_allows_more_than_its_pattern(p in pattern(), cmd in command()) {
            let m = Matcher::new(&spec(RuleAnswer::Allow, RuleMatch {
                tool: Some("Bash".into()),
                input: glob(&p),
                ..RuleMatch::default()
            })).unwrap();
            if m.matches(&bash(&cmd, "/x")) {
                prop_assert!(glob_regex(&p, ANY).unwrap().is_match(&cmd));
                prop_assert!(cmd.chars().filter(|c| shell_control(*c)).all(|c| p.contains(c)));
            }
            // A pattern without wildcards allows exactly itself.
            let literal = p.replace(['*', '?'], "");
            if !literal.is_empty() {
                let m = Matcher::new(&spec(RuleAnswer::Allow, RuleMatch {
                    input: glob(&literal),
                    tool: Some("Bash".into()),
                    ..RuleMatch::default()
                })).unwrap();
                prop_assert_eq!(m.matches(&bash(&cmd, "/x")), cmd == literal);
            }
        }

        /// A rule that names a directory matches only calls in it or under it, never one whose
        /// path says `..`.
        #[test]
        fn an_allow_rule_stays_in_its_directory(
            base in "(/[a-z]{1,3}){1,3}",
            dir in "(/[a-z.]{1,3}){0,5}",
        ) {
            let m = Matcher::new(&spec(RuleAnswer::Allow, RuleMatch {
                tool: Some("Bash".into()),
                directory: Some(base.clone()),
                ..RuleMatch::default()
            })).unwrap();
            let dir = if dir.is_empty() { "/".to_owned() } else { dir };
            if m.matches(&bash("ls", &dir)) {
                let under = format!("{}/", base);
                prop_assert!(dir == base || dir.starts_with(&under));
                prop_assert!(plain_absolute(&dir));
            }
        }

        /// An expired or revoked rule — or one not yet made — answers nothing, allow or deny.
        #[test]
        fn an_expired_or_revoked_rule_answers_nothing(
            a in answer(),
            cmd in command(),
            created in 0i64..100,
            life in 1i64..100,
            later in 0i64..100,
            revoked in any::<bool>(),
        ) {
            let mut r = live("rul_1", spec(a, RuleMatch {
                tool: Some("Bash".into()),
                ..RuleMatch::default()
            }), created, created + life);
            if revoked {
                r.row.revoked_at = Some(created);
            }
            let now = created + life + later;
            let rules = [r];
            prop_assert!(ruling(&rules, &bash(&cmd, "/x"), false, now).is_none());
            if revoked {
                prop_assert!(ruling(&rules, &bash(&cmd, "/x"), false, created).is_none());
            } else {
                // Alive, the same rule answers: the test above is not vacuous.
                prop_assert!(ruling(&rules, &bash(&cmd, "/x"), false, created).is_some());
            }
            prop_assert!(ruling(&rules, &bash(&cmd, "/x"), false, created - 1).is_none());
        }

        /// Deny beats allow: whenever a live deny rule matches, the ruling is a deny, whatever
        /// allow rules match too and in whatever order they are listed.
        #[test]
        fn deny_beats_allow(
            answers in proptest::collection::vec(answer(), 1..6),
            pats in proptest::collection::vec(pattern(), 6),
            cmd in command(),
            risky in any::<bool>(),
        ) {
            let rules: Vec<LiveRule> = answers.iter().zip(&pats).enumerate().map(|(i, (a, p))| {
                live(&format!("rul_{i}"), spec(*a, RuleMatch {
                    tool: Some("Bash".into()),
                    input: glob(p),
                    ..RuleMatch::default()
                }), 0, 100)
            }).collect();
            let facts = bash(&cmd, "/x");
            let deny_matches = rules.iter().any(|r| r.row.answer == RuleAnswer::Deny && r.matcher.matches(&facts));
            match ruling(&rules, &facts, risky, 50) {
                Some(r) if deny_matches => prop_assert_eq!(r.row.answer, RuleAnswer::Deny),
                Some(r) => {
                    prop_assert_eq!(r.row.answer, RuleAnswer::Allow);
                    prop_assert!(r.matcher.matches(&facts));
                    prop_assert!(!risky, "no rule here allows risky calls");
                }
                None => prop_assert!(!deny_matches),
            }
        }
    }

    #[test]
    fn a_risky_call_is_allowed_only_by_a_rule_that_allows_risky_calls() {
        let mut s = spec(
            RuleAnswer::Allow,
            RuleMatch {
                tool: Some("Bash".into()),
                input: glob("rm -rf build"),
                ..RuleMatch::default()
            },
        );
        let plain = [live("rul_1", s.clone(), 0, 100)];
        let call = bash("rm -rf build", "/x");
        assert!(ruling(&plain, &call, false, 1).is_some());
        assert!(ruling(&plain, &call, true, 1).is_none());
        s.allow_risky = true;
        let risky = [live("rul_2", s, 0, 100)];
        assert!(ruling(&risky, &call, true, 1).is_some());
    }

    fn own(effect: OwnEffect, text: &str, m: RuleMatch) -> RuntimeRule {
        RuntimeRule {
            runtime: "claude-code".into(),
            source: "/home/alice/.claude/settings.json".into(),
            text: text.into(),
            effect,
            matches: RuleMatch {
                runtime: Some("claude-code".into()),
                ..m
            },
        }
    }

    fn claude_bash(effect: OwnEffect, prefix: &str) -> RuntimeRule {
        own(
            effect,
            &format!("Bash({prefix}:*)"),
            RuleMatch {
                tool: Some("Bash".into()),
                input: glob(&format!("{prefix}*")),
                ..RuleMatch::default()
            },
        )
    }

    #[test]
    fn a_deny_rule_under_a_runtimes_allow_rule_is_named_and_nothing_else_is() {
        let deny = npm_test(RuleAnswer::Deny, "npm test*");
        let allow = npm_test(RuleAnswer::Allow, "npm test*");
        let says = conflict(&deny, &claude_bash(OwnEffect::Allow, "npm"), "laptop").unwrap();
        assert!(
            says.contains("Claude Code on laptop runs these calls without asking"),
            "{says}"
        );
        assert!(says.contains("`Bash(npm:*)`"), "{says}");
        // The same answer, an ask, another tool, another runtime or machine: nothing to name.
        assert_eq!(
            conflict(&allow, &claude_bash(OwnEffect::Allow, "npm"), "laptop"),
            None
        );
        assert_eq!(
            conflict(&deny, &claude_bash(OwnEffect::Ask, "npm"), "laptop"),
            None
        );
        assert_eq!(
            conflict(&deny, &claude_bash(OwnEffect::Allow, "cargo"), "laptop"),
            None
        );
        let mut read = claude_bash(OwnEffect::Allow, "npm");
        read.matches.tool = Some("Read".into());
        assert_eq!(conflict(&deny, &read, "laptop"), None);
        let mut codex = claude_bash(OwnEffect::Allow, "npm");
        codex.runtime = "codex".into();
        codex.matches.runtime = Some("codex".into());
        let only_claude = Matcher::new(&spec(
            RuleAnswer::Deny,
            RuleMatch {
                runtime: Some("claude-code".into()),
                tool: Some("Bash".into()),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        assert_eq!(conflict(&only_claude, &codex, "laptop"), None);
        let on_desk = Matcher::new(&spec(
            RuleAnswer::Deny,
            RuleMatch {
                machine: Some("desk".into()),
                ..RuleMatch::default()
            },
        ))
        .unwrap();
        assert_eq!(
            conflict(&on_desk, &claude_bash(OwnEffect::Allow, "npm"), "laptop"),
            None
        );
        assert!(conflict(&on_desk, &claude_bash(OwnEffect::Allow, "npm"), "desk").is_some());
    }

    #[test]
    fn an_allow_rule_over_calls_a_runtime_refuses_is_named() {
        let allow = npm_test(RuleAnswer::Allow, "npm test*");
        let says = conflict(&allow, &claude_bash(OwnEffect::Deny, "npm test"), "laptop").unwrap();
        assert!(says.contains("refuses these calls before asking"), "{says}");
        // A runtime that allows everything everywhere (a mode) against a narrow deny rule.
        let mode = own(
            OwnEffect::Allow,
            "defaultMode: bypassPermissions",
            RuleMatch::default(),
        );
        let deny = npm_test(RuleAnswer::Deny, "rm -rf *");
        assert!(conflict(&deny, &mode, "laptop").is_some());
    }

    #[test]
    fn directories_meet_only_when_one_holds_the_other() {
        let deny = npm_test(RuleAnswer::Deny, "npm test*"); // in /home/alice/src/shop
        let mut elsewhere = claude_bash(OwnEffect::Allow, "npm");
        elsewhere.matches.directory = Some("/home/alice/src/blog".into());
        assert_eq!(conflict(&deny, &elsewhere, "laptop"), None);
        let mut above = claude_bash(OwnEffect::Allow, "npm");
        above.matches.directory = Some("/home/alice/src".into());
        assert!(conflict(&deny, &above, "laptop").is_some());
        let mut below = claude_bash(OwnEffect::Allow, "npm");
        below.matches.directory = Some("/home/alice/src/shop/web".into());
        assert!(conflict(&deny, &below, "laptop").is_some());
    }

    #[test]
    fn a_runners_report_of_runtime_rules_is_checked() {
        let good = claude_bash(OwnEffect::Allow, "npm");
        let mut ok = vec![good.clone()];
        assert!(check_runtime_rules(&mut ok).is_ok());
        assert_eq!(ok[0], good, "a good rule is kept as it is");
        let mut other = good.clone();
        other.matches.runtime = Some("codex".into());
        assert!(check_runtime_rules(&mut [other]).is_err());
        let mut empty = good.clone();
        empty.text = " ".into();
        assert!(check_runtime_rules(&mut [empty]).is_err());
        assert!(check_runtime_rules(&mut vec![good.clone(); RUNTIME_RULES_MAX + 1]).is_err());
        // What a person's file may hold is kept: a pattern Waymark cannot compile is listed as
        // such and matches nothing in particular; a long text is clipped.
        let mut odd = good.clone();
        odd.matches.directory = Some("src".into());
        odd.text = "é".repeat(600);
        let mut kept = vec![odd];
        assert!(check_runtime_rules(&mut kept).is_ok());
        assert_eq!(kept[0].effect, OwnEffect::Ask);
        assert_eq!(kept[0].matches.directory, None);
        assert!(kept[0].text.chars().count() <= MAX_TEXT + 1);
        let mut lone = good;
        lone.matches.input = glob("npm \\");
        let mut kept = vec![lone];
        check_runtime_rules(&mut kept).unwrap();
        assert!(kept[0].text.contains("(not matched:"), "{}", kept[0].text);
    }
}
