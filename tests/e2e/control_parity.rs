//! The same control requests on the same tasks do the same thing on a queue directory and on a
//! queue shared in a real, throwaway PostgreSQL (see `tests/common/postgres.rs`): one rule
//! decides (`queue::control_rules`), and each backend only carries it out. A daemon running one
//! task at a time is kept busy by a blocker, so that the tasks steered wait where they stand
//! (pending, paused, failed, done, cancelled); each request's journal events and the task's
//! state afterwards are compared between the two backends.

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::common::postgres::{cairn_db, query_texts, PgCluster};
use crate::common::{stderr_of, stdout_of, wait_for, Daemon, TestQueue, DEADLINE};

/// Where the requests go.
enum Target {
    Files,
    Database { _cluster: PgCluster, url: String },
}

/// One queue of either kind, with its daemon.
struct Queue {
    host: TestQueue,
    target: Target,
    daemon: Option<Daemon>,
}

impl Queue {
    fn command(&self, args: &[&str]) -> std::process::Command {
        match &self.target {
            Target::Files => {
                let mut command = self.host.cairn();
                command.args(args);
                command.stdin(std::process::Stdio::null());
                command
            }
            Target::Database { url, .. } => cairn_db(url, args),
        }
    }

    /// `cairn ARGS`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = self.command(args).output().expect("running cairn");
        assert!(
            output.status.success(),
            "cairn {args:?}: {}",
            stderr_of(&output)
        );
        stdout_of(&output)
    }

    fn submit(&self, task: &Value) {
        let id = task["id"].as_str().unwrap();
        let file: PathBuf = self.host.aux(&format!("{id}.json"));
        std::fs::write(&file, task.to_string()).unwrap();
        self.ok(&["submit", file.to_str().unwrap()]);
    }

    /// Task `id` as `cairn status --json` lists it.
    fn listed(&self, id: &str) -> Option<Value> {
        let status: Value = serde_json::from_str(&self.ok(&["status", "--json"])).ok()?;
        status["tasks"]
            .as_array()?
            .iter()
            .find(|t| t["id"] == id)
            .cloned()
    }

    fn state(&self, id: &str) -> String {
        let task = self
            .listed(id)
            .unwrap_or_else(|| panic!("{id} is not listed"));
        task["state"].as_str().unwrap_or_default().to_string()
    }

    fn wait_state(&self, id: &str, state: &str) {
        wait_for(&format!("{id} is {state}"), DEADLINE, || {
            self.listed(id).filter(|t| t["state"] == state).map(|_| ())
        });
    }

    /// The task's journal, as `cairn show --json` gives it.
    fn timeline(&self, id: &str) -> Vec<Value> {
        let shown: Value = serde_json::from_str(&self.ok(&["show", id, "--json"])).unwrap();
        shown["timeline"].as_array().cloned().unwrap_or_default()
    }

    /// Whether every control request has been handled by a daemon.
    fn requests_handled(&self) -> bool {
        match &self.target {
            Target::Files => std::fs::read_dir(self.host.path("control"))
                .map(|entries| entries.count() == 0)
                .unwrap_or(true),
            Target::Database { url, .. } => {
                let pending = query_texts(
                    url,
                    "SELECT count(*)::text FROM cairn_control WHERE handled_at IS NULL",
                    &[],
                );
                pending[0][0].as_deref() == Some("0")
            }
        }
    }

    /// Send `cairn ACTION ID [extra]`, wait until a daemon has handled it, and say what it did:
    /// the events it journaled (with a refusal's reason, a limit's change) and the task's state.
    fn steer(&self, action: &str, id: &str, extra: &[&str]) -> Value {
        let before = self.timeline(id).len();
        let mut args = vec![action, id];
        args.extend_from_slice(extra);
        // Refused or taken, the journal says which; the exit code alone could be "not taken
        // yet" on a slow machine.
        let _ = self.command(&args).output().expect("running cairn");
        wait_for(&format!("{action} {id} is handled"), DEADLINE, || {
            self.requests_handled().then_some(())
        });
        let events: Vec<Value> = self.timeline(id)[before..]
            .iter()
            .map(|event| {
                json!({
                    "event": event["event"],
                    "reason": event.get("reason"),
                    "from": event.get("from"),
                    "to": event.get("to"),
                })
            })
            .collect();
        json!({"request": format!("{action} {id}"), "events": events, "state": self.state(id)})
    }
}

