//! Codex items that change the world (commands, file changes, tool calls) as effects keyed
//! `threadId:turnId:itemId`: declared and marked under way at `item/started`, closed with a
//! receipt at `item/completed`. Codex runs the item itself; the adapter only records it.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{oneshot, watch};
use waymark_proto::{EffectRef, EffectStatus};
use waymark_worker::tree::TreeRecorder;
use waymark_worker::{EffectCtx, Error, ProviderError, ProviderStatus, Reconciler, Run};

/// How an item ended, as Codex said.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    /// Done; the receipt.
    Completed(Value),
    /// Failed or declined; why.
    Failed(String),
    /// Nobody can say (the connection closed, the turn ended without it).
    Unknown(String),
}

/// An item under way: how to tell its effect that it ended.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) done: oneshot::Sender<Outcome>,
    /// The item as `item/started` showed it.
    pub(super) item: Value,
    /// The item's effect, once declared: an approval for the item is tied to it.
    pub(super) effect: watch::Receiver<Option<String>>,
}

/// The effect kind of an item type, for the types that change something.
pub(super) fn effect_kind(item_type: &str) -> Option<&'static str> {
    match item_type {
        "commandExecution" => Some("codex.commandExecution"),
        "fileChange" => Some("codex.fileChange"),
        "mcpToolCall" => Some("codex.mcpToolCall"),
        "dynamicToolCall" => Some("codex.dynamicToolCall"),
        _ => None,
    }
}

fn sha256(text: &str) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(text.as_bytes())))
}

fn pick(item: &Value, fields: &[&str]) -> Map<String, Value> {
    fields
        .iter()
        .filter_map(|f| item.get(*f).map(|v| ((*f).to_owned(), v.clone())))
        .collect()
}

/// What the item sets out to do: only the fields Codex fixes at the start, so the same item
/// declares the same intent every time it is seen. Contents go in as digests.
pub(super) fn intent(item: &Value) -> Value {
    match item.get("type").and_then(Value::as_str) {
        Some("commandExecution") => Value::Object(pick(item, &["command", "cwd"])),
        Some("fileChange") => {
            let changes: Vec<Value> = item
                .get("changes")
                .and_then(Value::as_array)
                .map(|c| {
                    c.iter()
                        .map(|x| {
                            let mut o = pick(x, &["path", "kind"]);
                            if let Some(d) = x.get("diff").and_then(Value::as_str) {
                                o.insert("diff_sha256".into(), sha256(d).into());
                            }
                            Value::Object(o)
                        })
                        .collect()
                })
                .unwrap_or_default();
            json!({ "changes": changes })
        }
        Some("mcpToolCall") => Value::Object(pick(item, &["server", "tool", "arguments"])),
        _ => Value::Object(pick(item, &["tool", "arguments"])),
    }
}

/// How the item ended, from its `item/completed` form.
pub(super) fn outcome(item: &Value) -> Outcome {
    let status = item
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("completed");
    match status {
        "completed" => Outcome::Completed(receipt(item)),
        "declined" => {
            Outcome::Failed("declined: Codex did not run it (its approval was refused)".into())
        }
        "failed" => {
            let why = match (
                item.get("exitCode").and_then(Value::as_i64),
                item.get("error")
                    .and_then(|e| e.get("message").or(Some(e)))
                    .and_then(Value::as_str),
            ) {
                (Some(code), _) => format!("it failed with exit code {code}"),
                (None, Some(msg)) => format!("it failed: {msg}"),
                (None, None) => "Codex reported it failed".into(),
            };
            Outcome::Failed(why)
        }
        other => Outcome::Unknown(format!("Codex ended the item with status `{other}`")),
    }
}

/// The receipt: status and exit code as Codex reported them; output only as a digest.
fn receipt(item: &Value) -> Value {
    let mut r = pick(item, &["status", "exitCode", "durationMs"]);
    if let Some(out) = item.get("aggregatedOutput").and_then(Value::as_str) {
        r.insert("output_sha256".into(), sha256(out).into());
        r.insert("output_bytes".into(), out.len().into());
    }
    if let Some(changes) = item.get("changes").and_then(Value::as_array) {
        let paths: Vec<Value> = changes
            .iter()
            .filter_map(|c| c.get("path").cloned())
            .collect();
        r.insert("paths".into(), paths.into());
    }
    if let Some(result) = item.get("result").filter(|v| !v.is_null()) {
        r.insert("result_sha256".into(), sha256(&result.to_string()).into());
    }
    Value::Object(r)
}

