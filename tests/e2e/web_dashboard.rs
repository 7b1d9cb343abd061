//! The dashboard's JSON and actions over plain HTTP (the browser drives the page in
//! `web_browser`): actions need the token, the listener's own origin and JSON, and change
//! nothing otherwise; `env` values appear in no response; bulk "retry failed" brings failed
//! tasks back; `cairn serve` serves a queue whose daemon is stopped.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::http::{free_port, get, request, HttpAnswer};
use crate::common::*;

pub(crate) const SECRET: &str = "hunter2-not-for-any-page";

/// A daemon with `--listen` (and `--allow-actions` when `actions`) on a free loopback port:
/// the daemon, the address, and the token it printed.
pub(crate) fn start_listening(
    queue: &TestQueue,
    actions: bool,
    extra: &[&str],
) -> (Daemon, SocketAddr, String) {
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let listen_text = listen.to_string();
    let mut args = vec!["--listen", listen_text.as_str()];
    if actions {
        args.push("--allow-actions");
    }
    args.extend_from_slice(extra);
    let daemon = queue.start(&args);
    let token = wait_for("the listener's start line", DEADLINE, || {
        let stderr = daemon.stderr();
        let line = stderr
            .lines()
            .find(|l| l.contains("listening on http://"))?
            .to_string();
        Some(match line.split_once("with the token ") {
            Some((_, rest)) => rest.split_whitespace().next()?.to_string(),
            None => String::new(),
        })
    });
    wait_until("the listener answers /readyz", DEADLINE, || {
        get(listen, "/readyz").is_some_and(|a| a.status == 200)
    });
    (daemon, listen, token)
}

/// POST an action as the page does, with extra headers.
pub(crate) fn post_action(
    addr: SocketAddr,
    action: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> HttpAnswer {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request(
        addr,
        "POST",
        &format!("/api/actions/{action}"),
        &all,
        &body.to_string(),
        Duration::from_secs(60),
    )
    .expect("the listener answers")
}

/// A task whose one command fails while `flag` exists, and succeeds once it is gone.
pub(crate) fn fails_while(id: &str, flag: &std::path::Path) -> Value {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "phases": [{"name": "check", "run": ["sh", "-c", format!("test ! -e '{}'", flag.display())]}],
    })
}

fn state_of(addr: SocketAddr, id: &str) -> Option<String> {
    let status: Value = serde_json::from_str(&get(addr, "/api/status")?.body).ok()?;
    status["tasks"]
        .as_array()?
        .iter()
        .find(|t| t["id"] == id)
        .and_then(|t| t["state"].as_str().map(str::to_string))
}

