//! `cairn validate FILE`: check a task file, print what is wrong, change nothing. With
//! `--db URL`, also check that the shared queue does not have the task's id already (what
//! `cairn submit --db` would refuse).

use std::path::PathBuf;

use clap::Args;

use super::error::{print_line, CliError, CliResult};
use super::source::DbArg;
use crate::client::QueueClient;

#[derive(Debug, Args)]
pub(super) struct ValidateArgs {
    /// The task file ("-" for stdin).
    file: PathBuf,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub(super) fn run(args: ValidateArgs) -> CliResult {
    let (_, task) = super::submit::read_task_file(&args.file)?;
    let name = super::submit::file_name(&args.file);
    let phases: Vec<String> = task
        .phases
        .iter()
        .map(|p| format!("{} ({})", p.name, p.kind.as_str()))
        .collect();
    let mut line = format!("{name}: valid; phases: {}", phases.join(", "));
    if let Some(url) = args.db.url() {
        match &task.id {
            // `submit` gives it a new id (the file's name and a random suffix).
            None => line.push_str("; no id (submit gives it a new one)"),
            Some(id) => {
                let client = QueueClient::database(url)?;
                let database = client.location();
                if !client.id_is_free(id)? {
                    return Err(CliError::invalid_task(format_args!(
                        "{name}: a task with id {:?} already exists in the shared queue \
                         ({database}); `cairn submit --db` would refuse it",
                        id.as_str()
                    )));
                }
                line.push_str(&format!(
                    "; id {:?} is free in the shared queue ({database})",
                    id.as_str()
                ));
            }
        }
    }
    print_line(line)
}
