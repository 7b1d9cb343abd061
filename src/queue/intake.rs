//! Intake: taking task files out of `inbox/`, validating them, and accepting or rejecting them.
//!
//! A file is claimed by renaming it out of the inbox into a directory of its own,
//! `tasks/.claim.<suffix>/<name>`: the claim's name has a fixed length whatever the file's name
//! (a name near `NAME_MAX` cannot make it too long), and the file keeps its name inside it. A
//! file is so processed once even if the daemon crashes mid-way: leftover claims are processed
//! again at the next start, and processing a claim is idempotent (the generated id and the
//! rejection record's name both derive from the claim's suffix). Accepted tasks are written
//! durably to `tasks/<id>.json` before the claim is removed; rejected files get a record in
//! `failed/` that says why, and their bytes are kept beside it.
//!
//! Each entry is dealt with on its own: one the daemon cannot read gets a rejection record, one
//! it cannot even move out of the inbox (a directory it may not write) is renamed aside inside
//! the inbox with a record, and the scan goes on. Only a problem of the queue itself (a full
//! disk) stops a scan, and what it accepted before is still reported.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs::{self, Metadata};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use super::task_sink::{FileSink, Stored, TaskSink};
use super::QueueDir;
use crate::limits::{Admission, SubmitterKey};
use crate::safe_fs::{open_no_follow, read_names};
use crate::store::records::RecordStatus;
use crate::store::Storage;
use crate::submitter::Submitter;
use crate::task::{random_suffix, Task, TaskError, MAX_TASK_FILE_BYTES};
use crate::task_id::TaskId;

/// How long a file must stay unchanged before it is taken without a "closed" hint.
pub(super) const SETTLE_TIME: Duration = Duration::from_millis(1000);

/// How long a file seen being written (and not closed) may stay unchanged before the writer is
/// taken to be gone.
pub(super) const WRITING_PATIENCE: Duration = Duration::from_secs(60);

/// How long a file that ends mid-JSON may stay unchanged before it is rejected as truncated.
pub(super) const TRUNCATED_PATIENCE: Duration = Duration::from_secs(10);

const CLAIM_PREFIX: &str = ".claim.";

/// Reads the inbox and turns its files into accepted tasks or rejection records.
#[derive(Debug)]
pub struct Intake {
    queue: QueueDir,
    /// Where rejection records are written.
    storage: Arc<dyn Storage>,
    /// Where accepted tasks go.
    sink: Arc<dyn TaskSink>,
    /// Inbox names known to be completely written (closed after writing, or renamed in).
    complete_hints: HashSet<String>,
    /// Inbox names seen being created or written and not closed since: still being written,
    /// however long the writer pauses.
    writing: HashSet<String>,
    /// Until a scan has gone through the whole inbox once: the files found there were written
    /// before this intake watched, so no close event can be waited for (see
    /// [`Intake::still_being_written`]).
    before_first_full_scan: bool,
    /// Entries that could neither be claimed nor moved aside, by name, with the (device,
    /// inode) they had: skipped quietly while they stay the same, so that one such entry does
    /// not fill the log at every scan.
    stuck: HashMap<OsString, (u64, u64)>,
    /// Files whose modification time is ahead of the clock (a clock stepped back, a file
    /// copied from a host whose clock runs ahead), by name: how the file looked when first
    /// seen so, and when. Their age is counted on this daemon's own clock from then.
    from_the_future: HashMap<OsString, (FileLook, Instant)>,
    /// The per-submitter limits a new task must pass, and the counts they are held against
    /// (`None`: no limits).
    admission: Option<Arc<Admission>>,
}