#[test]
fn actions_need_the_token_and_the_same_origin_and_env_values_show_nowhere() {
    let queue = TestQueue::new();
    let mut long = loop_task("long", &queue.aux("long.side"), 1_000_000, 0.2);
    long["env"] = json!({"API_KEY": SECRET});
    queue.seed_task("long.json", &long);
    let flag = queue.aux("fail.flag");
    std::fs::write(&flag, "").unwrap();
    for id in ["bad1", "bad2"] {
        queue.seed_task(&format!("{id}.json"), &fails_while(id, &flag));
    }
    let (mut daemon, addr, token) = start_listening(&queue, true, &[]);
    assert_eq!(token.len(), 64, "{}", daemon.stderr());
    queue.wait_failed("bad1");
    queue.wait_failed("bad2");
    wait_until("long runs", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("running")
    });

    // Nothing the listener serves shows the env value; the page names the variable.
    let task = get(addr, "/api/task/long").expect("/api/task/long");
    assert_eq!(task.status, 200);
    assert!(task.body.contains("API_KEY"), "{}", task.body);
    for path in [
        "/",
        "/task/long",
        "/api/status",
        "/api/task/long",
        "/metrics",
        "/api/info",
        "/assets/app.js",
    ] {
        let answer = get(addr, path).unwrap_or_else(|| panic!("{path} answers"));
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            !answer.body.contains(SECRET),
            "{path} shows the env value: {}",
            answer.body
        );
    }

    // Refused, each for its own reason, and nothing changes.
    let pause = json!({"id": "long"});
    let refusals = [
        post_action(addr, "pause", &pause, &[]),
        post_action(
            addr,
            "pause",
            &pause,
            &[("X-Cairn-Token", "0123456789abcdef")],
        ),
        post_action(
            addr,
            "pause",
            &pause,
            &[("X-Cairn-Token", &token), ("Origin", "http://evil.example")],
        ),
        post_action(
            addr,
            "pause",
            &pause,
            &[("X-Cairn-Token", &token), ("Sec-Fetch-Site", "cross-site")],
        ),
    ];
    for answer in &refusals {
        assert_eq!(answer.status, 403, "{answer:?}");
    }
    assert!(
        refusals[2].body.contains("another origin"),
        "{:?}",
        refusals[2]
    );
    let form = request(
        addr,
        "POST",
        "/api/actions/pause",
        &[
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("X-Cairn-Token", &token),
        ],
        "id=long",
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(form.status, 415, "{form:?}");
    let by_get = get(addr, "/api/actions/pause?id=long").unwrap();
    assert_eq!(by_get.status, 405, "{by_get:?}");
    assert!(
        queue.list("control").is_empty(),
        "a refused action left a request"
    );
    let journal = std::fs::read_to_string(queue.path("runs/long/events.jsonl")).unwrap_or_default();
    assert!(!journal.contains("pause"), "{journal}");
    assert_eq!(state_of(addr, "long").as_deref(), Some("running"));

    // With the token, from the listener's own origin: taken by the daemon.
    let origin = format!("http://{addr}");
    let good: [(&str, &str); 3] = [
        ("X-Cairn-Token", &token),
        ("Origin", &origin),
        ("Sec-Fetch-Site", "same-origin"),
    ];
    let paused = post_action(addr, "pause", &pause, &good);
    assert_eq!(paused.status, 200, "{paused:?}");
    wait_until("long is paused", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("paused")
    });
    let resumed = post_action(addr, "resume", &pause, &good);
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_until("long runs again", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("running")
    });

    // Bulk: every task of long's submitter paused, then resumed.
    let status: Value = serde_json::from_str(&get(addr, "/api/status").unwrap().body).unwrap();
    let long_row = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "long")
        .unwrap();
    let submitter = long_row["submitted_by"]["user"]
        .as_str()
        .expect("a submitter name")
        .to_string();
    let by = json!({"submitter": submitter});
    let paused = post_action(addr, "pause-submitter", &by, &good);
    assert_eq!(paused.status, 200, "{paused:?}");
    wait_until("the submitter's task is paused", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("paused")
    });
    let resumed = post_action(addr, "resume-submitter", &by, &good);
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_until("the submitter's task runs again", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("running")
    });

    // Bulk: every failed task back, and now they pass.
    std::fs::remove_file(&flag).unwrap();
    let retried = post_action(addr, "retry-failed", &json!({}), &good);
    assert_eq!(retried.status, 200, "{retried:?}");
    assert!(retried.body.contains("2 task(s)"), "{retried:?}");
    for id in ["bad1", "bad2"] {
        wait_until(&format!("{id} is done after the retry"), DEADLINE, || {
            queue.done(id).is_some()
        });
    }

    // A fork with a merge patch: a new task from long's checkpoint.
    let forked = post_action(
        addr,
        "fork",
        &json!({"id": "long", "as": "long-fork", "patch": "{\"extra\": 1}"}),
        &good,
    );
    assert_eq!(forked.status, 200, "{forked:?}");
    assert!(forked.body.contains("long-fork"), "{forked:?}");
    wait_until("the fork is taken in", DEADLINE, || {
        state_of(addr, "long-fork").is_some()
    });

    // A spending limit set from the page (last: `long` reports no cost, so any limit ends it,
    // failing closed).
    let limit = post_action(
        addr,
        "budget",
        &json!({"id": "long", "max_cost": 5.5}),
        &good,
    );
    assert_eq!(limit.status, 200, "{limit:?}");
    assert!(limit.body.contains("spending limit is set"), "{limit:?}");
    let refused = post_action(
        addr,
        "budget",
        &json!({"id": "long", "max_cost": -1}),
        &good,
    );
    assert_eq!(refused.status, 409, "{refused:?}");
    wait_until("the limit is in force", DEADLINE, || {
        let status: Value = serde_json::from_str(&get(addr, "/api/status").unwrap().body).unwrap();
        status["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == "long" && t["max_cost"] == 5.5)
    });

    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

#[test]
fn a_read_only_listener_refuses_every_action() {
    let queue = TestQueue::new();
    queue.seed_task(
        "long.json",
        &loop_task("long", &queue.aux("long.side"), 1_000_000, 0.2),
    );
    let (mut daemon, addr, token) = start_listening(&queue, false, &[]);
    assert!(token.is_empty());
    assert!(daemon.stderr().contains("read-only"), "{}", daemon.stderr());
    wait_until("long runs", DEADLINE, || {
        state_of(addr, "long").as_deref() == Some("running")
    });
    let answer = post_action(
        addr,
        "pause",
        &json!({"id": "long"}),
        &[("X-Cairn-Token", "anything-at-all-0123")],
    );
    assert_eq!(answer.status, 403, "{answer:?}");
    assert!(answer.body.contains("read-only"), "{answer:?}");
    assert!(queue.list("control").is_empty());
    daemon.signal(SIGTERM);
    daemon.wait_exit(DEADLINE);
}

#[test]
fn cairn_serve_shows_a_queue_whose_daemon_is_stopped() {
    let queue = TestQueue::new();
    for id in ["a", "b"] {
        queue.seed_task(
            &format!("{id}.json"),
            &loop_task(id, &queue.aux(&format!("{id}.side")), 2, 0.0),
        );
    }
    queue.run_until_idle(&[]);
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let stderr = std::fs::File::create(queue.aux("serve.stderr")).unwrap();
    let serve = queue
        .cairn()
        .args(["serve", "--listen", &listen.to_string()])
        .stdin(std::process::Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("cairn serve");
    let serve = ChildGuard(serve);
    wait_until("cairn serve answers", DEADLINE, || {
        get(listen, "/healthz").is_some_and(|a| a.status == 200)
    });
    assert_eq!(state_of(listen, "a").as_deref(), Some("done"));
    let metrics = get(listen, "/metrics").unwrap().body;
    assert!(
        metrics.contains("cairn_queue_tasks{state=\"done\"} 2"),
        "{metrics}"
    );
    let task: Value = serde_json::from_str(&get(listen, "/api/task/a").unwrap().body).unwrap();
    assert_eq!(task["state"], "done");
    assert_eq!(get(listen, "/api/task/nope").unwrap().status, 404);
    drop(serve);
}

/// A child process killed and reaped when the test ends.
pub(crate) struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
