//! Whose new task starts next when a slot is free: submitters share the slots. Pure, so the
//! unit test below holds the rules as a table; `Scheduler::start_ready` starts the named
//! submitter's first task (its own tasks go by priority, then in order of acceptance).
//!
//! The submitter with the fewest attempts running goes first; priority decides only between
//! submitters with as many running, then the task accepted first. So a flood of one
//! submitter's tasks at the top priority cannot hold back another submitter's task: that task
//! starts at the next free slot. A submitter at `--max-running-per-submitter` waits whatever
//! its priorities. This is the instantaneous share (as round-robin), not a share of usage over
//! time as Slurm's decayed fair-share factor.

use crate::limits::SubmitterLimits;

/// One submitter with tasks waiting to start: what the choice looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Waiting {
    /// Attempts of this submitter's tasks running now.
    pub running: usize,
    /// The priority and acceptance order of its first task (its highest priority, earliest).
    pub priority: i32,
    pub seq: u64,
}

/// The submitter whose first waiting task starts next, or `None` when each is at its limit
/// of running attempts (or none waits).
pub(super) fn next_submitter<K: Copy>(
    waiting: impl IntoIterator<Item = (K, Waiting)>,
    limits: &SubmitterLimits,
) -> Option<K> {
    waiting
        .into_iter()
        .filter(|(_, w)| limits.may_run(w.running))
        .min_by(|(_, a), (_, b)| {
            a.running
                .cmp(&b.running)
                .then(b.priority.cmp(&a.priority))
                .then(a.seq.cmp(&b.seq))
        })
        .map(|(key, _)| key)
}

#[cfg(test)]
mod tests {
    use super::{next_submitter, Waiting};
    use crate::limits::SubmitterLimits;

    #[test]
    fn who_starts_next() {
        let w = |running, priority, seq| Waiting {
            running,
            priority,
            seq,
        };
        let unlimited = SubmitterLimits::default();
        let one_each = SubmitterLimits {
            max_running: Some(1),
            ..Default::default()
        };
        let two_each = SubmitterLimits {
            max_running: Some(2),
            ..Default::default()
        };
        // (waiting submitters 'a', 'b', 'c'..., limits) → who starts
        #[rustfmt::skip]
        type Row = (Vec<(char, Waiting)>, SubmitterLimits, Option<char>);
        let table: Vec<Row> = vec![
            // Nobody waits.
            (vec![], unlimited, None),
            // One submitter: its own first task, as before submitters were shared.
            (vec![('a', w(7, 100, 3))], unlimited, Some('a')),
            // A flood at the top priority does not hold back another submitter's task: the
            // one with fewer running goes first, whatever the priorities.
            (
                vec![('a', w(2, 100, 0)), ('b', w(0, 0, 200))],
                unlimited,
                Some('b'),
            ),
            (
                vec![('a', w(1, 100, 0)), ('b', w(2, 1000, 1))],
                unlimited,
                Some('a'),
            ),
            // As many running: the higher priority, then the task accepted first.
            (
                vec![('a', w(1, 5, 9)), ('b', w(1, 6, 10))],
                unlimited,
                Some('b'),
            ),
            (
                vec![('a', w(1, 5, 9)), ('b', w(1, 5, 4))],
                unlimited,
                Some('b'),
            ),
            (
                vec![('a', w(0, 5, 1)), ('b', w(0, 5, 4)), ('c', w(0, -1, 0))],
                unlimited,
                Some('a'),
            ),
            // A submitter at its limit of running attempts waits; the others go.
            (vec![('a', w(1, 100, 0)), ('b', w(1, 0, 1))], one_each, None),
            (
                vec![('a', w(1, 100, 0)), ('b', w(0, 0, 1))],
                one_each,
                Some('b'),
            ),
            (
                vec![('a', w(1, 100, 0)), ('b', w(2, 0, 1))],
                two_each,
                Some('a'),
            ),
            (vec![('a', w(2, 100, 0))], two_each, None),
            // The unknown submitter (tasks with none recorded) is one more submitter.
            (
                vec![('u', w(0, 0, 0)), ('a', w(3, 9, 1))],
                two_each,
                Some('u'),
            ),
        ];
        for (waiting, limits, expected) in table {
            assert_eq!(
                next_submitter(waiting.iter().copied(), &limits),
                expected,
                "{waiting:?} under {limits:?}"
            );
        }
    }
}
