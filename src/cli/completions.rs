//! `cairn completions` (being written).

use clap::Args;

#[derive(Debug, Args)]
pub struct CompletionsArgs {}

pub fn run(_args: CompletionsArgs) -> u8 {
    eprintln!("error: `cairn completions` is not available in this build yet");
    super::exit::FAILURE
}
