//! The PostgreSQL backend's foundation: several daemons on several hosts share one queue kept
//! in PostgreSQL, each running task leased by one daemon, every durable write for a task fenced
//! by its lease epoch.
//!
//! - [`schema`]: versioned, idempotent migrations, safe when several daemons start at once.
//! - [`PgQueue`]: a small connection pool, and on it the statements of the lease protocol:
//!   [`PgQueue::submit`] (once per task id), [`PgQueue::claim`] (`FOR UPDATE SKIP LOCKED`, a new
//!   epoch per claim, expired leases taken over and counted as crashes),
//!   [`PgQueue::renew_held`] (one statement for all the leases a node holds), [`PgQueue::release_all`] (a clean stop),
//!   and the fenced writes (checkpoint, phase state, output, event, requeue after a failed
//!   attempt, pause, final record), each of
//!   which checks the lease in the same statement and returns [`PgError::LeaseLost`] when it
//!   no longer holds. Checkpoints of many tasks are stored in one statement, each row fenced
//!   by its own lease ([`PgQueue::save_checkpoints`]); the backend group-commits its tasks'
//!   saves that way.
//! - [`PgBackend`]: the owner's [`QueueBackend`](super::QueueBackend) on these statements,
//!   with each host's inbox feeding the shared queue ([`PgSink`]), control requests
//!   (`cairn_control`, applied in SQL to tasks nobody holds) and forks with start points.
//! - [`PgQueue::prune`]: finished tasks past their retention removed with all their rows.
//! - [`PgReader`]: the read model the operator commands use with `--db`: the same views as
//!   the file queue's reader, from rows.
//! - [`SubmitListener`]: LISTEN/NOTIFY wake-ups for new and released work; the caller still
//!   polls, so a lost notification only delays pickup.
//!
//! Lease expiry is decided by the database's clock (`now()`) alone, so the hosts' clocks never
//! matter. `docs/cluster.md` describes the model.

mod backend;
mod committer;
mod connect;
mod conninfo;
mod control;
mod error;
mod fenced;
mod fork;
mod grants;
mod intake;
mod journal;
mod lease;
mod listen;
mod progress;
mod prune;
mod read;
mod redact;
mod roles;
mod row_state;
pub mod schema;
mod steer;
mod submit;

pub use backend::PgBackend;
pub use connect::{PgQueue, DEFAULT_POOL_SIZE};
pub use control::HandledRequest;
pub use error::PgError;
pub use fenced::{CheckpointWrite, Outcome, StoredCheckpoint};
pub use fork::{ForkError, ForkSource};
pub use intake::PgSink;
pub use lease::{ClaimedTask, Lease, RenewedLease};
pub use listen::{SubmitListener, Wakeup, WORK_CHANNEL};
pub use progress::TaskTimes;
pub use prune::{DbPrune, PruneRules, PrunedGeneration, PrunedTask, PRUNE_BATCH};
pub use read::{decode_newest, LeasedEvent, PgReader, ReadError, NODE_SEEN_WITHIN};
pub use redact::redacted_url;
pub use roles::{NoVouching, RegisteredRole, RoleKind, Vouched};
pub use schema::{Migrated, SCHEMA_VERSION};
pub use submit::{NewTask, Submitted};