/// What tells one version of an inbox file from another: its inode, size and modification
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileLook {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl FileLook {
    fn of(meta: &Metadata) -> FileLook {
        FileLook {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        }
    }
}

/// What one scan did.
#[derive(Debug, Default)]
pub struct IntakeReport {
    /// Tasks newly written to `tasks/`, in the order they were taken.
    pub accepted: Vec<Task>,
    /// Tasks newly submitted to a shared queue (PostgreSQL), in the order they were taken:
    /// every daemon claims them from there, so they are not in `accepted`.
    pub submitted: Vec<TaskId>,
    pub rejected: Vec<Rejection>,
    /// Files left in the inbox for now because they may still be being written.
    pub deferred: usize,
    /// Files left in the inbox because their submitter's recent files were rejected up to
    /// the limit (`Admission::may_take_from`); a later scan takes them.
    pub held: usize,
    /// The scan stopped at its batch limit with files left to take: scan again.
    pub more: bool,
    /// A problem of the queue itself (the inbox unreadable, a full disk) stopped the scan; the
    /// file it was taking went back to the inbox. What was accepted before it is in `accepted`.
    pub error: Option<io::Error>,
}

/// A file refused at intake.
#[derive(Debug)]
pub struct Rejection {
    /// Where the record was written (`failed/<key>.json`).
    pub record_key: String,
    /// The file as it was named in the inbox (`inbox/<name>`; a name that is not UTF-8 with
    /// its other bytes written `\xNN`). May hold any character: escape it when logging.
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
    Submitted(TaskId),
    AlreadyAccepted,
    Rejected(Rejection),
}

impl Intake {
    /// Intake for the file queue: accepted tasks are written to `tasks/` through `storage`.
    pub fn new(queue: QueueDir, storage: Arc<dyn Storage>) -> Self {
        let sink = Arc::new(FileSink::new(Arc::clone(&storage)));
        Intake::with_sink(queue, storage, sink)
    }

    /// Intake that hands accepted tasks to `sink` (a shared queue); claims and rejection
    /// records stay in `queue`, written through `storage`.
    pub fn with_sink(queue: QueueDir, storage: Arc<dyn Storage>, sink: Arc<dyn TaskSink>) -> Self {
        Intake {
            queue,
            storage,
            sink,
            complete_hints: HashSet::new(),
            writing: HashSet::new(),
            before_first_full_scan: true,
            stuck: HashMap::new(),
            from_the_future: HashMap::new(),
            admission: None,
        }
    }

    /// Hold every new task to the per-submitter limits of `admission`, and count what is
    /// accepted there.
    pub fn set_admission(&mut self, admission: Arc<Admission>) {
        self.admission = Some(admission);
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

    /// Finish the claims a previous daemon left half-processed (run once at start). A claim
    /// that cannot be finished now goes back to the inbox; the report's `error` says why.
    pub fn recover_claims(&mut self) -> IntakeReport {
        let mut report = IntakeReport::default();
        let tasks = self.queue.tasks();
        let mut claims: Vec<OsString> = match read_names(&tasks) {
            Ok(names) => names,
            Err(e) => {
                report.error = Some(e);
                return report;
            }
        };
        claims.retain(|n| n.as_bytes().starts_with(CLAIM_PREFIX.as_bytes()));
        claims.sort();
        for claim in claims {
            let Some(claim) = claim.to_str() else {
                continue;
            };
            let suffix = &claim[CLAIM_PREFIX.len()..];
            let claim_path = tasks.join(claim);
            if is_claim_dir_name(claim) && claim_path.is_dir() {
                // This daemon's claims: a directory holding the file under its own name.
                for name in read_names(&claim_path).unwrap_or_default() {
                    self.recover_one(&claim_path.join(&name), &name, suffix, &mut report);
                }
                remove_claim_dir(&claim_path);
            } else if let Some((suffix, original)) = suffix.split_once('.') {
                // Left by an earlier version: `.claim.<suffix>.<name>`.
                let name = OsString::from(original);
                self.recover_one(&claim_path, &name, suffix, &mut report);
            }
        }
        report
    }

    fn recover_one(&self, claim: &Path, name: &OsStr, suffix: &str, report: &mut IntakeReport) {
        match self.process_claim(claim, name, suffix, true) {
            Ok(outcome) => self.record(outcome, report),
            Err(e) => {
                return_to_inbox(claim, &self.queue.inbox().join(name));
                report.error = Some(e);
            }
        }
    }

    /// Take every complete file in the inbox.
    pub fn scan(&mut self) -> IntakeReport {
        self.scan_batch(usize::MAX)
    }

    /// Take complete files in the inbox, at most `limit` of them (accepted or rejected); the
    /// report's `more` says whether files were left for another call. The daemon scans in
    /// batches so that the first tasks of a large drop start while the rest are taken.
    pub fn scan_batch(&mut self, limit: usize) -> IntakeReport {
        let mut report = IntakeReport::default();
        let inbox = self.queue.inbox();
        let names = match read_names(&inbox) {
            Ok(names) => names,
            Err(e) => {
                report.error = Some(e);
                return report;
            }
        };
        self.forget_gone(&names);
        let now = SystemTime::now();
        let mut taken = 0;
        for (name, meta) in round_robin_by_owner(&inbox, names) {
            if taken >= limit {
                report.more = true;
                break;
            }
            let path = inbox.join(&name);
            let meta = match meta {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    report.error = Some(io::Error::new(
                        e.kind(),
                        format!("reading inbox/{:?}: {e}", shown_name(&name)),
                    ));
                    break;
                }
            };
            if self.stuck.get(&name) == Some(&(meta.dev(), meta.ino())) {
                continue;
            }
            let owner = SubmitterKey::Uid(meta.uid());
            if let Some(admission) = &self.admission {
                if !admission.may_take_from(owner, std::time::Instant::now()) {
                    report.held += 1;
                    continue;
                }
            }
            if self.still_being_written(&name, &meta, &path, now) {
                report.deferred += 1;
                continue;
            }
            if let Some(name) = name.to_str() {
                self.complete_hints.remove(name);
            }
            taken += 1;
            match self.take(&name, &path, &meta) {
                Ok(Some(outcome)) => {
                    if let (Outcome::Rejected(_), Some(admission)) = (&outcome, &self.admission) {
                        admission.note_rejected(owner);
                    }
                    self.record(outcome, &mut report)
                }
                Ok(None) => {}
                Err(e) => {
                    report.error = Some(e);
                    break;
                }
            }
        }
        if !report.more && report.error.is_none() {
            self.before_first_full_scan = false;
        }
        report
    }

    /// Forget what is known about files that are gone: the inbox holds only `names`.
    fn forget_gone(&mut self, names: &[OsString]) {
        let present: HashSet<&OsStr> = names.iter().map(OsString::as_os_str).collect();
        let utf8 = |n: &String| present.contains(OsStr::new(n));
        self.writing.retain(utf8);
        self.complete_hints.retain(utf8);
        self.stuck.retain(|n, _| present.contains(n.as_os_str()));
        self.from_the_future
            .retain(|n, _| present.contains(n.as_os_str()));
    }

    /// Whether a regular file may still be being written, and is to be left for a later scan.
    fn still_being_written(
        &mut self,
        name: &OsStr,
        meta: &Metadata,
        path: &Path,
        now: SystemTime,
    ) -> bool {
        if !meta.file_type().is_file() || meta.len() > MAX_TASK_FILE_BYTES {
            return false;
        }
        // The watcher's hints are kept by UTF-8 names.
        let hint_name = name.to_str();
        let age = self.age(name, meta, now);
        // Open for writing, by inotify's account; a lost close event must not hold a file
        // forever, so the hint lapses once the file stops changing for a while.
        let writing = hint_name.is_some_and(|n| self.writing.contains(n));
        if writing && age.is_none_or(|age| age < WRITING_PATIENCE) {
            return true;
        }
        // A file already there when the daemon started cannot have its close seen: one that
        // holds a whole JSON document is complete (`cairn submit` renames its files in whole),
        // so a fresh daemon takes it at once instead of a second later.
        let closed = hint_name.is_some_and(|n| self.complete_hints.contains(n))
            || (self.before_first_full_scan && !writing && holds_whole_json(path));
        if age.is_none_or(|age| age < SETTLE_TIME) && !closed {
            return true;
        }
        // A writer that closed the file between two writes, or that wrote it before this
        // daemon watched, looks complete; if what is there ends mid-JSON and changed lately,
        // give it longer before calling it broken.
        let lately = age.is_none_or(|age| age < TRUNCATED_PATIENCE);
        lately && looks_truncated(path)
    }

    /// How long the file has stayed as it is: by its modification time, or, for one modified
    /// in the future by the clock, since this daemon first saw it as it is now (so that a
    /// clock stepped back does not hold it in the inbox until the clock catches up).
    fn age(&mut self, name: &OsStr, meta: &Metadata, now: SystemTime) -> Option<Duration> {
        let modified = meta.modified().ok()?;
        match now.duration_since(modified) {
            Ok(age) => {
                self.from_the_future.remove(name);
                Some(age)
            }
            Err(_) => {
                let look = FileLook::of(meta);
                let (seen, since) = self
                    .from_the_future
                    .entry(name.to_os_string())
                    .or_insert((look, Instant::now()));
                if *seen != look {
                    *seen = look;
                    *since = Instant::now();
                }
                Some(since.elapsed())
            }
        }
    }

    /// Claim one inbox entry and accept or reject it (`None`: it vanished, or is skipped). An
    /// error is a problem of the queue itself; the entry is then back in the inbox.
    fn take(&mut self, name: &OsStr, path: &Path, meta: &Metadata) -> io::Result<Option<Outcome>> {
        let (claim_dir, suffix) = self.make_claim_dir()?;
        let claim = claim_dir.join(name);
        if let Err(e) = fs::rename(path, &claim) {
            remove_claim_dir(&claim_dir);
            if e.kind() == io::ErrorKind::NotFound {
                return Ok(None);
            }
            return self.refuse_in_place(name, path, meta, &suffix, e);
        }
        if self.sink.wants_durable_claims() {
            // The id a task without one gets derives from the claim: the claim must outlive a
            // power loss, or taking the file again would make a second task.
            let synced = sync_dir(&claim_dir)
                .and_then(|()| sync_dir(&self.queue.tasks()))
                .and_then(|()| sync_dir(&self.queue.inbox()));
            if let Err(e) = synced {
                return_to_inbox(&claim, path);
                remove_claim_dir(&claim_dir);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "making the claim of inbox/{:?} durable: {e}",
                        shown_name(name)
                    ),
                ));
            }
        }
        let outcome = self.process_claim(&claim, name, &suffix, false);
        if outcome.is_err() {
            return_to_inbox(&claim, path);
        }
        remove_claim_dir(&claim_dir);
        outcome.map(Some).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("taking inbox/{:?}: {e}", shown_name(name)),
            )
        })
    }

    /// A fresh claim directory `tasks/.claim.<suffix>`, only the daemon's user may enter.
    fn make_claim_dir(&self) -> io::Result<(PathBuf, String)> {
        let mut last = None;
        for _ in 0..16 {
            let suffix = random_suffix();
            let dir = self.queue.tasks().join(format!("{CLAIM_PREFIX}{suffix}"));
            match fs::DirBuilder::new().mode(0o700).create(&dir) {
                Ok(()) => return Ok((dir, suffix)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", dir.display()),
                    ))
                }
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no free claim name")))
    }

    /// An entry that cannot be moved out of the inbox (a directory the daemon may not write:
    /// moving it would rewrite its `..`) is renamed aside inside the inbox, where scans ignore
    /// it and its owner can remove it, and gets a rejection record. If even that fails, it is
    /// skipped until it changes, with one log line.
    fn refuse_in_place(
        &mut self,
        name: &OsStr,
        path: &Path,
        meta: &Metadata,
        suffix: &str,
        error: io::Error,
    ) -> io::Result<Option<Outcome>> {
        let shown = shown_name(name);
        let aside = format!(".rejected.{:016x}", fastrand::u64(..));
        let aside_path = self.queue.inbox().join(&aside);
        let moved = if fs::symlink_metadata(&aside_path).is_ok() {
            Err(io::Error::from(io::ErrorKind::AlreadyExists))
        } else {
            fs::rename(path, &aside_path)
        };
        if let Err(e) = moved {
            self.stuck.insert(name.to_owned(), (meta.dev(), meta.ino()));
            tracing::warn!(
                file = ?format!("inbox/{shown}"),
                "cannot take this entry ({error}) nor rename it aside ({e}); skipping it until it changes"
            );
            return Ok(None);
        }
        let kind = match kind_problem(meta.file_type()) {
            Some(kind) => format!("{kind}; "),
            None => String::new(),
        };
        let problem = format!(
            "{kind}it cannot be moved out of inbox/ ({error}), so it was renamed to inbox/{aside}: remove it"
        );
        let rejection = self.write_record(
            &format!("inbox/{shown}"),
            suffix,
            TaskError::whole_file(problem),
            Some(format!("inbox/{aside}")),
            None,
        )?;
        Ok(Some(Outcome::Rejected(rejection)))
    }

    fn record(&self, outcome: Outcome, report: &mut IntakeReport) {
        match outcome {
            Outcome::Accepted(task) => {
                tracing::info!(task_id = %task.id(), "accepted task");
                report.accepted.push(task);
            }
            Outcome::Submitted(id) => {
                tracing::info!(task_id = %id, "submitted task to the shared queue");
                report.submitted.push(id);
            }
            Outcome::AlreadyAccepted => {}
            Outcome::Rejected(rejection) => {
                // Debug formatting escapes what a file name or its contents may hold (a newline
                // would otherwise start a forged log line).
                tracing::warn!(
                    file = ?rejection.file,
                    record = %rejection.record_key,
                    problem = ?rejection.error.to_string(),
                    "rejected task file"
                );
                report.rejected.push(rejection);
            }
        }
    }

    /// Validate a claimed file and accept or reject it. `recovering` is true for claims left by
    /// an earlier daemon, whose task may already have been written to `tasks/`. A file that
    /// cannot be read, or fails a check, is rejected; an error is a problem of the queue.
    fn process_claim(
        &self,
        claim: &Path,
        name: &OsStr,
        suffix: &str,
        recovering: bool,
    ) -> io::Result<Outcome> {
        let file = format!("inbox/{}", shown_name(name));
        let reject = |error: TaskError| self.reject(claim, &file, suffix, error);

        let meta = match fs::symlink_metadata(claim) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Outcome::AlreadyAccepted),
            Err(e) => return Err(e),
        };
        if let Some(kind) = kind_problem(meta.file_type()) {
            return reject(TaskError::whole_file(kind));
        }
        let Some(utf8_name) = name.to_str() else {
            return reject(TaskError::whole_file(
                "has a name that is not valid UTF-8; rename it (<name>.json, in UTF-8) and drop it again",
            ));
        };
        if !utf8_name.ends_with(".json") {
            return reject(TaskError::whole_file(
                "task files must be named <name>.json",
            ));
        }
        let (bytes, owner) = match self.read_checked(claim, &meta) {
            Ok(read) => read,
            Err(error) => return reject(error),
        };
        let mut task = match Task::parse(&bytes) {
            Ok(task) => task,
            Err(error) => return reject(error),
        };
        // The submitter is whoever owns the file read, never what it says (`Task::parse`
        // refuses a `submitted_by`).
        task.submitted_by = Some(Submitter::of_uid(owner));
        // A claim an earlier daemon left may hold a task already accepted (and counted): only
        // new files are held to the limits.
        if let (Some(admission), false) = (&self.admission, recovering) {
            if let Err(error) = admission.check(&task) {
                return reject(error);
            }
        }
        let stem = utf8_name.strip_suffix(".json").unwrap_or(utf8_name);
        let id = task
            .id
            .get_or_insert_with(|| TaskId::generate(stem, suffix))
            .clone();
        let normalized = task.to_json_bytes();
        match self.sink.store(&task, &normalized, recovering)? {
            Stored::IdTaken { place } => reject(TaskError::new(
                "id",
                format!("a task with id {id:?} already exists in {place}"),
            )),
            stored => {
                remove_claim(claim);
                Ok(match stored {
                    Stored::Submitted => Outcome::Submitted(id),
                    Stored::Same => Outcome::AlreadyAccepted,
                    _ => {
                        // Counted now, before the next file of this scan is checked.
                        if let Some(admission) = &self.admission {
                            admission.note(&id, SubmitterKey::of_task(&task));
                        }
                        Outcome::Accepted(task)
                    }
                })
            }
        }
    }

    /// Open the claimed file without following a link or blocking on a FIFO swapped in, check
    /// what `fstat` says of that same descriptor (the file read is the file checked), and read
    /// it. Returns its bytes and its owner (the submitter), both of that one descriptor. The
    /// error is what to put in the rejection record.
    fn read_checked(&self, claim: &Path, listed: &Metadata) -> Result<(Vec<u8>, u32), TaskError> {
        let cannot_read = |e: io::Error| {
            TaskError::whole_file(format!(
                "cannot be read by the daemon's user ({e}); make it readable by the daemon (chmod 0640, with the inbox's group) and drop it again"
            ))
        };
        let file = open_no_follow(claim).map_err(cannot_read)?;
        let meta = file.metadata().map_err(cannot_read)?;
        if (meta.dev(), meta.ino()) != (listed.dev(), listed.ino()) || !meta.is_file() {
            return Err(TaskError::whole_file(
                "was replaced while being taken; drop it again",
            ));
        }
        if let Ok(inbox) = fs::metadata(self.queue.inbox()) {
            super::check_task_file(&meta, &inbox)
                .map_err(|refused| TaskError::whole_file(refused.to_string()))?;
        }
        if meta.len() > MAX_TASK_FILE_BYTES {
            return Err(TaskError::whole_file(format!(
                "file is {} bytes, larger than the limit of {MAX_TASK_FILE_BYTES} bytes",
                meta.len()
            )));
        }
        let mut bytes = Vec::new();
        file.take(MAX_TASK_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(cannot_read)?;
        Ok((bytes, meta.uid()))
    }

    /// Write the rejection record, then keep the file's bytes beside it (symlinks are removed:
    /// the record names their target instead).
    fn reject(
        &self,
        claim: &Path,
        file: &str,
        suffix: &str,
        error: TaskError,
    ) -> io::Result<Outcome> {
        let link_target = fs::read_link(claim).ok();
        let input = link_target
            .is_none()
            .then(|| format!("failed/{}.input", record_name(file, suffix)));
        let rejection = self.write_record(file, suffix, error, input.clone(), link_target)?;
        match input {
            Some(input) => fs::rename(claim, self.queue.root().join(input))?,
            None => remove_claim(claim),
        }
        Ok(Outcome::Rejected(rejection))
    }

    /// Write `failed/rejected-<stem>-<suffix>.json` for `file`; `input` is where its bytes are
    /// kept (relative to the queue), `symlink_target` what a link pointed to.
    fn write_record(
        &self,
        file: &str,
        suffix: &str,
        error: TaskError,
        input: Option<String>,
        symlink_target: Option<PathBuf>,
    ) -> io::Result<Rejection> {
        let record_key = QueueDir::failed_key(&record_name(file, suffix));
        let record = json!({
            "status": RecordStatus::Rejected,
            "file": file,
            "field": error.field,
            "problem": error.problem,
            "reason": format!("{file}: {error}"),
            "input": input,
            "symlink_target": symlink_target,
            "rejected_at": chrono::Utc::now(),
        });
        let mut bytes = serde_json::to_vec_pretty(&record).map_err(io::Error::other)?;
        bytes.push(b'\n');
        if let Err(e) = self.storage.put(&record_key, &bytes, None) {
            let _ = self.storage.remove(&record_key);
            return Err(e);
        }
        Ok(Rejection {
            record_key,
            file: file.to_string(),
            error,
        })
    }
}

