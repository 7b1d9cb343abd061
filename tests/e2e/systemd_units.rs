//! The files in `systemd/` as systemd reads them: `systemd-analyze verify` accepts both units
//! (their `ExecStart=` pointed at the built binary) without printing anything on stderr,
//! `systemd-analyze security --offline=true` rates `cairn.service` 2.0 or better, the sysusers
//! and tmpfiles snippets build the users and the shared `inbox/` they promise, each unit's
//! command line is one the binary runs, and the units' numbers agree with cairn's (exit codes
//! that must not restart, stop timeout above the stop grace).
//!
//! These tests need systemd's tools (`systemd-analyze`, `systemd-sysusers`, `systemd-tmpfiles`,
//! Debian's `systemd` package) but not a running systemd: none of them talks to PID 1. Without
//! the tools they are skipped with a message, except in CI, where they fail.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use cairn::cli::exit;
use tempfile::TempDir;

const BINARY: &str = env!("CARGO_BIN_EXE_cairn");

/// Where the system unit expects the binary, and where the user unit does (`cargo install`).
const SYSTEM_EXEC: &str = "/usr/local/bin/cairn";
const USER_EXEC: &str = "%h/.cargo/bin/cairn";

/// The kill window cairn leaves between SIGTERM and SIGKILL after the stop grace.
const KILL_WINDOW: Duration = Duration::from_secs(5);
/// Time left over for the final flush before systemd's own SIGKILL.
const FLUSH_MARGIN: Duration = Duration::from_secs(10);

