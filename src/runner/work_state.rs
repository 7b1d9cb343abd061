//! The daemon's in-memory work state (every task in flight) and the one writer that persists it.
//!
//! Writes are group-committed and per entry: every change is made in memory first, marking the
//! entries it touched; then [`WorkState::persist`] returns once a write that includes it is
//! durable. A write hands the backend only the entries changed since the last write (and the
//! ids that left), so its cost follows what changed, not how many tasks are in flight; changes
//! that several tasks make while a write is under way are all covered by the next one.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::queue::{LoadError, Queue, QueueError};
use crate::store::current_work::{ActiveTask, CurrentWork};
use crate::task_id::TaskId;

/// The entries of every task in flight, by id, with the ids changed or removed since the last
/// write. Changes go through its methods, which mark what they touch.
#[derive(Debug, Default)]
pub struct WorkEntries {
    entries: BTreeMap<TaskId, ActiveTask>,
    changed: BTreeSet<TaskId>,
    removed: BTreeSet<TaskId>,
}

impl WorkEntries {
    /// The state as loaded, nothing marked: what is on disk already. (The file backend's first
    /// write rewrites its snapshot whatever it is given, which carries a work state of an
    /// older cairn over.)
    fn from_work(work: CurrentWork) -> WorkEntries {
        WorkEntries {
            entries: work
                .active_tasks
                .into_iter()
                .map(|entry| (entry.task_id.clone(), entry))
                .collect(),
            ..WorkEntries::default()
        }
    }

    pub fn get(&self, task_id: &str) -> Option<&ActiveTask> {
        self.entries.get(task_id)
    }

    /// The entry, to change it (marked as changed).
    pub fn get_mut(&mut self, task_id: &str) -> Option<&mut ActiveTask> {
        let entry = self.entries.get_mut(task_id)?;
        if !self.changed.contains(task_id) {
            self.changed.insert(entry.task_id.clone());
        }
        Some(entry)
    }

    /// Insert or replace the entry of `task.task_id`.
    pub fn upsert(&mut self, task: ActiveTask) {
        self.removed.remove(&task.task_id);
        self.changed.insert(task.task_id.clone());
        self.entries.insert(task.task_id.clone(), task);
    }

    pub fn remove(&mut self, task_id: &str) -> Option<ActiveTask> {
        let entry = self.entries.remove(task_id)?;
        self.changed.remove(task_id);
        self.removed.insert(entry.task_id.clone());
        Some(entry)
    }

    /// Every entry, by id.
    pub fn iter(&self) -> impl Iterator<Item = &ActiveTask> {
        self.entries.values()
    }

    /// The marked changes, taken for a write: copies of the changed entries, and the removed ids.
    fn take_changes(&mut self) -> (Vec<ActiveTask>, Vec<TaskId>) {
        let changed = std::mem::take(&mut self.changed)
            .into_iter()
            .filter_map(|id| self.entries.get(&id).cloned())
            .collect();
        let removed = std::mem::take(&mut self.removed).into_iter().collect();
        (changed, removed)
    }

    /// Mark again the changes of a write that failed (unless changed since).
    fn restore_changes(&mut self, changed: Vec<ActiveTask>, removed: Vec<TaskId>) {
        let ids = changed
            .into_iter()
            .map(|entry| entry.task_id)
            .chain(removed);
        for id in ids {
            if self.entries.contains_key(&id) {
                self.changed.insert(id);
            } else {
                self.removed.insert(id);
            }
        }
    }
}

/// Shared by the scheduler and every running task; each change is followed by [`persist`].
///
/// [`persist`]: WorkState::persist
#[derive(Debug)]
pub struct WorkState {
    work: Mutex<WorkEntries>,
    /// Persist requests so far; a request's ticket is this count right after it was made.
    requested: AtomicU64,
    /// Serializes writers, so what is on disk only moves forward. An async lock: callers
    /// waiting for the writer wait as futures, not as blocked threads.
    writer: tokio::sync::Mutex<Writer>,
    /// The owner it is read from and written through.
    queue: Queue,
}

