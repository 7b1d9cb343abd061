//! `cairn history` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct HistoryArgs {}

pub fn run(_queue: &Path, _args: HistoryArgs) -> u8 {
    eprintln!("error: `cairn history` is not available in this build yet");
    super::exit::FAILURE
}