fn unit_source(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("systemd")
        .join(name);
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A systemd tool by name; `None` (after a loud skip message, or a failure in CI) if it is not
/// installed.
fn tool(test: &str, name: &str) -> Option<PathBuf> {
    crate::common::require_tool(test, name, "systemd")
}

/// Run a systemd tool with a predictable log level (an inherited SYSTEMD_LOG_LEVEL=debug would
/// fill stderr).
fn run(mut command: Command) -> Output {
    command
        .env_remove("SYSTEMD_LOG_LEVEL")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

fn describe(command: &str, output: &Output) -> String {
    format!(
        "{command}: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Every `Key=Value` of a section, in order (keys repeat in unit files).
fn section(unit: &str, name: &str) -> Vec<(String, String)> {
    let header = format!("[{name}]");
    let mut inside = false;
    let mut entries = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == header;
        } else if inside && !line.is_empty() && !line.starts_with(['#', ';']) {
            let (key, value) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not a Key=Value line: {line:?}"));
            entries.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    entries
}

/// The single value of a `[Service]` key.
fn service_value(unit: &str, key: &str) -> String {
    let values: Vec<String> = section(unit, "Service")
        .into_iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values.len(), 1, "{key}= should be set exactly once");
    values.into_iter().next().unwrap()
}

/// The unit's text with the program of `ExecStart=` (which must be `expected`) replaced by the
/// built binary.
fn with_built_binary(unit: &str, expected: &str) -> String {
    assert!(
        !BINARY.contains(char::is_whitespace),
        "the binary's path {BINARY:?} cannot stand in a unit's command line"
    );
    let mut replaced = 0;
    let lines: Vec<String> = unit
        .lines()
        .map(|line| match line.strip_prefix("ExecStart=") {
            Some(command) => {
                let rest = command.strip_prefix(expected).unwrap_or_else(|| {
                    panic!("ExecStart= should run {expected}, it is {command:?}")
                });
                replaced += 1;
                format!("ExecStart={BINARY}{rest}")
            }
            None => line.to_string(),
        })
        .collect();
    assert_eq!(replaced, 1, "exactly one ExecStart= line expected");
    lines.join("\n") + "\n"
}

/// A temp directory holding `name`, ready for systemd-analyze, with `drop_ins` installed as
/// `name.d/<file>`.
fn unit_dir(name: &str, text: &str, drop_ins: &[(&str, &str)]) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    fs::write(&path, text).unwrap();
    if !drop_ins.is_empty() {
        let d = dir.path().join(format!("{name}.d"));
        fs::create_dir(&d).unwrap();
        for (file, text) in drop_ins {
            fs::write(d.join(file), text).unwrap();
        }
    }
    (dir, path)
}

fn assert_verifies(analyze: &Path, path: &Path, user: bool) {
    let runtime = tempfile::tempdir().unwrap();
    let mut command = Command::new(analyze);
    if user {
        // A user manager is not needed, only a runtime directory for the one verify creates.
        fs::set_permissions(runtime.path(), fs::Permissions::from_mode(0o700)).unwrap();
        command.arg("--user").env("XDG_RUNTIME_DIR", runtime.path());
    }
    command.arg("verify").arg(path);
    let output = run(command);
    let what = describe(
        &format!("systemd-analyze verify {}", path.display()),
        &output,
    );
    assert!(output.status.success(), "{what}");
    assert!(output.stderr.is_empty(), "verify printed warnings:\n{what}");
}

#[test]
fn system_unit_verifies() {
    let Some(analyze) = tool("system_unit_verifies", "systemd-analyze") else {
        return;
    };
    let text = with_built_binary(&unit_source("cairn.service"), SYSTEM_EXEC);
    let (_dir, path) = unit_dir("cairn.service", &text, &[]);
    assert_verifies(&analyze, &path, false);
}

/// The drop-in with every suggested setting (`#Key=value`) uncommented, its `ExecStart=` pointed
/// at the built binary.
fn every_suggestion_of(drop_in: &str) -> String {
    let lines: Vec<String> = drop_in
        .lines()
        .map(|line| match line.strip_prefix('#') {
            Some(setting)
                if setting.starts_with(|c: char| c.is_ascii_uppercase())
                    && setting.contains('=') =>
            {
                setting.replace(SYSTEM_EXEC, BINARY)
            }
            _ => line.to_string(),
        })
        .collect();
    lines.join("\n") + "\n"
}

#[test]
fn the_relaxing_drop_in_changes_nothing_as_shipped() {
    // Installed as is, it must not name paths of some other site (a missing ReadWritePaths= or
    // BindPaths= fails the unit with 226/NAMESPACE).
    let drop_in = unit_source("relax-sandbox.conf.example");
    assert_eq!(
        section(&drop_in, "Service"),
        Vec::<(String, String)>::new(),
        "every setting of relax-sandbox.conf.example must be commented out"
    );
}

#[test]
fn system_unit_verifies_with_the_relaxing_drop_in() {
    let Some(analyze) = tool(
        "system_unit_verifies_with_the_relaxing_drop_in",
        "systemd-analyze",
    ) else {
        return;
    };
    let text = with_built_binary(&unit_source("cairn.service"), SYSTEM_EXEC);
    let drop_in = every_suggestion_of(&unit_source("relax-sandbox.conf.example"));
    assert!(drop_in.contains("\nBindPaths="), "{drop_in}");
    let (_dir, path) = unit_dir(
        "cairn.service",
        &text,
        &[("relax-sandbox.conf", drop_in.as_str())],
    );
    assert_verifies(&analyze, &path, false);
}

#[test]
fn user_unit_verifies_in_a_user_manager() {
    let Some(analyze) = tool("user_unit_verifies_in_a_user_manager", "systemd-analyze") else {
        return;
    };
    let text = with_built_binary(&unit_source("cairn-user.service"), USER_EXEC);
    let (_dir, path) = unit_dir("cairn.service", &text, &[]);
    assert_verifies(&analyze, &path, true);
}

/// `Overall exposure level for cairn.service: 1.4 OK` → 1.4
fn exposure(output: &str) -> Option<f64> {
    let line = output
        .lines()
        .find(|l| l.contains("Overall exposure level"))?;
    let after = line.split_once(": ")?.1;
    after.split_whitespace().next()?.parse().ok()
}

#[test]
fn system_unit_exposure_is_at_most_2() {
    let Some(analyze) = tool("system_unit_exposure_is_at_most_2", "systemd-analyze") else {
        return;
    };
    let text = with_built_binary(&unit_source("cairn.service"), SYSTEM_EXEC);
    let (_dir, path) = unit_dir("cairn.service", &text, &[]);
    let mut command = Command::new(analyze);
    command
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path);
    let output = run(command);
    let what = describe(
        &format!("systemd-analyze security --offline=true {}", path.display()),
        &output,
    );
    assert!(output.status.success(), "{what}");
    let level = exposure(&String::from_utf8_lossy(&output.stdout))
        .unwrap_or_else(|| panic!("no overall exposure level in the output:\n{what}"));
    assert!(level <= 2.0, "exposure {level} is above 2.0:\n{what}");
}

/// The drop-in of `--run-as-submitter`, its `ExecStart=` pointed at the built binary.
fn run_as_submitter_drop_in() -> String {
    let drop_in = unit_source("run-as-submitter.conf");
    assert!(
        drop_in.contains(&format!("ExecStart={SYSTEM_EXEC} ")),
        "the drop-in should run {SYSTEM_EXEC}"
    );
    drop_in.replace(SYSTEM_EXEC, BINARY)
}

#[test]
fn the_run_as_submitter_drop_in_verifies_and_its_exposure_is_at_most_2_3() {
    let test = "the_run_as_submitter_drop_in_verifies_and_its_exposure_is_at_most_2_3";
    let Some(analyze) = tool(test, "systemd-analyze") else {
        return;
    };
    let drop_in = run_as_submitter_drop_in();
    let exec: Vec<(String, String)> = section(&drop_in, "Service")
        .into_iter()
        .filter(|(k, v)| k == "ExecStart" && !v.is_empty())
        .collect();
    assert_eq!(exec.len(), 1, "one ExecStart= after the reset");
    assert!(exec[0].1.ends_with(" --run-as-submitter"), "{exec:?}");
    let capabilities = "CAP_SETUID CAP_SETGID CAP_CHOWN CAP_KILL";
    for key in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        let value = section(&drop_in, "Service")
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v);
        assert_eq!(value.as_deref(), Some(capabilities), "{key}=");
    }
    let text = with_built_binary(&unit_source("cairn.service"), SYSTEM_EXEC);
    let (_dir, path) = unit_dir(
        "cairn.service",
        &text,
        &[("run-as-submitter.conf", drop_in.as_str())],
    );
    assert_verifies(&analyze, &path, false);
    let mut command = Command::new(analyze);
    command
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&path);
    let output = run(command);
    let what = describe("systemd-analyze security --offline=true", &output);
    assert!(output.status.success(), "{what}");
    let level = exposure(&String::from_utf8_lossy(&output.stdout))
        .unwrap_or_else(|| panic!("no overall exposure level in the output:\n{what}"));
    assert!(level <= 2.3, "exposure {level} is above 2.3:\n{what}");
}

