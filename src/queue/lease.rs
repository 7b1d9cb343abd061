//! Leases: the right to write for a task, and the fence that refuses a writer that lost it.
//!
//! A daemon that owns a queue holds an [`OwnerLease`]; a task it claims gets a [`Lease`]
//! under it. Every durable write for a task (checkpoint, phase state, output, record) takes
//! the task's lease, and the backend refuses it with [`LeaseLost`] unless the lease is still
//! current. With files, the owner lease is the `flock` on `.lock`: it is held for the
//! daemon's life, its epoch never changes, and a lease of another queue or owner (or of one
//! that was closed) is refused. A database backend gives every claim a new epoch and checks
//! it in the same statement as the write.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Owners opened in this process so far: each gets its own id, so a lease can never be taken
/// for another queue's or another open's.
static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// The right to write a queue as its owner (the file backend: the queue lock held).
///
/// Cheap to clone; clones share whether the ownership still holds.
#[derive(Debug, Clone)]
pub struct OwnerLease {
    state: Arc<OwnerState>,
}

#[derive(Debug)]
struct OwnerState {
    /// Unique among the owners opened in this process.
    id: u64,
    /// The backend's fencing token for this ownership (constant for the file backend).
    epoch: u64,
    /// Set once the ownership ended: every later write is refused.
    released: AtomicBool,
}

impl OwnerLease {
    /// A new ownership with the backend's `epoch`.
    pub(crate) fn new(epoch: u64) -> OwnerLease {
        OwnerLease {
            state: Arc::new(OwnerState {
                id: NEXT_OWNER.fetch_add(1, Ordering::Relaxed),
                epoch,
                released: AtomicBool::new(false),
            }),
        }
    }

    /// The fencing token of this ownership.
    pub fn epoch(&self) -> u64 {
        self.state.epoch
    }

    /// End the ownership: every lease under it is refused from now on.
    pub(crate) fn release(&self) {
        self.state.released.store(true, Ordering::Release);
    }

    /// Whether `other` is this same ownership, and it still holds.
    pub(crate) fn holds(&self, other: &OwnerLease) -> bool {
        Arc::ptr_eq(&self.state, &other.state) && !self.state.released.load(Ordering::Acquire)
    }

    /// A lease on `task_id` under this ownership, with `epoch`.
    pub(crate) fn lease(&self, task_id: &str, epoch: u64) -> Lease {
        Lease {
            task_id: task_id.to_string(),
            owner: self.state.id,
            epoch,
        }
    }

    /// Whether `lease` was given under this ownership, with its epoch, and it still holds.
    /// Integer compares and one atomic load: cheap enough for every checkpoint.
    pub(crate) fn check(&self, lease: &Lease) -> Result<(), LeaseLost> {
        if lease.owner != self.state.id {
            return Err(LeaseLost::new(
                lease,
                "the lease was given by another owner of a queue",
            ));
        }
        if lease.epoch != self.state.epoch {
            return Err(LeaseLost::new(
                lease,
                "a newer claim of the task superseded it",
            ));
        }
        if self.state.released.load(Ordering::Acquire) {
            return Err(LeaseLost::new(
                lease,
                "the queue was released by this owner",
            ));
        }
        Ok(())
    }
}

/// The right to write for one claimed task, until it is lost.
///
/// Only the backend that gave it can tell whether it still holds; it is checked on every
/// write, never trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    task_id: String,
    /// The owner it was given under (an id unique in this process).
    owner: u64,
    /// The fencing token: a database backend gives each claim a new one.
    epoch: u64,
}

impl Lease {
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The fencing token of the claim, which external systems may check too.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

/// A write was refused because its lease no longer holds (or never held here): the writer
/// must stop writing for the task; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease lost on task {task_id} (epoch {epoch}): {reason}")]
pub struct LeaseLost {
    pub task_id: String,
    pub epoch: u64,
    pub reason: &'static str,
}

impl LeaseLost {
    fn new(lease: &Lease, reason: &'static str) -> LeaseLost {
        LeaseLost {
            task_id: lease.task_id.clone(),
            epoch: lease.epoch,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::OwnerLease;

    #[test]
    fn a_lease_holds_only_under_its_own_owner_while_it_lasts() {
        let owner = OwnerLease::new(1);
        let other = OwnerLease::new(1);
        let lease = owner.lease("t1", owner.epoch());
        assert_eq!(owner.check(&lease), Ok(()));
        let refused = other.check(&lease).unwrap_err();
        assert_eq!(refused.task_id, "t1");
        assert!(refused.reason.contains("another owner"), "{refused}");
        owner.release();
        let refused = owner.check(&lease).unwrap_err();
        assert!(refused.reason.contains("released"), "{refused}");
    }

    #[test]
    fn a_lease_of_an_older_epoch_is_refused() {
        let owner = OwnerLease::new(7);
        let stale = owner.lease("t1", 6);
        let refused = owner.check(&stale).unwrap_err();
        assert_eq!(refused.epoch, 6);
        assert!(refused.reason.contains("superseded"), "{refused}");
    }

    #[test]
    fn clones_share_the_ownership() {
        let owner = OwnerLease::new(1);
        let clone = owner.clone();
        assert!(owner.holds(&clone));
        assert!(!owner.holds(&OwnerLease::new(1)));
        clone.release();
        assert!(!owner.holds(&clone));
    }
}