/// The rejection record's name for `inbox/<name>`: `rejected-<stem>-<suffix>`.
fn record_name(file: &str, suffix: &str) -> String {
    let name = file.strip_prefix("inbox/").unwrap_or(file);
    let stem = name.strip_suffix(".json").unwrap_or(name);
    format!("rejected-{}", TaskId::generate(stem, suffix))
}

/// What is wrong with an entry that is not a regular file, if it is not.
fn kind_problem(kind: fs::FileType) -> Option<&'static str> {
    if kind.is_file() {
        None
    } else if kind.is_symlink() {
        Some("is a symbolic link; drop the task file itself, not a link to it")
    } else if kind.is_dir() {
        Some("is a directory; a task must be a regular JSON file")
    } else if kind.is_fifo() {
        Some("is a FIFO; a task must be a regular JSON file")
    } else if kind.is_socket() {
        Some("is a socket; a task must be a regular JSON file")
    } else {
        Some("is not a regular file; a task must be a regular JSON file")
    }
}

/// The inbox's entries (not dot-files, not `.tmp`) in the order intake takes them: one of each
/// owner's in turn, each owner's by name, owners by uid. Taken by name alone, 5,000 bad files
/// of one submitter named to sort first held another's task back for the whole of them; now
/// each submitter's next file waits behind at most one of every other's. An entry whose
/// metadata cannot be read comes first, with its error.
fn round_robin_by_owner(
    inbox: &Path,
    names: Vec<OsString>,
) -> Vec<(OsString, io::Result<Metadata>)> {
    let mut by_owner: std::collections::BTreeMap<
        Option<u32>,
        Vec<(OsString, io::Result<Metadata>)>,
    > = std::collections::BTreeMap::new();
    for name in names {
        let bytes = name.as_bytes();
        if bytes.starts_with(b".") || bytes.ends_with(b".tmp") {
            continue;
        }
        let meta = fs::symlink_metadata(inbox.join(&name));
        let owner = meta.as_ref().ok().map(MetadataExt::uid);
        by_owner.entry(owner).or_default().push((name, meta));
    }
    let mut queues: Vec<std::vec::IntoIter<_>> = by_owner
        .into_values()
        .map(|mut files| {
            files.sort_by(|a, b| a.0.cmp(&b.0));
            files.into_iter()
        })
        .collect();
    let mut order = Vec::new();
    loop {
        let before = order.len();
        for files in &mut queues {
            order.extend(files.next());
        }
        if order.len() == before {
            return order;
        }
    }
}

