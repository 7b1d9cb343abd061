//! Steering one task: a request (pause, resume, cancel, retry) into `control/` or the shared
//! queue's `cairn_control`, then, unless told not to, a few seconds' wait for a daemon to take
//! it and what became of it. A refusal (who may steer, a state the request does not apply to)
//! is the daemon's: it is judged there, once, for files and for the database alike.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{writable_root, Backend, ClientError, ClientResult, QueueClient};
use crate::queue::control::{self, ControlAction, ControlRequest};
use crate::queue::{QueueDir, QueueReader};
use crate::store::{FileStorage, Storage};
use crate::task_id::TaskId;

/// How long a client waits for a running daemon to take a request, unless told otherwise.
pub const WAIT_FOR_DAEMON: Duration = Duration::from_secs(5);

/// How often it looks.
const POLL: Duration = Duration::from_millis(50);

/// What became of a request that was not refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// A daemon took it (`by`: "the daemon (pid N)", or "node NAME").
    Taken { by: String, detail: Option<String> },
    /// Written; it takes effect when a daemon takes it (`why` says when that is).
    Waiting { why: Option<String> },
}

impl RequestOutcome {
    /// The line a person reads: what `cairn pause|resume|cancel|retry` prints.
    pub fn message(&self, action: ControlAction, id: &TaskId) -> String {
        let verb = action.as_str();
        match self {
            RequestOutcome::Taken { by, detail: None } => {
                format!(
                    "{verb}: {by} took the request for {id}; {}",
                    what_follows(action)
                )
            }
            RequestOutcome::Taken {
                by,
                detail: Some(detail),
            } => format!("{verb}: {by} took the request for {id}: {detail}"),
            RequestOutcome::Waiting { why: None } => format!("{verb} requested for {id}"),
            RequestOutcome::Waiting { why: Some(why) } => {
                format!("{verb} requested for {id}; {why}")
            }
        }
    }

    /// Did a daemon take it?
    pub fn taken(&self) -> bool {
        matches!(self, RequestOutcome::Taken { .. })
    }
}

/// What an applied request does next, for the operator.
fn what_follows(action: ControlAction) -> &'static str {
    match action {
        ControlAction::Pause => "it stops at its next iteration boundary, checkpointed",
        ControlAction::Resume => "it continues",
        ControlAction::Cancel => "it is stopped and recorded as cancelled",
        ControlAction::Retry => "it resumes from its last checkpoint",
        ControlAction::Budget => {
            "its spending limit is set (a paused task stays paused until `cairn resume`)"
        }
    }
}

/// A request written and not yet seen taken: what waiting for it needs.
#[derive(Debug, Clone)]
pub struct Sent {
    action: ControlAction,
    id: TaskId,
    how: SentHow,
}

#[derive(Debug, Clone)]
enum SentHow {
    /// Its key in `control/`, when it was written (a second back), and whether the task was
    /// still in the inbox.
    File {
        key: String,
        written_at: chrono::DateTime<chrono::Utc>,
        submitted: bool,
    },
    /// Its row in `cairn_control`.
    #[cfg(feature = "postgres")]
    Database { request: i64 },
}

impl QueueClient {
    /// Ask the queue's daemon to apply `action` to task `id`. With `wait`, waits up to
    /// the client's wait ([`QueueClient::waiting_for_daemon`]) for a running daemon to take it; a refusal is an error naming why.
    pub fn request(
        &self,
        action: ControlAction,
        id: &TaskId,
        wait: bool,
    ) -> ClientResult<RequestOutcome> {
        let sent = self.send(action, id)?;
        if !wait {
            return Ok(RequestOutcome::Waiting { why: None });
        }
        self.outcome(&sent)
    }

    /// Write the request for `action` on task `id`, without waiting for a daemon.
    pub fn send(&self, action: ControlAction, id: &TaskId) -> ClientResult<Sent> {
        self.send_request(&ControlRequest::new(action, id))
    }

    /// Set task `id`'s spending limit to `max_cost` (`cairn budget`); as [`Self::request`].
    pub fn set_budget(
        &self,
        id: &TaskId,
        max_cost: f64,
        wait: bool,
    ) -> ClientResult<RequestOutcome> {
        if !control::valid_limit(max_cost) {
            return Err(ClientError::usage(
                "--max-cost must be a number of at least 0",
            ));
        }
        let sent = self.send_request(&ControlRequest::budget(id, max_cost))?;
        if !wait {
            return Ok(RequestOutcome::Waiting { why: None });
        }
        self.outcome(&sent)
    }

    /// Write `request`, without waiting for a daemon.
    pub fn send_request(&self, request: &ControlRequest) -> ClientResult<Sent> {
        let how = match &self.backend {
            Backend::Files { root, writable } => {
                send_file(writable_root(root, writable)?, request)?
            }
            #[cfg(feature = "postgres")]
            Backend::Database(shared) => send_db(shared, request)?,
        };
        Ok(Sent {
            action: request.action,
            id: request.task_id.clone(),
            how,
        })
    }

