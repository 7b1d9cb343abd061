//! `cairn run --run-as-submitter`: each task's commands run as the user who submitted it, who
//! cannot touch another submitter's task; a daemon that cannot switch users refuses to start.

use crate::common::*;

#[test]
fn a_daemon_that_cannot_switch_users_refuses_to_start_and_says_what_it_needs() {
    let queue = TestQueue::new();
    // As root, the capabilities are taken away (setpriv); as anyone else there are none.
    let wrapper: &[&str] = if nix::unistd::geteuid().is_root() {
        &[
            "setpriv",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ]
    } else {
        &[]
    };
    if !wrapper.is_empty()
        && require_tool(
            "a_daemon_that_cannot_switch_users_refuses_to_start_and_says_what_it_needs",
            "setpriv",
            "util-linux",
        )
        .is_none()
    {
        return;
    }
    let mut daemon = queue.start_wrapped(wrapper, &["--run-as-submitter"]);
    let status = daemon.wait_exit(std::time::Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "{}", daemon.stderr());
    let stderr = daemon.stderr();
    for needed in ["CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"] {
        assert!(stderr.contains(needed), "{needed} is not named: {stderr}");
    }
    assert!(
        queue.list("tasks").is_empty(),
        "it worked on the queue before refusing"
    );
}

/// `cairn --queue <queue> <args>` run as `user` (its uid, the group's gid and its groups), with
/// `stdin` as its input.
pub(crate) fn cairn_as(
    queue: &TestQueue,
    users: &SystemUsers,
    user: &SystemUser,
    args: &[&str],
    stdin: &[u8],
) -> std::process::Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", users.gid))
        .arg("--init-groups")
        .arg(env!("CARGO_BIN_EXE_cairn"))
        .arg("--queue")
        .arg(queue.root())
        .args(args)
        .env_remove("CAIRN_QUEUE")
        .env_remove("RUST_LOG")
        .env("CAIRN_WAIT", crate::common::DAEMON_WAIT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting cairn as another user");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().expect("waiting for cairn")
}

/// Set a path's owner, group and mode.
/// Set a queue up as `docs/service.md` shares it with a group `gid`: the members reach it
/// through a parent only root may change, the queue `0750` of `uid` and `gid`, `inbox/` and
/// `control/` `3770` shared with the group.
pub(crate) fn share_with_group(queue: &TestQueue, uid: u32, gid: u32) {
    own(queue.aux("").as_path(), 0, 0, 0o755);
    own(queue.root(), uid, gid, 0o750);
    for shared in ["inbox", "control"] {
        let dir = queue.path(shared);
        std::fs::create_dir_all(&dir).unwrap();
        own(&dir, uid, gid, 0o3770);
    }
}

