//! Intake: taking task files out of `inbox/`, validating them, and accepting or rejecting them.
//!
//! A file is claimed by renaming it out of the inbox into `tasks/.claim.<suffix>.<name>`, so a
//! file is processed once even if the daemon crashes mid-way: leftover claims are processed again
//! at the next start, and processing a claim is idempotent (the generated id and the rejection
//! record's name both derive from the claim's suffix). Accepted tasks are written durably to
//! `tasks/<id>.json` before the claim is removed; rejected files get a record in `failed/` that
//! says why, and their bytes are kept beside it.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_json::json;

use super::QueueDir;
use crate::store::Storage;
use crate::task::{generate_id, random_suffix, Task, TaskError, MAX_TASK_FILE_BYTES};

/// How long a file must stay unchanged before it is taken without a "closed" hint.
pub const SETTLE_TIME: Duration = Duration::from_millis(1000);

/// How long a file seen being written (and not closed) may stay unchanged before the writer is
/// taken to be gone.
pub const WRITING_PATIENCE: Duration = Duration::from_secs(60);

/// How long a file that ends mid-JSON may stay unchanged before it is rejected as truncated.
pub const TRUNCATED_PATIENCE: Duration = Duration::from_secs(10);

const CLAIM_PREFIX: &str = ".claim.";

/// Reads the inbox and turns its files into accepted tasks or rejection records.
#[derive(Debug)]
pub struct Intake {
    queue: QueueDir,
    storage: Arc<dyn Storage>,
    /// Inbox names known to be completely written (closed after writing, or renamed in).
    complete_hints: HashSet<String>,
    /// Inbox names seen being created or written and not closed since: still being written,
    /// however long the writer pauses.
    writing: HashSet<String>,
}

/// What one scan did.
#[derive(Debug, Default)]
pub struct IntakeReport {
    /// Tasks newly written to `tasks/`, in the order they were taken.
    pub accepted: Vec<Task>,
    pub rejected: Vec<Rejection>,
    /// Files left in the inbox for now because they may still be being written.
    pub deferred: usize,
    /// The scan stopped at its batch limit with files left to take: scan again.
    pub more: bool,
}

/// A file refused at intake.
#[derive(Debug)]
pub struct Rejection {
    /// Where the record was written (`failed/<key>.json`).
    pub record_key: String,
    /// The file as it was named in the inbox (`inbox/<name>`).
    pub file: String,
    pub error: TaskError,
}

impl Rejection {
    /// The record's name without directory and extension (`rejected-<stem>-<suffix>`), which
    /// `cairn show` takes.
    pub fn record_name(&self) -> String {
        let name = self
            .record_key
            .rsplit('/')
            .next()
            .unwrap_or(&self.record_key);
        name.strip_suffix(".json").unwrap_or(name).to_string()
    }
}

enum Outcome {
    Accepted(Task),
    AlreadyAccepted,
    Rejected(Rejection),
}

impl Intake {
    pub fn new(queue: QueueDir, storage: Arc<dyn Storage>) -> Self {
        Intake {
            queue,
            storage,
            complete_hints: HashSet::new(),
            writing: HashSet::new(),
        }
    }

    /// Note that `name` in the inbox was closed after writing or renamed in, so it is complete.
    pub fn hint_complete(&mut self, name: String) {
        self.writing.remove(&name);
        self.complete_hints.insert(name);
    }

    /// Note that `name` in the inbox is open for writing (created or written to).
    pub fn hint_writing(&mut self, name: String) {
        self.complete_hints.remove(&name);
        self.writing.insert(name);
    }

    /// Finish the claims a previous daemon left half-processed (run once at start).
    pub fn recover_claims(&mut self) -> io::Result<IntakeReport> {
        let mut report = IntakeReport::default();
        let mut claims: Vec<String> = read_names(&self.queue.tasks())?
            .into_iter()
            .filter(|n| n.starts_with(CLAIM_PREFIX))
            .collect();
        claims.sort();
        for claim in claims {
            let Some((suffix, original)) = claim[CLAIM_PREFIX.len()..].split_once('.') else {
                continue;
            };
            let (suffix, original) = (suffix.to_string(), original.to_string());
            let path = self.queue.tasks().join(&claim);
            match self.process_claim(&path, &original, &suffix, true) {
                Ok(outcome) => self.record(outcome, &mut report),
                Err(e) => {
                    return_to_inbox(&path, &self.queue.inbox().join(&original));
                    return Err(e);
                }
            }
        }
        Ok(report)
    }

    /// Take every complete file in the inbox.
    pub fn scan(&mut self) -> io::Result<IntakeReport> {
        self.scan_batch(usize::MAX)
    }