/// The duration a unit gives, e.g. "60s", "1min 30s".
fn unit_duration(value: &str) -> Duration {
    humantime::parse_duration(value).unwrap_or_else(|e| panic!("{value:?}: {e}"))
}

/// What a unit's `run` is told as `--stop-grace` (cairn's default when absent).
fn stop_grace(exec_start: &str) -> Duration {
    let args: Vec<&str> = exec_start.split_whitespace().collect();
    match args.iter().position(|a| *a == "--stop-grace") {
        Some(i) => unit_duration(args[i + 1]),
        None => Duration::from_secs(30),
    }
}

fn assert_service_settings(name: &str) {
    let unit = unit_source(name);
    let exec_start = service_value(&unit, "ExecStart");
    assert_eq!(service_value(&unit, "Type"), "notify", "{name}");
    assert_eq!(service_value(&unit, "NotifyAccess"), "main", "{name}");
    assert_eq!(service_value(&unit, "KillMode"), "mixed", "{name}");
    assert_eq!(service_value(&unit, "Restart"), "on-failure", "{name}");
    assert!(
        !unit_duration(&service_value(&unit, "WatchdogSec")).is_zero(),
        "{name}: WatchdogSec= must be set"
    );

    // systemd's SIGKILL must not cut the stop short: grace, then cairn's own kill window, then
    // the flush.
    let grace = stop_grace(&exec_start);
    let timeout = unit_duration(&service_value(&unit, "TimeoutStopSec"));
    assert!(
        timeout >= grace + KILL_WINDOW + FLUSH_MARGIN,
        "{name}: TimeoutStopSec={timeout:?} leaves no room after a {grace:?} stop grace, \
         the {KILL_WINDOW:?} kill window and the flush"
    );

    // The exit codes a restart would only repeat are cairn's own.
    let listed: BTreeSet<u8> = service_value(&unit, "RestartPreventExitStatus")
        .split_whitespace()
        .map(|code| code.parse().unwrap())
        .collect();
    let expected = BTreeSet::from([
        exit::USAGE,
        exit::INVALID_TASK,
        exit::QUEUE_LOCKED,
        exit::UNSAFE_QUEUE,
    ]);
    assert_eq!(listed, expected, "{name}: RestartPreventExitStatus=");
    assert!(!listed.contains(&exit::FAILURE) && !listed.contains(&exit::OK));
}

