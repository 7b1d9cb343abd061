//! The PostgreSQL backend's foundation against a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): the schema's migrations, claims, lease fencing, expiry
//! takeover, renewal, release, checkpoints, submission and notifications.
//!
//! Lease expiry is judged by the database's clock, so the tests that wait for it ask the
//! database whether the lease has expired rather than sleeping a fixed time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn::queue::postgres::{
    CheckpointWrite, ClaimedTask, Lease, NewTask, Outcome, PgError, PgQueue, SubmitListener,
    Submitted, Wakeup, SCHEMA_VERSION,
};
use cairn::store::{decode_checkpoint, encode_checkpoint, IterationCheckpoint};
use serde_json::json;

use crate::common::postgres::PgCluster;
use crate::common::{process_alive, wait_until, DEADLINE};

/// A lease long enough never to expire during a test that does not wait for expiry.
const LONG: Duration = Duration::from_secs(600);

/// A lease short enough to wait out; the tests poll the database's clock for its end.
const SHORT: Duration = Duration::from_secs(2);

/// A lease a test writes under before waiting it out: long enough for a few statements even
/// on a loaded machine, short enough to wait for.
const WRITE_THEN_EXPIRE: Duration = Duration::from_secs(8);

#[test]
fn a_throwaway_cluster_serves_on_its_socket_and_is_gone_after_drop() {
    let test = "a_throwaway_cluster_serves_on_its_socket_and_is_gone_after_drop";
    let Some(cluster) = PgCluster::start(test) else {
        return;
    };
    let url = cluster.create_database("scratch");
    assert!(url.contains("scratch"), "{url}");
    let dir = cluster.dir().to_path_buf();
    let pid = cluster.postmaster_pid();
    assert!(process_alive(pid), "the postmaster {pid} runs");
    assert!(
        std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with(".s.PGSQL.")),
        "the socket is in the temp dir"
    );
    drop(cluster);
    wait_until("the postmaster is gone", DEADLINE, || !process_alive(pid));
    assert!(!dir.exists(), "{} is removed", dir.display());
}

/// A cluster and a migrated queue on it, or `None` when the test is skipped.
async fn migrated_queue(test: &str) -> Option<(PgCluster, PgQueue)> {
    let cluster = PgCluster::start(test)?;
    let queue = PgQueue::connect(&cluster.url()).unwrap();
    queue.migrate().await.unwrap();
    Some((cluster, queue))
}

/// The one lease `lease`, as a renewal names what it holds.
fn held(lease: &Lease) -> Vec<(String, i64)> {
    vec![(lease.task_id.clone(), lease.epoch)]
}

/// A plain connection for looking at the tables directly.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

fn definition(id: &str) -> String {
    // Digits beyond 64 bits and a key order that is not sorted: stored verbatim.
    format!(
        r#"{{"id": "{id}", "phases": [{{"name": "p", "run": ["true"]}}], "meta": {{"z": 1, "big": 123456789012345678901234567890}}}}"#
    )
}

async fn submit(queue: &PgQueue, id: &str) -> Submitted {
    let text = definition(id);
    let task = NewTask {
        id,
        priority: 0,
        crash_limit: 5,
        definition: &text,
        submitted_by: None,
    };
    queue.submit(&task).await.unwrap()
}

/// Claim exactly the one task there is.
async fn claim_one(queue: &PgQueue, node: &str, lease: Duration) -> ClaimedTask {
    let mut claimed = queue.claim(node, 1, lease, true).await.unwrap();
    assert_eq!(claimed.len(), 1, "{node} claims one task: {claimed:?}");
    claimed.remove(0)
}

/// Submit t1 and t2 and claim both for node "a", with a lease that is waited out.
async fn claim_two(queue: &PgQueue) -> Vec<ClaimedTask> {
    submit(queue, "t1").await;
    submit(queue, "t2").await;
    let claimed = queue.claim("a", 2, WRITE_THEN_EXPIRE, true).await.unwrap();
    assert_eq!(claimed.len(), 2);
    claimed
}

