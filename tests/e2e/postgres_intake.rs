//! What enters or steers the shared queue on a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): each host's `inbox/` taken into the database exactly once,
//! crash or not, with the file queue's rejection records; control requests applied in SQL to
//! tasks nobody holds and handed to the node that holds the others; `cairn pause|resume|
//! cancel|retry --db` and `cairn fork --db` through the real binary; and files dropped into
//! three hosts' inboxes, and a pause and resume, through `cairn run --db` daemons.
//!
//! The backend is blocking: the tests call it from their own thread, and use a separate
//! runtime for the statements they make themselves.

use std::time::{Duration, Instant};

use cairn::queue::control::ControlAction;
use cairn::queue::postgres::{NewTask, PgBackend, PgQueue, SCHEMA_VERSION};
use cairn::queue::{QueueBackend, QueueDir, QueueError};
use cairn::store::current_work::{ActiveTask, StartPoint, StoredOutput};
use cairn::store::records::RecordStatus;
use cairn::store::IterationCheckpoint;
use cairn::task::Task;
use cairn::task_id::TaskId;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use crate::common::postgres::{cairn_db, final_record, submit_task, PgCluster};
use crate::common::{
    loop_result, loop_task, side_events, stderr_of, stdout_of, wait_for, wait_until, Daemon,
    TestQueue, DEADLINE, SIGTERM,
};

/// A lease that never expires during these tests.
const LONG: Duration = Duration::from_secs(600);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A plain connection for looking at the tables directly.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The first column of each row `statement` returns for `param`, as text.
fn column(rt: &Runtime, url: &str, statement: &str, param: &str) -> Vec<Option<String>> {
    rt.block_on(async {
        let client = sql(url).await;
        let rows = client.query(statement, &[&param]).await.unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    })
}

fn one(rt: &Runtime, url: &str, statement: &str, param: &str) -> Option<String> {
    column(rt, url, statement, param)
        .into_iter()
        .next()
        .flatten()
}

fn state_of(rt: &Runtime, url: &str, id: &str) -> Option<String> {
    one(rt, url, "SELECT state FROM cairn_tasks WHERE id = $1", id)
}

fn task_count(rt: &Runtime, url: &str) -> usize {
    column(rt, url, "SELECT id FROM cairn_tasks WHERE $1 = $1", "").len()
}

/// The event names of task `id`'s journal, oldest first.
fn event_types(rt: &Runtime, url: &str, id: &str) -> Vec<String> {
    column(
        rt,
        url,
        "SELECT event::text FROM cairn_events WHERE task_id = $1 ORDER BY id",
        id,
    )
    .into_iter()
    .map(|text| {
        let event: Value = serde_json::from_str(&text.unwrap()).unwrap();
        event["event"].as_str().unwrap_or_default().to_string()
    })
    .collect()
}

/// A one-phase task, with `id` when given.
fn a_task(id: Option<&str>, command: &str) -> Value {
    let mut task = json!({"phases": [{"name": "p", "run": ["sh", "-c", command]}]});
    if let Some(id) = id {
        task["id"] = json!(id);
    }
    task
}

fn submit(rt: &Runtime, url: &str, task: &Value) {
    let text = task.to_string();
    let parsed = Task::parse(text.as_bytes()).unwrap();
    rt.block_on(async {
        let queue = PgQueue::connect(url).unwrap();
        queue.migrate().await.unwrap();
        queue.submit(&NewTask::of(&parsed, &text)).await.unwrap();
    });
}

fn request(rt: &Runtime, url: &str, id: &str, action: ControlAction) -> i64 {
    rt.block_on(async {
        let queue = PgQueue::connect(url).unwrap();
        queue
            .request_control(&TaskId::parse(id).unwrap(), action)
            .await
            .unwrap()
    })
}

