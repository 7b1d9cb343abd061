//! `current_work.json`: the coarse, phase-level checkpoint of every task in flight.
//!
//! Kept on disk as a snapshot and a log of the entries written since (`store::work_log`). It is
//! written whenever a task starts an attempt, finishes a phase, changes status
//! or leaves; iteration-level progress lives in the task's iteration checkpoint instead, so the
//! `iterations` counter here is as of the last rewrite. Phase outputs larger than
//! [`INLINE_OUTPUT_LIMIT`] are kept in per-task files and only referenced from here.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::task_id::TaskId;

/// The layout version of `current_work.json`.
pub const CURRENT_WORK_VERSION: u32 = 1;

/// Phase outputs up to this many bytes of JSON are kept inline in `current_work.json`.
pub const INLINE_OUTPUT_LIMIT: usize = 4096;

/// The whole file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CurrentWork {
    pub version: u32,
    pub updated_at: DateTime<Utc>,
    /// The generation of this snapshot: the work log `current_work.log` that starts with the
    /// same number holds the writes since (see `store::work_log`). 0 in a file of an older
    /// cairn, which had no log.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub log_generation: u64,
    pub active_tasks: Vec<ActiveTask>,
}

impl Default for CurrentWork {
    fn default() -> Self {
        CurrentWork {
            version: CURRENT_WORK_VERSION,
            updated_at: Utc::now(),
            log_generation: 0,
            active_tasks: Vec::new(),
        }
    }
}

impl CurrentWork {
    pub fn get(&self, task_id: &str) -> Option<&ActiveTask> {
        self.active_tasks.iter().find(|t| t.task_id == task_id)
    }

    pub fn get_mut(&mut self, task_id: &str) -> Option<&mut ActiveTask> {
        self.active_tasks.iter_mut().find(|t| t.task_id == task_id)
    }

    /// Insert or replace the entry of `task.task_id`.
    pub fn upsert(&mut self, task: ActiveTask) {
        match self.get_mut(&task.task_id) {
            Some(entry) => *entry = task,
            None => self.active_tasks.push(task),
        }
    }

    pub fn remove(&mut self, task_id: &str) -> Option<ActiveTask> {
        let index = self
            .active_tasks
            .iter()
            .position(|t| t.task_id == task_id)?;
        Some(self.active_tasks.remove(index))
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

/// Where a task in flight stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActiveStatus {
    /// An attempt is running (or was, when the daemon died).
    Running,
    /// Held by an operator.
    Paused,
    /// Stopped cleanly by a daemon shutdown; resumes at the next start.
    Interrupted,
    /// A failed attempt waits for its backoff to pass.
    WaitingRetry,
}

impl ActiveStatus {
    /// As `current_work.json` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ActiveStatus::Running => "running",
            ActiveStatus::Paused => "paused",
            ActiveStatus::Interrupted => "interrupted",
            ActiveStatus::WaitingRetry => "waiting_retry",
        }
    }
}

/// A finished phase's output, inline or in a per-task file (a storage key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredOutput {
    Inline(Value),
    File(String),
}

/// Progress as a worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    pub done: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

/// When a phase ran.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTiming {
    pub name: String,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Completed iterations, for iterative phases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
    /// A worker's last reported total (`{"progress": {"total": N}}`), kept for its records:
    /// a worker's definition has no total of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

/// The task and checkpoint a forked task started from (`cairn fork`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    pub task_id: String,
    /// The generation it continued from; 0 for a restart at a phase (`--from-phase`).
    pub generation: u64,
    /// The phase it started at.
    pub phase: String,
}

