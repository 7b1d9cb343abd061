//! The checkpoint bytes one submitter's tasks hold: the newest checkpoint of each of their
//! tasks in flight on this daemon, as stored (compressed), summed per submitter
//! (`cairn run --max-checkpoint-bytes-per-submitter`). A task whose submitter's tasks hold
//! more than the bound has its next checkpoint refused: its attempt fails with the reason, and
//! its share is let go when the attempt ends, so the submitter's other tasks go on. A
//! checkpoint is measured once it is stored, so the bound can be passed by one checkpoint per
//! task; it keeps a submitter's workers from piling up checkpoints without end.

use std::collections::HashMap;
use std::sync::Mutex;

/// One submitter's bound unless the daemon is told otherwise.
pub const DEFAULT_MAX_CHECKPOINT_BYTES_PER_SUBMITTER: u64 = 1 << 30;

/// A submitter's tasks hold more checkpoint bytes than one submitter may.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error(
    "checkpoint refused: the newest checkpoints of the tasks of {whose} in flight on this daemon \
     hold {held} bytes, more than the {limit} one submitter may hold (cairn run \
     --max-checkpoint-bytes-per-submitter)"
)]
pub struct QuotaExceeded {
    whose: String,
    held: u64,
    limit: u64,
}

/// The bytes held per submitter (`None`: tasks that record none), per task.
#[derive(Debug, Default)]
pub struct CheckpointQuota {
    limit: Option<u64>,
    held: Mutex<HashMap<Option<u32>, HashMap<String, u64>>>,
}

impl CheckpointQuota {
    /// A quota of `limit` bytes per submitter (`None`: unbounded, nothing counted).
    pub fn new(limit: Option<u64>) -> CheckpointQuota {
        CheckpointQuota {
            limit,
            held: Mutex::default(),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Option<u32>, HashMap<String, u64>>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Task `task` of `submitter` now holds a newest checkpoint of `bytes`.
    pub fn note(&self, submitter: Option<u32>, task: &str, bytes: u64) {
        if self.limit.is_some() {
            self.held()
                .entry(submitter)
                .or_default()
                .insert(task.to_string(), bytes);
        }
    }

    /// Whether another checkpoint of `submitter`'s may be stored; the error is the reason.
    pub fn check(&self, submitter: Option<u32>) -> Result<(), QuotaExceeded> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let held: u64 = self
            .held()
            .get(&submitter)
            .map_or(0, |tasks| tasks.values().sum());
        if held <= limit {
            return Ok(());
        }
        let whose = match submitter {
            Some(uid) => crate::submitter::Submitter::of_uid(uid).to_string(),
            None => "tasks that record no submitter".to_string(),
        };
        Err(QuotaExceeded { whose, held, limit })
    }

    /// Task `task`'s attempt ended: what it held no longer counts.
    pub fn forget(&self, submitter: Option<u32>, task: &str) {
        let mut held = self.held();
        if let Some(tasks) = held.get_mut(&submitter) {
            tasks.remove(task);
            if tasks.is_empty() {
                held.remove(&submitter);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::CheckpointQuota;

    #[test]
    fn a_submitter_past_its_bound_is_refused_until_a_task_of_theirs_ends() {
        let quota = CheckpointQuota::new(Some(100));
        quota.note(Some(1), "a", 60);
        quota.note(Some(1), "b", 40);
        quota.note(Some(2), "c", 90);
        assert_eq!(quota.check(Some(1)), Ok(()));
        quota.note(Some(1), "a", 61);
        let refused = quota.check(Some(1)).unwrap_err();
        assert!(
            refused.to_string().contains("101 bytes, more than the 100"),
            "{refused}"
        );
        assert_eq!(quota.check(Some(2)), Ok(()), "another submitter goes on");
        quota.forget(Some(1), "a");
        assert_eq!(quota.check(Some(1)), Ok(()));
        let unbounded = CheckpointQuota::new(None);
        unbounded.note(None, "a", u64::MAX);
        assert_eq!(unbounded.check(None), Ok(()));
    }
}