pub(crate) fn own(path: &std::path::Path, uid: u32, gid: u32, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Members of a submit group share a queue set up as `docs/service.md` says (the queue `0750`
/// of the daemon's user and group, `inbox/` and `control/` `3770` shared with the group); the
/// daemon runs as root with `--run-as-submitter --operators-group`. Each task runs as its
/// submitter; another member's task cannot write its checkpoint or definition, and that
/// member's steering requests are refused, while the operator's and the submitter's are
/// honoured; the submitter is named in the record, `status` and `show`.
#[test]
fn each_submitter_s_task_runs_as_them_and_only_they_may_steer_it() {
    const TEST: &str = "each_submitter_s_task_runs_as_them_and_only_they_may_steer_it";
    if !require_root(TEST, "it creates users and runs tasks as them")
        || require_tool(TEST, "setpriv", "util-linux").is_none()
        || require_tool(TEST, "useradd", "passwd").is_none()
    {
        return;
    }
    let mut users = SystemUsers::create(&["a", "b", "c"]);
    let carol = users.users[2].clone();
    let (operators, _) = users.add_group("ops", &[&carol]);
    let (alice, bob) = (&users.users[0], &users.users[1]);
    let gid = users.gid;

    let queue = TestQueue::new();
    // The members reach the queue through its parent, which only root may change.
    // (`cairn submit` also opens it, to make its writes durable up the tree.)
    share_with_group(&queue, 0, gid);
    // The daemon's group is the queue's (as the user cairn's group cairn is in the service):
    // what it creates, its members may read.
    let mut daemon = queue.start_wrapped(
        &["setpriv", &format!("--regid={gid}"), "--clear-groups"],
        &["--run-as-submitter", "--operators-group", &operators],
    );

    let fixture = fixture("logging_loop.py");
    let fixture = fixture.to_str().unwrap();
    // Alice's task: who it runs as, then a loop slow enough to be steered while it runs.
    let alice_task = serde_json::json!({
        "id": "alice-job",
        "phases": [
            {"name": "who", "run": ["sh", "-c", "printf '{\"uid\": %s}' \"$(id -u)\""]},
            {"name": "count", "kind": "loop", "max_iterations": 20, "run": [
                "sh", "-c", "exec python3 \"$0\" \"$CAIRN_SCRATCH/side\" --sleep 1", fixture,
            ]},
        ],
    });
    let submitted = cairn_as(
        &queue,
        &users,
        alice,
        &["submit", "-"],
        alice_task.to_string().as_bytes(),
    );
    assert!(
        submitted.status.success(),
        "alice's submit: {}",
        stderr_of(&submitted)
    );
    wait_until("alice's task to have a checkpoint", DEADLINE, || {
        queue.path("incremental/alice-job.json.gz").exists()
    });
    let checkpoint_before = std::fs::read(queue.path("incremental/alice-job.json.gz")).unwrap();
    let definition_before = std::fs::read(queue.path("tasks/alice-job.json")).unwrap();

    // Bob's task: who it runs as, then an attempt on Alice's checkpoint and definition.
    let attack = r#"
        try() { if printf forged >> "$1" 2>/dev/null; then echo written; else echo refused; fi; }
        printf '{"checkpoint": "%s", "definition": "%s", "new_checkpoint": "%s"}' \
            "$(try incremental/alice-job.json.gz)" "$(try tasks/alice-job.json)" \
            "$(try incremental/alice-job.forged)"
    "#;
    let bob_task = serde_json::json!({
        "id": "bob-job",
        "phases": [
            {"name": "who", "run": ["sh", "-c", "printf '{\"uid\": %s}' \"$(id -u)\""]},
            {"name": "attack", "run": ["sh", "-c", attack]},
        ],
    });
    let submitted = cairn_as(
        &queue,
        &users,
        bob,
        &["submit", "-"],
        bob_task.to_string().as_bytes(),
    );
    assert!(
        submitted.status.success(),
        "bob's submit: {}",
        stderr_of(&submitted)
    );
    let bob_done = queue.wait_done("bob-job");
    assert_eq!(
        bob_done["phase_outputs"]["who"]["uid"], bob.uid,
        "{bob_done:#}"
    );
    assert_eq!(
        bob_done["result"],
        serde_json::json!({"checkpoint": "refused", "definition": "refused", "new_checkpoint": "refused"}),
        "{bob_done:#}"
    );
    assert_eq!(bob_done["submitted_by"]["uid"], bob.uid, "{bob_done:#}");

    // Bob may not steer Alice's task (nor set its spending limit): each request is refused,
    // and he is told why.
    assert!(
        queue.done("alice-job").is_none(),
        "alice's task ended too soon to be steered"
    );
    let requests: [&[&str]; 3] = [
        &["cancel", "alice-job"],
        &["pause", "alice-job"],
        &["budget", "alice-job", "--max-cost", "100"],
    ];
    for request in requests {
        let action = request[0];
        let out = cairn_as(&queue, &users, bob, request, b"");
        let stderr = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "bob's {action}: {stderr}");
        assert!(
            stderr.contains("refused the request for alice-job")
                && stderr.contains(&format!("{} (uid {}) may not steer it", bob.name, bob.uid))
                && stderr.contains(&alice.name)
                && stderr.contains(&format!("operators' group {operators}")),
            "bob's {action}: {stderr}"
        );
    }
    let journal = std::fs::read_to_string(queue.path("runs/alice-job/events.jsonl")).unwrap();
    let refusals = journal
        .lines()
        .filter(|l| l.contains("\"control_refused\"") && l.contains("may not steer it"))
        .count();
    assert_eq!(refusals, 3, "{journal}");
    assert!(!journal.contains("\"budget_set\""), "{journal}");
    assert!(
        journal
            .lines()
            .next()
            .unwrap()
            .contains(&format!("\"uid\":{}", alice.uid)),
        "{journal}"
    );
    // Carol, an operator, may: her pause is taken (whether it lands before the loop ends or
    // not); Alice, the submitter, may too: her resume brings the task back if it did.
    let out = cairn_as(&queue, &users, &carol, &["pause", "alice-job"], b"");
    assert!(out.status.success(), "carol's pause: {}", stderr_of(&out));
    let paused = wait_for("alice's task to be paused or done", DEADLINE, || {
        let status = queue
            .active_entry("alice-job")
            .and_then(|e| e["status"].as_str().map(str::to_string));
        match status.as_deref() {
            Some("paused") => Some(true),
            _ if queue.done("alice-job").is_some() => Some(false),
            _ => None,
        }
    });
    if paused {
        let out = cairn_as(&queue, &users, alice, &["resume", "alice-job"], b"");
        assert!(out.status.success(), "alice's resume: {}", stderr_of(&out));
    } else {
        eprintln!("{TEST}: the loop ended before the pause landed; alice's resume is not tried");
    }

    let alice_done = queue.wait_done("alice-job");
    assert_eq!(
        alice_done["phase_outputs"]["who"]["uid"], alice.uid,
        "{alice_done:#}"
    );
    assert_eq!(alice_done["result"], loop_result(20), "{alice_done:#}");
    assert_eq!(
        alice_done["submitted_by"]["uid"], alice.uid,
        "{alice_done:#}"
    );
    assert_eq!(
        alice_done["submitted_by"]["user"],
        alice.name.as_str(),
        "{alice_done:#}"
    );
    let definition_after = std::fs::read(queue.path("tasks/alice-job.json")).unwrap();
    assert_eq!(
        definition_after, definition_before,
        "alice's definition was changed"
    );
    assert!(
        !String::from_utf8_lossy(&checkpoint_before).contains("forged")
            && !queue.path("incremental/alice-job.forged").exists(),
        "a checkpoint was forged"
    );

    // status and show name the submitter.
    let status = queue.cairn_output(&["status", "--json"], b"");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let alice_status = status["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "alice-job")
        .unwrap_or_else(|| panic!("no alice-job in {status:#}"));
    assert_eq!(
        alice_status["submitted_by"],
        serde_json::json!({"uid": alice.uid, "user": alice.name}),
        "{status:#}"
    );
    let show = queue.cairn_output(&["show", "alice-job", "--json"], b"");
    let show: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(show["submitted_by"]["uid"], alice.uid, "{show:#}");
    assert_eq!(
        show["submitted_by"]["user"],
        alice.name.as_str(),
        "{show:#}"
    );
    let table = stdout_of(&queue.cairn_output(&["status"], b""));
    let row = table
        .lines()
        .find(|l| l.starts_with("alice-job"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(row.ends_with(&alice.name), "{table}");

    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "{}", daemon.stderr());
}

#[test]
fn operators_group_needs_run_as_submitter_and_an_existing_group() {
    let queue = TestQueue::new();
    let alone = queue.cairn_output(&["run", "--operators-group", "root"], b"");
    assert_eq!(alone.status.code(), Some(2), "{}", stderr_of(&alone));
    assert!(
        stderr_of(&alone).contains("--run-as-submitter"),
        "{}",
        stderr_of(&alone)
    );
    let missing = "cairn-no-such-group";
    let unknown = queue.cairn_output(
        &["run", "--run-as-submitter", "--operators-group", missing],
        b"",
    );
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr_of(&unknown));
    assert!(
        stderr_of(&unknown).contains(&format!("there is no group {missing:?}")),
        "{}",
        stderr_of(&unknown)
    );
    assert!(
        queue.list("tasks").is_empty(),
        "it worked on the queue before refusing"
    );
}

/// The capabilities `systemd/run-as-submitter.conf` gives the daemon (`AmbientCapabilities=`,
/// which its `CapabilityBoundingSet=` matches), as setpriv names them: `setuid`, `chown`, ...
fn drop_in_capabilities() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/run-as-submitter.conf");
    let text = std::fs::read_to_string(path).unwrap();
    let value = |key: &str| -> Vec<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{path} has no {key}="))
            .split_whitespace()
            .map(|cap| cap.trim_start_matches("CAP_").to_ascii_lowercase())
            .collect()
    };
    let ambient = value("AmbientCapabilities");
    assert_eq!(ambient, value("CapabilityBoundingSet"), "{path}");
    ambient
}