    /// Take complete files in the inbox, at most `limit` of them (accepted or rejected); the
    /// report's `more` says whether files were left for another call. The daemon scans in
    /// batches so that the first tasks of a large drop start while the rest are taken.
    pub fn scan_batch(&mut self, limit: usize) -> io::Result<IntakeReport> {
        let mut report = IntakeReport::default();
        let inbox = self.queue.inbox();
        let mut names = read_names(&inbox)?;
        names.sort();
        // Forget hints about files that are gone.
        {
            let present: HashSet<&str> = names.iter().map(String::as_str).collect();
            self.writing.retain(|n| present.contains(n.as_str()));
            self.complete_hints.retain(|n| present.contains(n.as_str()));
        }
        let now = SystemTime::now();
        let mut taken = 0;
        for name in names {
            if name.starts_with('.') || name.ends_with(".tmp") {
                continue;
            }
            if taken >= limit {
                report.more = true;
                break;
            }
            let path = inbox.join(&name);
            let meta = match fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.file_type().is_file() && meta.len() <= MAX_TASK_FILE_BYTES {
                let age = meta
                    .modified()
                    .ok()
                    .and_then(|m| now.duration_since(m).ok());
                // Open for writing, by inotify's account; a lost close event must not hold a
                // file forever, so the hint lapses once the file stops changing for a while.
                if self.writing.contains(&name) && age.is_none_or(|age| age < WRITING_PATIENCE) {
                    report.deferred += 1;
                    continue;
                }
                let recent = age.is_none_or(|age| age < SETTLE_TIME);
                if recent && !self.complete_hints.contains(&name) {
                    report.deferred += 1;
                    continue;
                }
                // A writer that closed the file between two writes, or that wrote it before
                // this daemon watched, looks complete; if what is there ends mid-JSON and
                // changed lately, give it longer before calling it broken.
                let lately = age.is_none_or(|age| age < TRUNCATED_PATIENCE);
                if lately && looks_truncated(&path) {
                    report.deferred += 1;
                    continue;
                }
            }
            self.complete_hints.remove(&name);
            let suffix = random_suffix();
            let claim = self
                .queue
                .tasks()
                .join(format!("{CLAIM_PREFIX}{suffix}.{name}"));
            match fs::rename(&path, &claim) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("claiming {}: {e}", path.display()),
                    ))
                }
            }
            taken += 1;
            match self.process_claim(&claim, &name, &suffix, false) {
                Ok(outcome) => self.record(outcome, &mut report),
                Err(e) => {
                    return_to_inbox(&claim, &path);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("taking {}: {e}", path.display()),
                    ));
                }
            }
        }
        Ok(report)
    }

    fn record(&self, outcome: Outcome, report: &mut IntakeReport) {
        match outcome {
            Outcome::Accepted(task) => {
                tracing::info!(task_id = task.id(), "accepted task");
                report.accepted.push(task);
            }
            Outcome::AlreadyAccepted => {}
            Outcome::Rejected(rejection) => {
                tracing::warn!(
                    file = %rejection.file,
                    record = %rejection.record_key,
                    "rejected task file: {}",
                    rejection.error
                );
                report.rejected.push(rejection);
            }
        }
    }

    /// Validate a claimed file and accept or reject it. `recovering` is true for claims left by
    /// an earlier daemon, whose task may already have been written to `tasks/`.
    fn process_claim(
        &self,
        claim: &Path,
        original: &str,
        suffix: &str,
        recovering: bool,
    ) -> io::Result<Outcome> {
        let file = format!("inbox/{original}");
        let stem = original.strip_suffix(".json").unwrap_or(original);
        let reject = |error: TaskError| self.reject(claim, &file, stem, suffix, error);

        let meta = match fs::symlink_metadata(claim) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Outcome::AlreadyAccepted),
            Err(e) => return Err(e),
        };
        let kind = meta.file_type();
        if kind.is_symlink() {
            return reject(TaskError::whole_file(
                "is a symbolic link; drop the task file itself, not a link to it",
            ));
        }
        if !kind.is_file() {
            let what = if kind.is_dir() {
                "a directory"
            } else if kind.is_fifo() {
                "a FIFO"
            } else if kind.is_socket() {
                "a socket"
            } else {
                "not a regular file"
            };
            return reject(TaskError::whole_file(format!(
                "is {what}; a task must be a regular JSON file"
            )));
        }
        if let Ok(inbox) = fs::metadata(self.queue.inbox()) {
            if let Err(problem) = super::check_submitter(&meta, &inbox) {
                return reject(TaskError::whole_file(problem));
            }
        }
        if !original.ends_with(".json") {
            return reject(TaskError::whole_file(
                "task files must be named <name>.json",
            ));
        }
        if meta.len() > MAX_TASK_FILE_BYTES {
            return reject(TaskError::whole_file(format!(
                "file is {} bytes, larger than the limit of {MAX_TASK_FILE_BYTES} bytes",
                meta.len()
            )));
        }
        let bytes = read_regular_file(claim)?;
        let mut task = match Task::parse(&bytes) {
            Ok(task) => task,
            Err(error) => return reject(error),
        };
        let id = task
            .id
            .get_or_insert_with(|| generate_id(stem, suffix))
            .clone();
        let normalized = task.to_json_bytes();
        let task_key = QueueDir::task_key(&id);
        let existing = self.storage.get(&task_key)?;
        if recovering && existing.as_deref() == Some(normalized.as_slice()) {
            remove_claim(claim);
            return Ok(Outcome::AlreadyAccepted);
        }
        let exists = existing.is_some()
            || self.storage.get(&QueueDir::done_key(&id))?.is_some()
            || self.storage.get(&QueueDir::failed_key(&id))?.is_some();
        if exists {
            return reject(TaskError::new(
                "id",
                format!("a task with id {id:?} already exists in this queue"),
            ));
        }
        if let Err(e) = self.storage.put(&task_key, &normalized, None) {
            // The task did not exist before; if the write got as far as the rename, undo it so
            // that taking the file again later does not find a "duplicate".
            let _ = self.storage.remove(&task_key);
            return Err(e);
        }
        remove_claim(claim);
        Ok(Outcome::Accepted(task))
    }

    /// Write the rejection record, then keep the file's bytes beside it (symlinks are removed:
    /// the record names their target instead).
    fn reject(
        &self,
        claim: &Path,
        file: &str,
        stem: &str,
        suffix: &str,
        error: TaskError,
    ) -> io::Result<Outcome> {
        let key = format!("rejected-{}", generate_id(stem, suffix));
        let record_key = QueueDir::failed_key(&key);
        let input_key = format!("failed/{key}.input");
        let link_target = fs::read_link(claim).ok();
        let record = json!({
            "status": "rejected",
            "file": file,
            "field": error.field,
            "problem": error.problem,
            "reason": format!("{file}: {error}"),
            "input": if link_target.is_some() { None } else { Some(&input_key) },
            "symlink_target": link_target,
            "rejected_at": chrono::Utc::now(),
        });
        let mut bytes = serde_json::to_vec_pretty(&record).map_err(io::Error::other)?;
        bytes.push(b'\n');
        if let Err(e) = self.storage.put(&record_key, &bytes, None) {
            let _ = self.storage.remove(&record_key);
            return Err(e);
        }
        if link_target.is_some() {
            remove_claim(claim);
        } else {
            fs::rename(claim, self.queue.root().join(&input_key))?;
        }
        Ok(Outcome::Rejected(Rejection {
            record_key,
            file: file.to_string(),
            error,
        }))
    }
}

