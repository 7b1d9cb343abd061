//! The PostgreSQL backend's foundation: several daemons on several hosts share one queue kept
//! in PostgreSQL, each running task leased by one daemon, every durable write for a task fenced
//! by its lease epoch.
//!
//! - [`schema`]: versioned, idempotent migrations, safe when several daemons start at once.
//! - [`PgQueue`]: a small connection pool, and on it the statements of the lease protocol:
//!   [`PgQueue::submit`] (once per task id), [`PgQueue::claim`] (`FOR UPDATE SKIP LOCKED`, a new
//!   epoch per claim, expired leases taken over and counted as crashes),
//!   [`PgQueue::renew_all`] (one statement per node), [`PgQueue::release_all`] (a clean stop),
//!   and the fenced writes (checkpoint, phase state, output, event, requeue after a failed
//!   attempt, pause, final record), each of
//!   which checks the lease in the same statement and returns [`PgError::LeaseLost`] when it
//!   no longer holds.
//! - [`PgBackend`]: the owner's [`QueueBackend`](super::QueueBackend) on these statements.
//! - [`SubmitListener`]: LISTEN/NOTIFY wake-ups for new and released work; the caller still
//!   polls, so a lost notification only delays pickup.
//!
//! Lease expiry is decided by the database's clock (`now()`) alone, so the hosts' clocks never
//! matter. `docs/cluster.md` describes the model.

mod backend;
mod connect;
mod error;
mod fenced;
mod journal;
mod lease;
mod listen;
pub mod schema;
mod submit;

pub use backend::PgBackend;
pub use connect::{PgQueue, DEFAULT_POOL_SIZE};
pub use error::PgError;
pub use fenced::{Outcome, StoredCheckpoint};
pub use lease::{ClaimedTask, Lease, RenewedLease};
pub use listen::{SubmitListener, Wakeup, WORK_CHANNEL};
pub use schema::{Migrated, SCHEMA_VERSION};
pub use submit::{NewTask, Submitted};
