//! Who is to blame when the daemon dies while tasks run.
//!
//! A crash is not a task's failure: a power cut, an OOM kill of something else or an operator's
//! SIGKILL uses up no attempt. But a task that kills the daemon (a command doing `kill -9
//! $PPID`, a fork bomb) would crash-loop the queue forever, so crashes are counted, and the
//! count must fall on the right task. The evidence:
//!
//! - A task that made progress in the attempt the daemon died in (a committed checkpoint, a
//!   finished phase) is cleared: whatever happened, it moves forward.
//! - Tasks in flight together without progress are *suspects*, none more than another. They are
//!   resumed one at a time, each on trial: nothing starts beside a suspect on trial, so if the
//!   daemon dies again, that suspect ran alone. A trial ends when the suspect makes progress or
//!   its attempt ends while the daemon lives (done, failed, clean stop).
//! - Only a task in flight alone when the daemon died, without progress, has its count raised;
//!   at [`crash_limit`] such crashes in a row it is quarantined in `failed/`, its record saying
//!   so. An innocent task beside it is never counted against.
//!
//! These are pure decisions; the scheduler applies them and keeps what they need (the suspect
//! flag and the count) in `current_work.json`, so they survive further crashes.

use crate::task::Task;

/// Crashes in a row, while a task ran alone without progress, after which it is taken for the
/// cause of them: more than its attempts, so that a few unlucky kills never fail a healthy task.
pub(crate) fn crash_limit(task: &Task) -> u32 {
    task.retry.max_attempts.saturating_add(2)
}

/// What is decided about one task that was in flight when the daemon died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It made progress in the attempt: no suspicion, its count starts again from zero.
    Cleared,
    /// It was in flight with others, without progress: to be tried alone. Its count is kept.
    Suspect { crashes_alone: u32 },
    /// It was in flight alone, without progress: its count goes up, and it stays on trial.
    CrashedAlone { crashes_alone: u32 },
    /// It ran alone for the last `crashes_alone` crashes in a row, without progress: it is
    /// taken for their cause.
    Quarantined { crashes_alone: u32 },
}

/// The verdict on a task that was in flight when the daemon died.
///
/// `in_flight` is how many tasks were in flight then (this one included), `progressed` whether
/// this one made progress in that attempt, `crashes_alone` its count so far and `limit` its
/// [`crash_limit`].
pub(crate) fn judge(in_flight: usize, progressed: bool, crashes_alone: u32, limit: u32) -> Verdict {
    if progressed {
        return Verdict::Cleared;
    }
    if in_flight > 1 {
        return Verdict::Suspect { crashes_alone };
    }
    let crashes_alone = crashes_alone.saturating_add(1);
    if crashes_alone >= limit {
        Verdict::Quarantined { crashes_alone }
    } else {
        Verdict::CrashedAlone { crashes_alone }
    }
}

/// Why a quarantined task is in `failed/`, for its record.
pub(crate) fn quarantine_reason(crashes_alone: u32) -> String {
    format!(
        "quarantined: the daemon died {crashes_alone} times in a row while this task ran alone, \
         with no checkpoint, finished phase or clean stop in between; it is taken for the cause \
         (`cairn retry` brings it back)"
    )
}

/// What the scheduler may start next while crash suspects remain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NextStart {
    /// The next suspect, on trial.
    Suspect,
    /// Whatever is next in line: no trial is under way.
    AnyTask,
    /// Nothing: the trial is as wide as it may be, or suspects on trial must show progress
    /// before anything else starts beside them.
    Nothing,
}

/// How many suspects may be on trial at once: half of those the crash left, at least one. Two
/// suspects are tried one at a time, so an innocent task never runs beside the killer again. A
/// crash during a trial makes suspects of only the tasks in flight then, so every repeated
/// crash halves the field: a task that kills the daemon runs alone after about log2(n) crashes,
/// and a restart after a power cut that caught thousands of tasks does not resume them one by
/// one. (An innocent task in the killer's half may see its interrupted work run again once per
/// halving.)
pub(crate) fn trial_width(suspects: usize) -> usize {
    (suspects / 2).max(1)
}