#[test]
fn units_agree_with_the_binary() {
    assert_service_settings("cairn.service");
    assert_service_settings("cairn-user.service");
}

/// Run a unit's command line, with its directories mapped into `root` and `--exit-when-idle`
/// added, and return the queue it used.
fn run_exec_start(unit: &str, expected_exec: &str, root: &Path) -> PathBuf {
    let exec_start = service_value(unit, "ExecStart");
    let rest = exec_start.strip_prefix(expected_exec).unwrap();
    let state = root.join("var/lib/cairn");
    let home = root.join("home");
    let args: Vec<String> = rest
        .split_whitespace()
        .map(|arg| {
            arg.replace("${STATE_DIRECTORY}", state.to_str().unwrap())
                .replace("%h", home.to_str().unwrap())
        })
        .collect();
    assert!(
        args.iter().all(|a| !a.contains('$') && !a.contains('%')),
        "unexpected variables or specifiers in ExecStart={exec_start}"
    );
    let queue = PathBuf::from(&args[args.iter().position(|a| a == "--queue").unwrap() + 1]);
    if exec_start.contains("${STATE_DIRECTORY}") {
        // systemd creates the state directory before it starts the service.
        fs::create_dir_all(&state).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o750)).unwrap();
    }
    let output = Command::new(BINARY)
        .args(&args)
        .arg("--exit-when-idle")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("CAIRN_QUEUE")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        describe(&format!("cairn {}", args.join(" ")), &output)
    );
    queue
}

#[test]
fn units_command_lines_run() {
    let root = tempfile::tempdir().unwrap();
    let queue = run_exec_start(&unit_source("cairn.service"), SYSTEM_EXEC, root.path());
    assert!(queue.join("inbox").is_dir(), "{}", queue.display());

    let root = tempfile::tempdir().unwrap();
    let queue = run_exec_start(&unit_source("cairn-user.service"), USER_EXEC, root.path());
    assert_eq!(queue, root.path().join("home/.local/share/cairn/queue"));
    assert!(queue.join("inbox").is_dir(), "{}", queue.display());
}

/// The numeric id of `name` in a passwd or group file.
fn id_in(file: &Path, name: &str) -> u32 {
    let text = fs::read_to_string(file).unwrap();
    text.lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields[0] == name)
        .unwrap_or_else(|| panic!("{name} is not in {}:\n{text}", file.display()))[2]
        .parse()
        .unwrap()
}

