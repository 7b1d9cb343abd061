//! `cairn serve`'s metrics: no daemon runs here, so they are the queue's own counts, read from
//! the status document: tasks by state (finished ones included, as the queue holds them), files
//! waiting in the inbox, and with a shared queue its daemons alive.

use std::collections::BTreeMap;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use serde_json::Value;

type Labels = Vec<(String, String)>;

/// The exposition of a `cairn status --json` document.
pub(super) fn render(status: &Value) -> String {
    let mut registry = Registry::with_prefix("cairn");
    let tasks = Family::<Labels, Gauge>::default();
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for state in crate::observe::metrics::GAUGED_STATES
        .iter()
        .chain(crate::observe::metrics::FINISHED_STATUSES.iter())
    {
        counts.insert(state.to_string(), 0);
    }
    for task in status["tasks"].as_array().into_iter().flatten() {
        if let Some(state) = task["state"].as_str() {
            *counts.entry(state.to_string()).or_default() += 1;
        }
    }
    for (state, count) in counts {
        tasks
            .get_or_create(&vec![("state".to_string(), state)])
            .set(count);
    }
    registry.register(
        "queue_tasks",
        "Tasks in the queue by state, as cairn status lists them (rejected: the most recent only)",
        tasks,
    );
    let inbox = Gauge::<i64>::default();
    inbox.set(status["inbox"].as_i64().unwrap_or(0));
    registry.register("queue_inbox_files", "Files waiting in the inbox", inbox);
    if let Some(nodes) = status["nodes"].as_array() {
        let alive = Gauge::<i64>::default();
        alive.set(
            nodes
                .iter()
                .filter(|n| n["alive"] == Value::Bool(true))
                .count() as i64,
        );
        registry.register(
            "queue_nodes_alive",
            "Daemons alive on the shared queue",
            alive,
        );
    }
    registry.register(
        "build",
        "The cairn that serves",
        Info::new(vec![(
            "version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        )]),
    );
    let mut text = String::new();
    let _ = encode(&mut text, &registry);
    text
}
