//! The read-only mirror of Hermes' session store: sessions become tasks, messages become the
//! task's messages (incrementally), assistant tool calls paired with their `role='tool'` rows
//! become effects with the output as receipt, lineage becomes a note on the child, and a
//! session's end finishes its attempt.
//!
//! What was mirrored is remembered in a small state file (per database, per session: the last
//! Hermes message id mirrored and the end recorded), written after every session's batch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use waymark_proto::{CheckpointBody, FinishOutcome, NewMessage};
use waymark_worker::{Client, EffectCtx, ProviderError, ProviderStatus, Reconciler, Run};

use super::HermesError;
use super::store::{HermesDb, MessageRow, SessionRow, ToolCall};
use crate::bridge::{self, SessionSpec};

/// End reasons after which Hermes can resume the session (`_RECOVERABLE_END_REASONS`).
const RECOVERABLE: &[&str] = &[
    "agent_close",
    "ws_orphan_reap",
    "superseded_by_resume",
    "startup_orphan_reap",
];
/// Deliberate conversation boundaries (`_BOUNDARY_END_REASONS`).
const BOUNDARY: &[&str] = &[
    "session_reset",
    "session_switch",
    "idle",
    "daily",
    "suspended",
    "resume_pending_expired",
    "new_session",
];
/// Longest message text recorded (the control plane takes up to 1 MiB).
const MAX_TEXT: usize = 256 * 1024;
/// Longest tool output kept in a receipt.
const MAX_RECEIPT: usize = 64 * 1024;
/// Messages per append.
const BATCH: usize = 200;

/// What the mirror remembers of one session.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Mark {
    /// The task it became.
    pub(crate) task_id: String,
    /// The last Hermes message id mirrored.
    pub(crate) last_message_id: i64,
    /// `end_reason@ended_at` of the end already recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ended: Option<String>,
}

/// The state file: per database path, per session id.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StateFile {
    version: u32,
    databases: BTreeMap<String, BTreeMap<String, Mark>>,
}

/// The mirror's memory, kept in a file.
#[derive(Debug)]
pub(crate) struct State {
    path: PathBuf,
    db: String,
    file: StateFile,
}

impl State {
    pub(crate) fn load(path: &Path, db: &Path) -> Result<State, HermesError> {
        let file = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| HermesError::StateFile {
                path: path.display().to_string(),
                reason: format!("not a mirror state file ({e}); move it away to start over"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => StateFile {
                version: 1,
                ..StateFile::default()
            },
            Err(e) => {
                return Err(HermesError::StateFile {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                });
            }
        };
        Ok(State {
            path: path.to_owned(),
            db: db.display().to_string(),
            file,
        })
    }

    fn get(&self, session: &str) -> Option<&Mark> {
        self.file.databases.get(&self.db)?.get(session)
    }

    /// Records `mark` and writes the file (a temporary file renamed over it).
    fn put(&mut self, session: &str, mark: Mark) -> Result<(), HermesError> {
        self.file
            .databases
            .entry(self.db.clone())
            .or_default()
            .insert(session.to_owned(), mark);
        let err = |e: std::io::Error| HermesError::StateFile {
            path: self.path.display().to_string(),
            reason: e.to_string(),
        };
        if let Some(dir) = self.path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(&self.file).expect("the state serialises");
        std::fs::write(&tmp, bytes).map_err(err)?;
        std::fs::rename(&tmp, &self.path).map_err(err)
    }
}

/// A tool call's answer as Hermes stored it.
struct Stored(Option<Value>);

impl Reconciler for Stored {
    async fn query(&self, _ctx: &EffectCtx) -> ProviderStatus {
        match &self.0 {
            Some(receipt) => ProviderStatus::Confirmed(receipt.clone()),
            None => ProviderStatus::Unknown {
                reason: "the Hermes session ended without a result for this tool call".into(),
            },
        }
    }
}

/// Mirrors sessions into tasks.
pub(crate) struct Mirror {
    client: Client,
    worker: String,
    db: HermesDb,
    state: State,
    /// Attempts kept open across passes (`--follow`), by session id.
    runs: HashMap<String, Run>,
    keep_open: bool,
    /// Sessions the control plane refuses (e.g. a person cancelled the task).
    refused: HashSet<String>,
}

impl Mirror {
    pub(crate) fn new(
        client: Client,
        worker: String,
        db: HermesDb,
        state: State,
        keep_open: bool,
    ) -> Mirror {
        Mirror {
            client,
            worker,
            db,
            state,
            runs: HashMap::new(),
            keep_open,
            refused: HashSet::new(),
        }
    }

