//! [`PgReader`]: the read model of a queue kept in PostgreSQL, for the operator commands
//! (`status`, `show`, `history`, `checkpoint`, `validate` with `--db`).
//!
//! It gives the same views the file queue's [`QueueReader`](crate::queue::QueueReader) gives
//! ([`QueueView`], [`TaskView`], [`LoadedCheckpoint`]), so the commands format both the same
//! way; the views are built by the same code ([`crate::queue::read`]'s builders), fed from rows
//! instead of files. Each call is a handful of plain statements on one connection, run to
//! their end on the reader's own current-thread runtime: the reader is blocking, like the
//! commands that use it.

mod facts;
mod view;

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::runtime::Runtime;

use super::connect::PgQueue;
use super::error::{During, PgError};
use super::fenced::StoredCheckpoint;
use super::redact::redacted_url;
use super::schema::SCHEMA_VERSION;
use crate::queue::{ClusterView, LoadOptions, NodeView, QueueView, TaskView};
use crate::store::journal::JournalEvent;
use crate::store::{GenerationInfo, IterationCheckpoint, LoadedCheckpoint};

pub use facts::decode_newest;

/// A daemon renews its leases, and with them its `last_seen_at`, every lease/6 (also while it
/// holds nothing). One not seen for its own lease (`cairn_nodes.lease_seconds`) and holding no
/// unexpired lease is taken for gone; this is the lease assumed for a daemon registered
/// before the lease was stored (schema version 3).
pub const NODE_SEEN_WITHIN: Duration = Duration::from_secs(30);

/// One event of a task's journal in the database, with the lease it was written under.
#[derive(Debug, Clone)]
pub struct LeasedEvent {
    pub journal: JournalEvent,
    pub node: String,
    pub lease_epoch: i64,
}

/// A reader of the queue in one PostgreSQL database; it never writes (the commands that do
/// use [`PgQueue`]'s statements).
pub struct PgReader {
    db: PgQueue,
    runtime: Runtime,
    /// The connection string without its password, for messages.
    database: String,
}

impl std::fmt::Debug for PgReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgReader")
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