/// How request `number` was handled: (node, outcome), or `None` while it waits.
fn outcome(rt: &Runtime, url: &str, number: i64) -> Option<(String, String)> {
    rt.block_on(async {
        let queue = PgQueue::connect(url).unwrap();
        queue
            .control_outcome(number)
            .await
            .unwrap()
            .map(|handled| (handled.node, handled.outcome))
    })
}

/// A backend on `url` as `node`, taking the inbox of `local` when given.
fn backend(url: &str, node: &str, local: Option<&TestQueue>) -> PgBackend {
    let backend = PgBackend::open(url, node, LONG).unwrap();
    match local {
        Some(local) => {
            let dir = QueueDir::new(local.root());
            dir.create_all().unwrap();
            backend.with_inbox(dir)
        }
        None => backend,
    }
}

#[test]
fn inbox_files_of_two_hosts_enter_the_shared_queue_once_and_bad_ones_get_records() {
    let test = "inbox_files_of_two_hosts_enter_the_shared_queue_once_and_bad_ones_get_records";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    let (host_a, host_b) = (TestQueue::new(), TestQueue::new());
    let (node_a, node_b) = (
        backend(&url, "node-a", Some(&host_a)),
        backend(&url, "node-b", Some(&host_b)),
    );
    // The same task dropped into both hosts' inboxes; a task without an id; a broken file
    // before a good one (it must not stop the batch); on B, another task under a taken id.
    let shared = a_task(Some("shared-1"), "true");
    host_a.seed_task("a-broken.json", &json!({"phases": 3}));
    host_a.seed_task("b-shared.json", &shared);
    host_a.seed_task("c-noid.json", &a_task(None, "echo a"));
    host_b.seed_task("b-shared.json", &shared);
    host_b.seed_task("d-other.json", &a_task(Some("shared-1"), "false"));

    let report_a = node_a.scan_intake(Vec::new(), 100);
    assert!(report_a.error.is_none(), "{:?}", report_a.error);
    assert!(report_a.accepted.is_empty(), "tasks go to the database");
    let mut submitted: Vec<String> = report_a.submitted.iter().map(|id| id.to_string()).collect();
    submitted.sort();
    assert_eq!(submitted.len(), 2, "{submitted:?}");
    assert_eq!(submitted[1], "shared-1");
    assert!(submitted[0].starts_with("c-noid-"), "{submitted:?}");
    assert_eq!(report_a.rejected.len(), 1, "{:?}", report_a.rejected);

    let report_b = node_b.scan_intake(Vec::new(), 100);
    assert!(report_b.error.is_none(), "{:?}", report_b.error);
    assert!(
        report_b.submitted.is_empty(),
        "the same task from another host is the one already there: {:?}",
        report_b.submitted
    );
    assert_eq!(report_b.rejected.len(), 1, "{:?}", report_b.rejected);

    assert_eq!(task_count(&rt, &url), 2);
    assert_eq!(state_of(&rt, &url, "shared-1").as_deref(), Some("queued"));
    // Journaled once, when the first host took it in, naming the owner of the file it took.
    let accepted = column(
        &rt,
        &url,
        "SELECT event::text FROM cairn_events WHERE task_id = $1 ORDER BY id",
        "shared-1",
    );
    assert_eq!(accepted.len(), 1, "{accepted:?}");
    let accepted: Value = serde_json::from_str(accepted[0].as_deref().unwrap()).unwrap();
    assert_eq!(accepted["event"], "accepted", "{accepted}");
    // The test made the files, so they are its user's, as is the inbox it made them in.
    let owner = std::fs::metadata(host_a.path("inbox")).unwrap();
    assert_eq!(
        accepted["submitted_by"]["uid"],
        json!(std::os::unix::fs::MetadataExt::uid(&owner)),
        "{accepted}"
    );
    assert!(host_a.list("inbox").is_empty() && host_b.list("inbox").is_empty());
    let rejected_a = host_a.rejections();
    assert_eq!(
        rejected_a.keys().collect::<Vec<_>>(),
        ["inbox/a-broken.json"]
    );
    let rejected_b = host_b.rejections();
    let other = &rejected_b["inbox/d-other.json"];
    assert_eq!(other["field"], "id");
    assert!(
        other["problem"]
            .as_str()
            .unwrap()
            .contains("already exists in the shared queue"),
        "{other}"
    );
    // Its bytes are kept beside the record, as the file queue keeps them.
    let input = other["input"].as_str().unwrap();
    assert!(host_b.path(input).is_file(), "{input}");
    // Nothing is waiting in either inbox now.
    assert!(!node_a.waiting_in_intake("shared-1"));

    // Batches and files still being written are reported as for the file queue.
    host_a.seed_task("e1.json", &a_task(Some("e1"), "true"));
    host_a.seed_task("e2.json", &a_task(Some("e2"), "true"));
    host_a.drop_task("fresh.json", &a_task(Some("fresh"), "true"));
    assert!(node_a.waiting_in_intake("fresh"));
    let first = node_a.scan_intake(Vec::new(), 1);
    assert_eq!((first.submitted.len(), first.more), (1, true), "{first:?}");
    let rest = node_a.scan_intake(Vec::new(), 100);
    assert_eq!(rest.submitted.len(), 1, "{rest:?}");
    assert_eq!(rest.deferred, 1, "a fresh file settles first: {rest:?}");
    assert_eq!(task_count(&rt, &url), 4);
}

