//! `cairn pause|resume|cancel|retry ID`: steer a task through a request in `control/`.
//!
//! A running daemon takes the request within a second (it watches `control/`); this command
//! waits up to a few seconds for that and says what happened: taken, or refused and why (the
//! daemon's `control_refused` event naming the request, in the task's journal; exit 1). Without a daemon the request
//! waits in `control/` and takes effect when the next one starts.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;

use super::error::{print_line, CliError, CliResult, ExitCodeExt};
use super::source::DbArg;
use super::{exit, format};
use crate::queue::control::{self, ControlAction, ControlRequest};
use crate::queue::{QueueDir, QueueReader};
use crate::store::{FileStorage, Storage};

/// Which request.
#[derive(Debug, Clone, Copy)]
pub enum Action {
    Pause,
    Resume,
    Cancel,
    Retry,
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The task id.
    id: String,

    /// Return as soon as the request is written, without waiting for the daemon to take it.
    #[arg(long)]
    no_wait: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

/// How long to wait for a running daemon to take the request.
const WAIT_FOR_DAEMON: Duration = Duration::from_secs(5);

pub fn run(queue: &Path, action: Action, args: ControlArgs) -> CliResult {
    let action = match action {
        Action::Pause => ControlAction::Pause,
        Action::Resume => ControlAction::Resume,
        Action::Cancel => ControlAction::Cancel,
        Action::Retry => ControlAction::Retry,
    };
    print_line(request(
        queue,
        args.db.url(),
        action,
        &args.id,
        args.no_wait,
    )?)
}

/// Ask the daemon (of the queue directory, or of the shared queue at `db`) to apply `action`
/// to the task `id_text`, and say what became of it: what `cairn pause|resume|cancel|retry`
/// prints, and what the dashboard's actions answer.
pub fn request(
    queue: &Path,
    db: Option<&str>,
    action: ControlAction,
    id_text: &str,
    no_wait: bool,
) -> CliResult<String> {
    let id = format::task_id_arg(id_text).exit_code(exit::USAGE)?;
    send(queue, db, ControlRequest::new(action, &id), no_wait)
}

/// Hand `request` to the daemon (of the queue directory, or of the shared queue at `db`) and
/// say what became of it, as [`request`] does.
pub fn send(
    queue: &Path,
    db: Option<&str>,
    request: ControlRequest,
    no_wait: bool,
) -> CliResult<String> {
    let (action, id) = (request.action, request.task_id.clone());
    let id_text = id.as_str();
    if let Some(url) = db {
        return run_db(url, &request, no_wait);
    }
    let storage = FileStorage::new(queue);
    let reader = QueueReader::open(queue);
    // A task still in the inbox is steered too: the daemon holds the request until it has
    // taken the task.
    let mut submitted = false;
    match storage.get(&QueueDir::task_key(id_text)) {
        Ok(Some(_)) => {}
        Ok(None) if reader.in_inbox(id_text) => submitted = true,
        Ok(None) => {
            return Err(CliError::failure(format_args!(
                "queue {} has no task {:?}",
                queue.display(),
                id_text
            )));
        }
        Err(e) => {
            return Err(CliError::failure(format_args!(
                "reading the task {:?}: {e}",
                id_text
            )));
        }
    }
    // A second back: the journal's clock is the daemon's, which reads the same clock later.
    let written_at = chrono::Utc::now() - chrono::Duration::seconds(1);
    let key = control::submit(&storage, &request).map_err(|e| {
        CliError::failure(format_args!(
            "writing the request into {}: {e}",
            QueueDir::new(queue).control().display()
        ))
    })?;
    let verb = action.as_str();
    if no_wait {
        return Ok(format!("{verb} requested for {}", id_text));
    }
    let Some(pid) = reader.daemon().pid else {
        let when = if submitted {
            format!(
                "it is still in {}/ and no daemon is running; it takes effect when one takes the task",
                QueueDir::INBOX_NAME
            )
        } else {
            "no daemon is running, it takes effect when one starts".to_string()
        };
        return Ok(format!("{verb} requested for {}; {when}", id_text));
    };
    let deadline = Instant::now() + WAIT_FOR_DAEMON;
    while Instant::now() < deadline {
        if control::handled(reader.dir(), &key) {
            let uid = nix::unistd::geteuid().as_raw();
            if let Some(why) = control::refusal(reader.dir(), id_text, &key, uid, written_at) {
                return Err(CliError::failure(format_args!(
                    "{verb}: the daemon (pid {pid}) refused the request for {}: {why}",
                    id_text
                )));
            }
            let outcome = what_follows(action);
            return Ok(format!(
                "{verb}: the daemon (pid {pid}) took the request for {}; {outcome}",
                id_text
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!(
        "{verb} requested for {}; the daemon (pid {pid}) has not taken it yet",
        id_text
    ))
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

#[cfg(not(feature = "postgres"))]
fn run_db(_url: &str, _request: &ControlRequest, _no_wait: bool) -> CliResult<String> {
    Err(super::source::without_postgres())
}

/// The request into `cairn_control` of the database at `url`: refused for a task the shared
/// queue does not have; then waits (unless `no_wait`) for a daemon to handle it and says how.
#[cfg(feature = "postgres")]
fn run_db(url: &str, request: &ControlRequest, no_wait: bool) -> CliResult<String> {
    let (action, id) = (request.action, &request.task_id);
    let shared = super::shared_queue::SharedQueue::open(url)?;
    let (runtime, db) = (&shared.runtime, &shared.db);
    if runtime.block_on(db.task_state(id))?.is_none() {
        return Err(CliError::failure(format_args!(
            "the shared queue has no task {:?} (a file still in a host's {}/ is taken in first)",
            id.as_str(),
            QueueDir::INBOX_NAME
        )));
    }
    let request = match request.max_cost {
        Some(max_cost) => runtime.block_on(db.request_budget(id, max_cost))?,
        None => runtime.block_on(db.request_control(id, action))?,
    };
    let verb = action.as_str();
    if no_wait {
        return Ok(format!("{verb} requested for {id}"));
    }
    let deadline = Instant::now() + WAIT_FOR_DAEMON;
    while Instant::now() < deadline {
        if let Some(handled) = runtime.block_on(db.control_outcome(request))? {
            let node = &handled.node;
            return match handled.outcome.strip_prefix("refused: ") {
                Some(why) => Err(CliError::failure(format_args!(
                    "{verb}: node {node} refused the request for {id}: {why}"
                ))),
                None if handled.outcome == "applied" || handled.outcome.starts_with("taken ") => {
                    Ok(format!(
                        "{verb}: node {node} took the request for {id}; {}",
                        what_follows(action)
                    ))
                }
                None => Ok(format!(
                    "{verb}: node {node} took the request for {id}: {}",
                    handled.outcome
                )),
            };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(format!(
        "{verb} requested for {id}; no daemon has taken it yet, it takes effect when one does"
    ))
}
