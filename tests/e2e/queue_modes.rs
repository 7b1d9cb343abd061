//! The modes of a queue, with the real binary: what cairn creates is `0750`/`0640` whatever the
//! umask; the daemon refuses (exit 5, naming the directory and the fix) a shared directory that
//! is not sticky, a parent of the queue that others can change, and a queue every user may
//! enter while it holds task definitions with `env`; the commands that write refuse that last
//! one too.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{json, Value};

use crate::common::*;

const UNSAFE_QUEUE: i32 = 5;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// `cairn --queue <queue> <args>` run by a shell that set the umask `umask` first.
fn cairn_with_umask(queue: &Path, umask: &str, args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_cairn"))
        .arg("--queue")
        .arg(queue)
        .args(args)
        .env_remove("CAIRN_QUEUE")
        .output()
        .expect("starting cairn under sh")
}

/// Every entry under `dir`, depth first.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        all.push(path.clone());
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            all.extend(walk(&path));
        }
    }
    all
}

fn assert_refused(output: &Output, names: &Path, fix: &str) {
    let stderr = stderr_of(output);
    assert_eq!(output.status.code(), Some(UNSAFE_QUEUE), "{stderr}");
    assert!(
        stderr.contains(&names.display().to_string()),
        "the refusal does not name {}: {stderr}",
        names.display()
    );
    assert!(
        stderr.contains(fix),
        "the refusal does not say {fix:?}: {stderr}"
    );
}

fn env_task(id: &str) -> Value {
    let mut task = once_task(id, &json!(id));
    task["env"] = json!({"API_TOKEN": "secret"});
    task
}

#[test]
fn what_cairn_creates_is_0750_and_0640_under_umask_000() {
    let queue = TestQueue::new();
    fs::remove_dir_all(queue.root()).unwrap(); // cairn creates it, under umask 000
    let task_file = queue.aux("count.json");
    let task = loop_task("count", &queue.aux("side.log"), 3, 0.0);
    fs::write(&task_file, serde_json::to_vec(&task).unwrap()).unwrap();

    let submitted = cairn_with_umask(
        queue.root(),
        "000",
        &["submit", "--create-queue", task_file.to_str().unwrap()],
    );
    assert!(submitted.status.success(), "{}", stderr_of(&submitted));
    let inbox_files = fs::read_dir(queue.path("inbox")).unwrap().count();
    assert_eq!(inbox_files, 1);
    for entry in fs::read_dir(queue.path("inbox")).unwrap() {
        assert_eq!(mode_of(&entry.unwrap().path()), 0o640, "the submitted file");
    }

    let run = cairn_with_umask(queue.root(), "000", &["run", "--exit-when-idle"]);
    assert!(run.status.success(), "{}", stderr_of(&run));
    assert_eq!(queue.done("count").unwrap()["result"], loop_result(3));

    assert_eq!(mode_of(queue.root()), 0o750, "the queue's directory");
    let mut seen = (0, 0);
    for path in walk(queue.root()) {
        let meta = fs::symlink_metadata(&path).unwrap();
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() {
            seen.0 += 1;
            assert_eq!(mode, 0o750, "{}", path.display());
        } else if meta.file_type().is_fifo() {
            assert_eq!(mode, 0o600, "{}", path.display());
        } else {
            seen.1 += 1;
            assert_eq!(mode, 0o640, "{}", path.display());
        }
    }
    // The directories, the definition, the record, current_work, a checkpoint, the journal,
    // the run log: more than a handful each.
    assert!(
        seen.0 >= 8 && seen.1 >= 5,
        "only {seen:?} directories/files"
    );
    for wrote in ["tasks/count.json", "done/count.json", "current_work.json"] {
        assert_eq!(mode_of(&queue.path(wrote)), 0o640, "{wrote}");
    }
}