/// The daemon as the shipped drop-in runs it: its own user, with exactly the drop-in's
/// capabilities (ambient, inheritable and the bounding set), started by setpriv as systemd
/// would. A task submitted by another user runs as them and completes, twice (the second
/// attempt finds the scratch directory handed over by the first).
#[test]
fn the_shipped_drop_in_s_capabilities_run_a_task_as_its_submitter() {
    const TEST: &str = "the_shipped_drop_in_s_capabilities_run_a_task_as_its_submitter";
    if !require_root(TEST, "it creates users and runs the daemon as one of them")
        || require_tool(TEST, "setpriv", "util-linux").is_none()
        || require_tool(TEST, "useradd", "passwd").is_none()
    {
        return;
    }
    let users = SystemUsers::create(&["d", "a"]);
    let (daemon_user, alice) = (&users.users[0], &users.users[1]);
    let gid = users.gid;
    let queue = TestQueue::new();
    share_with_group(&queue, daemon_user.uid, gid);
    let caps = drop_in_capabilities();
    let plus = |caps: &[String]| {
        caps.iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let wrapper = [
        "setpriv".to_string(),
        format!("--reuid={}", daemon_user.uid),
        format!("--regid={gid}"),
        "--clear-groups".to_string(),
        format!("--inh-caps=-all,{}", plus(&caps)),
        format!("--ambient-caps=-all,{}", plus(&caps)),
        format!("--bounding-set=-all,{}", plus(&caps)),
    ];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut daemon = queue.start_wrapped(&wrapper, &["--run-as-submitter"]);

    // Fails its first attempt (after leaving a file in its scratch directory), then completes.
    let task = serde_json::json!({
        "id": "alice-job",
        "retry": {"max_attempts": 2, "backoff": "1s"},
        "phases": [{"name": "who", "run": ["sh", "-c",
            "if [ -e \"$CAIRN_SCRATCH/tried\" ]; then printf '{\"uid\": %s}' \"$(id -u)\"; \
             else touch \"$CAIRN_SCRATCH/tried\"; exit 1; fi"]}],
    });
    let submitted = cairn_as(
        &queue,
        &users,
        alice,
        &["submit", "-"],
        task.to_string().as_bytes(),
    );
    assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    let done = queue.wait_done("alice-job");
    assert_eq!(done["result"]["uid"], alice.uid, "{done:#}");
    assert_eq!(done["attempts"], 2, "{done:#}");

    daemon.signal(SIGTERM);
    let status = daemon.wait_exit(DEADLINE);
    assert_eq!(status.code(), Some(0), "{}", daemon.stderr());
}
