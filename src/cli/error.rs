//! The one error path of the command line, as ripgrep's `main` has it: every subcommand
//! returns a [`CliResult`]; [`super::main`] prints the error once, on stderr, and exits with
//! the code it carries. A closed stdout (`cairn status | head -1`) is recognised there too.

use std::fmt;
use std::io;

use super::exit;

/// What a subcommand returns.
pub type CliResult<T = ()> = Result<T, CliError>;

/// A failed command: the error to print and its documented exit code (see [`exit`]).
///
/// Any error converts into one with `?`, as a runtime failure (exit 1); the other codes are
/// given where the failure is found ([`CliError::usage`], [`CliError::invalid_task`],
/// [`CliError::new`]). Like `anyhow::Error`, it is not a `std::error::Error` itself, so that
/// the blanket conversion can exist.
pub struct CliError {
    code: u8,
    error: anyhow::Error,
}

impl CliError {
    /// An error that exits with `code`.
    pub fn new(code: u8, error: impl Into<anyhow::Error>) -> CliError {
        CliError {
            code,
            error: error.into(),
        }
    }

    /// A runtime failure (exit 1) with this message.
    pub fn failure(message: impl fmt::Display) -> CliError {
        CliError::new(exit::FAILURE, anyhow::anyhow!("{message}"))
    }

    /// Bad usage (exit 2) with this message.
    pub fn usage(message: impl fmt::Display) -> CliError {
        CliError::new(exit::USAGE, anyhow::anyhow!("{message}"))
    }

    /// An invalid task file (exit 3) with this message.
    pub fn invalid_task(message: impl fmt::Display) -> CliError {
        CliError::new(exit::INVALID_TASK, anyhow::anyhow!("{message}"))
    }

    /// The exit code this error ends the process with.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// Did the reader of stdout go away? That is how a pipe ends (`| head`), not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        self.error.chain().any(|cause| {
            cause
                .downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe)
        })
    }

    /// The message printed after `error: `: the error and its causes, each cause left out when
    /// the message already quotes it (the library's errors name their cause in their text).
    pub fn message(&self) -> String {
        let mut text = self.error.to_string();
        for cause in self.error.chain().skip(1) {
            let cause = cause.to_string();
            if !text.contains(&cause) {
                text.push_str(": ");
                text.push_str(&cause);
            }
        }
        text
    }
}

impl<E: Into<anyhow::Error>> From<E> for CliError {
    /// A runtime failure (exit 1), except for the client's errors, whose class says their code.
    fn from(error: E) -> CliError {
        let error = error.into();
        let code = error
            .downcast_ref::<crate::client::ClientError>()
            .map_or(exit::FAILURE, |e| exit_code_of(e.kind()));
        CliError::new(code, error)
    }
}

/// The exit code of a client error of class `kind`.
fn exit_code_of(kind: crate::client::ErrorKind) -> u8 {
    use crate::client::ErrorKind;
    match kind {
        ErrorKind::Failure => exit::FAILURE,
        ErrorKind::Usage => exit::USAGE,
        ErrorKind::InvalidTask => exit::INVALID_TASK,
        ErrorKind::UnsafeQueue => exit::UNSAFE_QUEUE,
    }
}

impl fmt::Debug for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CliError")
            .field("code", &self.code)
            .field("message", &self.message())
            .finish()
    }
}

/// Give an error its exit code where it is found: `parse(x).exit_code(exit::USAGE)?`.
pub trait ExitCodeExt<T> {
    fn exit_code(self, code: u8) -> CliResult<T>;
}

impl<T, E: Into<anyhow::Error>> ExitCodeExt<T> for Result<T, E> {
    fn exit_code(self, code: u8) -> CliResult<T> {
        self.map_err(|error| CliError::new(code, error))
    }
}

/// Write `text` to stdout and flush it. A closed pipe comes back as an error like any other;
/// [`super::main`] is where it is told apart.
pub fn print(text: &str) -> CliResult {
    use std::io::Write;
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| anyhow::Error::new(e).context("writing to stdout"))?;
    Ok(())
}

/// [`print()`] with a newline after `line`.
pub fn print_line(line: impl fmt::Display) -> CliResult {
    print(&format!("{line}\n"))
}

#[cfg(test)]
mod tests {
    use super::{exit, CliError, ExitCodeExt};

    #[test]
    fn causes_are_printed_once() {
        let io = std::io::Error::other("disk on fire");
        let quoted = anyhow::Error::new(std::io::Error::other("disk on fire"))
            .context("reading x: disk on fire");
        assert_eq!(CliError::from(quoted).message(), "reading x: disk on fire");
        let chained = anyhow::Error::new(io).context("reading x");
        assert_eq!(CliError::from(chained).message(), "reading x: disk on fire");
    }

    #[test]
    fn codes_and_broken_pipes() {
        let usage: Result<(), _> = Err(anyhow::anyhow!("bad id"));
        assert_eq!(
            usage.exit_code(exit::USAGE).unwrap_err().code(),
            exit::USAGE
        );
        let pipe = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::BrokenPipe))
            .context("writing to stdout");
        assert!(CliError::from(pipe).is_broken_pipe());
        assert!(!CliError::failure("no such task").is_broken_pipe());
    }
}