impl PgReader {
    /// Connect to the database at `url` and check that cairn's schema is there (and not
    /// newer than this cairn's). Blocking; never call it from an async task.
    pub fn open(url: &str) -> Result<PgReader, PgError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(PgError::Runtime)?;
        let db = PgQueue::connect_with_pool_size(url, 1)?;
        let version = runtime.block_on(db.schema_version())?;
        if version == 0 {
            return Err(PgError::NoSchema);
        }
        if version > SCHEMA_VERSION {
            return Err(PgError::SchemaTooNew {
                found: version,
                supported: SCHEMA_VERSION,
            });
        }
        Ok(PgReader {
            db,
            runtime,
            database: redacted_url(url),
        })
    }

    /// The database, named without its password.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Every task, in the order the file queue lists them (in flight, pending, finished; by
    /// id within each), and the daemons.
    pub fn status(&self, _options: LoadOptions) -> Result<QueueView, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            let (tasks, now) = view::read_tasks(&client, None).await?;
            let nodes = read_nodes(&client).await?;
            let mut warnings = Vec::new();
            for task in &tasks {
                warnings.extend(task.warnings.iter().cloned());
            }
            Ok(QueueView {
                root: self.database.clone().into(),
                now,
                daemon: crate::queue::DaemonInfo {
                    running: nodes.iter().any(|node| node.alive),
                    pid: None,
                },
                tasks,
                inbox: 0,
                rejected: 0,
                warnings,
                current_work_problem: None,
                limits: None,
                cluster: Some(ClusterView {
                    database: self.database.clone(),
                    nodes,
                }),
            })
        })
    }

    /// The daemons registered in the database, by name.
    pub fn daemons(&self) -> Result<Vec<NodeView>, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            read_nodes(&client).await
        })
    }

    /// One task; `None` when the database has no such task.
    pub fn task(&self, id: &str) -> Result<Option<TaskView>, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            let (tasks, _) = view::read_tasks(&client, Some(id)).await?;
            Ok(tasks.into_iter().next())
        })
    }

    /// Whether the database has a task with this id.
    pub fn task_exists(&self, id: &str) -> Result<bool, PgError> {
        Ok(self.definition(id)?.is_some())
    }

    /// A task's definition as stored (JSON text); `None` when there is no such task.
    pub fn definition(&self, id: &str) -> Result<Option<String>, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            let row = client
                .query_opt(
                    "SELECT definition::text FROM cairn_tasks WHERE id = $1",
                    &[&id],
                )
                .await
                .during("reading a task's definition")?;
            Ok(row.map(|row| row.get(0)))
        })
    }

    /// A task's journal, oldest first, with the node and epoch of each event.
    pub fn events(&self, id: &str) -> Result<Vec<LeasedEvent>, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            let rows = client
                .query(
                    "SELECT at, node, lease_epoch, event::text FROM cairn_events
                     WHERE task_id = $1 ORDER BY id",
                    &[&id],
                )
                .await
                .during("reading a task's events")?;
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let journal = facts::journal_event(row.get(0), row.get(3))?;
                    Some(LeasedEvent {
                        journal,
                        node: row.get(1),
                        lease_epoch: row.get(2),
                    })
                })
                .collect())
        })
    }

    /// The outputs of a task's finished phases kept beside its work state, by phase index.
    pub fn outputs(&self, id: &str) -> Result<Vec<(usize, serde_json::Value)>, PgError> {
        self.runtime.block_on(async {
            let client = self.db.client().await?;
            let rows = client
                .query(
                    "SELECT phase_index, output::text FROM cairn_outputs
                     WHERE task_id = $1 ORDER BY phase_index",
                    &[&id],
                )
                .await
                .during("reading a task's outputs")?;
            Ok(rows
                .iter()
                .filter_map(|row| {
                    let index = usize::try_from(row.get::<_, i32>(0)).ok()?;
                    let text: String = row.get(1);
                    Some((index, serde_json::from_str(&text).ok()?))
                })
                .collect())
        })
    }

    /// A task's checkpoint generations, newest first, as stored.
    pub fn checkpoints(&self, id: &str) -> Result<Vec<StoredCheckpoint>, PgError> {
        self.runtime.block_on(self.db.checkpoints(id))
    }

    /// A task's checkpoint generations, newest first, as `cairn history` lists them: what each
    /// says (or why it does not decode, by the checks the file store makes), and the
    /// checkpoint itself when it decodes.
    pub fn history(
        &self,
        id: &str,
    ) -> Result<Vec<(GenerationInfo, Option<IterationCheckpoint>)>, PgError> {
        Ok(self
            .checkpoints(id)?
            .into_iter()
            .map(|stored| facts::generation_info(id, &stored))
            .collect())
    }

    /// The newest checkpoint of a task that decodes, with the generations skipped on the way
    /// (an error when none of them decodes).
    pub fn latest_checkpoint(&self, id: &str) -> Result<Option<LoadedCheckpoint>, ReadError> {
        decode_newest(id, self.checkpoints(id)?).map_err(ReadError::Checkpoint)
    }

    /// One generation of a task's checkpoint.
    pub fn checkpoint_generation(
        &self,
        id: &str,
        generation: u64,
    ) -> Result<IterationCheckpoint, ReadError> {
        let stored = self.checkpoints(id)?;
        let Some(found) = stored.iter().find(|cp| cp.generation == generation) else {
            return Err(ReadError::NoGeneration {
                task_id: id.to_string(),
                generation,
                kept: stored.iter().map(|cp| cp.generation).collect(),
            });
        };
        crate::store::decode_checkpoint(&found.bytes).map_err(|source| {
            ReadError::Checkpoint(crate::store::StoreError::Corrupt {
                key: facts::checkpoint_key(id, generation),
                source,
            })
        })
    }
}

/// Why a checkpoint could not be read from the database.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Database(#[from] PgError),
    #[error(transparent)]
    Checkpoint(crate::store::StoreError),
    #[error(
        "task {task_id:?} has no checkpoint generation {generation} (kept: {})",
        list(kept)
    )]
    NoGeneration {
        task_id: String,
        generation: u64,
        kept: Vec<u64>,
    },
}

fn list(generations: &[u64]) -> String {
    if generations.is_empty() {
        return "none".into();
    }
    let names: Vec<String> = generations.iter().map(u64::to_string).collect();
    names.join(", ")
}

/// The daemons registered in the database, by name.
async fn read_nodes(client: &tokio_postgres::Client) -> Result<Vec<NodeView>, PgError> {
    let rows = client
        .query(
            "SELECT n.name, n.started_at, n.last_seen_at,
                    n.last_seen_at > now()
                        - COALESCE((to_jsonb(n) ->> 'lease_seconds')::float8, $1::float8)
                          * interval '1 second',
                    (SELECT count(*) FROM cairn_tasks t
                     WHERE t.lease_node = n.name AND t.state = 'running'
                       AND t.lease_expires_at > now())
             FROM cairn_nodes n ORDER BY n.name",
            &[&NODE_SEEN_WITHIN.as_secs_f64()],
        )
        .await
        .during("reading the daemons")?;
    Ok(rows
        .iter()
        .map(|row| {
            let seen: bool = row.get(3);
            let leases = usize::try_from(row.get::<_, i64>(4)).unwrap_or(0);
            NodeView {
                name: row.get(0),
                started_at: row.get::<_, DateTime<Utc>>(1),
                last_seen_at: row.get::<_, DateTime<Utc>>(2),
                alive: seen || leases > 0,
                leases,
            }
        })
        .collect())
}
