//! The dashboard's actions (pause, resume, cancel, retry, fork, and bulk ones), taken through
//! the same functions as the `cairn` commands, so that the same checks apply.

use std::path::Path;

use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::client::{QueueClient, TaskFilter};
use crate::queue::control::ControlAction;

use super::error::WebError;
use super::App;

/// The secret an action must carry (`X-Cairn-Token`), so that a page of another site cannot act.
#[derive(Clone)]
pub(crate) struct Token {
    pub secret: String,
    /// Made at start (and printed), rather than read from a file.
    pub generated: bool,
}

/// What an action's body may carry.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ActionBody {
    /// The task (pause, resume, cancel, retry, fork).
    #[serde(default)]
    id: Option<String>,
    /// fork: a JSON merge patch of the checkpoint's state, as text.
    #[serde(default)]
    patch: Option<String>,
    /// fork: the new task's id.
    #[serde(default, rename = "as")]
    new_id: Option<String>,
    /// pause-submitter, resume-submitter: the submitter (user name, or uid).
    #[serde(default)]
    submitter: Option<String>,
    /// budget: the new spending limit.
    #[serde(default)]
    max_cost: Option<f64>,
}

/// Take an action: only with a token configured, only from this listener's own pages (a
/// browser says where a request comes from in `Sec-Fetch-Site` and `Origin`), only as JSON
/// (which a page of another site cannot send without a preflight this listener never
/// grants), and only with the token.
pub(super) async fn act(
    State(app): State<App>,
    UrlPath(action): UrlPath<String>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let Some(token) = &app.token else {
        return refuse(
            StatusCode::FORBIDDEN,
            "this listener is read-only (start it with --allow-actions to act from the page)",
        );
    };
    if let Err(why) = same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, &why.to_string());
    }
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().starts_with("application/json"));
    if !json {
        return refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "an action is a JSON body (Content-Type: application/json)",
        );
    }
    let given = headers
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !same_secret(given, &token.secret) {
        return refuse(
            StatusCode::FORBIDDEN,
            "the action token is missing or wrong (X-Cairn-Token: the token cairn printed at start)",
        );
    }
    let body: ActionBody =
        match serde_json::from_str(if body.trim().is_empty() { "{}" } else { &body }) {
            Ok(body) => body,
            Err(e) => return refuse(StatusCode::BAD_REQUEST, &format!("the action's body: {e}")),
        };
    let Some(kind) = ActionKind::named(&action) else {
        return refuse(
            StatusCode::NOT_FOUND,
            &format!(
                "no action {action:?} (pause, resume, cancel, retry, budget, fork, \
                 retry-failed, pause-submitter, resume-submitter)"
            ),
        );
    };
    let (queue, db) = (app.source.queue.clone(), app.source.db.clone());
    // The command line's functions block (a daemon is given a few seconds to take a request)
    // and a database's open a runtime of their own: a thread of their own, not this runtime.
    let (answer, answered) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = answer.send(kind.take(&queue, db.as_deref(), body));
    });
    match answered.await {
        Ok(Ok(message)) => (StatusCode::OK, format!("{message}\n")).into_response(),
        Ok(Err(why)) => refuse(StatusCode::CONFLICT, &why.to_string()),
        Err(_) => refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the action did not finish",
        ),
    }
}

/// The header an action's token travels in.
pub(super) const TOKEN_HEADER: &str = "x-cairn-token";

fn refuse(status: StatusCode, why: &str) -> Response {
    (status, format!("{why}\n")).into_response()
}

/// Refuse what a browser says comes from another site: `Sec-Fetch-Site` other than
/// `same-origin` (or `none`: typed by the user), or an `Origin` other than this listener's.
fn same_origin(headers: &HeaderMap) -> Result<(), WebError> {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = text("sec-fetch-site") {
        if site != "same-origin" && site != "none" {
            return Err(WebError::OtherSite(site.to_string()));
        }
    }
    if let Some(origin) = text("origin") {
        let host = text("host").unwrap_or("");
        let expected = [format!("http://{host}"), format!("https://{host}")];
        if host.is_empty() || !expected.iter().any(|e| e == origin) {
            return Err(WebError::OtherOrigin(origin.to_string()));
        }
    }
    Ok(())
}

/// Compare secrets in time that does not depend on where they differ.
fn same_secret(given: &str, secret: &str) -> bool {
    let (a, b) = (given.as_bytes(), secret.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Clone, Copy)]
enum ActionKind {
    One(ControlAction),
    Budget,
    Fork,
    RetryFailed,
    PauseSubmitter,
    ResumeSubmitter,
}

