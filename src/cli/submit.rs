//! `cairn submit FILE|-`: validate a task and write it atomically into the inbox, or with
//! `--db URL` insert it into the queue several hosts share.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Args;

use super::error::{print_line, CliError, CliResult};
use super::source::DbArg;
use crate::queue::{QueueDir, QueueReader};
use crate::store::{FileStorage, Storage};
use crate::task::{random_suffix, Task, TaskError, MAX_TASK_FILE_BYTES};
use crate::task_id::TaskId;

#[derive(Debug, Args)]
#[command(after_help = "\
The id goes to stdout (for scripts); what happened and what to run next goes to stderr.
The queue directory must exist: a submit in the wrong directory would otherwise start a queue
no daemon reads. --create-queue makes a new one.
With --db URL the task goes straight into the shared queue in that PostgreSQL database (the
queue directory is not used); an id the shared queue has already is refused (exit 3).")]
pub struct SubmitArgs {
    /// The task file ("-" for stdin).
    file: PathBuf,

    /// Create the queue directory if it does not exist yet.
    #[arg(long)]
    create_queue: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub fn run(queue: &Path, args: SubmitArgs) -> CliResult {
    let (stem, mut task) = read_task_file(&args.file)?;
    let id = task
        .id
        .get_or_insert_with(|| TaskId::generate(&stem, &random_suffix()))
        .clone();
    if let Some(url) = args.db.url() {
        return submit_db(url, &args.file, &task);
    }
    let queue_dir = QueueDir::new(queue);
    if !queue.is_dir() && !args.create_queue {
        let shown = std::path::absolute(queue).unwrap_or_else(|_| queue.to_path_buf());
        return Err(CliError::failure(format_args!(
            "there is no queue at {} (nothing was submitted); name the queue with \
             --queue DIR or CAIRN_QUEUE, run from the directory that holds it, or create it \
             with `cairn submit --create-queue` or `cairn run`",
            shown.display()
        )));
    }
    // Root writes into another user's queue as that user (the task file is read already).
    super::as_owner::become_queue_owner(queue)?;
    // The inbox of a new queue is created; an existing one is left as its owner set it up.
    if !queue_dir.inbox().is_dir() {
        queue_dir.create_all()?;
    }
    let storage = FileStorage::new(queue);
    let inbox_key = QueueDir::inbox_key(&id);
    for key in QueueDir::keys_of_id(&id) {
        match storage.get(&key) {
            Ok(None) => {}
            Ok(Some(_)) => {
                return Err(CliError::invalid_task(format_args!(
                    "{}: a task with id {id:?} already exists in the queue ({})",
                    args.file.display(),
                    queue_dir.display_key(&key)
                )));
            }
            // A submitter may not be allowed to read the daemon's directories; the daemon
            // refuses a duplicate id itself, so the early check is only a courtesy.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => {
                return Err(CliError::failure(format_args!(
                    "reading {}: {e}",
                    queue_dir.display_key(&key)
                )));
            }
        }
    }
    // The inbox file appears whole or not at all: temp file, fsync, rename, directory fsync.
    storage
        .put(&inbox_key, &task.to_json_bytes(), None)
        .map_err(|e| {
            CliError::failure(format_args!(
                "writing {}: {e}",
                queue_dir.display_key(&inbox_key)
            ))
        })?;
    print_line(&id)?;
    tell_what_next(queue, &id);
    Ok(())
}

/// Insert `task` (its id set) into the shared queue at `url`, once: an id the queue has
/// already is refused as the file queue refuses it, and nothing changes.
#[cfg(feature = "postgres")]
fn submit_db(url: &str, file: &Path, task: &Task) -> CliResult {
    use crate::queue::postgres::{NewTask, Submitted};

    let shared = super::shared_queue::SharedQueue::open(url)?;
    let id = task.id();
    // Stored as the inbox's intake stores it (with its submitter: the user running this, as
    // a host's intake takes the owner of the file), so a task is the same text however it
    // came in.
    let mut task = task.clone();
    task.submitted_by = Some(crate::submitter::Submitter::current());
    let definition = String::from_utf8_lossy(&task.to_json_bytes()).into_owned();
    let submitted = shared
        .runtime
        .block_on(shared.db.submit(&NewTask::of(&task, &definition)))
        .map_err(|e| shared.error(format_args!("{e}; nothing was submitted")))?;
    if submitted == Submitted::AlreadyThere {
        return Err(CliError::invalid_task(format_args!(
            "{}: a task with id {:?} already exists in the shared queue ({}); nothing was \
             submitted",
            file_name(file),
            id.as_str(),
            shared.database
        )));
    }
    print_line(id)?;
    eprintln!(
        "submitted {id} to the shared queue ({}); a `cairn run --db` daemon takes it within a \
         second or two; follow it with `cairn status --db URL` or `cairn show --db URL {id}`",
        shared.database
    );
    Ok(())
}

