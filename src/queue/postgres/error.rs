//! Why a PostgreSQL queue operation failed.

use crate::store::CheckpointError;

/// Errors of the PostgreSQL backend.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// A fenced write found the lease no longer held: it expired (by the database's clock), was
    /// released, or another daemon took the task over with a newer epoch. Nothing was written;
    /// the caller must stop working on the task.
    #[error(
        "lease lost on task {task_id:?} (node {node:?}, epoch {epoch}): it expired or another \
         daemon took the task over; nothing was written"
    )]
    LeaseLost {
        task_id: String,
        node: String,
        epoch: i64,
    },
    /// The runtime that drives the database client could not be started.
    #[error("starting the database client's runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The connection string does not parse.
    #[error("invalid database URL: {0}")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// TLS could not be set up for the connection.
    #[error("setting up TLS for the database connection: {0}")]
    Tls(#[source] rustls::Error),
    /// The connection string's `sslmode` is none of libpq's.
    #[error(
        "invalid database URL: sslmode {0:?} is not one of disable, allow, prefer, require, \
         verify-ca, verify-full"
    )]
    InvalidSslMode(String),
    /// The connection string's `sslrootcert` could not be read.
    #[error("sslrootcert {}: {problem}", path.display())]
    RootCert {
        path: std::path::PathBuf,
        problem: String,
    },
    /// The connection pool could not be set up.
    #[error("setting up the database connection pool: {0}")]
    Pool(#[source] deadpool_postgres::BuildError),
    /// No connection could be had from the pool (the database is down or refuses us).
    #[error("connecting to the database: {0}")]
    Connect(#[source] deadpool_postgres::PoolError),
    /// No answer came within the time the lease still allowed for it.
    #[error("{action}: no answer from the database within {waited:?}")]
    TimedOut {
        action: &'static str,
        waited: std::time::Duration,
    },
    /// A statement failed; `action` says what it was doing.
    #[error("{action}: {source}")]
    Query {
        action: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    /// The database has no cairn schema: no daemon ran on it and nobody migrated it.
    #[error(
        "the database has no cairn schema: run `cairn db migrate --db URL` or start a daemon \
         on it with `cairn run --db URL`"
    )]
    NoSchema,
    /// The database's schema was migrated by a newer cairn.
    #[error(
        "the database's cairn schema is at version {found}, newer than this cairn's \
         {supported}: upgrade cairn on this host"
    )]
    SchemaTooNew { found: i32, supported: i32 },
    /// `cairn db grant` was given a role the database does not have.
    #[error("the database has no role {0:?}: create it first (CREATE ROLE ... LOGIN)")]
    NoSuchRole(String),
    /// Another live daemon registered under the same node name.
    #[error(
        "node name {node:?} is in use by another running daemon: give each daemon its own \
         name (--node)"
    )]
    NodeNameInUse { node: String },
    /// The task id cannot be stored.
    #[error("invalid task id {task_id:?}: {reason}")]
    InvalidTaskId {
        task_id: String,
        #[source]
        reason: crate::task_id::InvalidName,
    },
    /// A number does not fit the column that stores it (nothing was written).
    #[error("{what} {value} does not fit its column")]
    OutOfRange { what: &'static str, value: String },
    /// A value stored as JSON could not be encoded; nothing was written.
    #[error("encoding {what} as JSON: {source}")]
    EncodeJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// The checkpoint could not be encoded; nothing was written.
    #[error("encoding the checkpoint of task {task_id:?}: {source}")]
    Encode {
        task_id: String,
        #[source]
        source: CheckpointError,
    },
    /// A batch of writes committed together failed as a whole (nothing of it was written):
    /// the error each write of the batch gets.
    #[error(transparent)]
    Batch(std::sync::Arc<PgError>),
}

/// Name what a failed statement was doing.
pub(super) trait During<T> {
    fn during(self, action: &'static str) -> Result<T, PgError>;
}

impl<T> During<T> for Result<T, tokio_postgres::Error> {
    fn during(self, action: &'static str) -> Result<T, PgError> {
        self.map_err(|source| PgError::Query { action, source })
    }
}

/// `value` as JSON text for a `$n::text::json` parameter (the text goes in as it is, so numbers
/// keep their digits), or [`PgError::EncodeJson`] naming `what` it is.
pub(super) fn json_text<T: serde::Serialize + ?Sized>(
    what: &'static str,
    value: &T,
) -> Result<String, PgError> {
    serde_json::to_string(value).map_err(|source| PgError::EncodeJson { what, source })
}

/// `value` as the column's type, or [`PgError::OutOfRange`] naming `what` it is.
pub(super) fn in_range<T, U>(what: &'static str, value: T) -> Result<U, PgError>
where
    T: Copy + std::fmt::Display,
    U: TryFrom<T>,
{
    U::try_from(value).map_err(|_| PgError::OutOfRange {
        what,
        value: value.to_string(),
    })
}

impl PgError {
    /// Whether the same statement may well succeed if sent again soon: the database could not
    /// be reached, restarted or shut the connection, or asked for the transaction to be run
    /// again. A refused lease, a bad value or a schema problem is not.
    pub fn is_transient(&self) -> bool {
        match self {
            PgError::Connect(_) | PgError::TimedOut { .. } => true,
            PgError::Query { source, .. } => is_transient_query_error(source),
            PgError::Batch(error) => error.is_transient(),
            _ => false,
        }
    }
}

/// A statement's error that says nothing about the statement itself: the connection broke (no
/// SQLSTATE but an I/O error, or class 08), the server is shutting down or starting (57P01-57P03), or a
/// serialization failure or deadlock asks for a retry.
fn is_transient_query_error(error: &tokio_postgres::Error) -> bool {
    if error.is_closed() {
        return true;
    }
    match error.code() {
        None => {
            std::error::Error::source(error).is_some_and(|source| source.is::<std::io::Error>())
        }
        Some(code) => {
            let code = code.code();
            code.starts_with("08")
                || matches!(
                    code,
                    "57P01" | "57P02" | "57P03" | "40001" | "40P01" | "53300"
                )
        }
    }
}
