//! The tasks the scheduler holds, counted per submitter as they come and go: every unfinished
//! task against its submitter's `--max-queued-per-submitter` (in the intake's
//! [`Admission`], which intake checks new files against), every running attempt against
//! `--max-running-per-submitter`. Kept beside the maps they count, so no path that adds or
//! drops a task can forget to count it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use crate::limits::{Admission, SubmitterKey};
use crate::task::Task;
use crate::task_id::TaskId;

/// Definitions of the tasks this daemon knows to be unfinished (a map, counting as it goes).
#[derive(Debug)]
pub(super) struct KnownTasks {
    tasks: HashMap<TaskId, Arc<Task>>,
    admission: Arc<Admission>,
}

impl KnownTasks {
    pub(super) fn new(admission: Arc<Admission>) -> KnownTasks {
        KnownTasks {
            tasks: HashMap::new(),
            admission,
        }
    }

    pub(super) fn get<Q>(&self, id: &Q) -> Option<&Arc<Task>>
    where
        TaskId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.tasks.get(id)
    }

    pub(super) fn contains_key<Q>(&self, id: &Q) -> bool
    where
        TaskId: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.tasks.contains_key(id)
    }

    /// Why `task` may not be counted once more (see [`Admission::check_queued`]).
    pub(super) fn check_queued(&self, task: &Task) -> Result<(), crate::limits::QueueFull> {
        self.admission.check_queued(task)
    }

    pub(super) fn insert(&mut self, id: TaskId, task: Arc<Task>) -> Option<Arc<Task>> {
        self.admission.note(&id, SubmitterKey::of_task(&task));
        self.tasks.insert(id, task)
    }

    pub(super) fn remove<Q>(&mut self, id: &Q) -> Option<Arc<Task>>
    where
        TaskId: Borrow<Q>,
        Q: Hash + Eq + ?Sized + AsRef<str>,
    {
        self.admission.forget(id.as_ref());
        self.tasks.remove(id)
    }
}

/// Attempts running now, per submitter.
#[derive(Debug, Default)]
pub(super) struct RunningBySubmitter {
    of: HashMap<TaskId, SubmitterKey>,
    count: HashMap<SubmitterKey, usize>,
}

impl RunningBySubmitter {
    pub(super) fn started(&mut self, id: &TaskId, key: SubmitterKey) {
        if self.of.insert(id.clone(), key).is_none() {
            *self.count.entry(key).or_insert(0) += 1;
        }
    }

    pub(super) fn ended(&mut self, id: &str) {
        let Some(key) = self.of.remove(id) else {
            return;
        };
        if let Some(n) = self.count.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.count.remove(&key);
            }
        }
    }

    pub(super) fn of(&self, key: SubmitterKey) -> usize {
        self.count.get(&key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{KnownTasks, RunningBySubmitter};
    use crate::limits::{Admission, SubmitterKey, SubmitterLimits};
    use crate::submitter::Submitter;
    use crate::task::Task;
    use crate::task_id::TaskId;

    #[test]
    fn tasks_and_attempts_are_counted_per_submitter_as_they_come_and_go() {
        let admission = Arc::new(Admission::new(SubmitterLimits::default()));
        let mut known = KnownTasks::new(Arc::clone(&admission));
        let mut task = Task::parse(br#"{"phases":[{"name":"a","run":["true"]}]}"#).unwrap();
        task.submitted_by = Some(Submitter { uid: 5, user: None });
        let (x, y) = (TaskId::parse("x").unwrap(), TaskId::parse("y").unwrap());
        known.insert(x.clone(), Arc::new(task.clone()));
        known.insert(x.clone(), Arc::new(task.clone()));
        known.insert(y.clone(), Arc::new(task));
        assert_eq!(admission.queued_of(SubmitterKey::Uid(5)), 2);
        assert!(known.remove("x").is_some());
        assert!(known.remove(&x).is_none());
        assert_eq!(admission.queued_of(SubmitterKey::Uid(5)), 1);
        assert!(known.contains_key("y") && known.get(&y).is_some());

        let mut running = RunningBySubmitter::default();
        running.started(&x, SubmitterKey::Unknown);
        running.started(&x, SubmitterKey::Unknown);
        running.started(&y, SubmitterKey::Unknown);
        assert_eq!(running.of(SubmitterKey::Unknown), 2);
        running.ended("x");
        running.ended("x");
        assert_eq!(running.of(SubmitterKey::Unknown), 1);
        assert_eq!(running.of(SubmitterKey::Uid(5)), 0);
    }
}
