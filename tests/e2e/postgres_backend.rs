//! The queue owner's backend on a real, throwaway PostgreSQL (see `tests/common/postgres.rs`):
//! claims, checkpoints, outputs, work state and records through the `QueueBackend` trait, each
//! write fenced by the task's lease; a node whose lease expired and was taken over is refused
//! with `LeaseLost` and writes nothing; recovery reads what the other node left.
//!
//! The backend is blocking: the tests call it from their own thread, and use a separate
//! runtime only for submitting tasks and looking at the tables.

use std::time::{Duration, Instant};

use cairn::queue::postgres::{NewTask, PgBackend, PgQueue};
use cairn::queue::{HandBack, Lease, QueueBackend, QueueError, TaskRecord};
use cairn::store::current_work::ActiveTask;
use cairn::store::records::DoneRecord;
use cairn::store::IterationCheckpoint;
use cairn::task_id::TaskId;
use serde_json::json;
use tokio::runtime::Runtime;

use crate::common::postgres::PgCluster;
use crate::common::DEADLINE;

/// A lease long enough never to expire during a test that does not wait for expiry.
const LONG: Duration = Duration::from_secs(600);

/// A lease written under before it is waited out: long enough for a few statements on a
/// loaded machine, short enough to wait for.
const WRITE_THEN_EXPIRE: Duration = Duration::from_secs(8);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Submit task `id` (one loop phase) through the statements the backend is built on.
fn submit(rt: &Runtime, url: &str, id: &str) {
    let text = format!(r#"{{"id": "{id}", "phases": [{{"name": "p", "run": ["true"]}}]}}"#);
    rt.block_on(async {
        let queue = PgQueue::connect(url).unwrap();
        queue.migrate().await.unwrap();
        queue
            .submit(&NewTask {
                id,
                priority: 0,
                crash_limit: 5,
                definition: &text,
                submitted_by: None,
            })
            .await
            .unwrap();
    });
}

/// A plain connection for looking at the tables directly.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// One text column of one row.
fn text(rt: &Runtime, url: &str, statement: &str, id: &str) -> Option<String> {
    rt.block_on(async {
        let client = sql(url).await;
        client
            .query_opt(statement, &[&id])
            .await
            .unwrap()
            .and_then(|row| row.get::<_, Option<String>>(0))
    })
}

/// Save through the trait, whose checkpoints carry their state serialized once; returns the
/// generation.
fn save(backend: &PgBackend, lease: &Lease, cp: IterationCheckpoint) -> Result<u64, QueueError> {
    let state = serde_json::value::to_raw_value(&cp.partial_results).unwrap();
    backend
        .save_checkpoint(lease, &mut cp.with_state(state.as_ref()))
        .map(|saved| saved.generation)
}

fn a_checkpoint(id: &str, iterations: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: 0,
        task_id: id.to_owned(),
        phase: "p".to_owned(),
        phase_index: 0,
        scope: "loop".to_owned(),
        iteration_count: iterations,
        checkpoint_interval: 1,
        partial_results: json!({ "total": iterations }),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: None,
        files: Default::default(),
    }
}

fn work_with(id: &str, iterations: u64) -> Vec<ActiveTask> {
    let mut entry = ActiveTask::new(&TaskId::parse(id).unwrap(), "p");
    entry.iterations = iterations;
    vec![entry]
}

fn a_done_record(id: &str) -> TaskRecord {
    let now = chrono::Utc::now();
    TaskRecord::Done(
        serde_json::from_value::<DoneRecord>(json!({
            "status": "done", "task_id": id, "result": {"total": 3}, "phase_outputs": {},
            "attempts": 1, "failed_attempts": 0, "started_at": now, "finished_at": now,
            "duration_seconds": 0.5, "phases": []
        }))
        .unwrap(),
    )
}

fn assert_lease_lost<T: std::fmt::Debug>(result: Result<T, QueueError>, what: &str) {
    match result {
        Err(QueueError::LeaseLost(lost)) => assert_eq!(lost.task_id, "t1", "{what}: {lost}"),
        other => panic!("{what}: expected LeaseLost, got {other:?}"),
    }
}

