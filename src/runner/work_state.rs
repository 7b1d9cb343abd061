//! The daemon's in-memory copy of `current_work.json` and the one writer that persists it.

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
    /// Serializes writers, so the file on disk only moves forward.
    write_lock: Mutex<()>,
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
            write_lock: Mutex::new(()),
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

    /// Durably write the latest in-memory state. Blocking: call it off the async thread.
    pub fn persist_blocking(&self) -> std::io::Result<()> {
        let _writer = self
            .write_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let bytes = self.update(|work| {
            work.updated_at = Utc::now();
            serde_json::to_vec_pretty(work)
        })?;
        self.storage
            .put(QueueDir::CURRENT_WORK_KEY, &bytes, None)
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("writing {}: {e}", QueueDir::CURRENT_WORK_KEY),
                )
            })
    }

    /// Durably write the latest in-memory state.
    pub async fn persist(self: &Arc<Self>) -> std::io::Result<()> {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || this.persist_blocking())
            .await
            .map_err(std::io::Error::other)?
    }
}