/// One task in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveTask {
    pub task_id: TaskId,
    /// Name of the phase to run (or running).
    pub phase: String,
    pub phase_index: usize,
    /// Outputs of the finished phases, by phase name.
    pub phase_outputs: BTreeMap<String, StoredOutput>,
    pub started_at: DateTime<Utc>,
    #[serde(default)]
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    /// Runs started so far (the current one included; resumes after a stop, pause or crash
    /// count too, so this is not a count of failures); given to commands as `attempt`.
    pub attempt: u32,
    /// Attempts that failed; the task fails when this reaches `retry.max_attempts`.
    pub failed_attempts: u32,
    pub status: ActiveStatus,
    /// Completed iterations of the current phase, as of the last rewrite.
    pub iterations: u64,
    /// The phase index when the current attempt began, to tell whether a crashed attempt made
    /// progress.
    pub attempt_started_phase: usize,
    /// Daemon crashes in a row while this task ran alone, with no progress (checkpoint, finished
    /// phase) or clean stop in between; see `daemon::crash_blame`. (Read from the older name
    /// too, which counted crashes beside other tasks as well.)
    #[serde(
        default,
        skip_serializing_if = "is_zero",
        alias = "crashes_without_progress"
    )]
    pub crashes_alone: u32,
    /// The daemon died while this task was in flight with others and before it made progress:
    /// it is tried alone before anything else starts beside it. Cleared by progress or by an
    /// attempt that ends while the daemon lives.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspect: bool,
    /// The task's summed cost, when its commands report costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Iterations that were in flight (or done but not yet checkpointed) when the daemon died,
    /// counted as spent: their cost is not in `cost`, which is what checkpoints committed.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub lost_iterations: u64,
    /// The attempt in flight has not started a command of its loop or worker phase yet, so a
    /// crash now loses no iteration. Set when the attempt is recorded, cleared (durably)
    /// before the phase's first command starts. Missing (an older cairn's entry): a crash is
    /// taken to have lost iterations, as it was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_iteration_started: bool,
    /// The lost iterations by the index of the phase they were lost in (their sum is at most
    /// `lost_iterations`; an older cairn's entry has none): each is priced at its own phase's
    /// largest iteration cost.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lost_by_phase: BTreeMap<usize, u64>,
    /// The largest cost a single iteration (a loop reply, a worker's `cost` message) reported:
    /// the price of a lost iteration whose phase has reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_iteration_cost: Option<f64>,
    /// The largest cost a single iteration of each phase (by index) reported: the price of the
    /// iterations lost in that phase.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_cost_by_phase: BTreeMap<usize, f64>,
    /// A worker's own account of its progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Set by `cairn retry`: the `failed_at` of the record this entry brings back, so that a
    /// crash before that record is archived is not mistaken for the task having failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<DateTime<Utc>>,
    #[serde(default)]
    pub phases: Vec<PhaseTiming>,
    /// The spending limit an operator set with `cairn budget`: it replaces the definition's
    /// `budget.max_cost` from then on (the definition stays as submitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost: Option<f64>,
    /// Why the task is paused when a policy of its own paused it (`budget.on_exceed`,
    /// `retry.on_exhausted`) rather than an operator; cleared when it resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_for: Option<PolicyPause>,
    /// Where a forked task came from (its start point), for its final record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
}

/// What paused a task by its own policy, as `status` and `show` give it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyPause {
    pub reason: PauseReason,
    /// `budget`: what was spent (committed cost plus the estimate for lost iterations) and the
    /// limit it reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
    /// `retries_exhausted`: the failed attempts, the last one's error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Which policy paused a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseReason {
    /// `budget.on_exceed: "pause"`: its spend reached its limit.
    Budget,
    /// `retry.on_exhausted: "pause"`: its attempts are used up.
    RetriesExhausted,
}

impl PauseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PauseReason::Budget => "budget",
            PauseReason::RetriesExhausted => "retries_exhausted",
        }
    }
}

impl PolicyPause {
    /// Paused by its budget: `spent` reached `limit`.
    pub fn budget(spent: f64, limit: f64) -> PolicyPause {
        PolicyPause {
            reason: PauseReason::Budget,
            spent: Some(spent),
            limit: Some(limit),
            failed_attempts: None,
            error: None,
        }
    }

    /// Paused with its attempts used up, the last one failing with `error`.
    pub fn retries_exhausted(failed_attempts: u32, error: String) -> PolicyPause {
        PolicyPause {
            reason: PauseReason::RetriesExhausted,
            spent: None,
            limit: None,
            failed_attempts: Some(failed_attempts),
            error: Some(error),
        }
    }

    /// One line for people: `budget: spent 0.05 of 0.05`, `retries exhausted: 3 failed
    /// attempts, the last: ...`.
    pub fn describe(&self) -> String {
        match self.reason {
            PauseReason::Budget => format!(
                "budget: spent {} of {}",
                self.spent.unwrap_or(0.0),
                self.limit.unwrap_or(0.0)
            ),
            PauseReason::RetriesExhausted => format!(
                "retries exhausted: {} failed attempt(s), the last: {}",
                self.failed_attempts.unwrap_or(0),
                self.error.as_deref().unwrap_or("")
            ),
        }
    }
}

impl ActiveTask {
    /// A task about to start its first attempt.
    pub fn new(task_id: &TaskId, first_phase: &str) -> Self {
        ActiveTask {
            task_id: task_id.clone(),
            phase: first_phase.to_string(),
            phase_index: 0,
            phase_outputs: BTreeMap::new(),
            started_at: Utc::now(),
            last_checkpoint_at: None,
            attempt: 0,
            failed_attempts: 0,
            status: ActiveStatus::Running,
            iterations: 0,
            attempt_started_phase: 0,
            crashes_alone: 0,
            suspect: false,
            cost: None,
            lost_iterations: 0,
            no_iteration_started: false,
            lost_by_phase: BTreeMap::new(),
            max_iteration_cost: None,
            max_cost_by_phase: BTreeMap::new(),
            progress: None,
            next_attempt_at: None,
            last_error: None,
            retry_of: None,
            phases: Vec::new(),
            max_cost: None,
            paused_for: None,
            forked_from: None,
        }
    }