/// Put a claimed file back where it was, when processing it failed (a full disk, say), so the
/// next scan takes it again. Never replaces a file that has appeared there since.
fn return_to_inbox(claim: &Path, inbox_path: &Path) {
    let returned = match fs::hard_link(claim, inbox_path) {
        Ok(()) => fs::remove_file(claim),
        // Directories cannot be linked; they are moved back only if the name is still free.
        Err(e) if claim.is_dir() && e.kind() != io::ErrorKind::AlreadyExists => {
            if fs::symlink_metadata(inbox_path).is_ok() {
                Err(io::Error::from(io::ErrorKind::AlreadyExists))
            } else {
                fs::rename(claim, inbox_path)
            }
        }
        Err(e) => Err(e),
    };
    if let Err(e) = returned {
        tracing::error!(
            claim = %claim.display(),
            "cannot return the file to the inbox ({e}); it is processed again at the next start"
        );
    }
}

fn remove_claim(claim: &Path) {
    if let Err(e) = fs::remove_file(claim) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(claim = %claim.display(), "could not remove claimed file: {e}");
        }
    }
}

fn read_names(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("reading {}: {e}", dir.display()),
            ))
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        if let Some(name) = entry?.file_name().to_str() {
            names.push(name.to_string());
        }
    }
    Ok(names)
}

/// Read a file that must be regular, without following a link or blocking on a FIFO swapped in.
fn read_regular_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)?;
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_TASK_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// True when the file's bytes so far end in the middle of a JSON document.
fn looks_truncated(path: &Path) -> bool {
    match read_regular_file(path) {
        Ok(bytes) => serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
            .err()
            .is_some_and(|e| e.is_eof()),
        Err(_) => false,
    }
}
