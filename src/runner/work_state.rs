//! The daemon's in-memory copy of `current_work.json` and the one writer that persists it.
//!
//! Writes are group-committed: every change is made in memory first, then [`WorkState::persist`]
//! returns once a write that includes it is durable. Changes that several tasks make while a
//! write is under way are all covered by the next one, so many tasks starting or finishing at
//! once cost a few rewrites of the file, not one each.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use chrono::Utc;

use crate::queue::QueueDir;
use crate::store::current_work::{CurrentWork, CURRENT_WORK_VERSION};
use crate::store::Storage;

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
    storage: Arc<dyn Storage>,
}

/// Why `current_work.json` could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {key}: {source}")]
    Io { key: String, source: std::io::Error },
    #[error("{key} is not a valid current_work file: {source}")]
    Corrupt {
        key: String,
        source: serde_json::Error,
    },
    #[error("{key} has version {found}; this cairn reads version {CURRENT_WORK_VERSION}")]
    Version { key: String, found: u32 },
}

impl WorkState {
    /// Read `current_work.json` (a missing file is an empty queue).
    pub fn load(storage: Arc<dyn Storage>) -> Result<WorkState, LoadError> {
        let key = QueueDir::CURRENT_WORK_KEY.to_string();
        let bytes = storage.get(&key).map_err(|source| LoadError::Io {
            key: key.clone(),
            source,
        })?;
        let work = match bytes {
            None => CurrentWork::default(),
            Some(bytes) => {
                let work: CurrentWork =
                    serde_json::from_slice(&bytes).map_err(|source| LoadError::Corrupt {
                        key: key.clone(),
                        source,
                    })?;
                if work.version != CURRENT_WORK_VERSION {
                    return Err(LoadError::Version {
                        key,
                        found: work.version,
                    });
                }
                work
            }
        };
        Ok(WorkState {
            work: Mutex::new(work),
            requested: AtomicU64::new(0),
            writer: tokio::sync::Mutex::new(Writer::default()),
            storage,
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
            buffer.clear();
            serde_json::to_writer_pretty(&mut *buffer, &*work)
        })?;
        self.storage
            .put(QueueDir::CURRENT_WORK_KEY, buffer, None)
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("writing {}: {e}", QueueDir::CURRENT_WORK_KEY),
                )
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