    /// The entry a task starts its first attempt with: at its first phase, or where
    /// `cairn fork` said (its start point, when it names a phase `task` has).
    pub fn first(task: &crate::task::Task, start: Option<StartPoint>) -> Self {
        let first_phase = task.phases.first().map(|p| p.name.as_str()).unwrap_or("");
        let mut entry = ActiveTask::new(task.id(), first_phase);
        let Some(start) = start.filter(|s| s.phase_index < task.phases.len()) else {
            return entry;
        };
        entry.phase_index = start.phase_index;
        entry.phase = task.phases[start.phase_index].name.clone();
        entry.forked_from = Some(ForkedFrom {
            task_id: start.forked_from,
            generation: start.generation,
            phase: entry.phase.clone(),
        });
        entry.phase_outputs = start
            .phase_outputs
            .into_iter()
            .map(|(name, value)| (name, StoredOutput::Inline(value)))
            .collect();
        entry
    }

    /// The spending limit in force: the one `cairn budget` set, else the definition's.
    pub fn spend_limit(&self, budget: Option<&crate::task::Budget>) -> Option<f64> {
        self.max_cost.or(budget.map(|b| b.max_cost))
    }

    /// What the task has spent, as its budget counts it: the committed cost plus the estimate
    /// for the iterations lost to crashes (decimals summed exactly).
    pub fn spent(&self) -> f64 {
        crate::cost::add(
            self.cost.unwrap_or(0.0),
            self.lost_cost_estimate().unwrap_or(0.0),
        )
    }

    /// `cairn resume` of a paused task: it is lined up to run again, from its last checkpoint.
    /// A task its used-up attempts paused gets a fresh allowance (the operator fixed the
    /// cause); its attempts are still numbered on.
    pub fn resume_from_pause(&mut self) {
        self.status = ActiveStatus::Interrupted;
        if let Some(pause) = self.paused_for.take() {
            if pause.reason == PauseReason::RetriesExhausted {
                self.failed_attempts = 0;
            }
        }
    }
}

impl ActiveTask {
    /// What the iterations lost to crashes are taken to have cost: each at the largest cost an
    /// iteration of its own phase reported, or, while that phase has reported none (and for
    /// the lost iterations of an older cairn's entry, whose phase is unknown), at the largest
    /// any iteration of the task reported. `None` while nothing is lost, or no cost was
    /// reported yet: they are priced once one is.
    pub fn lost_cost_estimate(&self) -> Option<f64> {
        if self.lost_iterations == 0 {
            return None;
        }
        let fallback = self.max_iteration_cost?;
        let mut placed = 0u64;
        let mut total = 0.0;
        for (phase, lost) in &self.lost_by_phase {
            let each = self
                .max_cost_by_phase
                .get(phase)
                .copied()
                .unwrap_or(fallback);
            total = crate::cost::add(total, crate::cost::times(*lost, each));
            placed = placed.saturating_add(*lost);
        }
        let unplaced = self.lost_iterations.saturating_sub(placed);
        Some(crate::cost::add(
            total,
            crate::cost::times(unplaced, fallback),
        ))
    }
}

/// Where a new task starts instead of at its first phase, written by `cairn fork` as
/// `runs/<id>/start.json` before the task is submitted: the phase to start at and the outputs
/// of the phases before it. The forked checkpoint itself is the task's own iteration checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartPoint {
    pub phase_index: usize,
    pub phase_outputs: BTreeMap<String, Value>,
    /// The task and checkpoint generation this one was forked from.
    pub forked_from: String,
    pub generation: u64,
}

impl StartPoint {
    /// The storage key of a task's start point.
    pub fn key(task_id: &str) -> String {
        format!("runs/{task_id}/start.json")
    }
}

#[cfg(test)]
mod tests {
    use super::{ActiveStatus, ActiveTask};

