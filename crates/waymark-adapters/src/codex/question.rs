//! Codex's questions to the person (`item/tool/requestUserInput`, the model's
//! `request_user_input` tool, offered in Plan mode) as question forms in the inbox, answered in
//! Codex's words: `{answers: {<question id>: {answers: [label…, "user_note: words"]}}}`, the
//! shape Codex's own terminal sends and the model receives as the tool's output.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use waymark_proto::{
    DecisionKind, DecisionStatus, FormAnswer, FormChoice, FormQuestion, QuestionForm,
    RequestDecision,
};
use waymark_worker::Run;

use super::approval::Closed;
use crate::jsonrpc::{Peer, RequestId};

/// The request.
pub(super) const USER_INPUT: &str = "item/tool/requestUserInput";

/// How Codex's terminal marks the person's own words among an answer's entries.
const NOTE: &str = "user_note: ";

/// What a secret question is answered: Waymark's record keeps every answer, so it carries none
/// that Codex marks secret (`isSecret`).
pub(super) const SECRET_REFUSED: &str = "user_note: (not answered: Waymark does not carry secret \
     answers through its record; ask for it at the machine, or go on without it)";

/// The form a request asks, and the ids of its secret questions (left out of the form).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Asked {
    pub(super) form: Option<QuestionForm>,
    pub(super) secret: Vec<String>,
}

/// Reads the request's questions: `{id, header, question, options: [{label, description}] |
/// null, isOther, isSecret}` as Codex 0.169 sends them. A question without options is
/// answered in words; `isOther` lets the person answer in words beside the choices. Says what
/// is wrong when the questions cannot be asked as a form.
pub(super) fn read(params: &Value) -> Result<Asked, String> {
    let Some(list) = params.get("questions").and_then(Value::as_array) else {
        return Err("the request has no `questions` list".into());
    };
    let mut questions = Vec::new();
    let mut secret = Vec::new();
    for q in list {
        let id = q.get("id").and_then(Value::as_str).unwrap_or_default();
        if id.is_empty() {
            return Err("a question has no `id`".into());
        }
        if q.get("isSecret").and_then(Value::as_bool) == Some(true) {
            secret.push(id.to_owned());
            continue;
        }
        let choices: Vec<FormChoice> = q
            .get("options")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|o| FormChoice {
                label: o
                    .get("label")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                description: o
                    .get("description")
                    .and_then(Value::as_str)
                    .filter(|d| !d.is_empty())
                    .map(str::to_owned),
            })
            .collect();
        let free_text =
            choices.is_empty() || q.get("isOther").and_then(Value::as_bool) == Some(true);
        questions.push(FormQuestion {
            id: id.to_owned(),
            question: q
                .get("question")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            header: q
                .get("header")
                .and_then(Value::as_str)
                .filter(|h| !h.is_empty())
                .map(str::to_owned),
            choices,
            multi_select: false,
            free_text,
        });
    }
    if questions.is_empty() {
        return Ok(Asked { form: None, secret });
    }
    let form = QuestionForm { questions };
    form.check()?;
    Ok(Asked {
        form: Some(form),
        secret,
    })
}

/// One line for the inbox: the question, or how many there are.
pub(super) fn summary(form: &QuestionForm) -> String {
    match form.questions.as_slice() {
        [one] => super::clip(&format!("Codex asks: {}", one.question), 1900),
        many => format!("Codex asks {} questions", many.len()),
    }
}

/// The answer Codex takes: each question's chosen labels, then the person's words marked as a
/// note; a secret question gets [`SECRET_REFUSED`]; with no answers (nobody answered, the
/// question was withdrawn) every question is answered with nothing, and the model goes on
/// without.
pub(super) fn response(asked: &Asked, answers: Option<&BTreeMap<String, FormAnswer>>) -> Value {
    let mut out = serde_json::Map::new();
    if let (Some(form), Some(answers)) = (&asked.form, answers) {
        for q in &form.questions {
            let Some(a) = answers.get(&q.id) else {
                continue;
            };
            let mut list: Vec<String> = a.chosen.clone();
            if let Some(t) = a.text.as_deref().filter(|t| !t.trim().is_empty()) {
                list.push(format!("{NOTE}{t}"));
            }
            out.insert(q.id.clone(), json!({"answers": list}));
        }
    }
    for id in &asked.secret {
        out.insert(id.clone(), json!({"answers": [SECRET_REFUSED]}));
    }
    json!({"answers": out})
}

