//! New tasks waiting to start, one priority heap per submitter: the next task of a submitter
//! is found in O(1) and taken in O(log n), and the choice between submitters
//! (`fair_share::next_submitter`) looks at one entry per submitter, not per task.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::fair_share::Waiting;
use crate::limits::SubmitterKey;
use crate::task_id::TaskId;

/// A waiting task: its priority, its order of acceptance (earlier first), its id.
pub(super) type PendingEntry = (i32, Reverse<u64>, TaskId);

#[derive(Debug, Default)]
pub(super) struct PendingQueues {
    /// Only submitters with a task waiting have a heap.
    by_submitter: HashMap<SubmitterKey, BinaryHeap<PendingEntry>>,
    len: usize,
}

impl PendingQueues {
    pub(super) fn push(&mut self, key: SubmitterKey, entry: PendingEntry) {
        self.by_submitter.entry(key).or_default().push(entry);
        self.len += 1;
    }

    /// Take `key`'s first task: its highest priority, accepted first.
    pub(super) fn pop_of(&mut self, key: SubmitterKey) -> Option<TaskId> {
        let heap = self.by_submitter.get_mut(&key)?;
        let (_, _, id) = heap.pop()?;
        if heap.is_empty() {
            self.by_submitter.remove(&key);
        }
        self.len -= 1;
        Some(id)
    }

    /// Each submitter with a task waiting, with what the choice between them looks at;
    /// `running` tells how many attempts of a submitter run now.
    pub(super) fn waiting<'a>(
        &'a self,
        running: impl Fn(SubmitterKey) -> usize + 'a,
    ) -> impl Iterator<Item = (SubmitterKey, Waiting)> + 'a {
        self.by_submitter.iter().filter_map(move |(key, heap)| {
            let (priority, Reverse(seq), _) = heap.peek()?;
            Some((
                *key,
                Waiting {
                    running: running(*key),
                    priority: *priority,
                    seq: *seq,
                },
            ))
        })
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every waiting task, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &PendingEntry> {
        self.by_submitter.values().flat_map(|heap| heap.iter())
    }

    /// Keep only the tasks `keep` says to keep.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&PendingEntry) -> bool) {
        for heap in self.by_submitter.values_mut() {
            heap.retain(&mut keep);
        }
        self.by_submitter.retain(|_, heap| !heap.is_empty());
        self.len = self.by_submitter.values().map(BinaryHeap::len).sum();
    }
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;

    use super::PendingQueues;
    use crate::limits::SubmitterKey;
    use crate::task_id::TaskId;

    #[test]
    fn each_submitter_takes_its_own_tasks_by_priority_then_acceptance() {
        let (a, b) = (SubmitterKey::Uid(1), SubmitterKey::Unknown);
        let mut pending = PendingQueues::default();
        for (seq, (key, priority, id)) in [(a, 0, "a0"), (a, 9, "a9"), (b, 5, "b5"), (a, 9, "a9x")]
            .into_iter()
            .enumerate()
        {
            pending.push(
                key,
                (priority, Reverse(seq as u64), TaskId::parse(id).unwrap()),
            );
        }
        assert_eq!(pending.len(), 4);
        let mut waiting: Vec<_> = pending.waiting(|_| 0).collect();
        waiting.sort_by_key(|(key, _)| *key);
        assert_eq!(
            waiting.iter().map(|(_, w)| w.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        pending.retain(|(_, _, id)| id.as_str() != "a0");
        assert_eq!(pending.len(), 3);
        let taken: Vec<String> = std::iter::from_fn(|| pending.pop_of(a))
            .map(|id| id.to_string())
            .collect();
        assert_eq!(taken, ["a9", "a9x"]);
        assert!(pending.iter().all(|(_, _, id)| id.as_str() == "b5"));
        assert_eq!(pending.pop_of(b).as_deref(), Some("b5"));
        assert!(pending.is_empty() && pending.pop_of(b).is_none());
    }
}
