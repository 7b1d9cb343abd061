//! A client's connection to a queue shared in PostgreSQL: a runtime to run statements on, one
//! connection for writes, and the read model's reader (opened when first needed). Clients
//! never change the schema; only `cairn run` and `cairn db migrate` do.

use std::sync::OnceLock;

use tokio::runtime::Runtime;

use super::error::{ClientError, ClientResult};
use crate::queue::postgres::{redacted_url, PgError, PgQueue, PgReader, SCHEMA_VERSION};

/// The database of a shared queue, for a client.
pub(super) struct SharedQueue {
    pub(super) runtime: Runtime,
    pub(super) db: PgQueue,
    /// The connection string without its password, for messages.
    pub(super) database: String,
    url: String,
    reader: OnceLock<PgReader>,
}

impl SharedQueue {
    /// Connect to `url` and check that its schema is this cairn's.
    pub(super) fn open(url: &str) -> ClientResult<SharedQueue> {
        let database = redacted_url(url);
        let named = |e: PgError| ClientError::failure(format_args!("database {database}: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::failure(format_args!("cannot start the runtime: {e}")))?;
        let db = PgQueue::connect_with_pool_size(url, 1).map_err(named)?;
        let version = runtime.block_on(db.schema_version()).map_err(named)?;
        if version == 0 {
            return Err(named(PgError::NoSchema));
        }
        if version != SCHEMA_VERSION {
            return Err(ClientError::failure(format_args!(
                "database {database}: the cairn schema is at version {version}, this cairn's is \
                 {SCHEMA_VERSION}: run `cairn db migrate --db URL` (or start `cairn run --db`)"
            )));
        }
        Ok(SharedQueue {
            runtime,
            db,
            database,
            url: url.to_string(),
            reader: OnceLock::new(),
        })
    }

    /// The read model's reader of the same database.
    pub(super) fn reader(&self) -> ClientResult<&PgReader> {
        if let Some(reader) = self.reader.get() {
            return Ok(reader);
        }
        let reader = PgReader::open(&self.url).map_err(|e| self.error(e))?;
        Ok(self.reader.get_or_init(|| reader))
    }

    /// Run one of the database's statements to its end.
    pub(super) fn block_on<T>(
        &self,
        statement: impl std::future::Future<Output = Result<T, PgError>>,
    ) -> ClientResult<T> {
        self.runtime.block_on(statement).map_err(|e| self.error(e))
    }

    /// A failure of a statement, naming the database.
    pub(super) fn error(&self, error: impl std::fmt::Display) -> ClientError {
        ClientError::failure(format_args!("database {}: {error}", self.database))
    }
}