/// A question request to carry through.
pub(super) struct Job {
    pub(super) run: Arc<Run>,
    pub(super) peer: Peer,
    pub(super) request_id: RequestId,
    pub(super) params: Value,
    pub(super) closed: Closed,
    /// Fired by `serverRequest/resolved` for its request id (answered in another client, or
    /// dropped with its turn).
    pub(super) resolved: CancellationToken,
    /// Closed, with why, when the adapter itself ends the turn under it (a pause).
    pub(super) withdrawn: Closed,
}

/// Opens the question, waits for a person (or Codex dropping it, or the connection's end) and
/// answers Codex.
pub(super) async fn carry(job: Job) {
    let asked = match read(&job.params) {
        Ok(a) => a,
        Err(e) => {
            let why = format!("Waymark cannot ask Codex's question as a form: {e}");
            tracing::warn!(request = %job.request_id, "{why}");
            let _ = job.peer.respond_error(&job.request_id, -32602, &why).await;
            super::say(&job.run, "system", why).await;
            return;
        }
    };
    let Some(form) = asked.form.clone() else {
        // Only secret questions: nothing to show anyone.
        super::say(
            &job.run,
            "system",
            "Codex asked only secret questions; Waymark does not carry secret answers, so it told Codex so".into(),
        )
        .await;
        let _ = job
            .peer
            .respond(&job.request_id, response(&asked, None))
            .await;
        return;
    };
    let req = RequestDecision {
        attempt_id: None,
        fence: None,
        kind: DecisionKind::Question,
        step: None,
        question: summary(&form),
        options: Vec::new(),
        default_option: None,
        expires_in_seconds: None,
        form: Some(form),
    };
    let opened = job.run.open_decision(req).await;
    let decision = match opened {
        Ok(d) => d,
        Err(e) => {
            let why = format!(
                "the question could not reach the inbox ({e}); Codex goes on without an answer"
            );
            tracing::warn!(request = %job.request_id, "{why}");
            let _ = job
                .peer
                .respond(&job.request_id, response(&asked, None))
                .await;
            super::say(&job.run, "system", why).await;
            return;
        }
    };
    let id = decision.id.clone();
    tracing::info!(decision = %id, request = %job.request_id, "question open");
    let answered = tokio::select! {
        biased;
        _ = job.withdrawn.wait() => return expire(&job.run, &id, &job.withdrawn.reason()).await,
        _ = job.resolved.cancelled() => {
            return expire(&job.run, &id, "Codex stopped waiting for the answer (serverRequest/resolved): answered in its own terminal, or its turn ended").await;
        }
        _ = job.closed.wait() => return expire(&job.run, &id, &job.closed.reason()).await,
        d = job.run.await_decision(&id) => d,
    };
    let answers = match &answered {
        Ok(d) if d.status == DecisionStatus::Resolved => {
            d.outcome.as_ref().and_then(|o| o.answers.clone())
        }
        Ok(d) => {
            tracing::info!(decision = %id, status = ?d.status, "the question closed unanswered; Codex goes on without an answer");
            None
        }
        Err(e) => {
            tracing::info!(decision = %id, error = %e, "no answer will come (the run stopped)");
            None
        }
    };
    if job.resolved.is_cancelled() || job.closed.is_closed() || job.withdrawn.is_closed() {
        return;
    }
    match job
        .peer
        .respond(&job.request_id, response(&asked, answers.as_ref()))
        .await
    {
        Ok(()) => tracing::info!(decision = %id, "answered Codex's question"),
        Err(e) => tracing::warn!(decision = %id, error = %e, "cannot send the answer to Codex"),
    }
}

