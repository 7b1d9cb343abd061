//! `cairn completions SHELL`: a completion script for bash, zsh, fish, elvish or PowerShell,
//! generated from the command-line definition itself (so it never falls behind).

use clap::Args;
use clap_complete::Shell;

use super::error::{print, CliResult};

#[derive(Debug, Args)]
#[command(after_help = "\
Install, for example:
  cairn completions bash > ~/.local/share/bash-completion/completions/cairn
  cairn completions zsh  > \"${fpath[1]}/_cairn\"
  cairn completions fish > ~/.config/fish/completions/cairn.fish")]
pub(super) struct CompletionsArgs {
    /// The shell to write the script for.
    #[arg(value_enum)]
    shell: Shell,
}

/// The script for the command line `definition` makes (the program's own subcommands too).
pub(super) fn run(args: CompletionsArgs, definition: fn() -> clap::Command) -> CliResult {
    let mut command = definition();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut command, "cairn", &mut script);
    print(&String::from_utf8_lossy(&script))
}
