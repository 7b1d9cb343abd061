//! `cairn submit FILE|-`: validate a task and write it atomically into the inbox, or with
//! `--db URL` insert it into the queue several hosts share.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Args;

use super::error::{print_line, CliError, CliResult};
use super::source::DbArg;
use crate::client::QueueClient;
use crate::task::{Task, TaskError, MAX_TASK_FILE_BYTES};

#[derive(Debug, Args)]
#[command(after_help = "\
The id goes to stdout (for scripts); what happened and what to run next goes to stderr.
The queue directory must exist: a submit in the wrong directory would otherwise start a queue
no daemon reads. --create-queue makes a new one.
With --db URL the task goes straight into the shared queue in that PostgreSQL database (the
queue directory is not used); an id the shared queue has already is refused (exit 3).")]
pub(super) struct SubmitArgs {
    /// The task file ("-" for stdin).
    file: PathBuf,

    /// Create the queue directory if it does not exist yet.
    #[arg(long)]
    create_queue: bool,

    #[command(flatten)]
    pub(super) db: DbArg,
}

pub(super) fn run(queue: &Path, args: SubmitArgs) -> CliResult {
    let (stem, task) = read_task_file(&args.file)?;
    let client = QueueClient::open(queue, args.db.url())?;
    if !client.is_shared() {
        // Root writes into another user's queue as that user (the task file is read already).
        super::as_owner::become_queue_owner(queue)?;
    }
    let submitted = client.submit(task, &stem, &file_name(&args.file), args.create_queue)?;
    print_line(&submitted.id)?;
    eprintln!("{}", submitted.next);
    Ok(())
}

/// Read and validate a task file ("-" is stdin). Returns the name to derive an id from, or
/// the error naming the file with its exit code.
pub(super) fn read_task_file(file: &Path) -> CliResult<(String, Task)> {
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
pub(super) fn file_name(file: &Path) -> String {
    if file == Path::new("-") {
        "<stdin>".to_string()
    } else {
        file.display().to_string()
    }
}
