//! `cairn pause|resume|cancel|retry ID`: steer a task, or with filters instead of an id every
//! task they select (`--state`, `--submitter`, `--phase`, `--since`, `--older-than`, `--all`).
//!
//! A running daemon takes a request within a second (it watches `control/`, or the shared
//! queue's requests); this command waits up to a few seconds for that and says what happened:
//! taken, or refused and why (exit 1). Without a daemon the request waits and takes effect when
//! the next one starts. The requests themselves are the client's (`client::QueueClient`).

use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;

use clap::Args;

use super::error::{print, print_line, CliError, CliResult};
use super::source::DbArg;
use crate::client::{BulkOutcome, QueueClient, TaskFilter};
use crate::queue::control::ControlAction;
use crate::queue::TaskView;

/// Which request.
#[derive(Debug, Clone, Copy)]
pub(super) enum Action {
    Pause,
    Resume,
    Cancel,
    Retry,
}

#[derive(Debug, Args)]
#[command(after_help = "\
Without an id, the filters select the tasks (every condition given must hold): the command \
lists them and, on a terminal, asks before sending (--yes does not ask; --dry-run only lists). \
Each task's request is judged as one for that task alone would be, and each is reported.

Examples:
  cairn retry --state failed --yes            every failed task
  cairn pause --submitter alice               alice's tasks (asks first)
  cairn cancel --phase fetch --older-than 2d --dry-run")]
pub(super) struct ControlArgs {
    /// The task id (or filters instead, below).
    #[arg(required_unless_present_any = ["state", "submitter", "phase", "since", "older_than", "all"])]
    id: Option<String>,

    /// Return as soon as the request is written, without waiting for the daemon to take it.
    #[arg(long)]
    no_wait: bool,

    /// How long to wait for a running daemon to take the request, e.g. 30s (a busy host can
    /// take longer than the default; --no-wait does not wait at all).
    #[arg(long, value_name = "DURATION", env = "CAIRN_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    wait: std::time::Duration,

    /// Tasks in this state (as `status` prints it; repeat or comma-separate for several).
    #[arg(
        long,
        value_name = "STATE",
        value_delimiter = ',',
        conflicts_with = "id"
    )]
    state: Vec<String>,

    /// Tasks of this submitter (user name or uid).
    #[arg(long, value_name = "USER", conflicts_with = "id")]
    submitter: Option<String>,

    /// Tasks at this phase.
    #[arg(long, value_name = "PHASE", conflicts_with = "id")]
    phase: Option<String>,

    /// Tasks active (finished, checkpointed or started) within this long, e.g. 1h.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "id")]
    since: Option<std::time::Duration>,

    /// Tasks not active for this long, e.g. 2d.
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, conflicts_with = "id")]
    older_than: Option<std::time::Duration>,

    /// Every task (the other filters still narrow it).
    #[arg(long, conflicts_with = "id")]
    all: bool,

    /// With filters: list what would be touched, send nothing.
    #[arg(long)]
    dry_run: bool,

    /// With filters: do not ask for confirmation.
    #[arg(long, short = 'y')]
    yes: bool,

    /// With filters: one JSON document of what was selected and what became of each.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

impl Action {
    fn request(self) -> ControlAction {
        match self {
            Action::Pause => ControlAction::Pause,
            Action::Resume => ControlAction::Resume,
            Action::Cancel => ControlAction::Cancel,
            Action::Retry => ControlAction::Retry,
        }
    }
}

pub(super) fn run(queue: &Path, action: Action, args: ControlArgs) -> CliResult {
    let action = action.request();
    let client = QueueClient::open(queue, args.db.url())?.waiting_for_daemon(args.wait);
    match &args.id {
        Some(id) => print_line(request(&client, action, id, !args.no_wait)?),
        None => bulk(&client, action, &args),
    }
}

/// Ask for `action` on task `id_text` and say what became of it: what
/// `cairn pause|resume|cancel|retry ID` prints, and what the dashboard's actions answer.
pub(super) fn request(
    client: &QueueClient,
    action: ControlAction,
    id_text: &str,
    wait: bool,
) -> CliResult<String> {
    let id = QueueClient::task_id(id_text)?;
    Ok(client.request(action, &id, wait)?.message(action, &id))
}

