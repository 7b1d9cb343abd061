//! `cairn validate FILE`: check a task file, print what is wrong, change nothing.

use std::path::PathBuf;

use clap::Args;

use super::error::{print_line, CliResult};

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The task file ("-" for stdin).
    file: PathBuf,
}

pub fn run(args: ValidateArgs) -> CliResult {
    let (_, task) = super::submit::read_task_file(&args.file)?;
    let phases: Vec<String> = task
        .phases
        .iter()
        .map(|p| format!("{} ({})", p.name, p.kind.as_str()))
        .collect();
    print_line(format_args!(
        "{}: valid; phases: {}",
        super::submit::file_name(&args.file),
        phases.join(", ")
    ))
}
