//! Per-submitter limits (`cairn run --max-queued-per-submitter`, `--max-running-per-submitter`,
//! `--max-priority-per-submitter`): one submitter's flood of tasks cannot crowd out the others.
//!
//! Intake refuses a file that would take its submitter past the tasks they may have queued, or
//! that asks for a priority above the highest allowed, with a rejection record saying why (the
//! file queue's normal path, so the submitter sees it); the scheduler never runs more than the
//! allowed attempts of one submitter at once, and shares free slots between submitters
//! (`daemon::fair_share`). A submitter is a uid; tasks with none recorded (accepted before
//! submitters were recorded, or added by an embedding program) count as one submitter,
//! "unknown". Root is limited like anyone: its tasks compete for the same slots.
//!
//! The daemon publishes the limits in effect in `limits.json` (see [`PublishedLimits`]) for
//! `cairn status`, which counts each submitter's tasks itself from what it reads.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::submitter::Submitter;
use crate::task::{Task, TaskError};
use crate::task_id::TaskId;

/// The limits on each submitter; `None` is unlimited (the default, as before limits existed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitterLimits {
    /// Unfinished tasks (waiting, running, waiting for a retry or paused) one submitter may
    /// have; a file beyond it is rejected at intake.
    pub max_queued: Option<usize>,
    /// Attempts of one submitter's tasks running at once.
    pub max_running: Option<usize>,
    /// The highest priority a task may ask for; a file asking for more is rejected at intake.
    pub max_priority: Option<i32>,
}

impl SubmitterLimits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.max_queued.is_some() || self.max_running.is_some() || self.max_priority.is_some()
    }

    /// Whether one more running attempt of a submitter with `running` now is allowed.
    pub fn may_run(&self, running: usize) -> bool {
        self.max_running.is_none_or(|max| running < max)
    }
}

/// A submitter has as many unfinished tasks as `--max-queued-per-submitter` allows.
#[derive(Debug, thiserror::Error)]
#[error(
    "its submitter, {key}, already has {queued} unfinished task(s) in this queue, the most one \
     submitter may have (cairn run --max-queued-per-submitter {max})"
)]
pub struct QueueFull {
    pub key: SubmitterKey,
    pub queued: usize,
    pub max: usize,
}

/// Whom a task counts against: its submitter's uid, or "unknown" for a task with none recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SubmitterKey {
    Uid(u32),
    Unknown,
}

impl SubmitterKey {
    pub fn of(submitter: Option<&Submitter>) -> SubmitterKey {
        match submitter {
            Some(submitter) => SubmitterKey::Uid(submitter.uid),
            None => SubmitterKey::Unknown,
        }
    }

    pub fn of_task(task: &Task) -> SubmitterKey {
        SubmitterKey::of(task.submitted_by())
    }
}

impl fmt::Display for SubmitterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitterKey::Uid(uid) => write!(f, "{}", Submitter::of_uid(*uid)),
            SubmitterKey::Unknown => f.write_str("unknown (no submitter recorded)"),
        }
    }
}

/// The intake's gate: the limits, and each submitter's unfinished tasks as the daemon knows
/// them. Shared by the daemon (which notes every task it holds and forgets each that finishes)
/// and the intake (which checks, then notes what it accepted at once, so that one scan cannot
/// take a whole batch past the limit before the daemon has seen any of it). Noting an id twice
/// counts it once.
#[derive(Debug, Default)]
pub struct Admission {
    limits: SubmitterLimits,
    queued: Mutex<Queued>,
    /// When each submitter's recent files were rejected (the last [`REJECTIONS_REMEMBERED`]).
    rejected: Mutex<HashMap<SubmitterKey, std::collections::VecDeque<std::time::Instant>>>,
}

/// How long a rejected file counts against its submitter (see [`Admission::may_take_from`]).
pub const REJECTIONS_REMEMBERED: std::time::Duration = std::time::Duration::from_secs(300);

#[derive(Debug, Default)]
struct Queued {
    of: HashMap<TaskId, SubmitterKey>,
    count: HashMap<SubmitterKey, usize>,
}

