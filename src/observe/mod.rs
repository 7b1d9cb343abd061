//! What the daemon tells about itself while it runs, for `cairn run --listen`: its metrics, fed
//! by the journal events it already writes (`Observer::event`) and by a few counts the
//! scheduler publishes, and whether its main loop turns ([`health`]). The daemon only
//! records here; the HTTP listener (`web`, in the command line) reads.

pub mod health;
pub mod metrics;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::store::events::Event;
use crate::submitter::Submitter;
use crate::task::TaskError;

pub use health::{Health, Liveness};
use metrics::label;
pub use metrics::Metrics;

/// The metrics and health of one running daemon, shared with its listener.
pub struct Observer {
    pub metrics: Metrics,
    pub health: Health,
    /// Per task in flight, what its later events need.
    tasks: Mutex<HashMap<String, Tracked>>,
    /// When the scheduler last published its counts.
    published_at: Mutex<Option<Instant>>,
}

/// What an event of a task needs from its earlier ones.
#[derive(Debug, Default)]
struct Tracked {
    submitter: Option<String>,
    accepted_at: Option<Instant>,
    /// The phase and iteration of its last checkpoint, for the iterations it completed.
    last_checkpoint: Option<(String, u64)>,
    quarantined: bool,
}

/// How often the scheduler's counts are published at most (it counts over every task in
/// flight, so not on every turn of the loop).
const PUBLISH_EVERY: Duration = Duration::from_millis(250);

/// The counts the scheduler publishes.
#[derive(Debug, Default, Clone, Copy)]
pub struct StateCounts {
    pub pending: usize,
    pub running: usize,
    pub paused: usize,
    pub waiting_retry: usize,
    pub interrupted: usize,
    /// Leases of a shared queue held (`None`: the queue is files).
    pub leases_held: Option<usize>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl Observer {
    pub fn new(health: Health) -> Observer {
        Observer {
            metrics: Metrics::new(),
            health,
            tasks: Mutex::new(HashMap::new()),
            published_at: Mutex::new(None),
        }
    }

    fn tracked<T>(&self, f: impl FnOnce(&mut HashMap<String, Tracked>) -> T) -> T {
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut tasks)
    }

    /// A journal event of a task, as the daemon writes it.
    pub fn event(&self, task_id: &str, event: &Event) {
        let m = &self.metrics;
        match event {
            Event::Accepted { submitted_by, .. } => self.tracked(|tasks| {
                let entry = tasks.entry(task_id.to_string()).or_default();
                entry.accepted_at = Some(Instant::now());
                entry.submitter = submitted_by.as_ref().map(Submitter::short);
            }),
            Event::AttemptStarted { .. } => {
                m.attempts_started.inc();
                let accepted =
                    self.tracked(|tasks| tasks.get_mut(task_id).and_then(|t| t.accepted_at.take()));
                if let Some(accepted) = accepted {
                    m.accept_to_start_seconds
                        .observe(accepted.elapsed().as_secs_f64());
                }
            }
            Event::Checkpoint {
                phase,
                iteration,
                bytes,
                ms,
                ..
            } => {
                m.checkpoints.inc();
                m.checkpoint_bytes.observe(*bytes as f64);
                m.checkpoint_commit_seconds.observe(ms / 1000.0);
                let completed = self.tracked(|tasks| {
                    let entry = tasks.entry(task_id.to_string()).or_default();
                    let completed = match &entry.last_checkpoint {
                        Some((last_phase, last)) if last_phase == phase && iteration > last => {
                            iteration - last
                        }
                        // The first checkpoint seen of a phase: at least its own iteration.
                        _ => 1,
                    };
                    entry.last_checkpoint = Some((phase.clone(), *iteration));
                    completed
                });
                m.iterations.inc_by(completed);
            }
            Event::AttemptFailed { .. } => self.attempt_ended("failed"),
            Event::Interrupted { .. } => self.attempt_ended("interrupted"),
            Event::ResumedAfterCrash { .. } => {
                m.crash_recoveries.inc();
            }
            Event::TakenOver { .. } => {
                m.takeovers.inc();
            }
            Event::Quarantined { .. } => self.tracked(|tasks| {
                tasks.entry(task_id.to_string()).or_default().quarantined = true;
            }),
            Event::Done { cost, .. } => {
                self.attempt_ended("done");
                let submitter = self.finished(task_id, "done");
                if let Some(cost) = cost.filter(|c| c.is_finite() && *c > 0.0) {
                    let who = submitter.unwrap_or_else(|| "unknown".to_string());
                    m.cost.get_or_create(&label("submitter", &who)).inc_by(cost);
                }
            }
            Event::Failed { .. } => {
                let quarantined =
                    self.tracked(|tasks| tasks.get(task_id).is_some_and(|t| t.quarantined));
                self.finished(task_id, if quarantined { "quarantined" } else { "failed" });
            }
            Event::Cancelled { .. } => {
                self.finished(task_id, "cancelled");
            }
            Event::BudgetStopped { .. } => {
                self.finished(task_id, "budget_exceeded");
            }
            _ => {}
        }
    }