impl ActionKind {
    fn named(name: &str) -> Option<ActionKind> {
        Some(match name {
            "pause" => ActionKind::One(ControlAction::Pause),
            "resume" => ActionKind::One(ControlAction::Resume),
            "cancel" => ActionKind::One(ControlAction::Cancel),
            "retry" => ActionKind::One(ControlAction::Retry),
            "budget" => ActionKind::Budget,
            "fork" => ActionKind::Fork,
            "retry-failed" => ActionKind::RetryFailed,
            "pause-submitter" => ActionKind::PauseSubmitter,
            "resume-submitter" => ActionKind::ResumeSubmitter,
            _ => return None,
        })
    }

    /// Take the action through the queue's client, as the commands do; what it says, or why
    /// not.
    fn take(self, queue: &Path, db: Option<&str>, body: ActionBody) -> Result<String, WebError> {
        let client = QueueClient::open(queue, db)?;
        let id = || body.id.clone().ok_or(WebError::Missing("task (\"id\")"));
        let submitter = || {
            body.submitter
                .clone()
                .filter(|s| !s.is_empty())
                .ok_or(WebError::Missing("submitter (\"submitter\")"))
        };
        let in_states = |states: &[&str], submitter: Option<String>| TaskFilter {
            states: states.iter().map(|s| s.to_string()).collect(),
            submitter,
            ..TaskFilter::default()
        };
        match self {
            ActionKind::One(action) => crate::cli::control::request(&client, action, &id()?, true)
                .map_err(WebError::command),
            ActionKind::Budget => {
                let max_cost = body
                    .max_cost
                    .ok_or(WebError::Missing("limit (\"max_cost\")"))?;
                let id = QueueClient::task_id(&id()?)?;
                let outcome = client.set_budget(&id, max_cost, true)?;
                Ok(outcome.message(ControlAction::Budget, &id))
            }
            ActionKind::Fork => {
                let patch = body.patch.as_deref().filter(|p| !p.trim().is_empty());
                crate::cli::fork::fork(&client, &id()?, None, patch, body.new_id.as_deref(), None)
                    .map(|new_id| format!("forked as {new_id}"))
                    .map_err(WebError::command)
            }
            ActionKind::RetryFailed => {
                bulk(&client, ControlAction::Retry, &in_states(&["failed"], None))
            }
            ActionKind::PauseSubmitter => {
                let states = [
                    "pending",
                    "running",
                    "waiting_retry",
                    "interrupted",
                    "submitted",
                ];
                bulk(
                    &client,
                    ControlAction::Pause,
                    &in_states(&states, Some(submitter()?)),
                )
            }
            ActionKind::ResumeSubmitter => bulk(
                &client,
                ControlAction::Resume,
                &in_states(&["paused"], Some(submitter()?)),
            ),
        }
    }
}

/// The same request for every task `filter` selects, without waiting for the daemon to take
/// each.
fn bulk(
    client: &QueueClient,
    action: ControlAction,
    filter: &TaskFilter,
) -> Result<String, WebError> {
    let verb = action.as_str();
    let tasks = client.select(filter)?;
    if tasks.is_empty() {
        return Ok(format!("{verb}: no task to {verb}"));
    }
    let outcomes = client.request_each(action, &tasks, false);
    let refused: Vec<String> = outcomes
        .iter()
        .filter_map(|o| o.result.as_ref().err().map(|e| format!("{}: {e}", o.id)))
        .collect();
    let asked = outcomes.len() - refused.len();
    let listed: Vec<&str> = outcomes.iter().map(|o| o.id.as_str()).collect();
    if refused.is_empty() {
        Ok(format!(
            "{verb} requested for {asked} task(s): {}",
            listed.join(", ")
        ))
    } else {
        Err(WebError::BulkRefused {
            verb,
            asked,
            total: outcomes.len(),
            refused: refused.join("; "),
        })
    }
}

/// 32 random bytes from the kernel, as hex.
pub(super) fn fresh_token() -> crate::cli::error::CliResult<Token> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| {
            crate::cli::error::CliError::failure(format_args!(
                "cannot make an action token from /dev/urandom: {e}"
            ))
        })?;
    let secret = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Token {
        secret,
        generated: true,
    })
}

/// The token in `file`'s first line; a file every user may read is refused.
pub(super) fn token_from_file(file: &std::path::Path) -> crate::cli::error::CliResult<Token> {
    use std::os::unix::fs::MetadataExt;
    let named = |what: String| {
        crate::cli::error::CliError::failure(format_args!(
            "--token-file {}: {what}",
            file.display()
        ))
    };
    let metadata = std::fs::metadata(file).map_err(|e| named(format!("{e}")))?;
    if metadata.mode() & 0o004 != 0 {
        return Err(named(format!(
            "every user may read it (mode {:o}): chmod o-r it",
            metadata.mode() & 0o7777
        )));
    }
    let text = std::fs::read_to_string(file).map_err(|e| named(format!("{e}")))?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.len() < 16 {
        return Err(named(
            "its first line must hold a token of at least 16 characters".into(),
        ));
    }
    Ok(Token {
        secret,
        generated: false,
    })
}
