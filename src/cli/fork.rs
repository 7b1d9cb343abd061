//! `cairn fork ID` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Args)]
pub struct ForkArgs {}

pub fn run(_queue: &Path, _args: ForkArgs) -> u8 {
    eprintln!("error: `cairn fork` is not available in this build yet");
    super::exit::FAILURE
}
