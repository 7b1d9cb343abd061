//! Which waiting task starts next: crash suspects on trial first (see `crash_blame`), then the
//! tasks that were in flight, then new ones (whose submitter goes first is `fair_share`'s
//! choice, by priority within a submitter's tasks). Pure, so the unit tests below hold the
//! rules as a table; `Scheduler::start_ready` pops the line this names.

use super::crash_blame::{self, NextStart};

/// The lines of tasks waiting to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Line {
    /// Crash suspects, each started on trial.
    Suspects,
    /// Tasks that were in flight (interrupted, or past their backoff): before new ones.
    Resume,
    /// New tasks, shared between submitters (`fair_share`).
    Pending,
}

/// What the scheduler knows when it looks for a task to start.
#[derive(Debug, Clone, Copy)]
pub(super) struct StartFacts {
    /// Attempts running now, and how many may run at once.
    pub running: usize,
    pub max_tasks: usize,
    /// The daemon is stopping: nothing new starts.
    pub stopping: bool,
    /// Suspects waiting for their trial, suspects on trial without progress so far, and how
    /// many may be on trial at once.
    pub suspects: usize,
    pub on_trial: usize,
    pub trial_width: usize,
    /// Whether the other lines hold a task.
    pub resume: bool,
    pub pending: bool,
}

/// The line the next task to start comes from, or `None` when nothing may start now.
pub(super) fn next_to_start(facts: StartFacts) -> Option<Line> {
    if facts.stopping || facts.running >= facts.max_tasks.max(1) {
        return None;
    }
    match crash_blame::next_start(facts.suspects, facts.on_trial, facts.trial_width) {
        NextStart::Nothing => None,
        NextStart::Suspect => Some(Line::Suspects),
        NextStart::AnyTask if facts.resume => Some(Line::Resume),
        NextStart::AnyTask if facts.pending => Some(Line::Pending),
        NextStart::AnyTask => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{next_to_start, Line, StartFacts};

    #[test]
    fn what_starts_next() {
        use Line::{Pending, Resume, Suspects};
        // (running, max, stopping, suspects, on trial, width, resume, pending) → line
        #[rustfmt::skip]
        let table = [
            // Nothing waits, or every slot is taken, or the daemon stops.
            ((0, 4, false, 0, 0, 1, false, false), None),
            ((4, 4, false, 0, 0, 1, true,  true),  None),
            ((0, 4, true,  0, 0, 1, true,  true),  None),
            ((1, 4, true,  3, 0, 1, false, false), None),
            // `max_tasks` 0 still runs one.
            ((0, 0, false, 0, 0, 1, false, true),  Some(Pending)),
            ((1, 0, false, 0, 0, 1, false, true),  None),
            // Tasks that were in flight go before new ones.
            ((0, 4, false, 0, 0, 1, true,  true),  Some(Resume)),
            ((3, 4, false, 0, 0, 1, false, true),  Some(Pending)),
            // Suspects go before everything, up to the trial's width...
            ((0, 4, false, 2, 0, 1, true,  true),  Some(Suspects)),
            ((2, 4, false, 6, 2, 3, true,  true),  Some(Suspects)),
            ((3, 4, false, 6, 3, 3, true,  true),  None),
            // ...and nothing else starts while one is on trial.
            ((1, 4, false, 0, 1, 1, true,  true),  None),
            ((2, 4, false, 1, 1, 1, true,  false), None),
            // A trial is over once no suspect is on it.
            ((2, 4, false, 0, 0, 1, true,  false), Some(Resume)),
            // The slots bound the trial too.
            ((4, 4, false, 6, 2, 3, false, false), None),
        ];
        for (
            (running, max_tasks, stopping, suspects, on_trial, trial_width, resume, pending),
            line,
        ) in table
        {
            let facts = StartFacts {
                running,
                max_tasks,
                stopping,
                suspects,
                on_trial,
                trial_width,
                resume,
                pending,
            };
            assert_eq!(next_to_start(facts), line, "{facts:?}");
        }
    }
}
