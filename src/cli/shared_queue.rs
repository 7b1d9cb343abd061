//! What the commands that steer or add to the shared queue (`--db`) need: a runtime, one
//! connection, and a schema this cairn reads. Commands other than `cairn run` and
//! `cairn db migrate` never change the schema.

use tokio::runtime::Runtime;

use super::error::{CliError, CliResult};
use crate::queue::postgres::{redacted_url, PgQueue, SCHEMA_VERSION};

/// The database at `url`, with a runtime to run its statements on.
pub struct SharedQueue {
    pub runtime: Runtime,
    pub db: PgQueue,
    /// The connection string without its password, for messages.
    pub database: String,
}

impl SharedQueue {
    /// Connect to `url` and check that its schema is this cairn's. A database that cannot be
    /// reached is a runtime failure (exit 1) naming it without its password.
    pub fn open(url: &str) -> CliResult<SharedQueue> {
        let database = redacted_url(url);
        let named = |e: crate::queue::postgres::PgError| {
            CliError::failure(format_args!("database {database}: {e}"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
        let db = PgQueue::connect_with_pool_size(url, 1).map_err(named)?;
        let version = runtime.block_on(db.schema_version()).map_err(named)?;
        if version == 0 {
            return Err(named(crate::queue::postgres::PgError::NoSchema));
        }
        if version != SCHEMA_VERSION {
            return Err(CliError::failure(format_args!(
                "database {database}: the cairn schema is at version {version}, this cairn's is \
                 {SCHEMA_VERSION}: run `cairn db migrate --db URL` (or start `cairn run --db`)"
            )));
        }
        Ok(SharedQueue {
            runtime,
            db,
            database,
        })
    }

    /// A failed statement, naming the database.
    pub fn error(&self, error: impl std::fmt::Display) -> CliError {
        CliError::failure(format_args!("database {}: {error}", self.database))
    }
}