fn task(id: &str, run: &[&str]) -> Value {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "only", "kind": "once", "run": run}],
    })
}

/// A queue with a finished, a failed and a running task, and two that wait behind it.
fn prepared(target: Target) -> Queue {
    let host = TestQueue::new();
    let mut args: Vec<String> = vec!["--max-tasks".into(), "1".into()];
    if let Target::Database { url, .. } = &target {
        args.extend(["--db", url, "--node", "n1", "--lease", "5s"].map(String::from));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut queue = Queue {
        host,
        target,
        daemon: None,
    };
    if let Target::Database { .. } = queue.target {
        queue.ok(&["db", "migrate"]);
    }
    queue.daemon = Some(queue.host.start(&args));
    queue.submit(&task("finished", &["true"]));
    queue.submit(&task("broken", &["false"]));
    queue.wait_state("finished", "done");
    queue.wait_state("broken", "failed");
    queue.submit(&task("blocker", &["sleep", "600"]));
    queue.wait_state("blocker", "running");
    queue.submit(&task("first", &["true"]));
    queue.submit(&task("second", &["true"]));
    queue.wait_state("first", "pending");
    queue.wait_state("second", "pending");
    queue
}

/// Every request the rule knows, on every standing a waiting task can be in.
fn steer_all(queue: &Queue) -> Vec<Value> {
    let steps: [(&str, &str, &[&str]); 16] = [
        ("pause", "first", &[]),
        ("pause", "first", &[]),
        ("budget", "first", &["--max-cost", "5"]),
        ("resume", "first", &[]),
        ("resume", "second", &[]),
        ("budget", "second", &["--max-cost", "5"]),
        ("cancel", "second", &[]),
        ("cancel", "second", &[]),
        ("resume", "second", &[]),
        ("retry", "second", &[]),
        ("retry", "finished", &[]),
        ("pause", "finished", &[]),
        ("budget", "finished", &["--max-cost", "5"]),
        ("retry", "broken", &[]),
        ("retry", "broken", &[]),
        ("cancel", "broken", &[]),
    ];
    steps
        .iter()
        .map(|(action, id, extra)| queue.steer(action, id, extra))
        .collect()
}

fn finish(mut queue: Queue) {
    queue.ok(&["cancel", "blocker"]);
    queue.wait_state("blocker", "cancelled");
    let mut daemon = queue.daemon.take().unwrap();
    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn the_same_requests_do_the_same_on_files_and_on_the_database() {
    let test = "the_same_requests_do_the_same_on_files_and_on_the_database";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.url();

    let files = prepared(Target::Files);
    let on_files = steer_all(&files);
    finish(files);

    let database = prepared(Target::Database {
        _cluster: cluster,
        url,
    });
    let on_database = steer_all(&database);
    finish(database);

    for (file_step, db_step) in on_files.iter().zip(&on_database) {
        assert_eq!(
            file_step, db_step,
            "files (left) and the database (right) differ"
        );
    }
    assert_eq!(on_files.len(), on_database.len());
    // The table is not vacuous: refusals, changes and a no-op are all in it.
    let events = |kind: &str| {
        on_files
            .iter()
            .flat_map(|step| step["events"].as_array().unwrap().clone())
            .filter(|e| e["event"] == kind)
            .count()
    };
    assert!(events("control_refused") >= 6, "{on_files:#?}");
    for kind in ["paused", "resumed", "cancelled", "retried", "budget_set"] {
        assert!(events(kind) >= 1, "no {kind} in {on_files:#?}");
    }
    assert!(
        on_files[1]["events"].as_array().unwrap().is_empty(),
        "pausing a paused task journals nothing: {:#}",
        on_files[1]
    );
}