/// What may start now: `waiting` suspects not started yet, `on_trial` suspects running without
/// progress so far, `width` the [`trial_width`]. Suspects go before everything; nothing else
/// starts while a trial is under way. (A suspect may start beside tasks already running that are
/// not on trial; a crash then has several tasks in flight, and counts against none of them.)
pub(crate) fn next_start(waiting: usize, on_trial: usize, width: usize) -> NextStart {
    match (waiting > 0, on_trial) {
        (true, running) if running < width.max(1) => NextStart::Suspect,
        (true, _) => NextStart::Nothing,
        (false, 0) => NextStart::AnyTask,
        (false, _) => NextStart::Nothing,
    }
}

/// The order in which suspects are tried: fewest crashes alone first (the likely innocent finish
/// their trial and get going), then in the order given.
pub(crate) fn trial_order<Id>(suspects: &mut [(u32, Id)]) {
    suspects.sort_by_key(|(crashes_alone, _)| *crashes_alone);
}

#[cfg(test)]
mod tests {
    use super::{judge, next_start, trial_order, trial_width, NextStart, Verdict};

    #[test]
    fn the_decision_table() {
        // (in flight, progressed, count so far, limit) → verdict
        let table = [
            ((1, true, 3, 5), Verdict::Cleared),
            ((4, true, 0, 5), Verdict::Cleared),
            ((2, false, 0, 5), Verdict::Suspect { crashes_alone: 0 }),
            ((2, false, 4, 5), Verdict::Suspect { crashes_alone: 4 }),
            ((1, false, 0, 5), Verdict::CrashedAlone { crashes_alone: 1 }),
            ((1, false, 3, 5), Verdict::CrashedAlone { crashes_alone: 4 }),
            ((1, false, 4, 5), Verdict::Quarantined { crashes_alone: 5 }),
            ((1, false, 9, 5), Verdict::Quarantined { crashes_alone: 10 }),
            (
                (1, false, u32::MAX, 5),
                Verdict::Quarantined {
                    crashes_alone: u32::MAX,
                },
            ),
        ];
        for ((in_flight, progressed, count, limit), expected) in table {
            assert_eq!(
                judge(in_flight, progressed, count, limit),
                expected,
                "in flight {in_flight}, progressed {progressed}, count {count}, limit {limit}"
            );
        }
    }

    #[test]
    fn an_innocent_beside_a_killer_is_never_counted_against() {
        // Every crash with both in flight: neither count moves, however many there are.
        let mut count = 0;
        for _ in 0..100 {
            match judge(2, false, count, 5) {
                Verdict::Suspect { crashes_alone } => count = crashes_alone,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(count, 0);
    }

    #[test]
    fn what_starts_while_suspects_remain() {
        use NextStart::{AnyTask, Nothing, Suspect};
        // (waiting suspects, suspects on trial, width) → what may start
        let table = [
            ((0, 0, 1), AnyTask),
            ((0, 1, 1), Nothing),
            ((0, 3, 5), Nothing),
            ((1, 0, 1), Suspect),
            ((1, 1, 1), Nothing),
            ((4, 2, 5), Suspect),
            ((4, 5, 5), Nothing),
            ((1, 0, 0), Suspect),
        ];
        for ((waiting, on_trial, width), expected) in table {
            assert_eq!(
                next_start(waiting, on_trial, width),
                expected,
                "waiting {waiting}, on trial {on_trial}, width {width}"
            );
        }
    }

    #[test]
    fn trials_take_half_the_suspects_and_two_one_at_a_time() {
        assert_eq!(trial_width(0), 1);
        assert_eq!(trial_width(1), 1);
        assert_eq!(trial_width(2), 1);
        assert_eq!(trial_width(3), 1);
        assert_eq!(trial_width(4), 2);
        assert_eq!(trial_width(10_000), 5_000);
    }

    #[test]
    fn suspects_with_fewer_crashes_alone_are_tried_first_in_a_stable_order() {
        let mut suspects = vec![
            (2, "killer".to_string()),
            (0, "b".to_string()),
            (0, "a".to_string()),
        ];
        trial_order(&mut suspects);
        let ids: Vec<&str> = suspects.iter().map(|(_, id)| id.as_str()).collect();
        assert_eq!(ids, ["b", "a", "killer"]);
    }
}
