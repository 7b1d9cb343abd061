//! The one-owner lock: an exclusive `flock` on `<queue>/.lock`, held for the daemon's lifetime.
//!
//! The kernel releases the lock when its owner dies, so a crashed daemon never leaves a stale
//! lock behind. The owner's pid is written into the file only to name it in error messages.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

use super::QueueDir;

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("queue {queue} is owned by a running daemon (pid {pid}); stop it first or use another --queue")]
    Held { queue: PathBuf, pid: String },
    #[error("cannot lock {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Held while the daemon owns the queue; dropping it releases the lock.
#[derive(Debug)]
pub struct QueueLock {
    lock: Flock<File>,
}

impl Drop for QueueLock {
    /// Clear the pid before the lock goes, so that no reader takes a later process with the
    /// same pid for this daemon.
    fn drop(&mut self) {
        let _ = self.lock.set_len(0);
    }
}

impl QueueLock {
    /// Take the queue's lock without waiting.
    pub fn acquire(queue: &QueueDir) -> Result<QueueLock, LockError> {
        let path = queue.lock_file();
        let io_err = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(crate::store::modes::FILE_MODE)
            .open(&path)
            .map_err(io_err)?;
        // Group readers (`cairn status`) read the daemon's pid from it. Best effort: a lock
        // file someone else created may not be ours to change, and it holds no secret.
        let _ = crate::store::modes::fix_new_file(&file);
        let mut lock = match lock_with_patience(file) {
            Ok(lock) => lock,
            Err((mut file, Errno::EWOULDBLOCK)) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                let pid = pid.trim();
                return Err(LockError::Held {
                    queue: queue.root().to_path_buf(),
                    pid: if pid.is_empty() {
                        "unknown".into()
                    } else {
                        pid.into()
                    },
                });
            }
            Err((_, errno)) => return Err(io_err(std::io::Error::from(errno))),
        };
        lock.set_len(0).map_err(io_err)?;
        lock.rewind().map_err(io_err)?;
        writeln!(lock, "{}", std::process::id()).map_err(io_err)?;
        Ok(QueueLock { lock })
    }
}

/// How long a start waits for a lock that is held. A daemon killed with SIGKILL may leave a
/// child between fork and exec for a moment; that child shares the lock's open file
/// description (and dies with the daemon), so a supervisor that restarts at once must not be
/// refused for it. A live daemon holds the lock far longer than this.
const LOCK_PATIENCE: Duration = Duration::from_secs(2);

fn lock_with_patience(file: File) -> Result<Flock<File>, (File, Errno)> {
    let deadline = Instant::now() + LOCK_PATIENCE;
    let mut file = file;
    loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((returned, Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                file = returned;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other,
        }
    }
}