/// Wait until task `id`'s lease has ended by the database's clock.
fn wait_lease_expired(rt: &Runtime, url: &str, id: &str) {
    let deadline = Instant::now() + DEADLINE;
    while text(
        rt,
        url,
        "SELECT (lease_expires_at <= now())::text FROM cairn_tasks WHERE id = $1",
        id,
    )
    .as_deref()
        != Some("true")
    {
        assert!(Instant::now() < deadline, "the lease of {id} never expired");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_claimed_task_checkpoints_writes_its_state_and_output_and_finishes_through_the_trait() {
    let Some(cluster) = PgCluster::start(
        "a_claimed_task_checkpoints_writes_its_state_and_output_and_finishes_through_the_trait",
    ) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, "t1");
    let backend = PgBackend::open(&url, "node-a", LONG).unwrap();
    assert_eq!(backend.accepted_ids().unwrap(), ["t1"]);
    assert_eq!(backend.task("t1").unwrap().id.as_deref(), Some("t1"));

    let lease = backend.claim("t1").unwrap();
    assert_eq!(lease.epoch(), 1, "the first claim is epoch 1");
    for iterations in 1..=3 {
        let generation = save(&backend, &lease, a_checkpoint("t1", iterations)).unwrap();
        assert_eq!(generation, iterations);
    }
    let latest = backend.latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(latest.checkpoint.iteration_count, 3);
    assert_eq!(latest.checkpoint.partial_results, json!({ "total": 3 }));

    backend
        .write_work_entries(backend.owner(), &work_with("t1", 3), &[])
        .unwrap();
    let iterations = text(
        &rt,
        &url,
        "SELECT phase_state->>'iterations' FROM cairn_tasks WHERE id = $1",
        "t1",
    );
    assert_eq!(
        iterations.as_deref(),
        Some("3"),
        "the task's row holds its entry"
    );

    let reference = backend
        .put_output(&lease, 0, br#"{"big": [1, 2, 3]}"#)
        .unwrap();
    assert_eq!(
        backend.read_output(&reference).unwrap(),
        Some(json!({"big": [1, 2, 3]}))
    );

    assert!(!backend.has_record("t1").unwrap());
    backend.finish(&lease, &a_done_record("t1")).unwrap();
    assert!(backend.has_record("t1").unwrap());
    assert!(backend.finished_ids().unwrap().contains("t1"));
    assert_eq!(backend.failed_record("t1").unwrap(), None);
    let state = text(
        &rt,
        &url,
        "SELECT state FROM cairn_tasks WHERE id = $1",
        "t1",
    );
    assert_eq!(state.as_deref(), Some("done"));
    // The lease ended with the record: no later write lands.
    assert_lease_lost(
        save(&backend, &lease, a_checkpoint("t1", 4)),
        "a checkpoint after the record",
    );
    assert!(
        backend.load_work().unwrap().active_tasks.is_empty(),
        "a finished task is no longer in flight"
    );
}

#[test]
fn a_newest_checkpoint_that_does_not_decode_falls_back_to_the_generation_before() {
    let Some(cluster) = PgCluster::start(
        "a_newest_checkpoint_that_does_not_decode_falls_back_to_the_generation_before",
    ) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, "t1");
    let backend = PgBackend::open(&url, "node-a", LONG).unwrap();
    let lease = backend.claim("t1").unwrap();
    for iterations in 1..=3 {
        save(&backend, &lease, a_checkpoint("t1", iterations)).unwrap();
    }
    let newest = backend.latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(newest.checkpoint.iteration_count, 3);
    assert_eq!(newest.key, "cairn_checkpoints/t1/3");
    assert!(newest.skipped.is_empty());

    // The newest generation's bytes are damaged (a gzip header and nothing after it).
    text(
        &rt,
        &url,
        "WITH damaged AS (
            UPDATE cairn_checkpoints SET bytes = decode('1f8b00', 'hex')
            WHERE task_id = $1 AND generation = 3 RETURNING task_id
        ) SELECT task_id FROM damaged",
        "t1",
    )
    .expect("generation 3 damaged");
    let fallback = backend.latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(fallback.checkpoint.iteration_count, 2);
    assert_eq!(fallback.key, "cairn_checkpoints/t1/2");
    assert_eq!(fallback.skipped.len(), 1, "{:?}", fallback.skipped);
    assert_eq!(fallback.skipped[0].0, "cairn_checkpoints/t1/3");
}

