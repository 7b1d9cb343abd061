//! `cairn checkpoint` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct CheckpointArgs {}

pub fn run(_queue: &Path, _args: CheckpointArgs) -> u8 {
    eprintln!("error: `cairn checkpoint` is not available in this build yet");
    super::exit::FAILURE
}
