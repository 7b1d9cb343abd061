//! Subcommands a program built on the library adds to the `cairn` command line, so that the
//! library need not compile what only that program runs. They take the global options, get
//! the exit codes' help, and appear in `cairn completions`.

use clap::{ArgMatches, FromArgMatches, Subcommand};

use super::error::CliResult;
use super::{Cli, Command, GlobalArgs};

/// The subcommands a program adds to the library's, as a clap [`Subcommand`] enum (whose own
/// doc comment clap would take as `cairn`'s about text, so it has none).
pub trait ExtraCommands: Subcommand {
    /// Run the parsed subcommand. `Ok` holds its exit code (see [`super::exit`]).
    fn run(self) -> CliResult<u8>;
}

/// No subcommands beyond the library's: the command line of [`super::main`].
#[derive(Debug, Subcommand)]
pub enum NoExtraCommands {}

impl ExtraCommands for NoExtraCommands {
    fn run(self) -> CliResult<u8> {
        match self {}
    }
}

/// The subcommand a command line names: one of the library's, or one the program added.
pub(super) enum Invocation<E> {
    Own(Box<Command>),
    Extra(E),
}

impl<E: ExtraCommands> Invocation<E> {
    /// The global options and the subcommand of `matches`, by the subcommand's name.
    pub(super) fn from_matches(matches: &ArgMatches) -> Result<(GlobalArgs, Self), clap::Error> {
        match matches.subcommand_name() {
            Some(name) if E::has_subcommand(name) => Ok((
                GlobalArgs::from_arg_matches(matches)?,
                Invocation::Extra(E::from_arg_matches(matches)?),
            )),
            _ => {
                let cli = Cli::from_arg_matches(matches)?;
                Ok((cli.global, Invocation::Own(Box::new(cli.command))))
            }
        }
    }
}
