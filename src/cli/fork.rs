//! `cairn fork ID [--gen N | --from-phase NAME] [--patch JSON] [--as NEW_ID]`: a new task that
//! starts from a checkpoint of another, with a JSON merge patch (RFC 7386) applied to its
//! state, or from the beginning of one of its phases with the earlier phases' outputs kept.
//! The fork itself is the client's (`client::QueueClient::fork`); the original is not touched.

use std::path::Path;

use clap::Args;
use serde_json::Value;

use super::error::{print_line, CliError, CliResult};
use super::source::DbArg;
use crate::client::{ForkRequest, QueueClient};
use crate::task_id::TaskId;

#[derive(Debug, Args)]
pub(super) struct ForkArgs {
    /// The task to fork.
    id: String,

    /// The checkpoint generation to start from (default: the latest; see `cairn history`).
    #[arg(long = "gen", value_name = "N")]
    generation: Option<u64>,

    /// A JSON merge patch (RFC 7386) applied to the checkpoint's state, e.g. '{"temperature": 0.2}'.
    #[arg(long, value_name = "JSON")]
    patch: Option<String>,

    /// Start the new task at the beginning of this phase, with the outputs of the phases
    /// before it (the patch, if any, then patches those outputs: an object by phase name).
    #[arg(long, value_name = "PHASE", conflicts_with = "generation")]
    from_phase: Option<String>,

    /// The new task's id (default: the old one with a random suffix).
    #[arg(long = "as", value_name = "NEW_ID")]
    new_id: Option<String>,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub(super) fn run(queue: &Path, args: ForkArgs) -> CliResult {
    let client = QueueClient::open(queue, args.db.url())?;
    print_line(fork(
        &client,
        &args.id,
        args.generation,
        args.patch.as_deref(),
        args.new_id.as_deref(),
        args.from_phase.clone(),
    )?)
}

/// Fork `id` as `cairn fork` does (the dashboard's fork too): the new task's id. `patch` and
/// `new_id` are as given on the command line, checked here.
pub(super) fn fork(
    client: &QueueClient,
    id: &str,
    generation: Option<u64>,
    patch: Option<&str>,
    new_id: Option<&str>,
    from_phase: Option<String>,
) -> CliResult<TaskId> {
    let patch: Option<Value> = patch
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| CliError::usage(format!("--patch is not JSON: {e}")))?;
    let new_id = new_id
        .map(TaskId::parse)
        .transpose()
        .map_err(|e| CliError::usage(format!("--as: {e}")))?;
    let request = ForkRequest {
        id: QueueClient::task_id(id)?,
        generation,
        patch,
        new_id,
        from_phase,
    };
    Ok(client.fork(&request)?)
}