/// Whether the task's lease has ended by the database's clock.
async fn lease_expired(client: &tokio_postgres::Client, id: &str) -> bool {
    client
        .query_one(
            "SELECT lease_expires_at <= now() FROM cairn_tasks WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

/// Wait until the task's lease has ended by the database's clock.
async fn wait_lease_expired(client: &tokio_postgres::Client, id: &str) {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if lease_expired(client, id).await {
            return;
        }
        assert!(Instant::now() < deadline, "the lease of {id} never expired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Everything stored for a task, as one text, to show that a refused write changed nothing.
async fn everything_about(client: &tokio_postgres::Client, id: &str) -> String {
    client
        .query_one(
            "SELECT concat_ws(' | ',
                 (SELECT row_to_json(t)::text FROM cairn_tasks t WHERE id = $1),
                 (SELECT json_agg(c ORDER BY generation)::text FROM cairn_checkpoints c WHERE task_id = $1),
                 (SELECT json_agg(o ORDER BY phase_index)::text FROM cairn_outputs o WHERE task_id = $1),
                 (SELECT json_agg(e ORDER BY id)::text FROM cairn_events e WHERE task_id = $1),
                 (SELECT row_to_json(r)::text FROM cairn_records r WHERE task_id = $1))",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

fn a_checkpoint(id: &str, iterations: u64) -> IterationCheckpoint {
    IterationCheckpoint {
        format_version: 0,
        task_id: id.to_owned(),
        phase: "sum".to_owned(),
        phase_index: 1,
        scope: "loop".to_owned(),
        iteration_count: iterations,
        checkpoint_interval: 1,
        partial_results: json!({"total": iterations, "exact": 0.1, "huge": 123456789012345678901234567890_u128}),
        last_checkpoint_at: chrono::Utc::now(),
        attempt: 1,
        generation: 0,
        done: false,
        output: None,
        cost: Some(0.25),
        files: Default::default(),
    }
}

fn assert_lease_lost(result: Result<impl std::fmt::Debug, PgError>, lease: &Lease) {
    match result {
        Err(PgError::LeaseLost {
            task_id,
            node,
            epoch,
        }) => {
            assert_eq!(
                (task_id.as_str(), node.as_str(), epoch),
                (lease.task_id.as_str(), lease.node.as_str(), lease.epoch)
            );
        }
        other => panic!("expected LeaseLost for {lease:?}, got {other:?}"),
    }
}

/// Every fenced write under `lease`, each expected to be refused.
async fn every_write_is_refused(queue: &PgQueue, lease: &Lease) {
    let mut stale = lease.clone();
    let mut cp = a_checkpoint(&lease.task_id, 99);
    assert_lease_lost(queue.save_checkpoint(&mut stale, &mut cp, 3).await, lease);
    assert_eq!(stale.last_generation(), lease.last_generation());
    assert_lease_lost(
        queue.save_phase_state(lease, r#"{"phase": "stale"}"#).await,
        lease,
    );
    assert_lease_lost(queue.save_output(lease, 0, "p", "\"stale\"").await, lease);
    assert_lease_lost(
        queue.append_event(lease, r#"{"event": "stale"}"#).await,
        lease,
    );
    assert_lease_lost(
        queue
            .finish(lease, Outcome::Done, r#"{"status": "done"}"#)
            .await,
        lease,
    );
    assert_lease_lost(queue.requeue(lease, Duration::ZERO, true).await, lease);
    assert_lease_lost(queue.pause(lease).await, lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_are_idempotent_and_safe_from_many_connections_at_once() {
    let Some(cluster) =
        PgCluster::start("migrations_are_idempotent_and_safe_from_many_connections_at_once")
    else {
        return;
    };
    const DAEMONS: usize = 6;
    let barrier = Arc::new(tokio::sync::Barrier::new(DAEMONS));
    let mut starts = Vec::new();
    for _ in 0..DAEMONS {
        let queue = PgQueue::connect_with_pool_size(&cluster.url(), 1).unwrap();
        // Connected before the barrier, so that the migrations themselves run at once.
        assert_eq!(queue.schema_version().await.unwrap(), 0);
        let barrier = Arc::clone(&barrier);
        starts.push(tokio::spawn(async move {
            barrier.wait().await;
            queue.migrate().await
        }));
    }
    let mut applied = 0;
    for start in starts {
        let migrated = start.await.unwrap().unwrap();
        assert_eq!(migrated.to, SCHEMA_VERSION);
        applied += usize::from(migrated.applied_any());
    }
    assert_eq!(applied, 1, "exactly one daemon applied the migration");

    let queue = PgQueue::connect(&cluster.url()).unwrap();
    let again = queue.migrate().await.unwrap();
    assert!(!again.applied_any(), "{again:?}");
    let client = sql(&cluster.url()).await;
    let versions: Vec<i32> = client
        .query("SELECT version FROM cairn_schema ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
}

#[test]
fn cairn_db_migrate_creates_the_schema_and_says_so_when_run_again() {
    let Some(cluster) =
        PgCluster::start("cairn_db_migrate_creates_the_schema_and_says_so_when_run_again")
    else {
        return;
    };
    let migrate = |args: &[&str], env_url: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_cairn"));
        command.args(["db", "migrate"]).args(args);
        command.env_remove("CAIRN_DATABASE_URL");
        if let Some(url) = env_url {
            command.env("CAIRN_DATABASE_URL", url);
        }
        command.output().unwrap()
    };
    let first = migrate(&["--db", &cluster.url()], None);
    assert!(first.status.success(), "{first:?}");
    assert_eq!(
        String::from_utf8_lossy(&first.stdout).trim(),
        format!("cairn schema migrated from version 0 to {SCHEMA_VERSION}")
    );
    let second = migrate(&[], Some(&cluster.url()));
    assert!(second.status.success(), "{second:?}");
    assert_eq!(
        String::from_utf8_lossy(&second.stdout).trim(),
        format!("cairn schema already at version {SCHEMA_VERSION}")
    );
    // Finding the schema there is not worth a line from PostgreSQL (it used to print
    // `NOTICE: relation "cairn_schema" already exists, skipping` at every start).
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        !stderr.contains("NOTICE") && !stderr.contains("already exists"),
        "{stderr}"
    );
    let bad = migrate(&["--db", "postgresql://[nonsense"], None);
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(stderr.contains("invalid database URL"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitting_the_same_id_twice_makes_one_task_kept_verbatim() {
    let Some((cluster, queue)) =
        migrated_queue("submitting_the_same_id_twice_makes_one_task_kept_verbatim").await
    else {
        return;
    };
    assert_eq!(submit(&queue, "t1").await, Submitted::Queued);
    let other = PgQueue::connect(&cluster.url()).unwrap();
    let second = NewTask {
        id: "t1",
        priority: 9,
        crash_limit: 5,
        definition: r#"{"id": "t1", "phases": []}"#,
        submitted_by: None,
    };
    assert_eq!(
        other.submit(&second).await.unwrap(),
        Submitted::AlreadyThere
    );
    let client = sql(&cluster.url()).await;
    let rows = client
        .query(
            "SELECT definition::text, priority FROM cairn_tasks WHERE id = 't1'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(0), definition("t1"));
    assert_eq!(rows[0].get::<_, i32>(1), 0);

    let bad = NewTask {
        id: "t.1",
        ..second
    };
    let refused = queue.submit(&bad).await;
    assert!(
        matches!(&refused, Err(PgError::InvalidTaskId { task_id, .. }) if task_id == "t.1"),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_claiming_at_once_take_each_task_exactly_once() {
    let Some((cluster, queue)) =
        migrated_queue("two_nodes_claiming_at_once_take_each_task_exactly_once").await
    else {
        return;
    };
    const TASKS: usize = 60;
    for n in 0..TASKS {
        submit(&queue, &format!("task-{n:02}")).await;
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let mut nodes = Vec::new();
    for node in ["node-a", "node-b"] {
        let queue = PgQueue::connect(&cluster.url()).unwrap();
        let barrier = Arc::clone(&barrier);
        nodes.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut mine = Vec::new();
            loop {
                let claimed = queue.claim(node, 3, LONG, true).await.unwrap();
                if claimed.is_empty() {
                    return mine;
                }
                mine.extend(claimed);
            }
        }));
    }
    let mut all = Vec::new();
    for node in nodes {
        all.extend(node.await.unwrap());
    }
    let ids: BTreeSet<&str> = all.iter().map(|c| c.lease.task_id.as_str()).collect();
    assert_eq!(all.len(), TASKS, "every task claimed once");
    assert_eq!(ids.len(), TASKS, "no task claimed twice");
    for claimed in &all {
        assert_eq!(claimed.lease.epoch, 1, "{claimed:?}");
        assert!(
            !claimed.taken_over && claimed.crash_count == 0,
            "{claimed:?}"
        );
        assert_eq!(claimed.definition, definition(&claimed.lease.task_id));
    }
    let client = sql(&cluster.url()).await;
    let owners: Vec<(String, String)> = client
        .query("SELECT id, lease_node FROM cairn_tasks ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for (id, node) in owners {
        let claimed = all.iter().find(|c| c.lease.task_id == id).unwrap();
        assert_eq!(
            node, claimed.lease.node,
            "{id} is held by the node that claimed it"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_leases_back_at_once_and_the_old_epoch_writes_nothing() {
    let Some((cluster, queue)) =
        migrated_queue("release_hands_leases_back_at_once_and_the_old_epoch_writes_nothing").await
    else {
        return;
    };
    submit(&queue, "t1").await;
    let a = claim_one(&queue, "a", LONG).await;
    let b_queue = PgQueue::connect(&cluster.url()).unwrap();
    assert!(
        b_queue.claim("b", 5, LONG, true).await.unwrap().is_empty(),
        "a leased task is not claimed by another node"
    );
    let mut a_lease = a.lease.clone();
    queue
        .save_checkpoint(&mut a_lease, &mut a_checkpoint("t1", 3), 3)
        .await
        .unwrap();

    assert_eq!(queue.release_all("a").await.unwrap(), vec!["t1".to_owned()]);
    let b = claim_one(&b_queue, "b", LONG).await;
    assert_eq!(b.lease.epoch, a.lease.epoch + 1);
    assert!(!b.taken_over, "a released lease is not a crash");
    assert_eq!(b.crash_count, 0);
    assert_eq!(b.lease.last_generation(), 1, "b knows a's checkpoint");

    let client = sql(&cluster.url()).await;
    let before = everything_about(&client, "t1").await;
    every_write_is_refused(&queue, &a_lease).await;
    assert_eq!(everything_about(&client, "t1").await, before);
    assert!(queue
        .renew_held("a", LONG, &held(&a_lease))
        .await
        .unwrap()
        .is_empty());
    assert!(queue.release_all("a").await.unwrap().is_empty());

    // The new holder writes, and its final record ends the lease.
    let mut b_lease = b.lease.clone();
    let generation = b_queue
        .save_checkpoint(&mut b_lease, &mut a_checkpoint("t1", 4), 3)
        .await
        .unwrap()
        .generation;
    assert_eq!(generation, 2);
    b_queue
        .finish(
            &b_lease,
            Outcome::Done,
            r#"{"status": "done", "result": 1}"#,
        )
        .await
        .unwrap();
    let (state, status): (String, String) = client
        .query_one(
            "SELECT t.state, r.status FROM cairn_tasks t JOIN cairn_records r ON r.task_id = t.id",
            &[],
        )
        .await
        .map(|row| (row.get(0), row.get(1)))
        .unwrap();
    assert_eq!((state.as_str(), status.as_str()), ("done", "done"));
    assert!(b_queue
        .renew_held("b", LONG, &held(&b_lease))
        .await
        .unwrap()
        .is_empty());
    assert!(b_queue.claim("b", 5, LONG, true).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_expiry_another_node_takes_over_and_the_old_nodes_writes_are_refused() {
    let Some((cluster, queue)) =
        migrated_queue("after_expiry_another_node_takes_over_and_the_old_nodes_writes_are_refused")
            .await
    else {
        return;
    };
    submit(&queue, "t1").await;
    let a = claim_one(&queue, "a", WRITE_THEN_EXPIRE).await;
    let mut a_lease = a.lease.clone();
    queue
        .save_checkpoint(&mut a_lease, &mut a_checkpoint("t1", 1), 3)
        .await
        .unwrap();
    let client = sql(&cluster.url()).await;
    wait_lease_expired(&client, "t1").await;
    assert!(
        queue
            .renew_held("a", LONG, &held(&a_lease))
            .await
            .unwrap()
            .is_empty(),
        "an expired lease is not renewed"
    );
    // Expired is lost, even before anyone takes the task over.
    let before = everything_about(&client, "t1").await;
    every_write_is_refused(&queue, &a_lease).await;
    assert_eq!(everything_about(&client, "t1").await, before);

    let b_queue = PgQueue::connect(&cluster.url()).unwrap();
    let b = claim_one(&b_queue, "b", LONG).await;
    assert_eq!(b.lease.epoch, a.lease.epoch + 1);
    assert!(b.taken_over, "{b:?}");
    assert_eq!(
        b.crash_count, 0,
        "a checkpoint under the expired lease was progress: no crash of the task's"
    );
    assert_eq!(b.lease.last_generation(), 1);

    let before = everything_about(&client, "t1").await;
    every_write_is_refused(&queue, &a_lease).await;
    assert_eq!(everything_about(&client, "t1").await, before);

    let mut b_lease = b.lease.clone();
    b_queue
        .save_checkpoint(&mut b_lease, &mut a_checkpoint("t1", 2), 3)
        .await
        .unwrap();
    let crash_count: i32 = client
        .query_one("SELECT crash_count FROM cairn_tasks WHERE id = 't1'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(crash_count, 0, "a committed checkpoint is progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_leases_keep_expiring_is_marked_for_quarantine() {
    let Some((cluster, queue)) =
        migrated_queue("a_task_whose_leases_keep_expiring_is_marked_for_quarantine").await
    else {
        return;
    };
    let text = definition("killer");
    let task = NewTask {
        id: "killer",
        priority: 0,
        crash_limit: 2,
        definition: &text,
        submitted_by: None,
    };
    queue.submit(&task).await.unwrap();
    let client = sql(&cluster.url()).await;
    let first = claim_one(&queue, "a", SHORT).await;
    assert!(!first.must_quarantine());
    wait_lease_expired(&client, "killer").await;
    let second = claim_one(&queue, "b", SHORT).await;
    assert_eq!(second.crash_count, 1);
    assert!(!second.must_quarantine());
    wait_lease_expired(&client, "killer").await;
    let third = claim_one(&queue, "a", LONG).await;
    assert_eq!(third.crash_count, 2);
    assert!(third.must_quarantine(), "{third:?}");
    queue
        .finish(
            &third.lease,
            Outcome::Failed,
            r#"{"status": "failed", "error": "quarantined"}"#,
        )
        .await
        .unwrap();
    let state: String = client
        .query_one("SELECT state FROM cairn_tasks WHERE id = 'killer'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(state, "failed");
}

/// Crash blame, as the file queue judges it: tasks whose node died with several of them in
/// flight without progress become suspects, none counted; while suspects wait, a busy node
/// claims nothing and an idle one claims one to try alone; a suspect that dies alone is
/// counted, one that made progress is cleared, and the innocent one is never counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiry_with_several_tasks_in_flight_makes_suspects_tried_one_per_node() {
    let Some((cluster, queue)) =
        migrated_queue("an_expiry_with_several_tasks_in_flight_makes_suspects_tried_one_per_node")
            .await
    else {
        return;
    };
    for id in ["s1", "s2", "s3", "later"] {
        submit(&queue, id).await;
    }
    let client = sql(&cluster.url()).await;
    // Node a dies holding three tasks; one of them (s3) had checkpointed.
    let held = queue.claim("a", 3, SHORT, true).await.unwrap();
    assert_eq!(held.len(), 3);
    let s3 = held.iter().find(|c| c.lease.task_id == "s3").unwrap();
    let mut s3_lease = s3.lease.clone();
    queue
        .save_checkpoint(&mut s3_lease, &mut a_checkpoint("s3", 1), 3)
        .await
        .unwrap();
    for task in &held {
        wait_lease_expired(&client, &task.lease.task_id).await;
    }
    // A node holding work claims nothing while suspects wait (it drains)...
    assert!(queue
        .claim("busy", 4, LONG, false)
        .await
        .unwrap()
        .is_empty());
    let judged = sql_rows(
        &client,
        "SELECT id, suspect::text, crash_count::text FROM cairn_tasks WHERE id LIKE 's%' ORDER BY id",
    )
    .await;
    assert_eq!(
        judged,
        [
            ["s1", "true", "0"],
            ["s2", "true", "0"],
            ["s3", "false", "0"]
        ],
        "in flight together without progress: suspects, none counted; s3 progressed: cleared"
    );
    // ...and an idle node claims one suspect, alone, to try it.
    let trial = queue.claim("b", 4, SHORT, true).await.unwrap();
    assert_eq!(trial.len(), 1, "{trial:?}");
    assert!(trial[0].on_trial && trial[0].taken_over, "{trial:?}");
    assert_eq!(trial[0].lease.task_id, "s1");
    // Another idle node tries the other suspect beside it (each alone on its node).
    let other = queue.claim("c", 4, LONG, true).await.unwrap();
    assert_eq!(other.len(), 1, "{other:?}");
    assert_eq!(other[0].lease.task_id, "s2");
    assert!(other[0].on_trial);
    // s1 dies on trial, alone on b: counted. Now nothing is suspect: normal claims again.
    wait_lease_expired(&client, "s1").await;
    let next = queue.claim("d", 4, LONG, false).await.unwrap();
    let mut ids: Vec<&str> = next.iter().map(|c| c.lease.task_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["later", "s1", "s3"], "{next:?}");
    let s1 = next.iter().find(|c| c.lease.task_id == "s1").unwrap();
    assert_eq!(s1.crash_count, 1, "died alone on its trial: {s1:?}");
    assert!(!s1.on_trial);
    let s3 = next.iter().find(|c| c.lease.task_id == "s3").unwrap();
    assert_eq!(s3.crash_count, 0, "{s3:?}");
    let s2 = sql_rows(
        &client,
        "SELECT crash_count::text FROM cairn_tasks WHERE id = 's2'",
    )
    .await;
    assert_eq!(s2, [["0"]], "the innocent suspect is not counted");
}

/// The rows `query` returns, every column as text.
async fn sql_rows(client: &tokio_postgres::Client, query: &str) -> Vec<Vec<String>> {
    client
        .query(query, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (0..row.len()).map(|i| row.get::<_, String>(i)).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_keeps_a_lease_alive_past_its_original_expiry() {
    let Some((cluster, queue)) =
        migrated_queue("renewing_keeps_a_lease_alive_past_its_original_expiry").await
    else {
        return;
    };
    let claimed = claim_two(&queue).await;
    let all: Vec<(String, i64)> = claimed
        .iter()
        .map(|c| (c.lease.task_id.clone(), c.lease.epoch))
        .collect();
    let renewed = queue.renew_held("a", LONG, &all).await.unwrap();
    assert_eq!(
        renewed.len(),
        2,
        "one statement renews every lease held: {renewed:?}"
    );
    for lease in &renewed {
        let original = claimed
            .iter()
            .find(|c| c.lease.task_id == lease.task_id)
            .unwrap();
        assert_eq!(
            lease.epoch, original.lease.epoch,
            "renewing keeps the epoch"
        );
        assert!(lease.expires_at > original.lease.expires_at, "{lease:?}");
    }
    // Wait, on the database's clock, until the original expiry has passed.
    let original_expiry = claimed.iter().map(|c| c.lease.expires_at).max().unwrap();
    let client = sql(&cluster.url()).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        let passed: bool = client
            .query_one("SELECT now() > $1", &[&original_expiry])
            .await
            .unwrap()
            .get(0);
        if passed {
            break;
        }
        assert!(Instant::now() < deadline, "the database clock never moved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let b_queue = PgQueue::connect(&cluster.url()).unwrap();
    assert!(b_queue.claim("b", 5, LONG, true).await.unwrap().is_empty());
    for task in &claimed {
        queue
            .save_phase_state(&task.lease, r#"{"phase": "still mine"}"#)
            .await
            .unwrap();
    }
}

/// A daemon that let go of a lease in memory (judged it lost, say, because a renewal crossed
/// the task's claim) must not keep it alive by renewing every lease of its node: the task
/// would stay running on that node, run by nobody, until the daemon stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewing_extends_only_the_leases_named_and_the_others_expire() {
    let Some((cluster, queue)) =
        migrated_queue("renewing_extends_only_the_leases_named_and_the_others_expire").await
    else {
        return;
    };
    let claimed = claim_two(&queue).await;
    let kept = claimed
        .iter()
        .find(|c| c.lease.task_id == "t1")
        .unwrap()
        .lease
        .clone();
    let client = sql(&cluster.url()).await;
    // Renew t1 alone, as often as a daemon would, until t2's lease has run out.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let renewed = queue
            .renew_held("a", WRITE_THEN_EXPIRE, &held(&kept))
            .await
            .unwrap();
        let ids: Vec<&str> = renewed.iter().map(|r| r.task_id.as_str()).collect();
        assert_eq!(ids, ["t1"], "only the lease named is renewed");
        if lease_expired(&client, "t2").await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "t2's lease lives on, renewed with t1's"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Another node takes t2 over; t1 is still a's.
    let b_queue = PgQueue::connect(&cluster.url()).unwrap();
    let taken: Vec<String> = b_queue
        .claim("b", 5, LONG, true)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.lease.task_id)
        .collect();
    assert_eq!(taken, ["t2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_bytes_round_trip_and_decode_with_the_stores_decoder() {
    let Some((_cluster, queue)) =
        migrated_queue("checkpoint_bytes_round_trip_and_decode_with_the_stores_decoder").await
    else {
        return;
    };
    submit(&queue, "t1").await;
    let mut lease = claim_one(&queue, "a", LONG).await.lease;
    let mut written = Vec::new();
    for iterations in 1..=5 {
        let mut cp = a_checkpoint("t1", iterations);
        let generation = queue
            .save_checkpoint(&mut lease, &mut cp, 2)
            .await
            .unwrap()
            .generation;
        assert_eq!(generation, iterations);
        assert_eq!(cp.generation, generation);
        written.push(cp);
    }
    let stored = queue.checkpoints("t1").await.unwrap();
    let generations: Vec<u64> = stored.iter().map(|s| s.generation).collect();
    assert_eq!(
        generations,
        vec![5, 4, 3],
        "the latest and two older are kept"
    );
    for row in &stored {
        let cp = &written[usize::try_from(row.generation).unwrap() - 1];
        assert_eq!(
            row.bytes,
            encode_checkpoint(cp).unwrap(),
            "the file's bytes"
        );
        let decoded = decode_checkpoint(&row.bytes).unwrap();
        assert_eq!(&decoded, cp);
        assert_eq!(row.iteration_count, cp.iteration_count);
        assert_eq!(row.lease_epoch, lease.epoch);
        assert_eq!(
            decoded.partial_results["huge"].to_string(),
            "123456789012345678901234567890"
        );
    }
    let latest = queue.latest_checkpoint("t1").await.unwrap().unwrap();
    assert_eq!(latest.generation, 5);
    assert!(queue.latest_checkpoint("nobody").await.unwrap().is_none());

    queue
        .save_output(&lease, 0, "gather", r#"[1, 2.50]"#)
        .await
        .unwrap();
    queue
        .append_event(&lease, r#"{"event": "phase_finished"}"#)
        .await
        .unwrap();
    let client = sql(&_cluster.url()).await;
    let output: String = client
        .query_one(
            "SELECT output::text FROM cairn_outputs WHERE task_id = 't1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(output, "[1, 2.50]", "outputs are kept verbatim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_checkpoints_refuses_only_the_row_whose_lease_was_taken_over() {
    let Some((cluster, queue)) =
        migrated_queue("a_batch_of_checkpoints_refuses_only_the_row_whose_lease_was_taken_over")
            .await
    else {
        return;
    };
    // Node a holds t2 on a lease that is waited out, t1 and t3 on long ones.
    submit(&queue, "t2").await;
    let a_t2 = claim_one(&queue, "a", WRITE_THEN_EXPIRE).await.lease;
    submit(&queue, "t1").await;
    submit(&queue, "t3").await;
    let claimed = queue.claim("a", 2, LONG, true).await.unwrap();
    let mut a_leases: Vec<Lease> = claimed.into_iter().map(|c| c.lease).collect();
    a_leases.sort_by(|x, y| x.task_id.cmp(&y.task_id));
    assert_eq!(
        a_leases
            .iter()
            .map(|l| l.task_id.as_str())
            .collect::<Vec<_>>(),
        ["t1", "t3"]
    );
    // t2's lease expires and node b takes the task over. (b has not checkpointed yet: a's
    // stale generation would otherwise meet b's on the key and be refused there.)
    let client = sql(&cluster.url()).await;
    wait_lease_expired(&client, "t2").await;
    let b_queue = PgQueue::connect(&cluster.url()).unwrap();
    let b_t2 = claim_one(&b_queue, "b", LONG).await.lease;
    assert_eq!(b_t2.epoch, a_t2.epoch + 1);
    let b_work = everything_about(&client, "t2").await;

    // Node a commits one batch: t1, its stale t2, t3.
    let mut checkpoints: Vec<IterationCheckpoint> = ["t1", "t2", "t3"]
        .iter()
        .map(|id| a_checkpoint(id, 3))
        .collect();
    let leases = [&a_leases[0], &a_t2, &a_leases[1]];
    let writes: Vec<CheckpointWrite> = leases
        .iter()
        .zip(checkpoints.iter_mut())
        .map(|(lease, cp)| CheckpointWrite::encode(lease, cp).unwrap())
        .collect();
    let batch: Vec<&CheckpointWrite> = writes.iter().collect();
    let stored = queue.save_checkpoints("a", &batch, 3).await.unwrap();
    assert_eq!(stored, [true, false, true], "only t2 is refused");

    assert_eq!(
        everything_about(&client, "t2").await,
        b_work,
        "nothing of node a's stale write reached t2"
    );
    for (lease, cp) in [
        (&a_leases[0], &checkpoints[0]),
        (&a_leases[1], &checkpoints[2]),
    ] {
        let rows = queue.checkpoints(&lease.task_id).await.unwrap();
        assert_eq!(rows.len(), 1, "{}: {rows:?}", lease.task_id);
        assert_eq!(rows[0].lease_epoch, lease.epoch);
        assert_eq!(decode_checkpoint(&rows[0].bytes).unwrap(), *cp);
    }
    // The stale row's waiter is told its lease is lost, as a save of its own would be.
    let mut stale = a_t2.clone();
    assert_lease_lost(
        queue
            .save_checkpoint(&mut stale, &mut a_checkpoint("t2", 4), 3)
            .await,
        &a_t2,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_reaches_a_listener_and_polling_goes_on_without_one() {
    let Some((cluster, queue)) =
        migrated_queue("a_notify_reaches_a_listener_and_polling_goes_on_without_one").await
    else {
        return;
    };
    let mut listener = SubmitListener::connect(&queue).await.unwrap();
    assert_eq!(
        listener.wait(Duration::from_millis(100)).await,
        Wakeup::PollDue,
        "nothing was submitted yet"
    );
    let submitter = PgQueue::connect(&cluster.url()).unwrap();
    submit(&submitter, "t1").await;
    match listener.wait(DEADLINE).await {
        Wakeup::Notified(ids) => assert_eq!(ids, vec!["t1".to_owned()]),
        other => panic!("expected a notification, got {other:?}"),
    }
    // A duplicate submission notifies nobody; a release does.
    submit(&submitter, "t1").await;
    claim_one(&queue, "a", LONG).await;
    queue.release_all("a").await.unwrap();
    match listener.wait(DEADLINE).await {
        Wakeup::Notified(ids) => assert_eq!(ids, vec![String::new()], "{ids:?}"),
        other => panic!("expected a notification, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_is_refused_while_another_daemon_uses_it() {
    let Some((cluster, queue)) =
        migrated_queue("a_node_name_is_refused_while_another_daemon_uses_it").await
    else {
        return;
    };
    queue.register_node("host-1", LONG).await.unwrap();
    queue.register_node("host-1", LONG).await.unwrap();
    let other = PgQueue::connect(&cluster.url()).unwrap();
    let refused = other.register_node("host-1", LONG).await;
    assert!(
        matches!(&refused, Err(PgError::NodeNameInUse { node }) if node == "host-1"),
        "{refused:?}"
    );
    // Once the first was not seen for longer than the lease, the name is free again.
    other.register_node("host-1", Duration::ZERO).await.unwrap();
    other.register_node("host-2", LONG).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_and_pause_end_the_lease_and_hold_the_task_as_asked() {
    let Some((cluster, queue)) =
        migrated_queue("requeue_and_pause_end_the_lease_and_hold_the_task_as_asked").await
    else {
        return;
    };
    let client = sql(&cluster.url()).await;
    let other = PgQueue::connect(&cluster.url()).unwrap();

    // A retry waiting out a long backoff is not claimed; the old lease writes nothing.
    submit(&queue, "backoff").await;
    let first = claim_one(&queue, "a", LONG).await;
    queue.requeue(&first.lease, LONG, false).await.unwrap();
    assert!(other.claim("b", 5, LONG, true).await.unwrap().is_empty());
    let before = everything_about(&client, "backoff").await;
    every_write_is_refused(&queue, &first.lease).await;
    assert_eq!(everything_about(&client, "backoff").await, before);

    // With no backoff it is claimed at once, with a new epoch, and no crash is counted.
    submit(&queue, "again").await;
    let first = claim_one(&queue, "a", LONG).await;
    queue
        .requeue(&first.lease, Duration::ZERO, true)
        .await
        .unwrap();
    let second = claim_one(&other, "b", LONG).await;
    assert_eq!(second.lease.task_id, "again");
    assert_eq!(second.lease.epoch, first.lease.epoch + 1);
    assert!(!second.taken_over && second.crash_count == 0, "{second:?}");

    // A paused task waits for its resume.
    other.pause(&second.lease).await.unwrap();
    assert!(queue.claim("a", 5, LONG, true).await.unwrap().is_empty());
    every_write_is_refused(&other, &second.lease).await;
    assert!(queue.resume_paused("again").await.unwrap());
    assert!(
        !queue.resume_paused("again").await.unwrap(),
        "not paused any more"
    );
    let third = claim_one(&queue, "a", LONG).await;
    assert_eq!(third.lease.epoch, second.lease.epoch + 1);
}