#[test]
fn a_crash_between_the_insert_and_removing_the_claim_leaves_one_task() {
    let test = "a_crash_between_the_insert_and_removing_the_claim_leaves_one_task";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    let host = TestQueue::new();
    QueueDir::new(host.root()).create_all().unwrap();
    let bytes = serde_json::to_vec(&a_task(None, "true")).unwrap();
    // The steps of taking `report.json` up to the crash: claimed (as `.claim.00abcd`), its
    // task inserted under the id derived from the claim, the claim not yet removed.
    let claim = host.path("tasks/.claim.00abcd");
    std::fs::create_dir(&claim).unwrap();
    std::fs::write(claim.join("report.json"), &bytes).unwrap();
    let mut task = Task::parse(&bytes).unwrap();
    task.id = Some(TaskId::generate("report", "00abcd"));
    // As intake stored it: with the claimed file's owner (this test's user) as submitter.
    let me = nix::unistd::Uid::effective().as_raw();
    task.submitted_by = Some(cairn::submitter::Submitter::of_uid(me));
    let normalized = String::from_utf8(task.to_json_bytes()).unwrap();
    rt.block_on(async {
        let queue = PgQueue::connect(&url).unwrap();
        queue.migrate().await.unwrap();
        queue
            .submit(&NewTask::of(&task, &normalized))
            .await
            .unwrap();
    });
    // And a claim cut short before its insert.
    let early = host.path("tasks/.claim.00beef");
    std::fs::create_dir(&early).unwrap();
    std::fs::write(early.join("late.json"), &bytes).unwrap();

    let node = backend(&url, "node-a", Some(&host));
    let report = node.recover_intake();
    assert!(report.error.is_none(), "{:?}", report.error);
    assert!(report.rejected.is_empty(), "{:?}", report.rejected);
    let submitted: Vec<String> = report.submitted.iter().map(|id| id.to_string()).collect();
    assert_eq!(
        submitted,
        ["late-00beef"],
        "the inserted one is not submitted again"
    );
    assert_eq!(task_count(&rt, &url), 2);
    assert!(
        !claim.exists() && !early.exists(),
        "the claims are finished"
    );
    // Recovering again finds nothing left to do.
    let again = node.recover_intake();
    assert!(
        again.submitted.is_empty() && again.rejected.is_empty(),
        "{again:?}"
    );
    assert_eq!(task_count(&rt, &url), 2);
}

