//! The environment a task's commands get, with the real binary: built from the task's `env`,
//! cairn's `CAIRN_*` variables and a short list of the daemon's (PATH, the locale, TZ, the
//! login variables of the user it runs as) plus what `--pass-env` names; never a secret of the
//! daemon's, the database URL above all, which also stays off every command line when it comes
//! from `--db-url-file`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use serde_json::{json, Value};

use crate::common::*;

/// A task whose one command writes the environment it was started with into `side` (as the
/// kernel keeps it: a shell or a wrapper such as pyenv's adds its own variables later).
fn environment_task(id: &str, side: &std::path::Path) -> Value {
    json!({
        "id": id,
        "env": {"MODEL": "tiny"},
        "phases": [{
            "name": "env",
            "run": ["sh", "-c", "cat /proc/$$/environ > \"$0\"; echo '{}'", side],
        }],
    })
}

/// The names a command may get without any `--pass-env`.
fn always_allowed(name: &str) -> bool {
    name.starts_with("CAIRN_")
        || name.starts_with("LC_")
        || [
            "PATH",
            "LANG",
            "LANGUAGE",
            "TZ",
            "HOME",
            "USER",
            "LOGNAME",
            "SHELL",
            "PYTHONPATH",
            "MODEL",
        ]
        .contains(&name)
}

/// The environment [`environment_task`] wrote into `side`.
fn environment_of(side: &std::path::Path) -> BTreeMap<String, String> {
    let bytes = std::fs::read(side).unwrap_or_else(|e| panic!("{}: {e}", side.display()));
    String::from_utf8_lossy(&bytes)
        .split('\0')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (name.to_string(), value.to_string()),
            None => (pair.to_string(), String::new()),
        })
        .collect()
}

#[test]
fn a_command_gets_a_built_environment_and_no_other_variable_of_the_daemons() {
    let queue = TestQueue::new();
    let side = queue.aux("env.side");
    queue.seed_task("env.json", &environment_task("env", &side));
    let mut daemon = queue.start_wrapped(
        &[
            "env",
            "DAEMON_SECRET=hunter2",
            "AWS_SECRET_ACCESS_KEY=also-secret",
            "OPERATOR_PROXY=http://proxy:3128",
            "LC_TIME=C",
        ],
        &["--exit-when-idle", "--pass-env", "OPERATOR_PROXY"],
    );
    assert_eq!(
        daemon.wait_exit(DEADLINE).code(),
        Some(0),
        "{}",
        daemon.stderr()
    );
    queue.wait_done("env");
    let env = environment_of(&side);
    assert_eq!(
        env.get("MODEL").map(String::as_str),
        Some("tiny"),
        "{env:?}"
    );
    assert_eq!(env.get("CAIRN_TASK_ID").map(String::as_str), Some("env"));
    assert_eq!(
        env.get("OPERATOR_PROXY").map(String::as_str),
        Some("http://proxy:3128"),
        "a variable named by --pass-env is passed: {env:?}"
    );
    assert_eq!(env.get("LC_TIME").map(String::as_str), Some("C"));
    assert!(env.contains_key("PATH"), "{env:?}");
    let user = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .unwrap()
        .unwrap();
    assert_eq!(env.get("USER"), Some(&user.name), "{env:?}");
    assert_eq!(
        env.get("HOME").map(String::as_str),
        Some(user.dir.to_str().unwrap()),
        "{env:?}"
    );
    // Everything else this test's process has (RUST_BACKTRACE, CARGO_*, ...) stays too.
    let others: Vec<&String> = env
        .keys()
        .filter(|name| !always_allowed(name) && *name != "OPERATOR_PROXY")
        .collect();
    assert!(
        others.is_empty(),
        "the command got variables of the daemon's it was not given: {others:?}"
    );
    for value in env.values() {
        assert!(
            !value.contains("secret") && !value.contains("hunter2"),
            "{env:?}"
        );
    }
}

#[test]
fn pass_env_refuses_the_database_url() {
    let queue = TestQueue::new();
    let output = queue.cairn_output(
        &[
            "run",
            "--exit-when-idle",
            "--pass-env",
            "CAIRN_DATABASE_URL",
        ],
        b"",
    );
    assert_eq!(output.status.code(), Some(2), "{}", stderr_of(&output));
    assert!(
        stderr_of(&output).contains("CAIRN_DATABASE_URL is never passed to tasks"),
        "{}",
        stderr_of(&output)
    );
}

#[test]
fn a_database_url_file_every_user_may_read_is_refused_naming_it() {
    let queue = TestQueue::new();
    let file = queue.aux("db.url");
    std::fs::write(&file, "postgresql://cairn:secret@db.example/cairn\n").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = queue.cairn_output(&["status", "--db-url-file", file.to_str().unwrap()], b"");
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("--db-url-file {}", file.display()))
            && stderr.contains("every user may read"),
        "{stderr}"
    );
    assert!(!stderr.contains("secret"), "{stderr}");
}

