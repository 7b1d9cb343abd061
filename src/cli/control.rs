//! `cairn pause|resume|cancel|retry ID` (being written).

use std::path::Path;

use clap::Args;

#[derive(Debug, Clone, Copy)]
pub enum Action {
    Pause,
    Resume,
    Cancel,
    Retry,
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    /// The task id.
    id: String,
}

pub fn run(_queue: &Path, _action: Action, _args: ControlArgs) -> u8 {
    eprintln!("error: this command is not available in this build yet");
    super::exit::FAILURE
}