impl Admission {
    pub fn new(limits: SubmitterLimits) -> Admission {
        Admission {
            limits,
            queued: Mutex::default(),
            rejected: Mutex::default(),
        }
    }

    pub fn limits(&self) -> SubmitterLimits {
        self.limits
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Why intake must refuse `task` (its submitter set), if it must.
    pub fn check(&self, task: &Task) -> Result<(), TaskError> {
        if let Some(max) = self.limits.max_priority {
            if task.priority > max {
                return Err(TaskError::new(
                    "priority",
                    format!(
                        "{} is above the highest priority this queue allows a submitter \
                         (cairn run --max-priority-per-submitter {max}); ask for {max} or less \
                         and drop the file again",
                        task.priority
                    ),
                ));
            }
        }
        self.check_queued(task).map_err(|full| {
            TaskError::whole_file(format!("{full}; drop it again once one has finished"))
        })
    }

    /// Why `task` may not become unfinished again (a `cairn retry` of it), if it may not: its
    /// submitter has as many unfinished tasks as `--max-queued-per-submitter` allows. A retry
    /// brings a finished task back into the queue as surely as a new file does.
    pub fn check_queued(&self, task: &Task) -> Result<(), QueueFull> {
        let Some(max) = self.limits.max_queued else {
            return Ok(());
        };
        let key = SubmitterKey::of_task(task);
        let queued = self.queued().count.get(&key).copied().unwrap_or(0);
        if queued >= max {
            return Err(QueueFull { key, queued, max });
        }
        Ok(())
    }

    /// Count `id` against `key` (again: no change).
    pub fn note(&self, id: &TaskId, key: SubmitterKey) {
        let mut queued = self.queued();
        if let Some(old) = queued.of.insert(id.clone(), key) {
            if old == key {
                return;
            }
            Queued::decrement(&mut queued.count, old);
        }
        *queued.count.entry(key).or_insert(0) += 1;
    }

    /// Stop counting `id` (finished, or no longer this daemon's).
    pub fn forget(&self, id: &str) {
        let mut queued = self.queued();
        if let Some(old) = queued.of.remove(id) {
            Queued::decrement(&mut queued.count, old);
        }
    }

    /// Count a file of `key`'s that intake rejected.
    pub fn note_rejected(&self, key: SubmitterKey) {
        if self.limits.max_queued.is_none() {
            return;
        }
        let mut rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        rejected
            .entry(key)
            .or_default()
            .push_back(std::time::Instant::now());
    }

    /// Whether intake may read another file of `key`'s now. A rejected file costs the queue a
    /// record and a copy of its bytes, so rejections count against the submitter too: with
    /// `--max-queued-per-submitter N`, one whose last N files within [`REJECTIONS_REMEMBERED`]
    /// were rejected has their further files wait in the inbox, unread, until the oldest of
    /// those rejections is that old.
    pub fn may_take_from(&self, key: SubmitterKey, now: std::time::Instant) -> bool {
        let Some(max) = self.limits.max_queued else {
            return true;
        };
        let mut rejected = self.rejected.lock().unwrap_or_else(|p| p.into_inner());
        let Some(times) = rejected.get_mut(&key) else {
            return true;
        };
        while times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= REJECTIONS_REMEMBERED)
        {
            times.pop_front();
        }
        if times.is_empty() {
            rejected.remove(&key);
            return true;
        }
        times.len() < max
    }

    /// Unfinished tasks counted against `key`.
    pub fn queued_of(&self, key: SubmitterKey) -> usize {
        self.queued().count.get(&key).copied().unwrap_or(0)
    }
}

impl Queued {
    fn decrement(count: &mut HashMap<SubmitterKey, usize>, key: SubmitterKey) {
        if let Some(n) = count.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                count.remove(&key);
            }
        }
    }
}

/// What the daemon publishes at start in the queue's `limits.json`, for `cairn status`: the
/// pid says which daemon it was (a file left by an earlier daemon is not shown as in effect).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublishedLimits {
    pub version: u32,
    pub pid: i32,
    /// `cairn run --max-tasks`.
    pub max_tasks: usize,
    pub per_submitter: SubmitterLimits,
}

