//! The daemon's metrics in the `cairn_` namespace, kept by `prometheus-client` and written in
//! the Prometheus text format. No metric is labelled by task id: a queue holds thousands of
//! tasks, and a series per task would swamp the server that scrapes it.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A metric's labels, as name/value pairs.
pub type Labels = Vec<(String, String)>;

/// The states `cairn_tasks` counts, named as `cairn status` names them.
pub const GAUGED_STATES: [&str; 5] = [
    "pending",
    "running",
    "paused",
    "waiting_retry",
    "interrupted",
];

/// Every metric the daemon keeps. Cloning a metric shares it, so the handles here are the
/// ones registered.
pub struct Metrics {
    registry: Registry,
    pub tasks: Family<Labels, Gauge>,
    pub finished: Family<Labels, Counter>,
    pub attempts_started: Counter,
    pub attempts_ended: Family<Labels, Counter>,
    pub iterations: Counter,
    pub checkpoints: Counter,
    pub checkpoint_commit_seconds: Histogram,
    pub checkpoint_bytes: Histogram,
    pub accept_to_start_seconds: Histogram,
    pub cost: Family<Labels, Counter<f64, AtomicU64>>,
    pub crash_recoveries: Counter,
    pub takeovers: Counter,
    pub rejections: Family<Labels, Counter>,
    pub leases_held: Gauge,
    pub leases_lost: Counter,
    pub ready: Gauge,
    pub main_loop_last_turn: Gauge<f64, AtomicU64>,
}

/// One label.
pub fn label(name: &str, value: &str) -> Labels {
    vec![(name.to_string(), value.to_string())]
}

impl Metrics {
    pub fn new() -> Metrics {
        let metrics = Metrics::unregistered();
        for state in GAUGED_STATES {
            let _ = metrics.tasks.get_or_create(&label("state", state));
        }
        for status in FINISHED_STATUSES {
            let _ = metrics.finished.get_or_create(&label("status", status));
        }
        let mut registry = Registry::with_prefix("cairn");
        metrics.register_tasks(&mut registry);
        metrics.register_checkpoints(&mut registry);
        metrics.register_the_rest(&mut registry);
        Metrics {
            registry,
            ..metrics
        }
    }

    /// Every metric at zero, none registered yet.
    fn unregistered() -> Metrics {
        Metrics {
            tasks: Family::default(),
            finished: Family::default(),
            attempts_started: Counter::default(),
            attempts_ended: Family::default(),
            iterations: Counter::default(),
            checkpoints: Counter::default(),
            // 0.5 ms to about 16 s.
            checkpoint_commit_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 16)),
            // 64 bytes to 64 MiB.
            checkpoint_bytes: Histogram::new(exponential_buckets(64.0, 4.0, 11)),
            // 10 ms to about 3 days.
            accept_to_start_seconds: Histogram::new(exponential_buckets(0.01, 4.0, 15)),
            cost: Family::default(),
            crash_recoveries: Counter::default(),
            takeovers: Counter::default(),
            rejections: Family::default(),
            leases_held: Gauge::default(),
            leases_lost: Counter::default(),
            ready: Gauge::default(),
            main_loop_last_turn: Gauge::default(),
            registry: Registry::default(),
        }
    }

    /// Tasks, attempts and iterations.
    fn register_tasks(&self, r: &mut Registry) {
        let metrics = self;
        r.register(
            "tasks",
            "Unfinished tasks this daemon holds, by state (as cairn status names them)",
            metrics.tasks.clone(),
        );
        r.register(
            "tasks_finished",
            "Tasks that ended for good since the daemon started, by their record's status",
            metrics.finished.clone(),
        );
        r.register(
            "attempts_started",
            "Attempts started since the daemon started",
            metrics.attempts_started.clone(),
        );
        r.register(
            "attempts_ended",
            "Attempts ended since the daemon started, by outcome (done, failed, interrupted)",
            metrics.attempts_ended.clone(),
        );
        r.register(
            "iterations",
            "Loop iterations and items completed (checkpointed) since the daemon started",
            metrics.iterations.clone(),
        );
    }

    /// Checkpoints and the time to a first start.
    fn register_checkpoints(&self, r: &mut Registry) {
        let metrics = self;
        r.register(
            "checkpoints",
            "Iteration checkpoints written since the daemon started",
            metrics.checkpoints.clone(),
        );
        r.register(
            "checkpoint_commit_seconds",
            "Time from an iteration's end to its checkpoint being durable",
            metrics.checkpoint_commit_seconds.clone(),
        );
        r.register(
            "checkpoint_bytes",
            "Size of each checkpoint written (compressed)",
            metrics.checkpoint_bytes.clone(),
        );
        r.register(
            "accept_to_start_seconds",
            "Time from a task's acceptance by this daemon's intake to its first attempt",
            metrics.accept_to_start_seconds.clone(),
        );
    }

    /// Cost, recoveries, intake, leases, readiness and the build.
    fn register_the_rest(&self, r: &mut Registry) {
        let metrics = self;
        r.register(
            "cost",
            "Cost reported by tasks that finished, by submitter",
            metrics.cost.clone(),
        );
        r.register(
            "crash_recoveries",
            "Tasks resumed after a crash of their daemon or command",
            metrics.crash_recoveries.clone(),
        );
        r.register(
            "takeovers",
            "Tasks taken over from a daemon whose lease ran out (a shared queue)",
            metrics.takeovers.clone(),
        );
        r.register(
            "intake_rejections",
            "Files refused at intake, by reason (invalid_field, whole_file)",
            metrics.rejections.clone(),
        );
        r.register(
            "leases_held",
            "Leases of a shared queue's tasks this daemon holds",
            metrics.leases_held.clone(),
        );
        r.register(
            "leases_lost",
            "Leases of a shared queue's tasks this daemon lost to another",
            metrics.leases_lost.clone(),
        );
        r.register(
            "ready",
            "1 once the queue is locked and what was in flight is recovered (READY=1)",
            metrics.ready.clone(),
        );
        r.register(
            "main_loop_last_turn_timestamp_seconds",
            "When the daemon's main loop last turned (Unix time)",
            metrics.main_loop_last_turn.clone(),
        );
        r.register(
            "build",
            "The cairn that runs",
            Info::new(vec![(
                "version".to_string(),
                env!("CARGO_PKG_VERSION").to_string(),
            )]),
        );
    }

    /// The exposition, in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing to a String does not fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// The statuses of `cairn_tasks_finished_total`, as records name them.
pub const FINISHED_STATUSES: [&str; 5] = [
    "done",
    "failed",
    "cancelled",
    "budget_exceeded",
    "quarantined",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_metric_in_the_cairn_namespace() {
        let metrics = Metrics::new();
        metrics
            .finished
            .get_or_create(&label("status", "done"))
            .inc();
        metrics.checkpoint_bytes.observe(1000.0);
        let text = metrics.encode();
        assert!(
            text.contains("cairn_tasks_finished_total{status=\"done\"} 1"),
            "{text}"
        );
        assert!(text.contains("cairn_tasks{state=\"running\"} 0"), "{text}");
        assert!(text.contains("cairn_build_info{version="), "{text}");
        assert!(text.contains("cairn_checkpoint_bytes_bucket"), "{text}");
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("cairn_"), "{line}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
