//! The PostgreSQL backend's foundation against a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): the schema's migrations, claims, lease fencing, expiry
//! takeover, renewal, release, checkpoints, submission and notifications.
//!
//! Lease expiry is judged by the database's clock, so the tests that wait for it ask the
//! database whether the lease has expired rather than sleeping a fixed time.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use cairn::queue::postgres::{NewTask, PgError, PgQueue, Submitted, SCHEMA_VERSION};
use common::postgres::PgCluster;
use common::{process_alive, wait_until, DEADLINE};

/// A lease long enough never to expire during a test that does not wait for expiry.
const LONG: Duration = Duration::from_secs(600);

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
    };
    queue.submit(&task).await.unwrap()
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
                let claimed = queue.claim(node, 3, LONG).await.unwrap();
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
