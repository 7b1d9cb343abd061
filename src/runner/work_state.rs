//! The daemon's in-memory copy of `current_work.json` and the one writer that persists it.
//!
//! Writes are group-committed: every change is made in memory first, then [`WorkState::persist`]
//! returns once a write that includes it is durable. Changes that several tasks make while a
//! write is under way are all covered by the next one, so many tasks starting or finishing at
//! once cost a few rewrites of the file, not one each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::Utc;

use crate::queue::{LoadError, Queue, QueueError};
use crate::store::current_work::CurrentWork;

/// Shared by the scheduler and every running task; each change is followed by [`persist`].
///
/// [`persist`]: WorkState::persist
#[derive(Debug)]
pub struct WorkState {
    work: Mutex<CurrentWork>,
    /// Persist requests so far; a request's ticket is this count right after it was made.
    requested: AtomicU64,
    /// Serializes writers, so the file on disk only moves forward. An async lock: callers
    /// waiting for the writer wait as futures, not as blocked threads.
    writer: tokio::sync::Mutex<Writer>,
    /// The owner it is read from and written through.
    queue: Queue,
}

impl WorkState {
    /// Read the work state through the queue's owner (a new queue has none). Blocking.
    pub fn load(queue: Queue) -> Result<WorkState, LoadError> {
        let work = queue.load_work()?;
        Ok(WorkState {
            work: Mutex::new(work),
            requested: AtomicU64::new(0),
            writer: tokio::sync::Mutex::new(Writer::default()),
            queue,
        })
    }

    /// Change the in-memory state (call [`WorkState::persist`] to make it durable).
    pub fn update<R>(&self, change: impl FnOnce(&mut CurrentWork) -> R) -> R {
        let mut work = self
            .work
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut work)
    }

    pub fn snapshot(&self) -> CurrentWork {
        self.update(|work| work.clone())
    }

    /// Take a ticket for the changes made so far. Any write that begins after the ticket was
    /// taken serializes the state after those changes (both happen under `work`'s lock or
    /// after this increment), so it covers them.
    fn ticket(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Write the state as it is now, encoded in `buffer`; returns the highest ticket the write
    /// covers.
    fn write_now(&self, buffer: &mut Vec<u8>) -> std::io::Result<u64> {
        // Read before the state is encoded: every ticket up to here belongs to changes that
        // are already in it.
        let covers = self.requested.load(Ordering::SeqCst);
        // Encoded under the lock, as one consistent state, straight into the kept buffer: a
        // copy taken to encode outside the lock cost as much memory again as the state, in
        // whichever thread's malloc arena the write ran.
        self.update(|work| {
            work.updated_at = Utc::now();
            self.queue.encode_work(work, buffer)
        })?;
        self.queue.write_work_state(buffer).map_err(|e| {
            let kind = match &e {
                QueueError::Io { source, .. } => source.kind(),
                _ => std::io::ErrorKind::Other,
            };
            std::io::Error::new(kind, e.to_string())
        })?;
        Ok(covers)
    }

    /// Durably write the latest in-memory state: returns once a write that includes every
    /// change made before the call is durable. A failed write reports its error to the caller
    /// that made it; callers that were waiting then write themselves.
    pub async fn persist(self: &Arc<Self>) -> std::io::Result<()> {
        let ticket = self.ticket();
        let mut writer = self.writer.lock().await;
        if writer.covered >= ticket {
            return Ok(());
        }
        let this = Arc::clone(self);
        let mut buffer = std::mem::take(&mut writer.buffer);
        let (written, buffer) = tokio::task::spawn_blocking(move || {
            let written = this.write_now(&mut buffer);
            (written, buffer)
        })
        .await
        .map_err(std::io::Error::other)?;
        writer.buffer = buffer;
        writer.covered = written?;
        Ok(())
    }
}

/// The writer's side of [`WorkState`].
#[derive(Debug, Default)]
struct Writer {
    /// The highest ticket that a finished write covered.
    covered: u64,
    /// The encoding buffer, kept between writes: a large file is encoded without growing a
    /// new buffer each time (which would leave freed megabytes in every thread's malloc arena).
    buffer: Vec<u8>,
}