    /// An entry as an older cairn wrote it: no crash suspicion, no lost iterations, the crash
    /// count under its old name.
    const OLD_ENTRY: &str = r#"{
        "task_id": "t", "phase": "p", "phase_index": 0, "phase_outputs": {},
        "started_at": "2026-11-21T23:53:37Z", "attempt": 2, "failed_attempts": 0,
        "status": "running", "iterations": 3, "attempt_started_phase": 0,
        "crashes_without_progress": 2, "cost": 0.5
    }"#;

    #[test]
    fn an_older_entry_still_reads() {
        let entry: ActiveTask = serde_json::from_str(OLD_ENTRY).unwrap();
        assert_eq!(entry.status, ActiveStatus::Running);
        assert_eq!(entry.crashes_alone, 2);
        assert!(!entry.suspect);
        assert_eq!(entry.lost_iterations, 0);
        assert_eq!(entry.lost_cost_estimate(), None);
    }

    #[test]
    fn the_crash_accounting_survives_a_rewrite() {
        let mut entry: ActiveTask = serde_json::from_str(OLD_ENTRY).unwrap();
        entry.suspect = true;
        entry.lost_iterations = 3;
        entry.max_iteration_cost = Some(0.1);
        let text = serde_json::to_string(&entry).unwrap();
        assert!(text.contains("\"crashes_alone\":2"), "{text}");
        let back: ActiveTask = serde_json::from_str(&text).unwrap();
        assert_eq!(back, entry);
        assert_eq!(back.lost_cost_estimate().unwrap().to_string(), "0.3");
    }

    /// A resume lets a paused task go on: one its used-up attempts paused gets a fresh
    /// allowance; one its budget paused keeps everything it spent (the lost iterations'
    /// estimate too) and the limit an operator set, which replaces the definition's.
    #[test]
    fn a_resume_clears_the_policy_pause_and_keeps_the_spend() {
        use super::{PauseReason, PolicyPause};
        let budget = crate::task::Budget {
            max_cost: 0.05,
            on_exceed: crate::task::OnExceed::Pause,
        };
        let mut entry: ActiveTask = serde_json::from_str(OLD_ENTRY).unwrap();
        entry.cost = Some(0.03);
        entry.lost_iterations = 2;
        entry.max_iteration_cost = Some(0.01);
        assert_eq!(entry.spent().to_string(), "0.05");
        assert_eq!(entry.spend_limit(Some(&budget)), Some(0.05));
        entry.status = ActiveStatus::Paused;
        entry.paused_for = Some(PolicyPause::budget(entry.spent(), 0.05));
        entry.max_cost = Some(0.1);
        entry.failed_attempts = 1;
        let text = serde_json::to_string(&entry).unwrap();
        assert_eq!(serde_json::from_str::<ActiveTask>(&text).unwrap(), entry);
        entry.resume_from_pause();
        assert_eq!(entry.status, ActiveStatus::Interrupted);
        assert_eq!(entry.paused_for, None);
        assert_eq!(
            (entry.failed_attempts, entry.spent().to_string()),
            (1, "0.05".into())
        );
        assert_eq!(entry.spend_limit(Some(&budget)), Some(0.1));
        assert_eq!(entry.spend_limit(None), Some(0.1));

        entry.status = ActiveStatus::Paused;
        entry.failed_attempts = 3;
        entry.paused_for = Some(PolicyPause::retries_exhausted(3, "boom".into()));
        assert_eq!(
            entry.paused_for.as_ref().map(|p| p.reason),
            Some(PauseReason::RetriesExhausted)
        );
        entry.resume_from_pause();
        assert_eq!(
            (entry.status, entry.failed_attempts),
            (ActiveStatus::Interrupted, 0)
        );
        // An operator's pause carries no reason; its resume counts nothing afresh.
        entry.status = ActiveStatus::Paused;
        entry.failed_attempts = 2;
        entry.resume_from_pause();
        assert_eq!(entry.failed_attempts, 2);
    }

    /// Iterations lost in a phase are priced at that phase's largest iteration cost, not at the
    /// task's (a worker billing 0.01 after a loop billing 0.05); a phase that reported nothing
    /// yet, and lost iterations of unknown phase, at the task's.
    #[test]
    fn lost_iterations_are_priced_at_their_own_phases_cost() {
        let mut entry: ActiveTask = serde_json::from_str(OLD_ENTRY).unwrap();
        entry.max_iteration_cost = Some(0.05);
        entry.max_cost_by_phase = [(0, 0.05), (1, 0.01)].into();
        entry.lost_iterations = 3;
        entry.lost_by_phase = [(1, 3)].into();
        assert_eq!(entry.lost_cost_estimate().unwrap().to_string(), "0.03");
        // One more in phase 2, which has reported no cost: the task's largest.
        entry.lost_iterations = 4;
        entry.lost_by_phase.insert(2, 1);
        assert_eq!(entry.lost_cost_estimate().unwrap().to_string(), "0.08");
        // Two from an older cairn, phase unknown: the task's largest too.
        entry.lost_iterations = 6;
        assert_eq!(entry.lost_cost_estimate().unwrap().to_string(), "0.18");
        let text = serde_json::to_string(&entry).unwrap();
        let back: ActiveTask = serde_json::from_str(&text).unwrap();
        assert_eq!(back, entry);
    }
}
