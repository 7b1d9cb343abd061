//! A shared PostgreSQL queue whose daemons run tasks as their submitters: the database vouches
//! for who submitted each task (the session's role, mapped to a local user by `cairn db grant`),
//! never what the row says. A submitter role that forges `"submitted_by": {"uid": 0}` gets its
//! own mapped user, an unmapped role gets nothing run, and neither may rewrite another's rows,
//! the mapping or a steering decision; without the roles a daemon refuses to start.

use std::time::Duration;

use serde_json::json;

use crate::common::postgres::{cairn_db, final_record, query_texts, PgCluster};
use crate::common::SystemUsers;
use crate::common::{require_root, require_tool, stderr_of, wait_until, TestQueue, DEADLINE};
use crate::run_as_submitter::own;

/// The connection string of `cluster` as `role`.
fn url_as(cluster: &PgCluster, role: &str) -> String {
    format!(
        "postgresql:///postgres?host={}&user={role}",
        cluster.dir().display()
    )
}

/// Run `statement` on a connection of its own; the database's error as text.
fn try_execute(url: &str, statement: &str) -> Result<u64, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connecting to the test cluster");
        tokio::spawn(connection);
        client
            .execute(statement, &[])
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => db.message().to_string(),
                None => e.to_string(),
            })
    })
}

/// `cairn db ARGS` with `url`, which must succeed.
fn cairn_db_ok(url: &str, args: &[&str]) {
    let output = cairn_db(url, args).output().unwrap();
    assert!(
        output.status.success(),
        "cairn {args:?}: {}",
        stderr_of(&output)
    );
}

/// A one-phase task that reports the uid it ran as, naming `submitted_by` as given.
fn who_am_i(id: &str, submitted_by: serde_json::Value) -> String {
    json!({
        "id": id,
        "retry": {"max_attempts": 1},
        "submitted_by": submitted_by,
        "phases": [{"name": "who", "run": ["sh", "-c", "printf '{\"uid\": %s}' \"$(id -u)\""]}],
    })
    .to_string()
}

fn insert_task(url: &str, id: &str, definition: &str) -> Result<u64, String> {
    try_execute(
        url,
        &format!(
            "INSERT INTO cairn_tasks (id, crash_limit, definition) VALUES ('{id}', 3, '{}')",
            definition.replace('\'', "''")
        ),
    )
}