#[cfg(feature = "postgres")]
mod shared_queue {
    use super::*;
    use crate::common::postgres::{final_record, submit_task, PgCluster};

    /// The daemon's command line, as `ps` shows it to every local user.
    fn command_line(pid: i32) -> String {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
            .unwrap_or_default()
    }

    #[test]
    fn the_database_url_reaches_no_task_and_no_command_line() {
        let test = "task_environment::the_database_url_reaches_no_task_and_no_command_line";
        let Some(cluster) = PgCluster::start(test) else {
            return;
        };
        // Trust authentication ignores the password: it stands for a real one here.
        let url = format!("{}&password=db-password-xyzzy", cluster.url());
        let host = TestQueue::new();
        let side = host.aux("from-env.side");
        submit_task(&url, &environment_task("from-env", &side));
        // As a unit with EnvironmentFile= gives it: in the daemon's environment.
        let env_url = format!("CAIRN_DATABASE_URL={url}");
        let mut daemon =
            host.start_wrapped(&["env", &env_url], &["--node", "n1", "--exit-when-idle"]);
        assert_eq!(
            daemon.wait_exit(DEADLINE).code(),
            Some(0),
            "{}",
            daemon.stderr()
        );
        assert!(final_record(&url, "from-env").is_some(), "the task ran");
        let env = environment_of(&side);
        assert!(!env.contains_key("CAIRN_DATABASE_URL"), "{env:?}");
        for (name, value) in &env {
            assert!(
                !value.contains("xyzzy"),
                "{name} holds the password: {env:?}"
            );
        }

        // From a file: neither on the command line nor in the task's environment.
        let side = host.aux("from-file.side");
        submit_task(&url, &environment_task("from-file", &side));
        let file = host.aux("db.url");
        std::fs::write(&file, format!("{url}\n")).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let mut daemon = host.start(&[
            "--db-url-file",
            file.to_str().unwrap(),
            "--node",
            "n2",
            "--exit-when-idle",
        ]);
        // Once the process runs cairn (before, its command line is the test's own).
        let pid = daemon.pid();
        let seen = wait_for("the daemon's command line", DEADLINE, || {
            Some(command_line(pid)).filter(|line| line.contains("--db-url-file"))
        });
        assert_eq!(
            daemon.wait_exit(DEADLINE).code(),
            Some(0),
            "{}",
            daemon.stderr()
        );
        assert!(!seen.contains("xyzzy"), "{seen}");
        assert!(final_record(&url, "from-file").is_some(), "the task ran");
        let env = environment_of(&side);
        for (name, value) in &env {
            assert!(
                !value.contains("xyzzy"),
                "{name} holds the password: {env:?}"
            );
        }
    }
}

/// A daemon started with descriptors open without close-on-exec (7 and 9 here, on a file
/// only its user may read) passes none of them to a command.
#[test]
fn an_inherited_descriptor_reaches_no_command() {
    let queue = TestQueue::new();
    let secret = queue.aux("secret");
    std::fs::write(&secret, "only the daemon's user may read this").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let side = queue.aux("fds.side");
    // The command lists its own descriptors, as the kernel has them, before doing anything.
    queue.seed_task(
        "fds.json",
        &json!({
            "id": "fds",
            "phases": [{"name": "fds", "run": [
                "sh", "-c", "ls -l /proc/$$/fd > \"$0\"; echo '{}'", side,
            ]}],
        }),
    );
    let redirect = format!("exec \"$0\" \"$@\" 7<'{0}' 9<'{0}'", secret.display());
    let mut daemon = queue.start_wrapped(&["sh", "-c", &redirect], &["--exit-when-idle"]);
    assert_eq!(
        daemon.wait_exit(DEADLINE).code(),
        Some(0),
        "{}",
        daemon.stderr()
    );
    queue.wait_done("fds");
    let listing = std::fs::read_to_string(&side).unwrap();
    assert!(
        !listing.contains(secret.to_str().unwrap()),
        "the command got the daemon's inherited descriptor: {listing}"
    );
    // (The shell keeps a copy of its stdout above 9 while it redirects it: its own.)
    let fds: Vec<&str> = listing
        .lines()
        .filter_map(|line| line.split(" -> ").next()?.split_whitespace().last())
        .collect();
    for inherited in ["7", "9"] {
        assert!(!fds.contains(&inherited), "{listing}");
    }
    for stdio in ["0", "1", "2"] {
        assert!(fds.contains(&stdio), "{listing}");
    }
}