/// Codex cannot be asked about an item of an earlier connection: an effect found under way
/// from before stays `unknown` until a person says what happened.
struct NotAnswerable;

impl Reconciler for NotAnswerable {
    fn query(&self, _ctx: &EffectCtx) -> impl Future<Output = ProviderStatus> + Send {
        std::future::ready(ProviderStatus::Unknown {
            reason: "the item was under way when the adapter lost its Codex app-server; Codex cannot be asked what became of it".into(),
        })
    }
}

/// Records one item as an effect: declared and under way now, closed when `done` says how it
/// ended. Returns the effect's id and final status for the turn's checkpoint.
pub(super) async fn record(
    run: Arc<Run>,
    key: String,
    kind: &'static str,
    intent: Value,
    done: oneshot::Receiver<Outcome>,
    tree: Option<Arc<TreeRecorder>>,
    declared: watch::Sender<Option<String>>,
) -> Option<EffectRef> {
    let res = run
        .effect(key.clone(), kind, intent)
        .run(&NotAnswerable, move |ctx| {
            let _ = declared.send(Some(ctx.effect_id.clone()));
            async move {
                match done.await {
                    Ok(Outcome::Completed(receipt)) => Ok(receipt),
                    Ok(Outcome::Failed(reason)) => Err(ProviderError::Failed {
                        compensable: false,
                        reason,
                    }),
                    Ok(Outcome::Unknown(reason)) => Err(ProviderError::Unknown { reason }),
                    Err(_) => Err(ProviderError::Unknown {
                        reason: "the adapter stopped following the item before it ended".into(),
                    }),
                }
            }
        })
        .await;
    if let Some(t) = tree {
        t.after_call(&run).await;
    }
    match res {
        Ok(done) => Some(EffectRef {
            effect_id: done.effect.id,
            status: done.effect.status,
        }),
        Err(Error::EffectFailed { effect_id, .. }) => Some(EffectRef {
            effect_id,
            status: EffectStatus::Failed,
        }),
        Err(Error::EffectUnknown { effect_id, .. }) => Some(EffectRef {
            effect_id,
            status: EffectStatus::Unknown,
        }),
        Err(e) => {
            tracing::warn!(key, error = %e, "cannot record the item as an effect");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_items_become_stable_intents_and_receipts() {
        let started = json!({"type": "commandExecution", "id": "call_1", "command": "npm test",
            "cwd": "/repo", "status": "inProgress", "commandActions": []});
        let completed = json!({"type": "commandExecution", "id": "call_1", "command": "npm test",
            "cwd": "/repo", "status": "completed", "commandActions": [],
            "aggregatedOutput": "ok\n", "exitCode": 0, "durationMs": 12});
        assert_eq!(intent(&started), intent(&completed));
        assert_eq!(
            intent(&started),
            json!({"command": "npm test", "cwd": "/repo"})
        );
        let Outcome::Completed(r) = outcome(&completed) else {
            panic!()
        };
        assert_eq!(r["exitCode"], 0);
        assert_eq!(r["status"], "completed");
        assert_eq!(r["output_bytes"], 3);
        assert!(r.get("aggregatedOutput").is_none());

        let failed = json!({"type": "commandExecution", "status": "failed", "exitCode": 2});
        assert_eq!(
            outcome(&failed),
            Outcome::Failed("it failed with exit code 2".into())
        );
        let declined = json!({"type": "fileChange", "status": "declined", "changes": []});
        assert!(matches!(outcome(&declined), Outcome::Failed(r) if r.starts_with("declined")));
        assert_eq!(effect_kind("agentMessage"), None);
        assert_eq!(effect_kind("fileChange"), Some("codex.fileChange"));
    }
}
