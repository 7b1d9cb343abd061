//! `cairn validate FILE`: check a task file, print what is wrong, change nothing.

use std::path::PathBuf;

use clap::Args;

use super::exit;

#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// The task file ("-" for stdin).
    file: PathBuf,
}

pub fn run(args: ValidateArgs) -> u8 {
    match super::submit::read_task_file(&args.file) {
        Ok((_, task)) => {
            let phases: Vec<String> = task
                .phases
                .iter()
                .map(|p| format!("{} ({})", p.name, p.kind.as_str()))
                .collect();
            println!(
                "{}: valid; phases: {}",
                super::submit::file_name(&args.file),
                phases.join(", ")
            );
            exit::OK
        }
        Err(code) => code,
    }
}
