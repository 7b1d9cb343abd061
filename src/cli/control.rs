//! `cairn pause|resume|cancel|retry ID`: steer a task through a request in `control/`.
//!
//! A running daemon takes the request within a second (it watches `control/`); this command
//! waits up to a few seconds for that and says what happened. Without a daemon the request
//! waits in `control/` and takes effect when the next one starts.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;

use super::error::{print_line, CliError, CliResult, ExitCodeExt};
use super::exit;
use super::view;
use crate::queue::control::{self, ControlAction, ControlRequest};
use crate::queue::QueueDir;
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
    let id = view::task_id_arg(&args.id).exit_code(exit::USAGE)?;
    let storage = FileStorage::new(queue);
    // A task still in the inbox is steered too: the daemon holds the request until it has
    // taken the task.
    let mut submitted = false;
    match storage.get(&QueueDir::task_key(&id)) {
        Ok(Some(_)) => {}
        Ok(None) if in_inbox(queue, &id) => submitted = true,
        Ok(None) => {
            return Err(CliError::failure(format_args!(
                "queue {} has no task {:?}",
                queue.display(),
                args.id
            )));
        }
        Err(e) => {
            return Err(CliError::failure(format_args!(
                "reading the task {:?}: {e}",
                args.id
            )));
        }
    }
    let request = ControlRequest::new(action, &id);
    let key = control::submit(&storage, &request).map_err(|e| {
        CliError::failure(format_args!(
            "writing the request into {}/control: {e}",
            queue.display()
        ))
    })?;
    let verb = action.as_str();
    if args.no_wait {
        return print_line(format_args!("{verb} requested for {}", args.id));
    }
    let Some(pid) = daemon_pid(queue) else {
        let when = if submitted {
            "it is still in inbox/ and no daemon is running; it takes effect when one takes the task"
        } else {
            "no daemon is running, it takes effect when one starts"
        };
        return print_line(format_args!("{verb} requested for {}; {when}", args.id));
    };
    let deadline = Instant::now() + WAIT_FOR_DAEMON;
    while Instant::now() < deadline {
        if control::handled(&QueueDir::new(queue), &key) {
            let outcome = match action {
                ControlAction::Pause => "it stops at its next iteration boundary, checkpointed",
                ControlAction::Resume => "it continues",
                ControlAction::Cancel => "it is stopped and recorded as cancelled",
                ControlAction::Retry => "it resumes from its last checkpoint",
            };
            return print_line(format_args!(
                "{verb}: the daemon (pid {pid}) took the request for {}; {outcome}",
                args.id
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    print_line(format_args!(
        "{verb} requested for {}; the daemon (pid {pid}) has not taken it yet",
        args.id
    ))
}

/// Is a task with this id waiting in `inbox/` (as `cairn submit` names it, or inside a file
/// named otherwise)?
fn in_inbox(queue: &Path, id: &str) -> bool {
    super::view::inbox_tasks(queue)
        .iter()
        .any(|(_, task)| task.id() == id)
}

/// The pid of the daemon that owns the queue, if one is alive. Only reads `.lock`: taking the
/// lock here could make a daemon that is starting fail.
pub fn daemon_pid(queue: &Path) -> Option<i32> {
    let text = std::fs::read_to_string(queue.join(".lock")).ok()?;
    let pid: i32 = text.trim().parse().ok()?;
    let alive = pid > 0 && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    alive.then_some(pid)
}
