//! What the commands that steer or add to the shared queue (`--db`) need: a runtime, one
//! connection, and a schema this cairn reads. Commands other than `cairn run` and
//! `cairn db migrate` never change the schema.

use tokio::runtime::Runtime;

use super::error::{CliError, CliResult};
use crate::queue::postgres::{PgQueue, SCHEMA_VERSION};

/// The database at `url`, with a runtime to run its statements on.
pub struct SharedQueue {
    pub runtime: Runtime,
    pub db: PgQueue,
}

impl SharedQueue {
    /// Connect to `url` and check that its schema is this cairn's.
    pub fn open(url: &str) -> CliResult<SharedQueue> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CliError::failure(format_args!("cannot start the runtime: {e}")))?;
        let db = PgQueue::connect_with_pool_size(url, 1)?;
        let version = runtime.block_on(db.schema_version())?;
        if version != SCHEMA_VERSION {
            return Err(CliError::failure(format_args!(
                "the database's cairn schema is at version {version}, this cairn's is \
                 {SCHEMA_VERSION}: run `cairn db migrate --db URL` (or start `cairn run --db`)"
            )));
        }
        Ok(SharedQueue { runtime, db })
    }
}