/// A file name as it may be shown in records and logs: itself when it is UTF-8, otherwise
/// its valid parts with each other byte written `\xNN`.
pub(super) fn shown_name(name: &OsStr) -> String {
    if let Some(name) = name.to_str() {
        return name.to_string();
    }
    let mut shown = String::new();
    for chunk in name.as_bytes().utf8_chunks() {
        shown.push_str(chunk.valid());
        for byte in chunk.invalid() {
            let _ = write!(shown, "\\x{byte:02x}");
        }
    }
    shown
}

/// `.claim.` and a suffix: a claim directory of this version.
fn is_claim_dir_name(name: &str) -> bool {
    let suffix = &name[CLAIM_PREFIX.len().min(name.len())..];
    name.starts_with(CLAIM_PREFIX)
        && suffix.len() == random_suffix().len()
        && suffix.bytes().all(|b| b.is_ascii_hexdigit())
}

fn remove_claim_dir(dir: &Path) {
    if let Err(e) = fs::remove_dir(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(claim = %dir.display(), "could not remove the claim directory: {e}");
        }
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
            claim = ?claim,
            "cannot return the file to the inbox ({e}); it is processed again at the next start"
        );
    }
}

/// Make a directory's entries durable (fsync on the directory).
fn sync_dir(dir: &Path) -> io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

