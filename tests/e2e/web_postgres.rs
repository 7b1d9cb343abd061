//! The listener with a queue shared in a real, throwaway PostgreSQL: a daemon's `/readyz`
//! answers 503 while it cannot yet open the queue (the server is stopped with SIGSTOP), and 200
//! once it has; `cairn serve --db` shows every node's tasks with their node, and counts them;
//! and in chromium, the dashboard of `cairn serve --db` over two daemons follows and steers
//! the shared queue (iterations advance without a reload, pause pauses the task in the
//! database, the bulk retry brings two failed tasks back, a task page decodes the checkpoint
//! kept in the database; `env` values nowhere).

use std::net::SocketAddr;
use std::process::Stdio;

use nix::sys::signal::Signal::{SIGCONT, SIGSTOP};
use serde_json::Value;

use crate::common::http::{free_port, get};
use crate::common::postgres::{query_texts, submit_task, PgCluster};
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

/// A task's state in the shared queue, as its row holds it (on a thread of its own: the
/// browser's steps call it from inside their runtime).
fn db_state(url: &str, id: &str) -> Option<String> {
    let (url, id) = (url.to_string(), id.to_string());
    std::thread::spawn(move || {
        query_texts(&url, "SELECT state FROM cairn_tasks WHERE id = $1", &[&id])
            .into_iter()
            .next()?
            .into_iter()
            .next()?
    })
    .join()
    .expect("the query's thread")
}

#[test]
fn the_dashboard_of_serve_db_in_chromium_steers_two_daemons() {
    let test = "the_dashboard_of_serve_db_in_chromium_steers_two_daemons";
    if require_tool(test, "chromium", "chromium").is_none()
        || require_tool(test, "chromedriver", "chromium-driver").is_none()
    {
        return;
    }
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.create_database("webui");
    let side = TestQueue::new();
    for n in 0..4 {
        let id = format!("long{n}");
        let mut task = loop_task(&id, &side.aux(&format!("{id}.side")), 1_000_000, 0.3);
        task["env"] = serde_json::json!({"API_KEY": crate::web_dashboard::SECRET});
        submit_task(&url, &task);
    }
    let flag = side.aux("fail.flag");
    std::fs::write(&flag, "").unwrap();
    for id in ["bad1", "bad2"] {
        submit_task(&url, &crate::web_dashboard::fails_while(id, &flag));
    }
    let (a_queue, b_queue) = (TestQueue::new(), TestQueue::new());
    let mut a = a_queue.start(&["--db", &url, "--node", "a", "--max-tasks", "3"]);
    let mut b = b_queue.start(&["--db", &url, "--node", "b", "--max-tasks", "3"]);
    for id in ["bad1", "bad2"] {
        wait_until(&format!("{id} fails"), DEADLINE, || {
            db_state(&url, id).as_deref() == Some("failed")
        });
    }

    let token = "a-token-for-the-test-0123456789";
    let token_file = side.aux("web-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(
        &token_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let serve_listen = loopback();
    let watcher = TestQueue::new();
    let serve = ChildGuard(
        watcher
            .cairn()
            .args(["serve", "--db", &url, "--listen", &serve_listen.to_string()])
            .arg("--allow-actions")
            .arg("--token-file")
            .arg(&token_file)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("cairn serve --db"),
    );
    wait_until("cairn serve answers", DEADLINE, || {
        get(serve_listen, "/healthz").is_some()
    });
    let ran = crate::web_browser::in_chromium(test, &side, |client| {
        let (url, flag) = (&url, &flag);
        async move { steer_shared_queue(&client, serve_listen, token, url, flag).await }
    });
    drop(serve);
    for daemon in [&mut a, &mut b] {
        daemon.signal(SIGTERM);
        daemon.wait_exit(DEADLINE);
    }
    assert!(ran, "chromium was found above");
}

/// What the test does in the browser, on the page of `cairn serve --db`.
async fn steer_shared_queue(
    client: &fantoccini::Client,
    serve: SocketAddr,
    token: &str,
    url: &str,
    flag: &std::path::Path,
) {
    use crate::web_browser::{click, eventually, shown_iteration, text_of};
    client
        .goto(&format!("http://{serve}/#token={token}"))
        .await
        .expect("opening the dashboard");
    // Every node's tasks, each with its node; an iteration advances without a reload.
    let nodes = eventually("the page shows the tasks of both nodes", || async {
        let mut nodes = Vec::new();
        for n in 0..4 {
            nodes.push(text_of(client, &format!("tr[data-id='long{n}'] td:nth-child(11)")).await?);
        }
        nodes.sort();
        nodes.dedup();
        (nodes == ["a", "b"]).then_some(nodes)
    })
    .await;
    assert_eq!(nodes, ["a", "b"]);
    let first = eventually("the page shows long1's iteration", || {
        shown_iteration(client, "long1")
    })
    .await;
    client
        .execute("window.notReloaded = true;", vec![])
        .await
        .unwrap();
    eventually("long1's iteration advances on the page", || async {
        shown_iteration(client, "long1")
            .await
            .filter(|n| *n > first)
    })
    .await;

    // Pause, pressed on the page, pauses the task in the shared queue.
    click(client, "tr[data-id='long0'] button[data-action='pause']").await;
    eventually("long0 is paused in the database", || async {
        (db_state(url, "long0").as_deref() == Some("paused")).then_some(())
    })
    .await;

    // The bulk retry brings both failed tasks back; they pass now.
    std::fs::remove_file(flag).unwrap();
    click(client, "#bulk-retry-failed").await;
    for id in ["bad1", "bad2"] {
        eventually(&format!("{id} is done after the retry"), || async {
            (db_state(url, id).as_deref() == Some("done")).then_some(())
        })
        .await;
    }
    let same_page = client
        .execute("return window.notReloaded === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same_page, serde_json::json!(true), "the page was reloaded");

    // A task page decodes the checkpoint the database keeps.
    client
        .goto(&format!("http://{serve}/task/long1"))
        .await
        .unwrap();
    let state = eventually("the task page shows the decoded checkpoint", || async {
        text_of(client, ".checkpoint-state")
            .await
            .filter(|t| t.contains("\"seen\""))
    })
    .await;
    assert!(state.contains("\"sum\""), "{state}");
    let shown = client.source().await.unwrap();
    assert!(
        !shown.contains(crate::web_dashboard::SECRET),
        "an env value is shown"
    );
}
