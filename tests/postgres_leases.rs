//! The PostgreSQL backend's foundation against a real, throwaway PostgreSQL (see
//! `tests/common/postgres.rs`): the schema's migrations, claims, lease fencing, expiry
//! takeover, renewal, release, checkpoints, submission and notifications.
//!
//! Lease expiry is judged by the database's clock, so the tests that wait for it ask the
//! database whether the lease has expired rather than sleeping a fixed time.

mod common;

use common::postgres::PgCluster;
use common::{process_alive, wait_until, DEADLINE};

#[test]
fn a_throwaway_cluster_serves_on_its_socket_and_is_gone_after_drop() {
    let Some(cluster) =
        PgCluster::start("a_throwaway_cluster_serves_on_its_socket_and_is_gone_after_drop")
    else {
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