#[test]
fn a_forged_submitter_in_a_row_runs_as_the_role_s_mapped_user_or_not_at_all() {
    const TEST: &str = "a_forged_submitter_in_a_row_runs_as_the_role_s_mapped_user_or_not_at_all";
    if !require_root(TEST, "it creates users and runs tasks as them")
        || require_tool(TEST, "useradd", "passwd").is_none()
        || require_tool(TEST, "setpriv", "util-linux").is_none()
    {
        return;
    }
    let Some(cluster) = PgCluster::start(TEST) else {
        return;
    };
    let owner = cluster.url();
    let users = SystemUsers::create(&["a", "b"]);
    let (alice, bob) = (&users.users[0], &users.users[1]);
    cairn_db_ok(&owner, &["db", "migrate"]);
    for role in ["daemon_r", "alice_r", "bob_r", "mallory_r"] {
        query_texts(&owner, &format!("CREATE ROLE {role} LOGIN"), &[]);
    }

    // Without the roles set up, a daemon that would run tasks as their submitters refuses.
    let queue = TestQueue::new();
    let refused = queue.cairn_output(
        &[
            "run",
            "--db",
            &owner,
            "--run-as-submitter",
            "--exit-when-idle",
        ],
        b"",
    );
    let said = stderr_of(&refused);
    assert!(!refused.status.success(), "it started: {said}");
    assert!(
        said.contains("not registered as a daemon") && said.contains("cairn db grant daemon"),
        "the refusal says what to set up: {said}"
    );

    cairn_db_ok(&owner, &["db", "grant", "daemon", "daemon_r"]);
    cairn_db_ok(
        &owner,
        &["db", "grant", "submitter", "alice_r", "--user", &alice.name],
    );
    cairn_db_ok(
        &owner,
        &["db", "grant", "submitter", "bob_r", "--user", &bob.name],
    );
    // Mallory may insert tasks but is mapped to nobody.
    query_texts(
        &owner,
        "GRANT SELECT, INSERT ON cairn_tasks, cairn_control TO mallory_r",
        &[],
    );
    query_texts(
        &owner,
        "GRANT USAGE ON SEQUENCE cairn_control_id_seq TO mallory_r",
        &[],
    );
    let (alice_url, bob_url, mallory_url) = (
        url_as(&cluster, "alice_r"),
        url_as(&cluster, "bob_r"),
        url_as(&cluster, "mallory_r"),
    );

    // The review's reproduction: a row that says root submitted it.
    let root = json!({"uid": 0, "user": "root"});
    insert_task(&alice_url, "forged", &who_am_i("forged", root.clone())).unwrap();
    insert_task(
        &mallory_url,
        "unmapped",
        &who_am_i("unmapped", root.clone()),
    )
    .unwrap();
    insert_task(
        &bob_url,
        "bobs",
        &who_am_i("bobs", json!({"uid": alice.uid})),
    )
    .unwrap();
    // A submitter cannot name another role as the row's submitter: the database stamps it.
    try_execute(
        &alice_url,
        "INSERT INTO cairn_tasks (id, crash_limit, definition, submitted_role)
         VALUES ('stamped', 3, '{}', 'daemon_r')",
    )
    .unwrap();
    let stamped = query_texts(
        &owner,
        "SELECT submitted_role FROM cairn_tasks WHERE id = 'stamped'",
        &[],
    );
    assert_eq!(stamped[0][0].as_deref(), Some("alice_r"));
    query_texts(&owner, "DELETE FROM cairn_tasks WHERE id = 'stamped'", &[]);
    // Nor write another's row, its own once inserted, the mapping, or a request's outcome.
    for (statement, what) in [
        (
            "UPDATE cairn_tasks SET definition = '{}' WHERE id = 'bobs'",
            "bob's task",
        ),
        (
            "UPDATE cairn_tasks SET priority = 9 WHERE id = 'forged'",
            "its own task",
        ),
        ("DELETE FROM cairn_tasks WHERE id = 'bobs'", "bob's task"),
        (
            "INSERT INTO cairn_roles (role, kind) VALUES ('alice_r', 'daemon')",
            "the mapping",
        ),
        (
            "UPDATE cairn_roles SET local_user = 'root' WHERE role = 'alice_r'",
            "the mapping",
        ),
        (
            "UPDATE cairn_control SET outcome = 'applied'",
            "the requests",
        ),
    ] {
        let result = try_execute(&alice_url, statement);
        assert!(
            result.is_err(),
            "alice_r could write {what}: {statement} -> {result:?}"
        );
    }
    // `cairn submit --db` works as a submitter's role, and records who the database says.
    let submitted = cairn_db(&alice_url, &["submit", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let task = json!({"id": "viacli", "phases": [{"name": "who", "run":
                ["sh", "-c", "printf '{\"uid\": %s}' \"$(id -u)\""]}]});
            child
                .stdin
                .take()
                .unwrap()
                .write_all(task.to_string().as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    // A submitter reads only its own tasks.
    let seen = query_texts(&alice_url, "SELECT id FROM cairn_tasks ORDER BY id", &[]);
    assert_eq!(
        seen,
        vec![
            vec![Some("forged".to_string())],
            vec![Some("viacli".to_string())]
        ]
    );

    // The daemon, as its own role, runs every task as the submitter the database vouches for.
    // As `docs/service.md` sets a queue up: its submitters reach their scratch directories
    // through the daemon's group.
    let gid = users.gid;
    own(queue.aux("").as_path(), 0, 0, 0o755);
    own(queue.root(), 0, gid, 0o750);
    // The daemon's role creates nothing; TLS as libpq names it is accepted (a Unix socket
    // has none, as with libpq).
    let daemon_may_create = query_texts(
        &owner,
        "SELECT has_schema_privilege('daemon_r', current_schema(), 'CREATE')::text",
        &[],
    );
    assert_eq!(daemon_may_create[0][0].as_deref(), Some("false"));
    let daemon_url = format!("{}&sslmode=verify-full", url_as(&cluster, "daemon_r"));
    let mut daemon = queue.start_wrapped(
        &["setpriv", &format!("--regid={gid}"), "--clear-groups"],
        &["--db", &daemon_url, "--run-as-submitter", "--node", "n1"],
    );
    let mut records = std::collections::BTreeMap::new();
    wait_until("every task has its record", DEADLINE, || {
        for id in ["forged", "unmapped", "bobs", "viacli"] {
            if let Some(record) = final_record(&owner, id) {
                records.insert(id, record);
            }
        }
        records.len() == 4
    });
    assert_eq!(
        records["forged"]["result"]["uid"], alice.uid,
        "alice's forged root row ran as alice: {}",
        records["forged"]
    );
    assert_eq!(
        records["bobs"]["result"]["uid"], bob.uid,
        "bob's row naming alice ran as bob: {}",
        records["bobs"]
    );
    assert_eq!(
        records["unmapped"]["status"], "failed",
        "{}",
        records["unmapped"]
    );
    let error = records["unmapped"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("no submitter it can trust"),
        "an unmapped role's task runs nothing: {}",
        records["unmapped"]
    );

    // The operator commands work as a submitter's role, and show only its own tasks.
    let status = cairn_db(&alice_url, &["status"]).output().unwrap();
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{}", stderr_of(&status));
    assert!(
        table.contains("forged") && table.contains("viacli") && !table.contains("bobs"),
        "{table}"
    );

    // Steering through the database: who asked is the session's role.
    let request = |url: &str, task: &str| -> String {
        try_execute(
            url,
            &format!("INSERT INTO cairn_control (task_id, action) VALUES ('{task}', 'retry')"),
        )
        .unwrap();
        let ask = format!(
            "SELECT outcome FROM cairn_control WHERE task_id = '{task}' AND requested_role = \
             '{}' ORDER BY id DESC LIMIT 1",
            url.rsplit('=').next().unwrap()
        );
        let mut outcome = String::new();
        wait_until("the request to be handled", DEADLINE, || {
            outcome = query_texts(&owner, &ask, &[])
                .into_iter()
                .next()
                .and_then(|row| row[0].clone())
                .unwrap_or_default();
            !outcome.is_empty()
        });
        outcome
    };
    let outcome = request(&alice_url, "unmapped");
    assert!(
        outcome.starts_with("refused:") && outcome.contains("alice_r"),
        "alice may not retry mallory's task: {outcome}"
    );
    let outcome = request(&mallory_url, "unmapped");
    assert!(
        outcome.contains("mapped to no user"),
        "an unmapped role may steer nothing: {outcome}"
    );
    assert_eq!(request(&owner, "unmapped"), "applied", "the owner may");

    // A flood of requests the database refuses reaches the task's journal a few times, then
    // as one notice (and a count when the window ends), not once per request.
    try_execute(
        &alice_url,
        "INSERT INTO cairn_control (task_id, action)
         SELECT 'forged', 'resume' FROM generate_series(1, 40)",
    )
    .unwrap();
    wait_until("the flood to be handled", DEADLINE, || {
        query_texts(
            &owner,
            "SELECT count(*)::text FROM cairn_control WHERE task_id = 'forged' AND handled_at IS NULL",
            &[],
        )[0][0]
            .as_deref()
            == Some("0")
    });
    let journaled = query_texts(
        &owner,
        "SELECT count(*)::text FROM cairn_events
         WHERE task_id = 'forged' AND event::text LIKE '%control_refused%'",
        &[],
    );
    let journaled: u32 = journaled[0][0].as_deref().unwrap().parse().unwrap();
    assert!(
        (1..=6).contains(&journaled),
        "40 refused requests made {journaled} journal entries"
    );

    daemon.signal(nix::sys::signal::Signal::SIGTERM);
    let status = daemon.wait_exit(Duration::from_secs(120));
    assert!(status.success(), "the daemon stopped: {}", daemon.stderr());
    for role in ["daemon_r", "alice_r", "bob_r", "mallory_r"] {
        query_texts(&owner, &format!("DROP OWNED BY {role}"), &[]);
        query_texts(&owner, &format!("DROP ROLE {role}"), &[]);
    }
}
