//! `cairn status` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct StatusArgs {}

pub fn run(_queue: &Path, _args: StatusArgs) -> u8 {
    eprintln!("error: `cairn status` is not available in this build yet");
    super::exit::FAILURE
}