#[test]
fn a_node_whose_lease_was_taken_over_writes_nothing_and_recovery_sees_the_new_holders_work() {
    let Some(cluster) = PgCluster::start(
        "a_node_whose_lease_was_taken_over_writes_nothing_and_recovery_sees_the_new_holders_work",
    ) else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, "t1");
    let stale = PgBackend::open(&url, "node-a", WRITE_THEN_EXPIRE).unwrap();
    let old = stale.claim("t1").unwrap();
    save(&stale, &old, a_checkpoint("t1", 1)).unwrap();
    stale
        .write_work_entries(stale.owner(), &work_with("t1", 1), &[])
        .unwrap();

    let other = PgBackend::open(&url, "node-b", LONG).unwrap();
    assert!(
        matches!(other.claim("t1"), Err(QueueError::LeaseLost(_))),
        "a live lease is not taken over"
    );
    wait_lease_expired(&rt, &url, "t1");
    let new = other.claim("t1").unwrap();
    assert!(new.epoch() > old.epoch(), "{new:?} after {old:?}");
    let resumed = other.latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(
        resumed.checkpoint.iteration_count, 1,
        "resumes from node-a's checkpoint"
    );
    save(&other, &new, a_checkpoint("t1", 2)).unwrap();
    other
        .write_work_entries(other.owner(), &work_with("t1", 2), &[])
        .unwrap();

    // node-a wakes up: every write for the task is refused and changes nothing.
    let before = text(
        &rt,
        &url,
        "SELECT concat_ws(' | ', (SELECT row_to_json(t)::text FROM cairn_tasks t WHERE id = $1),
             (SELECT json_agg(c ORDER BY generation)::text FROM cairn_checkpoints c WHERE task_id = $1),
             (SELECT json_agg(o)::text FROM cairn_outputs o WHERE task_id = $1),
             (SELECT json_agg(r)::text FROM cairn_records r WHERE task_id = $1))",
        "t1",
    );
    assert_lease_lost(
        save(&stale, &old, a_checkpoint("t1", 9)),
        "the stale checkpoint",
    );
    assert_lease_lost(stale.put_output(&old, 0, b"{}"), "the stale output");
    assert_lease_lost(stale.finish(&old, &a_done_record("t1")), "the stale record");
    assert_lease_lost(stale.renew(&old), "the stale renewal");
    stale
        .write_work_entries(stale.owner(), &work_with("t1", 9), &[])
        .unwrap();
    let after = text(
        &rt,
        &url,
        "SELECT concat_ws(' | ', (SELECT row_to_json(t)::text FROM cairn_tasks t WHERE id = $1),
             (SELECT json_agg(c ORDER BY generation)::text FROM cairn_checkpoints c WHERE task_id = $1),
             (SELECT json_agg(o)::text FROM cairn_outputs o WHERE task_id = $1),
             (SELECT json_agg(r)::text FROM cairn_records r WHERE task_id = $1))",
        "t1",
    );
    assert_eq!(before, after, "node-a's refused writes changed nothing");

    // What node-b left is there for whoever takes the task next: node-c, once node-b lets go.
    let recovering = PgBackend::open(&url, "node-c", LONG).unwrap();
    let latest = recovering.latest_checkpoint("t1").unwrap().unwrap();
    assert_eq!(latest.checkpoint.iteration_count, 2);
    other.renew(&new).unwrap();
    assert!(
        recovering.claim_work(4, true).unwrap().is_empty(),
        "node-b still holds t1"
    );
    other.release();
    let claimed = recovering.claim_work(4, true).unwrap();
    assert_eq!(claimed.len(), 1, "node-c claims the released task");
    assert_eq!(
        claimed[0].entry.as_ref().map(|entry| entry.iterations),
        Some(2),
        "with node-b's work state"
    );
    assert_eq!(claimed[0].quarantine, None, "a release is no crash");
    assert!(recovering.holds("t1"));
}