    /// One pass over every session. A session the control plane refuses is skipped (and
    /// logged); a database that cannot be read fails the pass.
    pub(crate) async fn pass(&mut self) -> Result<(), HermesError> {
        let sessions = self.db.sessions().await?;
        for s in &sessions {
            if self.refused.contains(&s.id) {
                continue;
            }
            match self.session(s, &sessions).await {
                Ok(()) => {}
                // Unreachable, or the attempt's lease ran out meanwhile: the next pass tries
                // again (a new attempt), from what the state file says was mirrored.
                Err(HermesError::ControlPlane(e)) if passing(&e) => {
                    return Err(HermesError::ControlPlane(e));
                }
                Err(HermesError::ControlPlane(e)) => {
                    tracing::warn!(session = %s.id, error = %e, "the control plane refused this session; it is no longer mirrored");
                    self.refused.insert(s.id.clone());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Releases the attempts kept open: the sessions go on in Hermes, unmirrored for now.
    pub(crate) async fn release(&mut self) {
        for (id, run) in self.runs.drain() {
            let summary = format!("the mirror stopped; Hermes session `{id}` is still open");
            if let Err(e) = run.finish(FinishOutcome::Released, Some(summary)).await {
                tracing::warn!(session = %id, error = %e, "releasing the attempt failed");
            }
        }
    }

    pub(crate) async fn close(mut self) {
        self.release().await;
        self.db.close().await;
    }

    async fn session(&mut self, s: &SessionRow, all: &[SessionRow]) -> Result<(), HermesError> {
        let mark = self.state.get(&s.id).cloned();
        let last = mark.as_ref().map_or(0, |m| m.last_message_id);
        let new = self.db.messages_after(&s.id, last).await?;
        let ended = s
            .ended_at
            .map(|t| format!("{}@{t}", s.end_reason.as_deref().unwrap_or("")));
        let end_is_new = ended.is_some() && mark.as_ref().and_then(|m| m.ended.clone()) != ended;
        if mark.is_some() && new.is_empty() && !end_is_new {
            return Ok(());
        }
        let run = match self.runs.remove(&s.id) {
            Some(run) => run,
            None => {
                let spec = SessionSpec {
                    runtime: "hermes".into(),
                    key: s.id.clone(),
                    title: title_of(s),
                    goal: goal_of(s),
                };
                bridge::attach(&self.client, &spec, &self.worker, Duration::from_secs(45)).await?
            }
        };
        let mut live = Live::default();
        let mut mark = match mark {
            Some(m) => m,
            None => {
                // First sight. The live adapter (`waymark adapters hermes acp`) may have made
                // this task already: what it recorded is not recorded twice.
                live = Live::of(&self.client.task(run.task_id()).await?);
                if live.tool_calls > 0 || !live.messages.is_empty() {
                    tracing::info!(session = %s.id, task = %run.task_id(), tool_calls = live.tool_calls, messages = live.messages.len(), "the live adapter recorded part of this session; the mirror adds the rest");
                }
                // Where the session comes from, once.
                if let Some(note) = lineage(s, all) {
                    run.messages(vec![NewMessage {
                        role: "system".into(),
                        text: note,
                    }])
                    .await?;
                }
                let m = Mark {
                    task_id: run.task_id().to_owned(),
                    ..Mark::default()
                };
                self.state.put(&s.id, m.clone())?;
                m
            }
        };
        if !new.is_empty() {
            // Effects first: repeating one is harmless, so a failure here leaves nothing to
            // duplicate on the next pass.
            let calls = self.db.tool_calls(&s.id).await?;
            // The live adapter's effects are the session's first tool calls, in order (Hermes
            // announces each call over ACP as it starts it, under an id of its own).
            for m in new
                .iter()
                .filter(|m| m.role == "tool")
                .skip(live.tool_calls)
            {
                if let Some(call_id) = &m.tool_call_id {
                    record_effect(&run, &s.id, call_id, calls.get(call_id), Some(m)).await?;
                }
            }
            let texts: Vec<NewMessage> = new
                .iter()
                .filter_map(message_of)
                .filter(|m| !live.take(m))
                .collect();
            for batch in texts.chunks(BATCH) {
                run.messages(batch.to_vec()).await?;
            }
            mark.last_message_id = new.last().map_or(last, |m| m.id);
            self.state.put(&s.id, mark.clone())?;
        }
        if end_is_new {
            // A call the session never answered: nobody can say whether it ran.
            let calls = self.db.tool_calls(&s.id).await?;
            let answered = self.db.answered_calls(&s.id).await?;
            for (call_id, call) in calls.iter().filter(|(id, _)| !answered.contains(*id)) {
                record_effect(&run, &s.id, call_id, Some(call), None).await?;
            }
            let reason = s.end_reason.clone().unwrap_or_default();
            if reason == "compression" {
                let child = all
                    .iter()
                    .find(|c| c.parent_session_id.as_deref() == Some(&s.id))
                    .map_or("a child session".to_owned(), |c| {
                        format!("Hermes session `{}`", c.id)
                    });
                run.checkpoint(CheckpointBody {
                    reason: "compaction".into(),
                    plan_revision: run.plan_revision(),
                    summary: Some(format!(
                        "Hermes compressed the context; the conversation continues in {child}"
                    )),
                    ..CheckpointBody::default()
                })
                .await?;
            }
            let (outcome, summary) = end_of(&reason);
            run.finish(outcome, Some(summary)).await?;
            mark.ended = ended;
            self.state.put(&s.id, mark)?;
        } else if self.keep_open {
            self.runs.insert(s.id.clone(), run);
        } else {
            run.finish(
                FinishOutcome::Released,
                Some(format!(
                    "mirrored through Hermes message {}; the session is still open",
                    mark.last_message_id
                )),
            )
            .await?;
        }
        Ok(())
    }
}

/// What the live ACP adapter already recorded on a session's task.
#[derive(Debug, Default)]
struct Live {
    /// (role, trimmed text) of its messages, each matched once.
    messages: Vec<(String, String)>,
    /// The tool calls it recorded as effects (kind `tool_call:…`).
    tool_calls: usize,
}

impl Live {
    fn of(detail: &waymark_proto::TaskDetail) -> Live {
        Live {
            messages: detail
                .messages
                .iter()
                .map(|m| (m.role.clone(), m.text.trim().to_owned()))
                .collect(),
            tool_calls: detail
                .effects
                .iter()
                .filter(|e| e.kind.starts_with("tool_call:"))
                .count(),
        }
    }

    /// Whether `m` is one the live adapter recorded (and forgets that one).
    fn take(&mut self, m: &NewMessage) -> bool {
        let text = m.text.trim();
        match self
            .messages
            .iter()
            .position(|(r, t)| *r == m.role && t == text)
        {
            Some(i) => {
                self.messages.remove(i);
                true
            }
            None => false,
        }
    }
}

/// A control-plane failure that a later pass may not meet: the server was away, or the
/// attempt's lease ran out between passes.
fn passing(e: &waymark_worker::Error) -> bool {
    use waymark_worker::Error;
    match e {
        Error::Unreachable { .. } | Error::Transport(_) | Error::LeaseLost { .. } => true,
        Error::Refused { problem } => problem.code == waymark_proto::ErrorCode::Unavailable,
        _ => false,
    }
}

/// Declares the effect of one tool call and records its result: the tool row's output
/// (`confirmed`), or `unknown` when the session ended without one.
async fn record_effect(
    run: &Run,
    session: &str,
    call_id: &str,
    call: Option<&ToolCall>,
    result: Option<&MessageRow>,
) -> Result<(), HermesError> {
    let tool = call
        .map(|c| c.name.clone())
        .or_else(|| result.and_then(|r| r.tool_name.clone()))
        .unwrap_or_else(|| "tool".into());
    let intent = json!({
        "call_id": call_id,
        "tool": tool,
        "arguments": call.map(|c| c.arguments.clone()),
    });
    let receipt = result.map(|r| {
        json!({
            "output": r.content.as_deref().map(|c| clip(c, MAX_RECEIPT)),
            "tool_name": r.tool_name,
            "effect_disposition": r.effect_disposition,
            "message_id": r.id,
        })
    });
    let reconciler = Stored(receipt.clone());
    let res = run
        .effect(
            format!("{session}:{call_id}"),
            format!("tool:{tool}"),
            intent,
        )
        .run(&reconciler, |_ctx| async move {
            receipt.ok_or_else(|| ProviderError::Unknown {
                reason: "the Hermes session ended without a result for this tool call".into(),
            })
        })
        .await;
    match res {
        Ok(_) | Err(waymark_worker::Error::EffectUnknown { .. }) => Ok(()),
        Err(waymark_worker::Error::EffectFailed { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn title_of(s: &SessionRow) -> String {
    let t = s
        .title
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map_or_else(|| format!("Hermes session {}", s.id), str::to_owned);
    t.chars().take(200).collect()
}

fn goal_of(s: &SessionRow) -> String {
    let mut g = format!("Hermes session `{}`", s.id);
    if let Some(src) = &s.source {
        g.push_str(&format!(" from `{src}`"));
    }
    if let Some(cwd) = cwd_of(s) {
        g.push_str(&format!(" in `{cwd}`"));
    }
    g
}

/// The session's working directory: `sessions.cwd`, which Hermes 0.19 leaves NULL for ACP
/// sessions and keeps in `model_config.cwd` instead.
pub(crate) fn cwd_of(s: &SessionRow) -> Option<String> {
    s.cwd.clone().filter(|c| !c.is_empty()).or_else(|| {
        s.model_config
            .as_ref()?
            .get("cwd")?
            .as_str()
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
    })
}

/// The note recorded on a child session saying where it comes from.
pub(crate) fn lineage(s: &SessionRow, all: &[SessionRow]) -> Option<String> {
    let marker = |name: &str| {
        s.model_config
            .as_ref()
            .and_then(|c| c.get(name))
            .filter(|v| !v.is_null())
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
    };
    if let Some(from) = marker("_branched_from") {
        return Some(format!("branched from Hermes session `{from}`"));
    }
    if let Some(from) = marker("_delegate_from") {
        return Some(format!("delegated from Hermes session `{from}`"));
    }
    if let Some(from) = marker("_reset_from") {
        return Some(format!("continues Hermes session `{from}` after a reset"));
    }
    let parent_id = s.parent_session_id.as_deref()?;
    let parent = all.iter().find(|p| p.id == parent_id);
    let parent_end = parent.and_then(|p| p.end_reason.as_deref());
    Some(match parent_end {
        Some("compression") => {
            format!("continues Hermes session `{parent_id}` after compression")
        }
        Some("branched") => format!("branched from Hermes session `{parent_id}`"),
        _ if s.source.as_deref() == Some("tool") => {
            format!("a tool session of Hermes session `{parent_id}`")
        }
        _ => format!("a subagent run of Hermes session `{parent_id}`"),
    })
}

/// The attempt's end for a Hermes `end_reason`.
pub(crate) fn end_of(reason: &str) -> (FinishOutcome, String) {
    if RECOVERABLE.contains(&reason) {
        return (
            FinishOutcome::Released,
            format!("the session ended `{reason}`; Hermes can resume it"),
        );
    }
    if reason == "compression" {
        return (
            FinishOutcome::Completed,
            "the session was compressed into a child session".into(),
        );
    }
    if BOUNDARY.contains(&reason) {
        return (
            FinishOutcome::Completed,
            format!("the conversation reached a boundary (`{reason}`)"),
        );
    }
    let reason = if reason.is_empty() {
        "none given"
    } else {
        reason
    };
    (
        FinishOutcome::Completed,
        format!("the session ended (`{reason}`)"),
    )
}

/// A Hermes message as a task message; `None` for model-facing scaffolding and empty rows.
fn message_of(m: &MessageRow) -> Option<NewMessage> {
    if m.display_kind.as_deref() == Some("hidden") {
        return None;
    }
    let content = m.content.clone().unwrap_or_default();
    let text = match m.role.as_str() {
        "assistant" => {
            let mut t = content;
            for c in m
                .tool_calls
                .as_ref()
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
            {
                if let Some((id, call)) = super::store::tool_call(c) {
                    if !t.is_empty() {
                        t.push('\n');
                    }
                    t.push_str(&format!(
                        "[tool call {id}] {} {}",
                        call.name, call.arguments
                    ));
                }
            }
            t
        }
        "tool" => format!(
            "[tool result {}{}] {content}",
            m.tool_call_id.as_deref().unwrap_or("?"),
            m.tool_name
                .as_deref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default()
        ),
        _ => content,
    };
    if text.trim().is_empty() {
        return None;
    }
    let role = match m.role.trim() {
        "" => "system".to_owned(),
        r => r.chars().take(32).collect(),
    };
    Some(NewMessage {
        role,
        text: clip(&text, MAX_TEXT),
    })
}

fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… clipped from {} bytes]", &text[..end], text.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: &str, parent: Option<&str>, config: Value, end: Option<&str>) -> SessionRow {
        SessionRow {
            id: id.into(),
            source: Some("cli".into()),
            title: None,
            model_config: Some(config),
            parent_session_id: parent.map(str::to_owned),
            started_at: Some(1.0),
            ended_at: end.map(|_| 2.0),
            end_reason: end.map(str::to_owned),
            cwd: None,
        }
    }

    #[test]
    fn lineage_reads_markers_then_the_parents_end() {
        let parent = session("p", None, json!({}), Some("compression"));
        let child = session("c", Some("p"), json!({}), None);
        let branch = session("b", Some("p"), json!({"_branched_from": "p"}), None);
        let sub = session("s", Some("x"), json!({}), None);
        let all = vec![parent.clone(), child.clone(), branch.clone(), sub.clone()];
        assert_eq!(lineage(&parent, &all), None);
        assert_eq!(
            lineage(&child, &all).unwrap(),
            "continues Hermes session `p` after compression"
        );
        assert_eq!(
            lineage(&branch, &all).unwrap(),
            "branched from Hermes session `p`"
        );
        assert_eq!(
            lineage(&sub, &all).unwrap(),
            "a subagent run of Hermes session `x`"
        );
    }

    #[test]
    fn end_reasons_split_into_resumable_and_boundaries() {
        assert_eq!(end_of("agent_close").0, FinishOutcome::Released);
        assert_eq!(end_of("idle").0, FinishOutcome::Completed);
        assert_eq!(end_of("compression").0, FinishOutcome::Completed);
        assert!(end_of("").1.contains("none given"));
    }
}