/// A queue root every user may enter (as git checks out the repository's `queue/`, mode 755)
/// takes tasks with `env`: what cairn writes is 0750 and 0640, so nobody else reads the tokens.
/// A definition someone opened up to every user, where every user can reach it, is refused.
#[test]
fn only_a_definition_with_env_every_user_can_read_is_refused() {
    let queue = TestQueue::new();
    let created = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(created.status.success(), "{}", stderr_of(&created));
    chmod(queue.root(), 0o755);
    chmod(&queue.path("inbox"), 0o755);

    // `cairn submit` adds a token there, and the daemon runs it.
    let with_env = queue.aux("with-env.json");
    fs::write(&with_env, serde_json::to_vec(&env_task("tok")).unwrap()).unwrap();
    let output = queue.cairn_output(&["submit", with_env.to_str().unwrap()], b"");
    assert!(output.status.success(), "{}", stderr_of(&output));
    let submitted = queue.path("inbox/tok.json");
    assert_eq!(mode_of(&submitted), 0o640, "submit writes 0640");
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("tok").unwrap()["result"], json!("tok"));

    // A token in a file every user can read, in the open inbox, stops the daemon and the
    // commands that write, naming the file.
    queue.seed_task("open.json", &env_task("open"));
    let open = queue.path("inbox/open.json");
    chmod(&open, 0o644);
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert_refused(&output, queue.root(), "chmod o-rwx");
    assert!(
        stderr_of(&output).contains("open.json"),
        "{}",
        stderr_of(&output)
    );
    for command in [&["pause", "tok"][..], &["prune", "--dry-run"][..]] {
        let output = queue.cairn_output(command, b"");
        assert_refused(&output, queue.root(), "chmod o-rwx");
    }
    // Reading is not refused.
    let status = queue.cairn_output(&["status"], b"");
    assert!(status.status.success(), "{}", stderr_of(&status));

    // Closing the file (or the directory, or the root) is enough.
    chmod(&open, 0o640);
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("open").unwrap()["result"], json!("open"));
}

#[test]
fn a_shared_directory_must_be_sticky() {
    for dir in ["inbox", "control"] {
        let queue = TestQueue::new();
        let created = queue.cairn_output(&["run", "--exit-when-idle"], b"");
        assert!(created.status.success(), "{}", stderr_of(&created));
        chmod(&queue.path(dir), 0o2770);
        let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
        assert_refused(&output, &queue.path(dir), "chmod +t");
        assert!(stderr_of(&output).contains("not sticky"));
        chmod(&queue.path(dir), 0o3770);
        queue.seed_task("shared.json", &once_task("shared", &json!(dir)));
        queue.run_until_idle(&[]);
        assert_eq!(queue.done("shared").unwrap()["result"], json!(dir));
    }
}

#[test]
fn a_parent_others_can_write_is_refused_unless_sticky() {
    let queue = TestQueue::new();
    let created = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(created.status.success(), "{}", stderr_of(&created));
    let parent = queue.root().parent().unwrap().to_path_buf();
    for (mode, who) in [(0o777, "every user"), (0o775, "its group")] {
        chmod(&parent, mode);
        let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
        assert_refused(&output, &parent, "chmod go-w");
        assert!(stderr_of(&output).contains(who), "{}", stderr_of(&output));
    }
    // Sticky, like /tmp (every test queue lives under it): nobody else can move the queue.
    chmod(&parent, 0o1777);
    queue.seed_task("sticky.json", &once_task("sticky", &json!(1)));
    queue.run_until_idle(&[]);
    assert_eq!(queue.done("sticky").unwrap()["result"], json!(1));
    chmod(&parent, 0o700);
}

#[test]
fn a_parent_owned_by_another_user_is_refused() {
    if !require_root(
        "a_parent_owned_by_another_user_is_refused",
        "it gives a parent of the queue to another user",
    ) {
        return;
    }
    let queue = TestQueue::new();
    let created = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(created.status.success(), "{}", stderr_of(&created));
    let parent = queue.root().parent().unwrap().to_path_buf();
    std::os::unix::fs::chown(&parent, Some(65534), None).unwrap();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert_refused(&output, &parent, "chown root");
    assert!(
        stderr_of(&output).contains("65534"),
        "{}",
        stderr_of(&output)
    );
    std::os::unix::fs::chown(&parent, Some(0), None).unwrap();
    let output = queue.cairn_output(&["run", "--exit-when-idle"], b"");
    assert!(output.status.success(), "{}", stderr_of(&output));
}