#[test]
fn requests_for_tasks_nobody_holds_are_applied_in_the_database() {
    let test = "requests_for_tasks_nobody_holds_are_applied_in_the_database";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, &a_task(Some("q1"), "true"));
    let node = backend(&url, "node-a", None);
    let apply = |action, expected_state: &str| {
        let number = request(&rt, &url, "q1", action);
        assert!(node.take_control().unwrap().is_empty(), "nobody holds q1");
        let (by, what) = outcome(&rt, &url, number).expect("handled in the same call");
        assert_eq!(by, "node-a");
        assert_eq!(state_of(&rt, &url, "q1").as_deref(), Some(expected_state));
        what
    };
    assert_eq!(apply(ControlAction::Pause, "paused"), "applied");
    assert_eq!(
        apply(ControlAction::Pause, "paused"),
        "nothing to do: it is paused already"
    );
    assert_eq!(apply(ControlAction::Resume, "queued"), "applied");
    assert_eq!(
        apply(ControlAction::Resume, "queued"),
        "refused: it is not paused"
    );
    assert_eq!(apply(ControlAction::Cancel, "cancelled"), "applied");
    let cancelled = node
        .failed_record("q1")
        .unwrap()
        .expect("a cancelled record");
    assert_eq!(cancelled.status, RecordStatus::Cancelled);
    assert_eq!(cancelled.error, "cancelled by an operator");
    assert_eq!(cancelled.phase, "p");
    assert!(node.finished_ids().unwrap().contains("q1"));
    assert_eq!(
        apply(ControlAction::Pause, "cancelled"),
        "refused: it is neither pending nor in flight"
    );

    assert_eq!(apply(ControlAction::Retry, "queued"), "applied");
    assert!(
        !node.has_record("q1").unwrap(),
        "the record left for the history"
    );
    let history = column(
        &rt,
        &url,
        "SELECT status FROM cairn_record_history WHERE task_id = $1",
        "q1",
    );
    assert_eq!(history, [Some("cancelled".to_string())]);
    let entry: ActiveTask = serde_json::from_str(
        &one(
            &rt,
            &url,
            "SELECT phase_state::text FROM cairn_tasks WHERE id = $1",
            "q1",
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(entry.retry_of, Some(cancelled.failed_at));
    assert_eq!(entry.failed_attempts, 0, "attempts are counted afresh");
    assert_eq!(
        event_types(&rt, &url, "q1"),
        [
            "accepted",
            "paused",
            "resumed",
            "control_refused",
            "cancelled",
            "control_refused",
            "retried"
        ]
    );
    // The task is claimable again, and resumes as the retry's entry says.
    let claimed = node.claim_work(10, true).unwrap();
    let ids: Vec<&str> = claimed.iter().map(|c| c.task.id().as_str()).collect();
    assert_eq!(ids, ["q1"]);
    let resumed = claimed[0].entry.as_ref().expect("the retry's entry");
    assert_eq!(resumed.retry_of, Some(cancelled.failed_at));

    let ghost = request(&rt, &url, "ghost", ControlAction::Cancel);
    assert!(node.take_control().unwrap().is_empty());
    assert_eq!(
        outcome(&rt, &url, ghost),
        Some(("node-a".to_string(), "no such task".to_string()))
    );
}

#[test]
fn two_nodes_handling_the_same_requests_at_once_apply_each_once() {
    let test = "two_nodes_handling_the_same_requests_at_once_apply_each_once";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    let ids: Vec<String> = (0..20).map(|n| format!("k{n:02}")).collect();
    for id in &ids {
        submit(&rt, &url, &a_task(Some(id), "true"));
        request(&rt, &url, id, ControlAction::Cancel);
    }
    let nodes = [backend(&url, "node-a", None), backend(&url, "node-b", None)];
    std::thread::scope(|scope| {
        for node in &nodes {
            scope.spawn(move || assert!(node.take_control().unwrap().is_empty()));
        }
    });
    for id in &ids {
        assert_eq!(
            state_of(&rt, &url, id).as_deref(),
            Some("cancelled"),
            "{id}"
        );
        assert_eq!(
            event_types(&rt, &url, id),
            ["accepted", "cancelled"],
            "{id}: applied once"
        );
    }
    let outcomes = column(
        &rt,
        &url,
        "SELECT outcome FROM cairn_control WHERE handled_at IS NOT NULL AND $1 = $1",
        "",
    );
    assert_eq!(outcomes.len(), ids.len());
    assert!(
        outcomes.iter().all(|o| o.as_deref() == Some("applied")),
        "{outcomes:?}"
    );
}

#[test]
fn a_request_for_a_task_a_node_holds_goes_to_that_node_only() {
    let test = "a_request_for_a_task_a_node_holds_goes_to_that_node_only";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, &a_task(Some("h1"), "true"));
    let (node_a, node_b) = (backend(&url, "node-a", None), backend(&url, "node-b", None));
    node_a.claim("h1").unwrap();
    let pause = request(&rt, &url, "h1", ControlAction::Pause);
    let cancel = request(&rt, &url, "h1", ControlAction::Cancel);

    assert!(
        node_b.take_control().unwrap().is_empty(),
        "B does not hold h1"
    );
    assert_eq!(outcome(&rt, &url, pause), None, "left for the holder");
    let taken = node_a.take_control().unwrap();
    let actions: Vec<_> = taken
        .iter()
        .map(|(_, r)| (r.task_id.to_string(), r.action))
        .collect();
    assert_eq!(
        actions,
        [
            ("h1".to_string(), ControlAction::Pause),
            ("h1".to_string(), ControlAction::Cancel)
        ]
    );
    // Until the daemon says it applied them, they are handed over again.
    assert_eq!(node_a.take_control().unwrap().len(), 2);
    assert_eq!(state_of(&rt, &url, "h1").as_deref(), Some("running"));
    for (claim, _) in &taken {
        node_a.remove_control(node_a.owner(), claim).unwrap();
    }
    assert!(node_a.take_control().unwrap().is_empty());
    for number in [pause, cancel] {
        let (by, what) = outcome(&rt, &url, number).unwrap();
        assert_eq!(
            (by.as_str(), what.as_str()),
            ("node-a", "taken by the daemon running the task")
        );
    }
}

