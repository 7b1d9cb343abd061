//! The client's one error type: a message for people, and its class for programs.

use std::fmt;

/// What a client call returns.
pub type ClientResult<T> = Result<T, ClientError>;

/// What kind of failure an error is: the command line's exit code and the Python package's
/// exception follow from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A runtime failure: I/O, an unreadable queue, an unreachable database, a daemon that
    /// refused the request.
    Failure,
    /// The request itself is wrong: a bad id, a bad patch, an id already taken.
    Usage,
    /// The task definition does not validate, or its id is taken in the queue.
    InvalidTask,
    /// The queue could be written by others, or exposes what it must not.
    UnsafeQueue,
}

/// A failed client call: what went wrong, in words that name the file, task or database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    kind: ErrorKind,
    message: String,
}

impl ClientError {
    /// An error of `kind` with this message.
    pub fn new(kind: ErrorKind, message: impl fmt::Display) -> ClientError {
        ClientError {
            kind,
            message: message.to_string(),
        }
    }

    /// A runtime failure.
    pub fn failure(message: impl fmt::Display) -> ClientError {
        ClientError::new(ErrorKind::Failure, message)
    }

    /// A wrong request.
    pub fn usage(message: impl fmt::Display) -> ClientError {
        ClientError::new(ErrorKind::Usage, message)
    }

    /// A task that does not validate or whose id is taken.
    pub fn invalid_task(message: impl fmt::Display) -> ClientError {
        ClientError::new(ErrorKind::InvalidTask, message)
    }

    /// Its class.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ClientError {}

/// The error of a database URL given to a cairn built without PostgreSQL support.
#[cfg(not(feature = "postgres"))]
pub(crate) fn without_postgres() -> ClientError {
    ClientError::usage(
        "--db: this cairn was built without PostgreSQL support (the `postgres` feature)",
    )
}