#[cfg(not(feature = "postgres"))]
fn submit_db(_url: &str, _file: &Path, _task: &Task) -> CliResult {
    Err(super::source::without_postgres())
}

/// For people (stderr, so the id stays alone on stdout): where the task went and what to run.
fn tell_what_next(queue: &Path, id: &str) {
    let shown = std::path::absolute(queue).unwrap_or_else(|_| queue.to_path_buf());
    let cairn = if queue == Path::new("./queue") {
        "cairn".to_string()
    } else {
        format!("cairn --queue {}", shown.display())
    };
    let reader = QueueReader::open(queue);
    let daemon = if reader.daemon().running {
        "its daemon takes it within a second".to_string()
    } else {
        format!("no daemon runs on this queue: `{cairn} run` starts one")
    };
    eprintln!(
        "submitted {id} to {}; {daemon}; follow it with `{cairn} status` or `{cairn} show {id}`",
        reader.dir().inbox().display()
    );
}

/// Read and validate a task file ("-" is stdin). Returns the name to derive an id from, or
/// the error naming the file with its exit code.
pub fn read_task_file(file: &Path) -> CliResult<(String, Task)> {
    let (bytes, stem) = if file == Path::new("-") {
        let mut bytes = Vec::new();
        let read = std::io::stdin()
            .take(MAX_TASK_FILE_BYTES + 1)
            .read_to_end(&mut bytes);
        read.map_err(|e| CliError::failure(format_args!("reading stdin: {e}")))?;
        (bytes, "task".to_string())
    } else {
        let meta = std::fs::metadata(file)
            .map_err(|e| CliError::failure(format_args!("{}: {e}", file.display())))?;
        if !meta.is_file() {
            return Err(CliError::invalid_task(format_args!(
                "{}: not a regular file",
                file.display()
            )));
        }
        if meta.len() > MAX_TASK_FILE_BYTES {
            return Err(CliError::invalid_task(format_args!(
                "{}: file is {} bytes, larger than the limit of {MAX_TASK_FILE_BYTES} bytes",
                file.display(),
                meta.len()
            )));
        }
        match std::fs::read(file) {
            Ok(bytes) => {
                let stem = file
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("task")
                    .to_string();
                (bytes, stem)
            }
            Err(e) => {
                return Err(CliError::failure(format_args!("{}: {e}", file.display())));
            }
        }
    };
    let name = file_name(file);
    let task = Task::parse(&bytes).map_err(|e| invalid_task_file(&name, e))?;
    for warning in task.warnings() {
        eprintln!("warning: {name}: {warning}");
    }
    Ok((stem, task))
}

/// Exit 3 for a task file that does not validate; several problems one a line, so that the
/// author fixes them all in one go.
fn invalid_task_file(name: &str, error: TaskError) -> CliError {
    if error.more.is_empty() {
        return CliError::invalid_task(format_args!("{name}: {error}"));
    }
    let first = TaskError {
        more: Vec::new(),
        ..error.clone()
    };
    let lines: Vec<String> = std::iter::once(first.to_string())
        .chain(error.more.iter().map(TaskError::to_string))
        .map(|line| format!("\n  {line}"))
        .collect();
    CliError::invalid_task(format_args!(
        "{name}: {} problems:{}",
        lines.len(),
        lines.concat()
    ))
}

/// How messages name a task file: its path, or `<stdin>` for "-".
pub fn file_name(file: &Path) -> String {
    if file == Path::new("-") {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    }
}