#[test]
fn archive_failed_moves_the_record_to_the_history_under_the_lease_only() {
    let test = "archive_failed_moves_the_record_to_the_history_under_the_lease_only";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, &a_task(Some("f1"), "true"));
    let node = backend(&url, "node-a", None);
    let lease = node.claim("f1").unwrap();
    let now = chrono::Utc::now();
    let record = json!({
        "status": "failed", "task_id": "f1", "error": "boom", "phase": "p", "phase_index": 0,
        "attempts": 3, "failed_attempts": 3, "started_at": now, "failed_at": now,
        "phase_outputs": {}, "phases": []
    });
    rt.block_on(async {
        sql(&url)
            .await
            .execute(
                "INSERT INTO cairn_records (task_id, status, record, lease_epoch)
                 VALUES ('f1', 'failed', $1::text::json, 1)",
                &[&record.to_string()],
            )
            .await
            .unwrap();
    });
    let failed = node.failed_record("f1").unwrap().unwrap();
    // A stale lease (another claim since) archives nothing.
    let newer = node.claim("f1").unwrap();
    match node.archive_failed(&lease, &failed) {
        Err(QueueError::LeaseLost(_)) => {}
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(node.has_record("f1").unwrap());
    node.archive_failed(&newer, &failed).unwrap();
    assert!(!node.has_record("f1").unwrap());
    let history = column(
        &rt,
        &url,
        "SELECT record->>'error' FROM cairn_record_history WHERE task_id = $1",
        "f1",
    );
    assert_eq!(history, [Some("boom".to_string())]);
}

