//! The inbox as users and accidents fill it: bad files dropped straight into `inbox/` end in
//! `failed/` with a reason while the daemon keeps running, half-written files wait until they
//! are complete, and only one daemon owns a queue.

use std::fs;
use std::io::Write;
use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};

/// A file dropped into the inbox and what its rejection record must say.
struct BadCase {
    name: &'static str,
    /// The record's `field` (`None`: the file as a whole).
    field: Option<&'static str>,
    /// A word the record's `problem` (and `reason`) must contain.
    word: &'static str,
}

#[test]
fn bad_input_is_rejected_with_a_reason_and_the_daemon_keeps_running() {
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let valid = |id: &str| once_task(id, &json!({"task": id}));

    // The first owner of the id "dup" is accepted and runs.
    queue.drop_task("dup.json", &valid("dup"));
    assert_eq!(queue.wait_done("dup")["result"], json!({"task": "dup"}));

    let mut cases = Vec::new();
    let mut kept_bytes: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut drop_case = |case: BadCase, bytes: Option<Vec<u8>>| {
        if let Some(bytes) = bytes {
            queue.drop_bytes(case.name, &bytes, false);
            kept_bytes.push((case.name, bytes));
        }
        cases.push(case);
    };

    drop_case(
        BadCase {
            name: "malformed.json",
            field: Some("phases[0]"),
            word: "not valid JSON",
        },
        Some(br#"{"phases": [oops]}"#.to_vec()),
    );
    let mut unknown = valid("unknown-field");
    unknown["colour"] = json!("red");
    drop_case(
        BadCase {
            name: "unknown-field.json",
            field: Some("colour"),
            word: "unknown field `colour`",
        },
        Some(serde_json::to_vec(&unknown).unwrap()),
    );
    // The submitter is the file's owner, never what the file says.
    let mut forged = valid("forged-submitter");
    forged["submitted_by"] = json!({"uid": 0, "user": "root"});
    drop_case(
        BadCase {
            name: "forged-submitter.json",
            field: Some("submitted_by"),
            word: "is recorded by cairn",
        },
        Some(serde_json::to_vec(&forged).unwrap()),
    );
    let mut wrong_type = valid("wrong-type");
    wrong_type["priority"] = json!("high");
    drop_case(
        BadCase {
            name: "wrong-type.json",
            field: Some("priority"),
            word: "invalid type",
        },
        Some(serde_json::to_vec(&wrong_type).unwrap()),
    );
    drop_case(
        BadCase {
            name: "escape.json",
            field: Some("id"),
            word: "'/'",
        },
        Some(serde_json::to_vec(&valid("../x")).unwrap()),
    );
    drop_case(
        BadCase {
            name: "dup-again.json",
            field: Some("id"),
            word: "already exists",
        },
        Some(serde_json::to_vec(&valid("dup")).unwrap()),
    );
    drop_case(
        BadCase {
            name: "no-phases.json",
            field: Some("phases"),
            word: "at least one phase",
        },
        Some(br#"{"id": "no-phases", "phases": []}"#.to_vec()),
    );
    let mut huge = valid("huge");
    huge["meta"] = json!({"padding": "x".repeat(1100 * 1024)});
    drop_case(
        BadCase {
            name: "huge.json",
            field: None,
            word: "larger than the limit",
        },
        Some(serde_json::to_vec(&huge).unwrap()),
    );
    drop_case(
        BadCase {
            name: "notes.txt",
            field: None,
            word: "<name>.json",
        },
        Some(serde_json::to_vec(&valid("notes")).unwrap()),
    );

    // A symlink to a valid task file elsewhere.
    let target = queue.aux("linked.json");
    fs::write(&target, serde_json::to_vec(&valid("linked")).unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, queue.path("inbox/link.json")).unwrap();
    drop_case(
        BadCase {
            name: "link.json",
            field: None,
            word: "symbolic link",
        },
        None,
    );
    nix::unistd::mkfifo(
        &queue.path("inbox/pipe.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    drop_case(
        BadCase {
            name: "pipe.json",
            field: None,
            word: "FIFO",
        },
        None,
    );
    fs::create_dir(queue.path("inbox/x.json")).unwrap();
    drop_case(
        BadCase {
            name: "x.json",
            field: None,
            word: "directory",
        },
        None,
    );
    // Truncated for good (left alone for minutes): rejected, not kept waiting forever.
    let cut = br#"{"id": "cut", "phases": ["#.to_vec();
    queue.drop_bytes("cut.json", &cut, true);
    kept_bytes.push(("cut.json", cut));
    cases.push(BadCase {
        name: "cut.json",
        field: Some("phases"),
        word: "EOF",
    });

    // Ignored until renamed: dot-files and .tmp files.
    fs::write(queue.path("inbox/.hidden.json"), b"{").unwrap();
    fs::write(queue.path("inbox/later.json.tmp"), b"{").unwrap();

    queue.drop_task("after.json", &valid("after"));
    assert_eq!(queue.wait_done("after")["result"], json!({"task": "after"}));
    wait_until(
        &format!("{} rejection records are in failed/", cases.len()),
        DEADLINE,
        || queue.rejections().len() >= cases.len(),
    );
    assert!(daemon.is_running(), "the daemon exited");

    let rejections = queue.rejections();
    assert_eq!(rejections.len(), cases.len(), "{rejections:#?}");
    for case in &cases {
        let file = format!("inbox/{}", case.name);
        let record = rejections
            .get(&file)
            .unwrap_or_else(|| panic!("no rejection record for {file}: {rejections:#?}"));
        assert_eq!(record["status"], "rejected", "{record:#}");
        assert_eq!(record["field"], json!(case.field), "{file}: {record:#}");
        let problem = record["problem"].as_str().unwrap();
        assert!(problem.contains(case.word), "{file}: {problem:?}");
        let reason = record["reason"].as_str().unwrap();
        assert!(reason.contains(&file), "{file}: {reason:?}");
        assert!(reason.contains(case.word), "{file}: {reason:?}");
        if let Some(field) = case.field {
            assert!(reason.contains(field), "{file}: {reason:?}");
        }
    }

    // Nothing is lost: the rejected bytes are kept beside their record.
    for (name, bytes) in &kept_bytes {
        let record = &rejections[&format!("inbox/{name}")];
        let input = record["input"]
            .as_str()
            .expect("the record names the kept input");
        assert_eq!(&fs::read(queue.path(input)).unwrap(), bytes, "{name}");
    }
    let link = &rejections["inbox/link.json"];
    assert_eq!(link["symlink_target"], json!(target));
    assert_eq!(
        fs::read(&target).unwrap(),
        serde_json::to_vec(&valid("linked")).unwrap()
    );
    for name in ["pipe.json", "x.json"] {
        let input = rejections[&format!("inbox/{name}")]["input"]
            .as_str()
            .unwrap();
        assert!(queue.path(input).exists(), "{name} was not kept at {input}");
    }

    // Only the valid tasks ran; the ignored files are still waiting in the inbox.
    assert_eq!(queue.list("done"), vec!["after.json", "dup.json"]);
    assert_eq!(queue.list("tasks"), vec!["after.json", "dup.json"]);
    assert_eq!(queue.list("inbox"), vec![".hidden.json", "later.json.tmp"]);
    assert_eq!(
        queue.done("dup").unwrap()["result"],
        json!({"task": "dup"}),
        "the duplicate replaced the original"
    );

    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn a_task_written_as_a_json_array_is_rejected() {
    // serde's derived structs also accept a positional array; cairn's task files are objects
    // with named fields (unknown fields are errors, with the field's name), so an
    // array, whatever its elements, is not a task.
    let queue = TestQueue::new();
    let positional = br#"[null, 0, null, {}, {}, null, [["p", "once", ["true"]]]]"#;
    let file = queue.aux("positional.json");
    fs::write(&file, positional).unwrap();
    let validate = queue.cairn_output(&["validate", &file.display().to_string()], b"");
    assert_eq!(
        validate.status.code(),
        Some(3),
        "validate accepted an array as a task: {}",
        String::from_utf8_lossy(&validate.stdout)
    );

    let mut daemon = queue.start(&[]);
    queue.drop_bytes("positional.json", positional, false);
    queue.drop_bytes("numbers.json", b"[1, 2]", false);
    queue.drop_task("after.json", &once_task("after", &json!(1)));
    queue.wait_done("after");
    wait_until("both arrays are dealt with", DEADLINE, || {
        queue.list("inbox").is_empty() && queue.list("tasks").len() + queue.rejections().len() >= 3
    });
    let rejections = queue.rejections();
    for name in ["positional.json", "numbers.json"] {
        let record = rejections
            .get(&format!("inbox/{name}"))
            .unwrap_or_else(|| panic!("{name} was accepted as a task: {:?}", queue.list("tasks")));
        let problem = record["problem"].as_str().unwrap();
        assert!(problem.contains("object"), "{name}: {problem:?}");
    }
    assert_eq!(queue.list("tasks"), vec!["after.json"]);
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

/// A valid task split in two halves, neither of them valid JSON on its own.
fn halves(task: &Value) -> (Vec<u8>, Vec<u8>) {
    let bytes = serde_json::to_vec_pretty(task).unwrap();
    let (first, second) = bytes.split_at(bytes.len() / 2);
    (first.to_vec(), second.to_vec())
}

#[test]
fn a_file_written_slowly_in_place_is_taken_once_complete() {
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let (first, second) = halves(&once_task("slow", &json!({"whole": true})));

    let mut file = fs::File::create(queue.path("inbox/slow.json")).unwrap();
    file.write_all(&first).unwrap();
    file.sync_all().unwrap();
    // A slow writer: the pause is the scenario.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        queue.path("inbox/slow.json").exists(),
        "the half-written file was taken"
    );
    file.write_all(&second).unwrap();
    drop(file);

    assert_eq!(queue.wait_done("slow")["result"], json!({"whole": true}));
    assert!(queue.rejections().is_empty(), "{:#?}", queue.rejections());
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn a_file_closed_between_two_writes_is_taken_once_complete() {
    // Like `cat head > inbox/x.json; ...; cat tail >> inbox/x.json`: the first close looks
    // like the end of the file.
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let (first, second) = halves(&once_task("reopened", &json!({"whole": true})));

    fs::write(queue.path("inbox/reopened.json"), &first).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(queue.path("inbox/reopened.json"))
        .expect("the half-written file is still in the inbox");
    file.write_all(&second).unwrap();
    drop(file);

    assert_eq!(
        queue.wait_done("reopened")["result"],
        json!({"whole": true})
    );
    assert!(queue.rejections().is_empty(), "{:#?}", queue.rejections());
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

/// A task file whose modification time is ahead of the clock (the clock was stepped back
/// after it was written) is taken once it has stayed unchanged for the settle time by the
/// daemon's own clock, and `--exit-when-idle` then exits: it used to sit in the inbox until
/// the clock caught up, the daemon waiting for it.
#[test]
fn a_task_file_modified_in_the_future_is_taken_and_the_daemon_goes_idle() {
    let queue = TestQueue::new();
    let path = queue.path("inbox/ahead.json");
    fs::write(
        &path,
        serde_json::to_vec(&once_task("ahead", &json!({"from": "the future"}))).unwrap(),
    )
    .unwrap();
    let tomorrow = std::time::SystemTime::now() + Duration::from_secs(24 * 3600);
    fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(tomorrow))
        .expect("dating the task file tomorrow");
    queue.run_until_idle(&[]);
    assert_eq!(
        queue.wait_done("ahead")["result"],
        json!({"from": "the future"})
    );
    assert!(queue.list("inbox").is_empty(), "{:?}", queue.list("inbox"));
}

#[test]
fn a_second_daemon_on_the_same_queue_exits_4_naming_the_owner() {
    let queue = TestQueue::new();
    let mut first = queue.start(&[]);
    wait_until("the first daemon owns the queue", DEADLINE, || {
        first.stderr().contains("cairn daemon started")
    });

    let second = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert_eq!(second.status.code(), Some(4), "{second:?}");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("owned by a running daemon"),
        "stderr: {stderr}"
    );
    assert!(
        stderr.contains(&format!("pid {}", first.pid())),
        "stderr does not name pid {}: {stderr}",
        first.pid()
    );
    assert!(first.is_running(), "the first daemon exited");

    // The owner still works the queue.
    queue.drop_task("still.json", &once_task("still", &json!(1)));
    assert_eq!(queue.wait_done("still")["result"], json!(1));

    // A dead owner's lock goes with it: no stale lock after SIGKILL.
    first.kill_hard();
    queue.seed_task("next.json", &once_task("next", &json!(2)));
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("next").unwrap()["result"], json!(2));
}

#[test]
fn a_writer_pausing_longer_than_the_settle_time_is_not_rejected() {
    // A slow writer is never rejected for a half-written file. Here the writer
    // keeps the file open and pauses for 2.5 s (a slow network copy, a program producing the
    // task as it goes) before writing the second half.
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let (first, second) = halves(&once_task("paused", &json!({"whole": true})));

    let mut file = fs::File::create(queue.path("inbox/paused.json")).unwrap();
    file.write_all(&first).unwrap();
    file.sync_all().unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    file.write_all(&second).unwrap();
    drop(file);

    wait_until("the task is done or rejected", DEADLINE, || {
        queue.done("paused").is_some() || !queue.rejections().is_empty()
    });
    assert!(
        queue.rejections().is_empty(),
        "a half-written file was rejected: {:#?}",
        queue.rejections()
    );
    assert_eq!(queue.wait_done("paused")["result"], json!({"whole": true}));
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

/// Put `bytes` into `inbox/<name>` (any bytes as a name) with `mode`, dated back so the daemon
/// takes it at once: written under a temp name, then renamed in.
fn drop_with_mode(queue: &TestQueue, name: &std::ffi::OsStr, bytes: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let temp = queue.path(&format!("inbox/.{:016x}.writing", fastrand::u64(..)));
    fs::write(&temp, bytes).unwrap();
    let file = fs::File::options().write(true).open(&temp).unwrap();
    file.set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    fs::set_permissions(&temp, fs::Permissions::from_mode(mode)).unwrap();
    fs::rename(&temp, queue.path("inbox").join(name)).unwrap();
}

#[test]
fn entries_the_daemon_cannot_take_do_not_stop_intake() {
    // A daemon without root's power over file permissions (as a daemon running as its own
    // user is): a directory it cannot move, a file it cannot read, and a name so long that
    // a claim name built from it would not fit, all dropped before a good task.
    let test = "entries_the_daemon_cannot_take_do_not_stop_intake";
    if !require_root(test, "it drops the daemon's file-permission capabilities")
        || require_tool(test, "setpriv", "util-linux").is_none()
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let queue = TestQueue::new();
    let wrapper = [
        "setpriv",
        "--bounding-set=-dac_override,-dac_read_search",
        "--",
    ];
    let mut daemon = queue.start_wrapped(&wrapper, &[]);
    wait_until("the daemon has started", DEADLINE, || {
        daemon.stderr().contains("cairn daemon started")
    });

    // Made under a dot-name the scans skip, so that it is unwritable before the daemon sees it.
    fs::create_dir(queue.path("inbox/.x")).unwrap();
    fs::set_permissions(queue.path("inbox/.x"), fs::Permissions::from_mode(0o555)).unwrap();
    fs::rename(queue.path("inbox/.x"), queue.path("inbox/x.json")).unwrap();
    let task = |id: &str| serde_json::to_vec(&once_task(id, &json!(id))).unwrap();
    drop_with_mode(
        &queue,
        "unreadable.json".as_ref(),
        &task("unreadable"),
        0o000,
    );
    let long = format!("{}.json", "l".repeat(245));
    assert_eq!(long.len(), 250);
    drop_with_mode(&queue, long.as_ref(), &task("long"), 0o644);

    queue.drop_task("after.json", &once_task("after", &json!("after")));
    assert_eq!(queue.wait_done("after")["result"], json!("after"));
    assert_eq!(queue.wait_done("long")["result"], json!("long"));
    wait_until("both entries have rejection records", DEADLINE, || {
        queue.rejections().len() >= 2
    });
    let rejections = queue.rejections();
    let directory = &rejections["inbox/x.json"];
    let problem = directory["problem"].as_str().unwrap();
    assert!(problem.contains("directory"), "{directory:#}");
    assert!(
        problem.contains("renamed to inbox/.rejected."),
        "{directory:#}"
    );
    let aside = directory["input"].as_str().unwrap();
    assert!(queue.path(aside).is_dir(), "{directory:#}");
    let unreadable = &rejections["inbox/unreadable.json"];
    assert!(
        unreadable["problem"]
            .as_str()
            .unwrap()
            .contains("cannot be read"),
        "{unreadable:#}"
    );
    assert!(queue.done("unreadable").is_none());
    // Nothing is left half-claimed, and the inbox holds only what was moved aside there.
    assert!(
        queue.list("tasks").iter().all(|n| !n.starts_with(".claim")),
        "{:?}",
        queue.list("tasks")
    );
    assert!(
        queue.list("inbox").iter().all(|n| n.starts_with('.')),
        "{:?}",
        queue.list("inbox")
    );
    let errors = daemon
        .stderr()
        .lines()
        .filter(|l| l.contains("ERROR"))
        .count();
    assert!(errors <= 3, "{errors} error lines:\n{}", daemon.stderr());
    assert!(daemon.is_running(), "the daemon exited");
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn group_writable_and_hard_linked_task_files_are_rejected_and_never_run() {
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let task = |id: &str| serde_json::to_vec(&once_task(id, &json!(id))).unwrap();
    drop_with_mode(&queue, "group.json".as_ref(), &task("group"), 0o664);
    drop_with_mode(&queue, "world.json".as_ref(), &task("world"), 0o646);
    let elsewhere = queue.aux("linked.json");
    fs::write(&elsewhere, task("linked")).unwrap();
    let file = fs::File::options().write(true).open(&elsewhere).unwrap();
    file.set_modified(std::time::SystemTime::now() - Duration::from_secs(600))
        .unwrap();
    fs::hard_link(&elsewhere, queue.path("inbox/linked.json")).unwrap();
    queue.drop_task("after.json", &once_task("after", &json!("after")));

    assert_eq!(queue.wait_done("after")["result"], json!("after"));
    wait_until("three rejection records", DEADLINE, || {
        queue.rejections().len() >= 3
    });
    let rejections = queue.rejections();
    for (name, word) in [
        ("group.json", "writable by its group"),
        ("world.json", "writable by every user"),
        ("linked.json", "hard link"),
    ] {
        let record = &rejections[&format!("inbox/{name}")];
        let reason = record["reason"].as_str().unwrap();
        assert!(reason.contains(word), "{name}: {reason:?}");
    }
    for id in ["group", "world", "linked"] {
        assert!(queue.done(id).is_none(), "{id} ran");
    }
    assert_eq!(queue.list("tasks"), vec!["after.json"]);
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn file_names_cannot_forge_log_lines_and_non_utf8_names_are_rejected() {
    use std::os::unix::ffi::OsStrExt;
    let queue = TestQueue::new();
    let mut daemon = queue.start(&[]);
    let forged = "x\nERROR forged line.json";
    drop_with_mode(&queue, forged.as_ref(), b"{oops", 0o644);
    let task = serde_json::to_vec(&once_task("latin1", &json!(1))).unwrap();
    let latin1 = std::ffi::OsStr::from_bytes(b"caf\xe9.json");
    drop_with_mode(&queue, latin1, &task, 0o644);
    queue.drop_task("after.json", &once_task("after", &json!("after")));

    assert_eq!(queue.wait_done("after")["result"], json!("after"));
    wait_until("two rejection records", DEADLINE, || {
        queue.rejections().len() >= 2
    });
    let rejections = queue.rejections();
    assert!(
        rejections.contains_key(&format!("inbox/{forged}")),
        "{rejections:#?}"
    );
    let escaped = &rejections["inbox/caf\\xe9.json"];
    assert!(
        escaped["problem"].as_str().unwrap().contains("UTF-8"),
        "{escaped:#}"
    );
    assert!(queue.done("latin1").is_none());
    assert!(queue.list("inbox").is_empty(), "{:?}", queue.list("inbox"));
    let stderr = daemon.stderr();
    assert!(
        !stderr.lines().any(|l| l.starts_with("ERROR forged")),
        "a file name forged a log line:\n{stderr}"
    );
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}

#[test]
fn a_daemon_not_running_as_root_rejects_root_owned_task_files() {
    // Only root may hand a root daemon its files; a daemon of its own user (here `nobody`)
    // takes its own user's files and refuses root's, which no submitter could have made.
    let test = "a_daemon_not_running_as_root_rejects_root_owned_task_files";
    if !require_root(test, "it runs the daemon as another user")
        || require_tool(test, "setpriv", "util-linux").is_none()
    {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    const NOBODY: u32 = 65534;
    let queue = TestQueue::new();
    let created = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(created.status.success(), "{created:?}");
    let parent = queue.root().parent().unwrap();
    fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    for dir in std::iter::once(queue.root().to_path_buf()).chain(
        fs::read_dir(queue.root())
            .unwrap()
            .map(|e| e.unwrap().path()),
    ) {
        std::os::unix::fs::lchown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    }
    let wrapper = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let mut daemon = queue.start_wrapped(&wrapper, &[]);
    wait_until("the daemon has started", DEADLINE, || {
        daemon.stderr().contains("cairn daemon started")
    });

    let task = |id: &str| serde_json::to_vec(&once_task(id, &json!(id))).unwrap();
    drop_with_mode(&queue, "roots.json".as_ref(), &task("roots"), 0o644);
    // Its own user's file, owned by it before it arrives.
    let temp = queue.path("inbox/.mine");
    fs::write(&temp, task("mine")).unwrap();
    std::os::unix::fs::chown(&temp, Some(NOBODY), Some(NOBODY)).unwrap();
    fs::rename(&temp, queue.path("inbox/mine.json")).unwrap();

    assert_eq!(queue.wait_done("mine")["result"], json!("mine"));
    wait_until("root's file is rejected", DEADLINE, || {
        !queue.rejections().is_empty()
    });
    let rejections = queue.rejections();
    let reason = rejections["inbox/roots.json"]["reason"].as_str().unwrap();
    assert!(reason.contains("owned by root"), "{reason:?}");
    assert!(queue.done("roots").is_none());
    daemon.signal(SIGTERM);
    assert_eq!(daemon.wait_exit(DEADLINE).code(), Some(0));
}