/// The filters of `args`, with the durations as times before now.
fn filter_of(args: &ControlArgs) -> TaskFilter {
    let before = |d: std::time::Duration| {
        chrono::Utc::now() - chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
    };
    TaskFilter {
        states: args.state.clone(),
        submitter: args.submitter.clone(),
        phase: args.phase.clone(),
        since: args.since.map(before),
        older_than: args.older_than.map(before),
        all: args.all,
    }
}

/// The request for every task the filters select: listed, confirmed, sent, reported.
fn bulk(client: &QueueClient, action: ControlAction, args: &ControlArgs) -> CliResult {
    let tasks = client.select(&filter_of(args))?;
    let verb = action.as_str();
    if args.dry_run || tasks.is_empty() {
        return report_selection(verb, &tasks, args);
    }
    if !args.json {
        print(&listing(verb, &tasks))?;
    }
    if !args.yes && !confirmed(verb, tasks.len())? {
        return Err(CliError::failure(format_args!("{verb}: nothing was sent")));
    }
    let outcomes = client.request_each(action, &tasks, !args.no_wait);
    let refused = outcomes.iter().filter(|o| o.result.is_err()).count();
    if args.json {
        print_line(serde_json::json!({
            "action": verb,
            "dry_run": false,
            "tasks": outcomes.iter().map(|o| outcome_json(action, o)).collect::<Vec<_>>(),
        }))?;
    } else {
        let mut text = String::new();
        for outcome in &outcomes {
            text.push_str(&format!("{}\n", outcome_line(action, outcome)));
        }
        text.push_str(&format!(
            "{verb}: {} of {} task(s) asked, {refused} refused\n",
            outcomes.len() - refused,
            outcomes.len()
        ));
        print(&text)?;
    }
    if refused == 0 {
        Ok(())
    } else {
        Err(CliError::failure(format_args!(
            "{verb}: {refused} of {} task(s) refused",
            outcomes.len()
        )))
    }
}

/// `--dry-run` (or nothing selected): what would be touched.
fn report_selection(verb: &str, tasks: &[TaskView], args: &ControlArgs) -> CliResult {
    if args.json {
        let listed: Vec<_> = tasks
            .iter()
            .map(|t| serde_json::json!({"id": t.id, "state": t.state.as_str()}))
            .collect();
        return print_line(serde_json::json!({
            "action": verb, "dry_run": args.dry_run, "tasks": listed,
        }));
    }
    if tasks.is_empty() {
        return print_line(format!("{verb}: no task matches"));
    }
    print(&listing(verb, tasks))?;
    print_line(format!("{verb} --dry-run: nothing was sent"))
}

/// The tasks a bulk request is for, one a line.
fn listing(verb: &str, tasks: &[TaskView]) -> String {
    let mut text = format!("{verb}: {} task(s):\n", tasks.len());
    for task in tasks {
        let by = task
            .submitted_by()
            .map(|s| s.short())
            .unwrap_or_else(|| "-".into());
        let phase = task.phase.as_deref().unwrap_or("-");
        text.push_str(&format!(
            "  {}  {}  {phase}  {by}\n",
            task.id,
            task.state.as_str()
        ));
    }
    text
}

/// On a terminal, ask; elsewhere (a script without `--yes`) refuse.
fn confirmed(verb: &str, count: usize) -> CliResult<bool> {
    if !std::io::stdin().is_terminal() {
        return Err(CliError::usage(format_args!(
            "{verb}: {count} task(s) selected; stdin is not a terminal, so nothing was sent: \
             give --yes to send, or --dry-run to list"
        )));
    }
    eprint!("{verb} these {count} task(s)? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::failure(format_args!("reading the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

fn outcome_line(action: ControlAction, outcome: &BulkOutcome) -> String {
    match &outcome.result {
        Ok(taken) => match QueueClient::task_id(&outcome.id) {
            Ok(id) => taken.message(action, &id),
            Err(_) => outcome.id.clone(),
        },
        Err(e) => e.to_string(),
    }
}

fn outcome_json(action: ControlAction, outcome: &BulkOutcome) -> serde_json::Value {
    let (result, message) = match &outcome.result {
        Ok(taken) if taken.taken() => ("taken", outcome_line(action, outcome)),
        Ok(_) => ("requested", outcome_line(action, outcome)),
        Err(e) => ("refused", e.to_string()),
    };
    serde_json::json!({
        "id": outcome.id, "state": outcome.state, "result": result, "message": message,
    })
}
