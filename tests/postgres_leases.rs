//! The PostgreSQL backend's foundation against a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): the schema's migrations, claims, lease fencing, expiry
//! takeover, renewal, release, checkpoints, submission and notifications.
//!
//! Lease expiry is judged by the database's clock, so the tests that wait for it ask the
//! database whether the lease has expired rather than sleeping a fixed time.

mod common;

use std::sync::Arc;

use cairn::queue::postgres::{PgQueue, SCHEMA_VERSION};
use common::postgres::PgCluster;
use common::{process_alive, wait_until, DEADLINE};

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

/// A plain connection for looking at the tables directly.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
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
