//! `cairn prune` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct PruneArgs {}

pub fn run(_queue: &Path, _args: PruneArgs) -> u8 {
    eprintln!("error: `cairn prune` is not available in this build yet");
    super::exit::FAILURE
}