impl WorkState {
    /// Read the work state through the queue's owner (a new queue has none). Blocking.
    pub fn load(queue: Queue) -> Result<WorkState, LoadError> {
        let work = queue.backend().load_work()?;
        Ok(WorkState {
            work: Mutex::new(WorkEntries::from_work(work)),
            requested: AtomicU64::new(0),
            writer: tokio::sync::Mutex::new(Writer::default()),
            queue,
        })
    }

    /// Change the in-memory state (call [`WorkState::persist`] to make it durable).
    pub fn update<R>(&self, change: impl FnOnce(&mut WorkEntries) -> R) -> R {
        let mut work = self
            .work
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        change(&mut work)
    }

    /// A copy of every entry, in the order the tasks first started (then by id).
    pub fn snapshot(&self) -> CurrentWork {
        let mut active_tasks: Vec<ActiveTask> = self.update(|work| work.iter().cloned().collect());
        active_tasks.sort_by_key(|entry| entry.started_at);
        CurrentWork {
            active_tasks,
            ..CurrentWork::default()
        }
    }

    /// Take a ticket for the changes made so far. Any write that begins after the ticket was
    /// taken takes the changes marked before it (both happen under `work`'s lock or after
    /// this increment), so it covers them.
    fn ticket(&self) -> u64 {
        self.requested.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Write the changes marked so far; returns the highest ticket the write covers.
    fn write_now(&self) -> std::io::Result<u64> {
        // Read before the changes are taken: every ticket up to here belongs to changes that
        // are already marked.
        let covers = self.requested.load(Ordering::SeqCst);
        let (changed, removed) = self.update(WorkEntries::take_changes);
        if changed.is_empty() && removed.is_empty() {
            return Ok(covers);
        }
        if let Err(e) = self.queue.write_work_state(&changed, &removed) {
            self.update(|work| work.restore_changes(changed, removed));
            let kind = match &e {
                QueueError::Io { source, .. } => source.kind(),
                _ => std::io::ErrorKind::Other,
            };
            return Err(std::io::Error::new(kind, e.to_string()));
        }
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
        let written = tokio::task::spawn_blocking(move || this.write_now())
            .await
            .map_err(std::io::Error::other)?;
        writer.covered = written?;
        Ok(())
    }
}

/// The writer's side of [`WorkState`].
#[derive(Debug, Default)]
struct Writer {
    /// The highest ticket that a finished write covered.
    covered: u64,
}

#[cfg(test)]
mod tests {
    use super::WorkEntries;
    use crate::store::current_work::ActiveTask;
    use crate::task_id::TaskId;

    fn id(name: &str) -> TaskId {
        TaskId::parse(name).unwrap()
    }

    #[test]
    fn a_write_takes_only_what_changed_since_the_last_one() {
        let mut work = WorkEntries::default();
        work.upsert(ActiveTask::new(&id("a"), "p"));
        work.upsert(ActiveTask::new(&id("b"), "p"));
        let (changed, removed) = work.take_changes();
        assert_eq!(changed.len(), 2);
        assert!(removed.is_empty());
        assert_eq!(work.take_changes(), (Vec::new(), Vec::new()));

        work.get_mut("a").unwrap().iterations = 3;
        assert!(work.get("b").is_some());
        work.remove("b");
        let (changed, removed) = work.take_changes();
        assert_eq!(
            changed
                .iter()
                .map(|e| (e.task_id.as_str(), e.iterations))
                .collect::<Vec<_>>(),
            [("a", 3)]
        );
        assert_eq!(removed, [id("b")]);
    }

    #[test]
    fn a_failed_write_marks_its_changes_again_as_they_stand_now() {
        let mut work = WorkEntries::default();
        work.upsert(ActiveTask::new(&id("a"), "p"));
        work.upsert(ActiveTask::new(&id("b"), "p"));
        let (changed, removed) = work.take_changes();
        // Meanwhile `b` left: the failed write's copy of it must not come back as changed.
        work.remove("b");
        work.restore_changes(changed, removed);
        let (changed, removed) = work.take_changes();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].task_id, "a");
        assert_eq!(removed, [id("b")]);
    }
}
