//! `cairn budget ID --max-cost X`: set a task's spending limit, through a control request like
//! `cairn pause` (files: `control/`; PostgreSQL: `cairn_control`). The daemon journals who set
//! it, the old and the new limit. It does not resume a task its budget paused: `cairn resume`
//! does, from its last checkpoint (docs/decisions.md).

use std::path::Path;

use clap::Args;

use super::error::{print_line, CliResult};
use super::source::DbArg;
use crate::client::QueueClient;
use crate::queue::control::ControlAction;

#[derive(Debug, Args)]
#[command(after_help = "\
The new limit replaces the task's budget.max_cost (its definition stays as submitted) and \
counts what the task has spent so far, the estimate for iterations lost to crashes included. \
A running task reads it before its next iteration; a task paused by its budget \
(budget.on_exceed: \"pause\") stays paused until `cairn resume ID`. Only a task in flight \
(running, paused, waiting) has a limit to set.")]
pub(super) struct BudgetArgs {
    /// The task id.
    id: String,

    /// The new spending limit, a number of at least 0.
    #[arg(long, value_name = "X")]
    max_cost: f64,

    /// Return as soon as the request is written, without waiting for the daemon to take it.
    #[arg(long)]
    no_wait: bool,

    /// How long to wait for a running daemon to take the request, e.g. 30s (a busy host can
    /// take longer than the default; --no-wait does not wait at all).
    #[arg(long, value_name = "DURATION", env = "CAIRN_WAIT", default_value = "5s", value_parser = humantime::parse_duration)]
    wait: std::time::Duration,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub(super) fn run(queue: &Path, args: BudgetArgs) -> CliResult {
    let id = QueueClient::task_id(&args.id)?;
    let client = QueueClient::open(queue, args.db.url())?.waiting_for_daemon(args.wait);
    let outcome = client.set_budget(&id, args.max_cost, !args.no_wait)?;
    print_line(outcome.message(ControlAction::Budget, &id))
}