impl PublishedLimits {
    pub const VERSION: u32 = 1;
}

#[cfg(test)]
mod tests {
    use super::{Admission, SubmitterKey, SubmitterLimits};
    use crate::submitter::Submitter;
    use crate::task::Task;
    use crate::task_id::TaskId;

    fn task(uid: Option<u32>, priority: i32) -> Task {
        let mut task =
            Task::parse(br#"{"phases":[{"name":"a","run":["true"]}]}"#).expect("a valid task");
        task.priority = priority;
        task.submitted_by = uid.map(|uid| Submitter { uid, user: None });
        task
    }

    #[test]
    fn intake_is_refused_past_a_limit_and_counting_is_per_submitter_and_idempotent() {
        let gate = Admission::new(SubmitterLimits {
            max_queued: Some(2),
            max_running: None,
            max_priority: Some(5),
        });
        let (a, unknown) = (SubmitterKey::Uid(1001), SubmitterKey::Unknown);
        assert!(gate.check(&task(Some(1001), 5)).is_ok());
        let too_high = gate.check(&task(Some(1001), 6)).unwrap_err();
        assert_eq!(too_high.field.as_deref(), Some("priority"));
        assert!(too_high.problem.contains("--max-priority-per-submitter 5"));

        let ids: Vec<TaskId> = ["a1", "a2", "u1"].map(|i| TaskId::parse(i).unwrap()).into();
        gate.note(&ids[0], a);
        gate.note(&ids[0], a);
        assert_eq!(gate.queued_of(a), 1, "noted twice, counted once");
        gate.note(&ids[1], a);
        gate.note(&ids[2], unknown);
        let full = gate.check(&task(Some(1001), 0)).unwrap_err();
        assert!(
            full.problem.contains("--max-queued-per-submitter 2"),
            "{full}"
        );
        assert!(full.problem.contains("already has 2"), "{full}");
        // Others are not held back by a's tasks; tasks without a submitter share one count.
        assert!(gate.check(&task(Some(1002), 0)).is_ok());
        assert!(gate.check(&task(None, 0)).is_ok());
        gate.note(&TaskId::parse("u2").unwrap(), unknown);
        assert!(gate.check(&task(None, 0)).is_err());
        // A finished task frees its place.
        gate.forget("a1");
        gate.forget("a1");
        assert_eq!(gate.queued_of(a), 1);
        assert!(gate.check(&task(Some(1001), 0)).is_ok());
    }

    #[test]
    fn without_limits_everything_is_admitted() {
        let gate = Admission::new(SubmitterLimits::default());
        for n in 0..50 {
            gate.note(
                &TaskId::parse(format!("t{n}")).unwrap(),
                SubmitterKey::Uid(7),
            );
        }
        assert!(gate.check(&task(Some(7), i32::MAX)).is_ok());
        assert!(SubmitterLimits::default().may_run(10_000));
        assert!(!SubmitterLimits {
            max_running: Some(1),
            ..Default::default()
        }
        .may_run(1));
    }

    #[test]
    fn rejected_files_count_against_their_submitter_for_a_while() {
        let gate = Admission::new(SubmitterLimits {
            max_queued: Some(2),
            max_running: None,
            max_priority: None,
        });
        let (a, b) = (SubmitterKey::Uid(1001), SubmitterKey::Uid(1002));
        let now = std::time::Instant::now();
        assert!(gate.may_take_from(a, now));
        gate.note_rejected(a);
        assert!(gate.may_take_from(a, now));
        gate.note_rejected(a);
        assert!(!gate.may_take_from(a, std::time::Instant::now()));
        assert!(gate.may_take_from(b, now), "another submitter is not held");
        let later = std::time::Instant::now() + super::REJECTIONS_REMEMBERED;
        assert!(gate.may_take_from(a, later), "the rejections are forgotten");
        // Without a queued limit nothing is held.
        let open = Admission::new(SubmitterLimits::default());
        for _ in 0..10 {
            open.note_rejected(a);
        }
        assert!(open.may_take_from(a, std::time::Instant::now()));
    }
}