    /// Wait up to the client's wait for a daemon to take `sent`, and say what became of it.
    pub fn outcome(&self, sent: &Sent) -> ClientResult<RequestOutcome> {
        match (&self.backend, &sent.how) {
            (
                Backend::Files { root, .. },
                SentHow::File {
                    key,
                    written_at,
                    submitted,
                },
            ) => outcome_file(root, sent, key, *written_at, *submitted, self.daemon_wait),
            #[cfg(feature = "postgres")]
            (Backend::Database(shared), SentHow::Database { request }) => {
                outcome_db(shared, sent, *request, self.daemon_wait)
            }
            #[cfg(feature = "postgres")]
            _ => Err(ClientError::usage(
                "a request sent to one queue is awaited in another",
            )),
        }
    }
}

fn send_file(root: &Path, request: &ControlRequest) -> ClientResult<SentHow> {
    let id = &request.task_id;
    let storage = FileStorage::new(root);
    let reader = QueueReader::open(root);
    // A task still in the inbox is steered too: the daemon holds the request until it has
    // taken the task.
    let submitted = match storage.get(&QueueDir::task_key(id)) {
        Ok(Some(_)) => false,
        Ok(None) if reader.in_inbox(id) => true,
        Ok(None) => {
            return Err(ClientError::failure(format_args!(
                "queue {} has no task {:?}",
                root.display(),
                id.as_str()
            )));
        }
        Err(e) => {
            return Err(ClientError::failure(format_args!(
                "reading the task {:?}: {e}",
                id.as_str()
            )));
        }
    };
    // A second back: the journal's clock is the daemon's, which reads the same clock later.
    let written_at = chrono::Utc::now() - chrono::Duration::seconds(1);
    let key = control::submit(&storage, request).map_err(|e| {
        ClientError::failure(format_args!(
            "writing the request into {}: {e}",
            QueueDir::new(root).control().display()
        ))
    })?;
    Ok(SentHow::File {
        key,
        written_at,
        submitted,
    })
}

fn outcome_file(
    root: &Path,
    sent: &Sent,
    key: &str,
    written_at: chrono::DateTime<chrono::Utc>,
    submitted: bool,
    wait: Duration,
) -> ClientResult<RequestOutcome> {
    let reader = QueueReader::open(root);
    let Some(pid) = reader.daemon().pid else {
        let why = if submitted {
            format!(
                "it is still in {}/ and no daemon is running; it takes effect when one takes the task",
                QueueDir::INBOX_NAME
            )
        } else {
            "no daemon is running, it takes effect when one starts".to_string()
        };
        return Ok(RequestOutcome::Waiting { why: Some(why) });
    };
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if control::handled(reader.dir(), key) {
            let uid = nix::unistd::geteuid().as_raw();
            if let Some(why) = control::refusal(reader.dir(), &sent.id, key, uid, written_at) {
                return Err(ClientError::failure(format_args!(
                    "{}: the daemon (pid {pid}) refused the request for {}: {why}",
                    sent.action.as_str(),
                    sent.id
                )));
            }
            return Ok(RequestOutcome::Taken {
                by: format!("the daemon (pid {pid})"),
                detail: None,
            });
        }
        std::thread::sleep(POLL);
    }
    Ok(RequestOutcome::Waiting {
        why: Some(format!("the daemon (pid {pid}) has not taken it yet")),
    })
}

/// The request into `cairn_control`, refused for a task the shared queue does not have.
#[cfg(feature = "postgres")]
fn send_db(
    shared: &super::database::SharedQueue,
    request: &ControlRequest,
) -> ClientResult<SentHow> {
    let id = &request.task_id;
    if shared.block_on(shared.db.task_state(id))?.is_none() {
        return Err(ClientError::failure(format_args!(
            "the shared queue has no task {:?} (a file still in a host's {}/ is taken in first)",
            id.as_str(),
            QueueDir::INBOX_NAME
        )));
    }
    let request = match request.max_cost {
        Some(max_cost) => shared.block_on(shared.db.request_budget(id, max_cost))?,
        None => shared.block_on(shared.db.request_control(id, request.action))?,
    };
    Ok(SentHow::Database { request })
}

/// How a daemon handled the request in row `request`, once one has.
#[cfg(feature = "postgres")]
fn outcome_db(
    shared: &super::database::SharedQueue,
    sent: &Sent,
    request: i64,
    wait: Duration,
) -> ClientResult<RequestOutcome> {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Some(handled) = shared.block_on(shared.db.control_outcome(request))? {
            let by = format!("node {}", handled.node);
            return match handled.outcome.strip_prefix("refused: ") {
                Some(why) => Err(ClientError::failure(format_args!(
                    "{}: {by} refused the request for {}: {why}",
                    sent.action.as_str(),
                    sent.id
                ))),
                None if handled.outcome == "applied" || handled.outcome.starts_with("taken ") => {
                    Ok(RequestOutcome::Taken { by, detail: None })
                }
                None => Ok(RequestOutcome::Taken {
                    by,
                    detail: Some(handled.outcome),
                }),
            };
        }
        std::thread::sleep(POLL);
    }
    Ok(RequestOutcome::Waiting {
        why: Some("no daemon has taken it yet, it takes effect when one does".to_string()),
    })
}