#[test]
fn sysusers_and_tmpfiles_snippets_build_the_shared_inbox() {
    const TEST: &str = "sysusers_and_tmpfiles_snippets_build_the_shared_inbox";
    let (Some(sysusers), Some(tmpfiles)) = (
        tool(TEST, "systemd-sysusers"),
        tool(TEST, "systemd-tmpfiles"),
    ) else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let etc = root.path().join("etc");
    for (dir, source) in [
        ("sysusers.d", "cairn.sysusers.conf"),
        ("tmpfiles.d", "cairn.tmpfiles.conf"),
    ] {
        fs::create_dir_all(etc.join(dir)).unwrap();
        fs::write(etc.join(dir).join("cairn.conf"), unit_source(source)).unwrap();
    }

    let mut command = Command::new(sysusers);
    command.arg(format!("--root={}", root.path().display()));
    command.arg("cairn.conf");
    let output = run(command);
    assert!(
        output.status.success(),
        "{}",
        describe("systemd-sysusers --root=... cairn.conf", &output)
    );
    let cairn_uid = id_in(&etc.join("passwd"), "cairn");
    let cairn_gid = id_in(&etc.join("group"), "cairn");
    let submit_gid = id_in(&etc.join("group"), "cairn-submit");
    let group = fs::read_to_string(etc.join("group")).unwrap();
    assert!(
        group
            .lines()
            .any(|l| l.starts_with("cairn-submit:") && l.split(':').nth(3) == Some("cairn")),
        "cairn should be a member of cairn-submit, to read the 0640 files dropped in inbox/:\n{group}"
    );
    let passwd = fs::read_to_string(etc.join("passwd")).unwrap();
    assert!(
        passwd.contains(":/var/lib/cairn:"),
        "cairn's home should be the queue:\n{passwd}"
    );

    if !crate::common::require_root(
        &format!("{TEST} (its systemd-tmpfiles part)"),
        "it creates files owned by the cairn user",
    ) {
        return;
    }
    let mut command = Command::new(tmpfiles);
    command
        .arg("--create")
        .arg(format!("--root={}", root.path().display()))
        .arg("cairn.conf");
    let output = run(command);
    let what = describe("systemd-tmpfiles --create --root=... cairn.conf", &output);
    assert!(output.status.success(), "{what}");
    assert!(output.stderr.is_empty(), "{what}");

    let queue = root.path().join("var/lib/cairn");
    let meta = fs::metadata(&queue).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (cairn_uid, cairn_gid, 0o750),
        "/var/lib/cairn as StateDirectory=/StateDirectoryMode= make it"
    );
    let inbox = fs::metadata(queue.join("inbox")).unwrap();
    assert_eq!(
        (inbox.uid(), inbox.gid(), inbox.mode() & 0o7777),
        (cairn_uid, submit_gid, 0o3770),
        "inbox/: setgid and sticky, writable by cairn and cairn-submit only"
    );
    let unit = unit_source("cairn.service");
    assert_eq!(service_value(&unit, "StateDirectoryMode"), "0750");
    assert_eq!(service_value(&unit, "StateDirectory"), "cairn");
}

/// The command lines of the first ```sh block after `heading` in a markdown file, without
/// comments, blank lines and a leading `sudo `.
fn commands_under(markdown: &str, heading: &str) -> Vec<String> {
    let after = markdown
        .split_once(heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"))
        .1;
    let block = after
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a sh block")
        .0;
    block
        .lines()
        .map(|l| l.split_once(" #").map_or(l, |(command, _)| command).trim())
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| l.strip_prefix("sudo ").unwrap_or(l).to_string())
        .collect()
}

#[test]
fn the_readme_installs_the_service_as_docs_service_md_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let guide = fs::read_to_string(root.join("docs/service.md")).unwrap();
    let install = commands_under(&guide, "## Install");
    let readme_steps = commands_under(&readme, "## Run as a service");
    assert_eq!(
        readme_steps[..install.len().min(readme_steps.len())],
        install[..],
        "README's service snippet must start with docs/service.md's install steps"
    );
}

#[test]
fn the_listen_drop_in_verifies_and_listens_on_the_loopback_only() {
    let test = "the_listen_drop_in_verifies_and_listens_on_the_loopback_only";
    let Some(analyze) = tool(test, "systemd-analyze") else {
        return;
    };
    let drop_in = unit_source("listen.conf");
    let exec: Vec<(String, String)> = section(&drop_in, "Service")
        .into_iter()
        .filter(|(k, v)| k == "ExecStart" && !v.is_empty())
        .collect();
    assert_eq!(exec.len(), 1, "one ExecStart= after the reset");
    assert!(exec[0].1.starts_with(SYSTEM_EXEC), "{exec:?}");
    assert!(
        exec[0].1.ends_with(" --listen 127.0.0.1:9464"),
        "the shipped listener is on the loopback, read-only: {exec:?}"
    );
    let drop_in = drop_in.replace(SYSTEM_EXEC, BINARY);
    let text = with_built_binary(&unit_source("cairn.service"), SYSTEM_EXEC);
    let (_dir, path) = unit_dir("cairn.service", &text, &[("listen.conf", drop_in.as_str())]);
    assert_verifies(&analyze, &path, false);
}