/// Closes a question Codex no longer waits for: expired, nothing answered.
async fn expire(run: &Run, decision_id: &str, reason: &str) {
    match run.expire_decision(decision_id, reason).await {
        Ok(_) => tracing::info!(decision = %decision_id, reason, "question expired"),
        Err(e) => {
            tracing::debug!(decision = %decision_id, error = %e, "the question was already closed")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request as the real Codex 0.169 sent it (Plan mode, fake model).
    fn recorded() -> Value {
        json!({"threadId": "t", "turnId": "u", "itemId": "call_1", "isBlocking": true,
               "autoResolutionMs": null,
               "questions": [{"id": "db", "header": "Database", "question": "Which database?",
                              "isOther": true, "isSecret": false,
                              "options": [{"label": "SQLite (Recommended)", "description": "a file"},
                                          {"label": "PostgreSQL", "description": "a server"}]}]})
    }

    #[test]
    fn a_real_request_becomes_a_form_and_its_answer_goes_back_in_codex_words() {
        let asked = read(&recorded()).unwrap();
        let form = asked.form.clone().unwrap();
        assert_eq!(form.questions.len(), 1);
        let q = &form.questions[0];
        assert_eq!(
            (q.id.as_str(), q.header.as_deref(), q.question.as_str()),
            ("db", Some("Database"), "Which database?")
        );
        assert_eq!(q.choices[1].label, "PostgreSQL");
        assert_eq!(q.choices[0].description.as_deref(), Some("a file"));
        assert!(q.free_text && !q.multi_select);
        assert_eq!(summary(&form), "Codex asks: Which database?");
        let one = |chosen: &[&str], text: Option<&str>| {
            let a = BTreeMap::from([(
                "db".to_owned(),
                FormAnswer {
                    chosen: chosen.iter().map(|c| c.to_string()).collect(),
                    text: text.map(str::to_owned),
                },
            )]);
            form.check_answers(&a).unwrap();
            response(&asked, Some(&a))
        };
        assert_eq!(
            one(&["PostgreSQL"], None),
            json!({"answers": {"db": {"answers": ["PostgreSQL"]}}})
        );
        // The person's own words, marked as Codex's terminal marks them.
        assert_eq!(
            one(&[], Some("DuckDB")),
            json!({"answers": {"db": {"answers": ["user_note: DuckDB"]}}})
        );
        // Unanswered: every question gets nothing, and Codex goes on.
        assert_eq!(response(&asked, None), json!({"answers": {}}));
    }

    #[test]
    fn a_secret_question_is_never_asked_through_the_record_and_is_told_so() {
        let mut p = recorded();
        p["questions"].as_array_mut().unwrap().push(
            json!({"id": "key", "header": "Key", "question": "Your API key?",
                         "isOther": true, "isSecret": true, "options": null}),
        );
        let asked = read(&p).unwrap();
        assert_eq!(asked.form.as_ref().unwrap().questions.len(), 1);
        assert_eq!(asked.secret, vec!["key".to_owned()]);
        let out = response(&asked, None);
        assert_eq!(out["answers"]["key"]["answers"][0], SECRET_REFUSED);
        // Only secret questions: no form at all.
        let only =
            json!({"questions": [{"id": "key", "question": "Your API key?", "isSecret": true}]});
        assert_eq!(read(&only).unwrap().form, None);
    }

    #[test]
    fn a_question_without_options_is_answered_in_words_and_bad_requests_are_refused() {
        let p = json!({"questions": [{"id": "name", "header": "Name", "question": "What name?",
                                      "isOther": false, "isSecret": false, "options": null}]});
        let form = read(&p).unwrap().form.unwrap();
        assert!(form.questions[0].free_text && form.questions[0].choices.is_empty());
        assert!(read(&json!({})).unwrap_err().contains("questions"));
        assert!(
            read(&json!({"questions": [{"question": "no id"}]}))
                .unwrap_err()
                .contains("id")
        );
        // Two choices with one label cannot be told apart: the form's own check says so.
        let twice = json!({"questions": [{"id": "x", "question": "Which?", "isOther": false,
            "options": [{"label": "A", "description": ""}, {"label": "A", "description": ""}]}]});
        assert!(read(&twice).is_err());
    }
}
