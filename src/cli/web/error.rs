//! Why the listener could not answer a request or take an action: one type, so that each
//! answer's status code follows from what went wrong.

use crate::client::ClientError;

/// A request the listener could not answer, or an action it did not take. Cloned: one status
/// document's error is the answer of every request until the next refresh.
#[derive(Debug, Clone, thiserror::Error)]
pub(super) enum WebError {
    #[error("the dashboard's reader is gone")]
    ReaderGone,
    #[error("reading the status: {0}")]
    Blocking(String),
    #[error("{0}")]
    Client(#[from] ClientError),
    /// A command's failure, as its message (`cairn show`'s document, a control request, a fork).
    #[error("{0}")]
    Command(String),
    #[error("refused: the request comes from another site (Sec-Fetch-Site: {0})")]
    OtherSite(String),
    #[error("refused: the request comes from another origin ({0}, not this listener's)")]
    OtherOrigin(String),
    #[error("the action names no {0}")]
    Missing(&'static str),
    #[error("{verb} requested for {asked} of {total} task(s); refused: {refused}")]
    BulkRefused {
        verb: &'static str,
        asked: usize,
        total: usize,
        refused: String,
    },
}

impl WebError {
    /// The error of a command of the command line.
    pub(super) fn command(error: crate::cli::error::CliError) -> WebError {
        WebError::Command(error.message())
    }
}