/// A hand-back that cannot reach the database (it is down for longer than the lease lets the
/// statement be tried again) lets the lease go: the owner no longer renews it once the
/// database is back, so the lease expires and another node takes the task up. (Before, the
/// lease stayed among those renewed, and the task was held for ever by a daemon that did not
/// run it.)
#[test]
fn a_hand_back_the_database_never_saw_lets_the_lease_go_for_another_node() {
    let test = "a_hand_back_the_database_never_saw_lets_the_lease_go_for_another_node";
    let Some(mut pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let rt = runtime();
    submit(&rt, &url, "t1");
    let lease = Duration::from_secs(4);
    let holder = PgBackend::open(&url, "node-a", lease).unwrap();
    let claimed = holder.claim_work(1, true).unwrap();
    assert_eq!(claimed.len(), 1);
    pg.stop("fast");
    let handed = holder.hand_back("t1", HandBack::RetryAfter(Duration::ZERO));
    assert!(
        matches!(handed, Err(QueueError::Backend { .. })),
        "the hand-back reached a stopped database: {handed:?}"
    );
    assert!(
        !holder.holds("t1"),
        "the lease was kept after the hand-back failed"
    );
    assert!(holder.renewed_tasks().is_empty());
    pg.resume();
    let other = PgBackend::open(&url, "node-b", LONG).unwrap();
    let deadline = Instant::now() + DEADLINE;
    let taken = loop {
        // The holder keeps renewing what it holds, as its daemon does.
        let _ = holder.renew_leases();
        if let Some(work) = other.claim_work(1, true).ok().filter(|w| !w.is_empty()) {
            break work;
        }
        assert!(
            Instant::now() < deadline,
            "node-b never got the task: its lease is still renewed by node-a"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(taken[0].task.id().as_str(), "t1");
    assert!(taken[0].lease.epoch() > claimed[0].lease.epoch());
}

/// A final record sent while the database restarts is tried again within the lease and lands
/// once the database is back: the task is done, with its record, and its lease is no longer
/// the owner's to renew.
#[test]
fn a_final_record_sent_during_a_restart_lands_when_the_database_is_back() {
    let test = "a_final_record_sent_during_a_restart_lands_when_the_database_is_back";
    let Some(mut pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let rt = runtime();
    submit(&rt, &url, "t1");
    let holder = PgBackend::open(&url, "node-a", LONG).unwrap();
    let lease = holder.claim("t1").unwrap();
    pg.stop("fast");
    let finished = std::thread::scope(|scope| {
        let finishing = scope.spawn(|| holder.finish(&lease, &a_done_record("t1")));
        // The record is on its way (being tried again) while the database is down.
        std::thread::sleep(Duration::from_secs(1));
        pg.resume();
        finishing.join().unwrap()
    });
    finished.expect("the record is written once the database is back, within the lease");
    assert_eq!(
        text(
            &rt,
            &url,
            "SELECT state FROM cairn_tasks WHERE id = $1",
            "t1"
        )
        .as_deref(),
        Some("done")
    );
    assert!(holder.has_record("t1").unwrap());
    assert!(holder.renewed_tasks().is_empty());
}

/// The journal appends the events queued together in one statement, each fenced by its own
/// lease: an event under a lease another node took over is not journaled, the events of the
/// live lease beside it are, in order.
#[test]
fn events_under_a_lease_taken_over_are_refused_and_the_others_journaled() {
    let Some(cluster) =
        PgCluster::start("events_under_a_lease_taken_over_are_refused_and_the_others_journaled")
    else {
        return;
    };
    let (rt, url) = (runtime(), cluster.url());
    submit(&rt, &url, "t1");
    submit(&rt, &url, "t2");
    let a = PgBackend::open(&url, "node-a", WRITE_THEN_EXPIRE).unwrap();
    a.claim("t1").unwrap();
    let a_t2 = a.claim("t2").unwrap();
    // Progress under the lease, so that its expiry is cleared and t2 claimable at once (not a
    // suspect to try alone).
    save(&a, &a_t2, a_checkpoint("t2", 1)).unwrap();
    wait_lease_expired(&rt, &url, "t2");
    // node-a claims t1 again (a new epoch, live); node-b takes t2 over. node-a still holds
    // t2's old lease in memory: no renewal has told it otherwise.
    a.claim("t1").unwrap();
    let b = PgBackend::open(&url, "node-b", LONG).unwrap();
    b.claim("t2").unwrap();
    let phase = |index: usize| cairn::store::events::Event::PhaseStarted {
        phase: format!("p{index}"),
        phase_index: index,
        kind: cairn::task::PhaseKind::Once,
        attempt: 1,
    };
    for index in 0..3 {
        a.append_event("t1", phase(index));
        a.append_event("t2", phase(index));
    }
    a.flush_events();
    let journaled = |id: &str| {
        text(
            &rt,
            &url,
            "SELECT string_agg(event->>'phase', ',' ORDER BY id) FROM cairn_events
             WHERE task_id = $1 AND node = 'node-a' AND event->>'event' = 'phase_started'",
            id,
        )
    };
    assert_eq!(journaled("t1").as_deref(), Some("p0,p1,p2"), "in order");
    assert_eq!(journaled("t2"), None, "nothing under the lease taken over");
}
