//! `cairn show` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct ShowArgs {}

pub fn run(_queue: &Path, _args: ShowArgs) -> u8 {
    eprintln!("error: `cairn show` is not available in this build yet");
    super::exit::FAILURE
}