    fn attempt_ended(&self, outcome: &str) {
        self.metrics
            .attempts_ended
            .get_or_create(&label("outcome", outcome))
            .inc();
    }

    /// Count a task that ended for good and forget it; its submitter, when known.
    fn finished(&self, task_id: &str, status: &str) -> Option<String> {
        self.metrics
            .finished
            .get_or_create(&label("status", status))
            .inc();
        self.tracked(|tasks| tasks.remove(task_id))
            .and_then(|t| t.submitter)
    }

    /// The submitter of a task about to start (tasks recovered after a restart were not
    /// accepted by this run).
    pub fn know_submitter(&self, task_id: &str, submitter: Option<&Submitter>) {
        self.tracked(|tasks| {
            let entry = tasks.entry(task_id.to_string()).or_default();
            if entry.submitter.is_none() {
                entry.submitter = submitter.map(Submitter::short);
            }
        })
    }

    /// A file refused at intake.
    pub fn rejected(&self, error: &TaskError) {
        let reason = if error.field.is_some() {
            "invalid_field"
        } else {
            "whole_file"
        };
        self.metrics
            .rejections
            .get_or_create(&label("reason", reason))
            .inc();
    }

    /// A lease of a shared queue's task was lost to another daemon.
    pub fn lease_lost(&self) {
        self.metrics.leases_lost.inc();
    }

    /// The main loop turned.
    pub fn turned(&self) {
        self.health.turned();
        let now = chrono::Utc::now();
        self.metrics
            .main_loop_last_turn
            .set(now.timestamp_millis() as f64 / 1000.0);
    }

    /// The queue is locked and recovered.
    pub fn ready(&self) {
        self.turned();
        self.health.set_ready();
        self.metrics.ready.set(1);
    }

    /// Whether the scheduler should publish its counts now.
    pub fn counts_due(&self) -> bool {
        let mut at = self.published_at.lock().unwrap_or_else(|p| p.into_inner());
        if at.is_some_and(|at| at.elapsed() < PUBLISH_EVERY) {
            return false;
        }
        *at = Some(Instant::now());
        true
    }

    /// The scheduler's counts of its tasks by state.
    pub fn publish(&self, counts: StateCounts) {
        let set = |state: &str, n: usize| {
            self.metrics
                .tasks
                .get_or_create(&label("state", state))
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set("pending", counts.pending);
        set("running", counts.running);
        set("paused", counts.paused);
        set("waiting_retry", counts.waiting_retry);
        set("interrupted", counts.interrupted);
        if let Some(held) = counts.leases_held {
            self.metrics
                .leases_held
                .set(i64::try_from(held).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
    }

    #[test]
    fn events_become_counts_without_task_ids() {
        let observer = Observer::new(Health::with_stall_limit(Duration::from_secs(1)));
        let alice = Submitter {
            uid: 1000,
            user: Some("alice".into()),
        };
        observer.event(
            "t1",
            &Event::Accepted {
                priority: 0,
                submitted_by: Some(alice),
            },
        );
        observer.event(
            "t1",
            &Event::AttemptStarted {
                attempt: 1,
                phase: "p".into(),
            },
        );
        for iteration in [1, 2, 5] {
            observer.event(
                "t1",
                &Event::Checkpoint {
                    phase: "p".into(),
                    iteration,
                    generation: iteration,
                    bytes: 100,
                    ms: 2.0,
                },
            );
        }
        observer.event(
            "t1",
            &Event::Done {
                attempts: 1,
                cost: Some(1.5),
            },
        );
        observer.event(
            "t2",
            &Event::Quarantined {
                crashes: 3,
                limit: 3,
            },
        );
        observer.event(
            "t2",
            &Event::Failed {
                error: "x".into(),
                attempts: 3,
            },
        );
        let text = observer.metrics.encode();
        assert_eq!(
            value_of(&text, "cairn_iterations_total "),
            Some(5.0),
            "{text}"
        );
        assert_eq!(value_of(&text, "cairn_checkpoints_total "), Some(3.0));
        assert_eq!(
            value_of(&text, "cairn_tasks_finished_total{status=\"done\"} "),
            Some(1.0)
        );
        assert_eq!(
            value_of(&text, "cairn_tasks_finished_total{status=\"quarantined\"} "),
            Some(1.0)
        );
        assert_eq!(
            value_of(&text, "cairn_tasks_finished_total{status=\"failed\"} "),
            Some(0.0)
        );
        assert_eq!(
            value_of(&text, "cairn_cost_total{submitter=\"alice\"} "),
            Some(1.5)
        );
        assert!(!text.contains("t1") && !text.contains("t2"), "{text}");
    }
}