#[test]
fn pause_resume_cancel_and_retry_with_db_reach_the_daemons() {
    let test = "pause_resume_cancel_and_retry_with_db_reach_the_daemons";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, &a_task(Some("c1"), "true"));
    let node = backend(&url, "node-a", None);

    // --no-wait: the request is written, a daemon applies it later.
    let output = cairn_db(&url, &["pause", "--no-wait", "c1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output).trim(), "pause requested for c1");
    assert_eq!(state_of(&rt, &url, "c1").as_deref(), Some("queued"));
    node.take_control().unwrap();
    assert_eq!(state_of(&rt, &url, "c1").as_deref(), Some("paused"));

    // Waiting: the command says which node took it (the URL given as --db this time).
    let mut resume = cairn_db("unused", &["resume", "--db", &url, "c1"])
        .spawn()
        .unwrap();
    let deadline = Instant::now() + DEADLINE;
    let status = loop {
        node.take_control().unwrap();
        if let Some(status) = resume.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "cairn resume --db never ended");
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = resume.wait_with_output().unwrap();
    assert!(status.success(), "{}", stderr_of(&output));
    assert!(
        stdout_of(&output).contains("node node-a took the request for c1"),
        "{}",
        stdout_of(&output)
    );
    assert_eq!(state_of(&rt, &url, "c1").as_deref(), Some("queued"));

    let output = cairn_db(&url, &["cancel", "--no-wait", "c1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    node.take_control().unwrap();
    assert_eq!(state_of(&rt, &url, "c1").as_deref(), Some("cancelled"));
    let output = cairn_db(&url, &["retry", "--no-wait", "c1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    node.take_control().unwrap();
    assert_eq!(state_of(&rt, &url, "c1").as_deref(), Some("queued"));

    let output = cairn_db(&url, &["pause", "--no-wait", "ghost"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr_of(&output).contains("the shared queue has no task \"ghost\""),
        "{}",
        stderr_of(&output)
    );
}

/// A two-phase task: `setup`'s output is the loop's input.
fn two_phases(id: &str) -> Value {
    json!({
        "id": id,
        "phases": [
            {"name": "setup", "run": ["sh", "-c", "echo '{\"scale\": 2}'"]},
            {"name": "sum", "kind": "loop", "run": ["sh", "-c", "cat"],
             "initial_state": {"total": 0, "step": 1}, "max_iterations": 6}
        ]
    })
}

fn loop_checkpoint(id: &str, total: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: 0,
        task_id: id.to_owned(),
        phase: "sum".to_owned(),
        phase_index: 1,
        scope: "loop".to_owned(),
        iteration_count: total,
        checkpoint_interval: 1,
        partial_results: json!({"total": total, "step": 1}),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: Some(0.5),
        files: Default::default(),
    }
}

#[test]
fn fork_with_db_makes_the_task_with_its_start_point_and_checkpoint() {
    let test = "fork_with_db_makes_the_task_with_its_start_point_and_checkpoint";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, &two_phases("acc"));
    let node = backend(&url, "node-a", None);
    // `acc` ran its setup (its output in the work state) and three loop iterations.
    let lease = node.claim("acc").unwrap();
    let mut entry = ActiveTask::new(&TaskId::parse("acc").unwrap(), "sum");
    entry.phase_index = 1;
    entry
        .phase_outputs
        .insert("setup".into(), StoredOutput::Inline(json!({"scale": 2})));
    node.write_work_entries(node.owner(), &[entry], &[])
        .unwrap();
    for total in 1..=3 {
        let checkpoint = loop_checkpoint("acc", total);
        let state = serde_json::value::to_raw_value(&checkpoint.partial_results).unwrap();
        node.save_checkpoint(&lease, &mut checkpoint.with_state(state.as_ref()))
            .unwrap();
    }
    // A large output is stored with its phase's name.
    node.put_output(&lease, 0, br#"{"scale": 2}"#).unwrap();
    assert_eq!(
        one(
            &rt,
            &url,
            "SELECT phase FROM cairn_outputs WHERE task_id = $1",
            "acc"
        )
        .as_deref(),
        Some("setup")
    );

    let output = cairn_db(
        &url,
        &[
            "fork",
            "acc",
            "--gen",
            "2",
            "--patch",
            r#"{"step": 10}"#,
            "--as",
            "acc-10",
        ],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert_eq!(stdout_of(&output).trim(), "acc-10");

    assert_eq!(state_of(&rt, &url, "acc-10").as_deref(), Some("queued"));
    assert_eq!(
        node.start_point("acc-10").unwrap(),
        Some(StartPoint {
            phase_index: 1,
            phase_outputs: [("setup".to_string(), json!({"scale": 2}))].into(),
            forked_from: "acc".to_string(),
            generation: 2,
        })
    );
    assert_eq!(node.start_point("acc").unwrap(), None);
    let forked = node
        .latest_checkpoint("acc-10")
        .unwrap()
        .unwrap()
        .checkpoint;
    assert_eq!(forked.task_id, "acc-10");
    assert_eq!(forked.generation, 1);
    assert_eq!(forked.iteration_count, 2);
    assert_eq!(forked.partial_results, json!({"total": 2, "step": 10}));
    assert_eq!((forked.cost, forked.attempt, forked.done), (None, 0, false));
    assert_eq!(node.task("acc-10").unwrap().phases.len(), 2);
    assert_eq!(event_types(&rt, &url, "acc"), ["accepted", "forked"]);
    assert_eq!(event_types(&rt, &url, "acc-10"), ["accepted"]);
    // The source is untouched.
    assert_eq!(
        node.latest_checkpoint("acc")
            .unwrap()
            .unwrap()
            .checkpoint
            .iteration_count,
        3
    );

    let again = cairn_db(&url, &["fork", "acc", "--as", "acc-10"])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "{}", stderr_of(&again));
    assert!(
        stderr_of(&again).contains("already exists"),
        "{}",
        stderr_of(&again)
    );
}

#[test]
fn a_database_at_version_1_migrates_to_the_current_schema() {
    let test = "a_database_at_version_1_migrates_to_the_current_schema";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    rt.block_on(async {
        let client = sql(&url).await;
        client
            .batch_execute(include_str!("../../src/queue/postgres/schema.sql"))
            .await
            .unwrap();
        client
            .batch_execute(
                "CREATE TABLE cairn_schema (version integer PRIMARY KEY,
                     applied_at timestamptz NOT NULL DEFAULT now());
                 INSERT INTO cairn_schema (version) VALUES (1);
                 INSERT INTO cairn_tasks (id, crash_limit, definition)
                 VALUES ('old', 5, '{\"phases\": [{\"name\": \"p\", \"run\": [\"true\"]}]}');
                 INSERT INTO cairn_control (task_id, action) VALUES ('old', 'pause');",
            )
            .await
            .unwrap();
    });
    let migrated = rt.block_on(async {
        let queue = PgQueue::connect(&url).unwrap();
        queue.migrate().await.unwrap()
    });
    assert_eq!((migrated.from, migrated.to), (1, SCHEMA_VERSION));
    const { assert!(SCHEMA_VERSION >= 2) };
    // The task and its request survive, and the new columns are there.
    let node = backend(&url, "node-a", None);
    assert_eq!(node.start_point("old").unwrap(), None);
    assert!(node.take_control().unwrap().is_empty());
    assert_eq!(state_of(&rt, &url, "old").as_deref(), Some("paused"));
}

/// `cairn run --db` on the local directory `host`, as node `node`.
fn start_daemon(host: &TestQueue, url: &str, node: &str) -> Daemon {
    host.start(&["--db", url, "--node", node, "--lease", "3s"])
}

#[test]
fn a_file_dropped_into_any_hosts_inbox_runs_exactly_once_through_the_daemons() {
    let test = "a_file_dropped_into_any_hosts_inbox_runs_exactly_once_through_the_daemons";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    // The schema is there before the test looks at it (the daemons would make it too).
    submit(&rt, &url, &a_task(Some("first"), "true"));
    let hosts: Vec<TestQueue> = (0..3).map(|_| TestQueue::new()).collect();
    let _daemons: Vec<Daemon> = hosts
        .iter()
        .zip(["n1", "n2", "n3"])
        .map(|(host, node)| start_daemon(host, &url, node))
        .collect();
    let side = hosts[0].aux("iterations.side");
    // One task dropped into all three inboxes; one without an id into the second; a broken
    // file into the third.
    let everywhere = loop_task("everywhere", &side, 3, 0.1);
    for host in &hosts {
        host.drop_task("everywhere.json", &everywhere);
    }
    hosts[1].drop_task("noid.json", &a_task(None, "echo '{\"ok\": true}'"));
    hosts[2].drop_bytes("broken.json", b"{\"phases\": ", false);

    let done = wait_for("every task done", DEADLINE, || {
        let ids = column(
            &rt,
            &url,
            "SELECT task_id FROM cairn_records WHERE $1 = $1",
            "",
        );
        (ids.len() == 3).then_some(ids)
    });
    let noid = done
        .iter()
        .flatten()
        .find(|id| id.starts_with("noid-"))
        .unwrap_or_else(|| panic!("the task without an id got one from its claim: {done:?}"));
    assert_eq!(task_count(&rt, &url), 3, "one task per file, not per copy");
    for id in ["everywhere", noid.as_str()] {
        let record =
            final_record(&url, id).unwrap_or_else(|| panic!("no record of {id}: {done:?}"));
        assert_eq!(record["status"], "done", "{id}: {record}");
    }
    let first_iterations = side_events(&side)
        .into_iter()
        .filter(|e| e.task == "everywhere" && e.event == "start" && e.iteration == 1)
        .count();
    assert_eq!(first_iterations, 1, "the task ran once");
    wait_until("the broken file's record", DEADLINE, || {
        hosts[2].rejections().contains_key("inbox/broken.json")
    });
    for host in &hosts {
        assert!(host.list("inbox").is_empty(), "{:?}", host.list("inbox"));
    }
}

#[test]
fn a_running_task_is_paused_by_its_daemon_and_resumed_through_the_database() {
    let test = "a_running_task_is_paused_by_its_daemon_and_resumed_through_the_database";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    let host = TestQueue::new();
    let side = host.aux("iterations.side");
    submit_task(&url, &loop_task("long", &side, 8, 0.3));
    let mut daemon = start_daemon(&host, &url, "n1");
    wait_until("the task is running", DEADLINE, || {
        side_events(&side).iter().any(|e| e.event == "end")
    });

    // Held by n1: the request goes to its daemon, which stops the task at a boundary.
    let output = cairn_db(&url, &["pause", "--no-wait", "long"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    wait_until("the task is paused", DEADLINE, || {
        state_of(&rt, &url, "long").as_deref() == Some("paused")
    });
    let handled = column(
        &rt,
        &url,
        "SELECT outcome FROM cairn_control WHERE task_id = $1",
        "long",
    );
    assert_eq!(
        handled,
        [Some("taken by the daemon running the task".to_string())]
    );

    // Paused, nobody holds it: the resume is applied in SQL and a daemon takes it again.
    let output = cairn_db(&url, &["resume", "long"]).output().unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(
        stdout_of(&output).contains("node n1 took the request for long"),
        "{}",
        stdout_of(&output)
    );
    let record = wait_for("the task's record", DEADLINE, || final_record(&url, "long"));
    assert_eq!(record["status"], "done", "{record}");
    assert_eq!(record["result"], loop_result(8));
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}
