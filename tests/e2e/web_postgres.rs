//! The listener with a queue shared in a real, throwaway PostgreSQL: a daemon's `/readyz`
//! answers 503 while it cannot yet open the queue (the server is stopped with SIGSTOP), and 200
//! once it has; `cairn serve --db` shows every node's tasks with their node, and counts them.

use std::net::SocketAddr;
use std::process::Stdio;

use nix::sys::signal::Signal::{SIGCONT, SIGSTOP};
use serde_json::Value;

use crate::common::http::{free_port, get};
use crate::common::postgres::{submit_task, PgCluster};
use crate::common::*;
use crate::web_dashboard::ChildGuard;

/// The server's postmaster stopped, continued when the test ends however it ends.
struct Stopped(i32);

impl Stopped {
    fn stop(pid: i32) -> Stopped {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.0), SIGCONT);
    }
}

fn loopback() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

#[test]
fn readyz_waits_for_the_shared_queue_and_serve_shows_every_nodes_tasks() {
    let test = "readyz_waits_for_the_shared_queue_and_serve_shows_every_nodes_tasks";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.create_database("web");
    let side = TestQueue::new();
    for n in 0..4 {
        let id = format!("long{n}");
        submit_task(
            &url,
            &loop_task(&id, &side.aux(&format!("{id}.side")), 1_000_000, 0.2),
        );
    }

    // Daemon a starts while the database does not answer: not ready, yet alive.
    let a_queue = TestQueue::new();
    let a_listen = loopback();
    let stopped = Stopped::stop(pg.postmaster_pid());
    let a_text = a_listen.to_string();
    let mut a = a_queue.start(&[
        "--db",
        &url,
        "--node",
        "a",
        "--max-tasks",
        "2",
        "--listen",
        &a_text,
    ]);
    wait_until("daemon a's listener answers", DEADLINE, || {
        get(a_listen, "/healthz").is_some()
    });
    let ready = get(a_listen, "/readyz").expect("/readyz answers");
    assert_eq!(ready.status, 503, "{ready:?}");
    assert_eq!(get(a_listen, "/healthz").unwrap().status, 200);
    drop(stopped);
    wait_until(
        "daemon a is ready once the database answers",
        DEADLINE,
        || get(a_listen, "/readyz").is_some_and(|r| r.status == 200),
    );

    let b_queue = TestQueue::new();
    let mut b = b_queue.start(&["--db", &url, "--node", "b", "--max-tasks", "2"]);

    let serve_listen = loopback();
    let watcher = TestQueue::new();
    let serve = ChildGuard(
        watcher
            .cairn()
            .args(["serve", "--db", &url, "--listen", &serve_listen.to_string()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cairn serve --db"),
    );
    let mut nodes = Vec::new();
    wait_until(
        "cairn serve shows four tasks running on a and b",
        DEADLINE,
        || {
            let Some(answer) = get(serve_listen, "/api/status") else {
                return false;
            };
            let Ok(status) = serde_json::from_str::<Value>(&answer.body) else {
                return false;
            };
            let running: Vec<&Value> = status["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|t| t["state"] == "running")
                .collect();
            nodes = running
                .iter()
                .filter_map(|t| t["node"].as_str().map(str::to_string))
                .collect();
            nodes.sort();
            running.len() == 4 && nodes == ["a", "a", "b", "b"]
        },
    );
    let metrics = get(serve_listen, "/metrics").unwrap().body;
    assert!(
        metrics.contains("cairn_queue_tasks{state=\"running\"} 4"),
        "{metrics}"
    );
    assert!(metrics.contains("cairn_queue_nodes_alive 2"), "{metrics}");
    // Daemon a's own metrics count what a holds.
    let mut own = String::new();
    wait_until(
        "daemon a's metrics count its two tasks and leases",
        DEADLINE,
        || {
            own = get(a_listen, "/metrics")
                .map(|a| a.body)
                .unwrap_or_default();
            own.contains("cairn_tasks{state=\"running\"} 2") && own.contains("cairn_leases_held 2")
        },
    );
    assert!(own.contains("cairn_ready 1"), "{own}");
    drop(serve);
    for daemon in [&mut a, &mut b] {
        daemon.signal(SIGTERM);
        daemon.wait_exit(DEADLINE);
    }
}