fn remove_claim(claim: &Path) {
    if let Err(e) = fs::remove_file(claim) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(claim = ?claim, "could not remove claimed file: {e}");
        }
    }
}

/// Read a file that must be regular, without following a link or blocking on a FIFO swapped in.
fn read_regular_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut file = open_no_follow(path)?;
    let mut bytes = Vec::new();
    file.by_ref()
        .take(MAX_TASK_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// True when the file's bytes so far end in the middle of a JSON document.
/// Does the file hold one whole JSON document (whatever its shape)?
fn holds_whole_json(path: &Path) -> bool {
    read_regular_file(path)
        .is_ok_and(|bytes| serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_ok())
}

fn looks_truncated(path: &Path) -> bool {
    match read_regular_file(path) {
        Ok(bytes) => serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
            .err()
            .is_some_and(|e| e.is_eof()),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::sync::Arc;

    use super::{Intake, QueueDir};
    use crate::store::FileStorage;

    const TASK: &[u8] = br#"{"phases": [{"name": "a", "run": ["true"]}]}"#;

    fn queue() -> (tempfile::TempDir, QueueDir, Intake) {
        let tmp = tempfile::tempdir().unwrap();
        let queue = QueueDir::new(tmp.path());
        queue.create_all().unwrap();
        let intake = Intake::new(queue.clone(), Arc::new(FileStorage::new(tmp.path())));
        (tmp, queue, intake)
    }

    #[test]
    fn claims_left_by_a_crash_are_finished_under_their_own_names_twice_alike() {
        let (_tmp, queue, mut intake) = queue();
        // This version's claim directory, and an earlier version's claim file.
        let claim_dir = queue.tasks().join(".claim.00abcd");
        fs::create_dir(&claim_dir).unwrap();
        fs::write(claim_dir.join("report.json"), TASK).unwrap();
        fs::write(queue.tasks().join(".claim.00beef.old.json"), TASK).unwrap();

        let report = intake.recover_claims();
        assert!(report.error.is_none(), "{:?}", report.error);
        let mut ids: Vec<&str> = report.accepted.iter().map(|t| t.id().as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["old-00beef", "report-00abcd"]);
        assert!(!claim_dir.exists());
        assert!(queue.tasks().join("report-00abcd.json").exists());

        // A crash after the task was written but before the claim was removed: the same task,
        // not a duplicate and not a rejection.
        fs::create_dir(&claim_dir).unwrap();
        fs::write(claim_dir.join("report.json"), TASK).unwrap();
        let again = intake.recover_claims();
        assert!(
            again.accepted.is_empty() && again.rejected.is_empty(),
            "{again:?}"
        );
        assert!(!claim_dir.exists());
    }

    /// A file already in the inbox when the intake starts, fresh but holding a whole JSON
    /// document, is taken by the first scan rather than a second later; a fresh one that ends
    /// mid-JSON is left to settle, and after the first full scan a fresh file waits for its
    /// close event or the settle time as before.
    #[test]
    fn the_first_scan_takes_fresh_whole_files_at_once() {
        let (_tmp, queue, mut intake) = queue();
        fs::write(queue.inbox().join("whole.json"), TASK).unwrap();
        fs::write(queue.inbox().join("half.json"), &TASK[..10]).unwrap();
        let first = intake.scan();
        assert!(first.error.is_none(), "{:?}", first.error);
        let ids: Vec<&str> = first.accepted.iter().map(|t| t.id().as_str()).collect();
        assert_eq!(ids.len(), 1, "{first:?}");
        assert!(ids[0].starts_with("whole-"), "{ids:?}");
        assert!(first.rejected.is_empty(), "{first:?}");
        assert_eq!(first.deferred, 1, "the half-written file waits: {first:?}");

        fs::write(queue.inbox().join("later.json"), TASK).unwrap();
        let second = intake.scan();
        assert!(second.accepted.is_empty(), "{second:?}");
        assert_eq!(second.deferred, 2, "{second:?}");
    }

    #[test]
    fn a_name_near_the_limit_is_taken_and_a_bad_entry_does_not_stop_the_scan() {
        let (_tmp, queue, mut intake) = queue();
        let long = format!("{}.json", "n".repeat(250));
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        for name in [long.as_str(), "a-bad.json", "z-good.json"] {
            let path = queue.inbox().join(name);
            let bytes: &[u8] = if name == "a-bad.json" { b"{" } else { TASK };
            fs::write(&path, bytes).unwrap();
            let file = fs::File::options().write(true).open(&path).unwrap();
            file.set_modified(old).unwrap();
        }
        let report = intake.scan();
        assert!(report.error.is_none(), "{:?}", report.error);
        assert_eq!(report.accepted.len(), 2, "{report:?}");
        // Each accepted task names the owner of its file as its submitter.
        let me = nix::unistd::Uid::effective().as_raw();
        for task in &report.accepted {
            assert_eq!(task.submitted_by().map(|s| s.uid), Some(me), "{task:?}");
            let stored = fs::read(queue.tasks().join(format!("{}.json", task.id()))).unwrap();
            let stored = crate::task::Task::parse_stored(&stored).unwrap();
            assert_eq!(stored.submitted_by(), task.submitted_by());
        }
        assert_eq!(report.rejected.len(), 1, "{report:?}");
        assert!(fs::read_dir(queue.inbox()).unwrap().next().is_none());
    }
}
