//! What `cairn prune` may remove, as typed items, and their removal.
//!
//! - A finished task (done, failed, budget_exceeded, cancelled) whose record is older than the
//!   retention loses `runs/<id>/`, `incremental/<id>.json.gz` and its older generations,
//!   `tasks/<id>.json`, and last its record — so a prune cut short leaves a task that still
//!   reads as finished, never one that looks pending and would run again.
//! - A rejected intake file's record (`failed/rejected-*.json`) goes with its `.input`.
//! - `keep_generations` trims the older checkpoint generations of the finished tasks that
//!   stay to the newest N (the latest file is always kept).
//! - Orphans: `runs/<id>/` and `incremental/<id>*.json.gz` of no task at all, and control
//!   requests, once older than the retention.
//!
//! Never touched: a task in `current_work.json` (in flight) or pending (`tasks/<id>.json`
//! without a record), a task named by a file in `inbox/`, and anything younger than
//! [`PRUNE_GRACE`] among orphans and control requests (a fork or a retry being set up; the
//! tasks such requests name are kept too). If `current_work.json` cannot be read, nothing is
//! planned.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::read::{
    disk_size, json_stems, list_names, mtime, newest_mtime, read_regular, CurrentWorkError,
    QueueReader, Record,
};
use super::safe_remove::{OpenedQueue, UnsafeQueueError};
use super::QueueDir;
use crate::store::{CheckpointFileName, CheckpointStore};

/// Orphans and control requests younger than this are left alone, whatever the retention.
pub const PRUNE_GRACE: Duration = Duration::from_secs(600);

/// What one removal is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PruneReason {
    /// A file of a finished task past its retention.
    Finished,
    /// A rejected intake file's record or bytes.
    Rejected,
    /// An older checkpoint generation beyond `keep_generations`.
    Generation,
    /// A run directory or checkpoint file of no task at all.
    Orphan,
    /// A control request past its retention.
    Control,
}

/// One path to remove, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneItem {
    pub path: PathBuf,
    pub reason: PruneReason,
}

impl PruneItem {
    /// Whether the path is a directory (not following a link).
    pub fn is_dir(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_dir())
    }

    /// Bytes under the path.
    pub fn disk_size(&self) -> u64 {
        disk_size(&self.path)
    }
}

/// What to keep.
#[derive(Debug, Clone, Copy)]
pub struct PruneRules {
    /// Retention: finished tasks whose record is older than this go (zero: every one).
    pub older_than: Duration,
    /// Trim the older generations of the finished tasks that remain to the newest N.
    pub keep_generations: Option<usize>,
}

/// The plan: paths in removal order, each with its reason.
#[derive(Debug, Default)]
pub struct PrunePlan {
    pub items: Vec<PruneItem>,
    pub finished_tasks: usize,
    pub rejected_records: usize,
}

/// Per task id: whether its latest checkpoint file exists, and its older generations, newest
/// first, as the checkpoint store names its files.
type CheckpointFiles = BTreeMap<String, (bool, Vec<u64>)>;

/// The queue read once for a plan.
struct Planner<'a> {
    reader: &'a QueueReader,
    cutoff: DateTime<Utc>,
    orphan_cutoff: DateTime<Utc>,
    defined: BTreeSet<String>,
    finished: BTreeSet<String>,
    rejected: Vec<(String, Record)>,
    protected: BTreeSet<String>,
    checkpoints: CheckpointFiles,
    plan: PrunePlan,
}

impl QueueReader {
    /// Work out everything prune may remove as of `now`, reading the queue once.
    pub fn prune_plan(
        &self,
        rules: &PruneRules,
        now: DateTime<Utc>,
    ) -> Result<PrunePlan, CurrentWorkError> {
        let mut planner = Planner::read(self, rules, now)?;
        planner.control_requests();
        planner.finished_tasks(rules.keep_generations);
        planner.rejected_records();
        planner.orphans();
        Ok(planner.plan)
    }
}

impl Planner<'_> {
    fn read<'a>(
        reader: &'a QueueReader,
        rules: &PruneRules,
        now: DateTime<Utc>,
    ) -> Result<Planner<'a>, CurrentWorkError> {
        let retention =
            chrono::Duration::from_std(rules.older_than).unwrap_or(chrono::Duration::MAX);
        let cutoff = now
            .checked_sub_signed(retention)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let grace_cutoff = now - chrono::Duration::from_std(PRUNE_GRACE).unwrap_or_default();
        // What must stay: tasks in flight, pending tasks, tasks named in the inbox or by a
        // fresh control request.
        let work = reader.current_work()?;
        let dir = reader.dir();
        let defined: BTreeSet<String> = json_stems(&dir.tasks()).into_iter().collect();
        let mut finished: BTreeSet<String> = json_stems(&dir.done_dir()).into_iter().collect();
        let mut rejected = Vec::new();
        for stem in json_stems(&dir.failed_dir()) {
            match Record::read(&dir.failed_file(&stem)) {
                Ok(record) if record.is_rejection() => rejected.push((stem, record)),
                _ => {
                    finished.insert(stem);
                }
            }
        }
        let mut protected: BTreeSet<String> = work
            .active_tasks
            .iter()
            .map(|t| t.task_id.to_string())
            .collect();
        protected.extend(defined.difference(&finished).cloned());
        protected.extend(reader.inbox_ids());
        Ok(Planner {
            reader,
            cutoff,
            orphan_cutoff: cutoff.min(grace_cutoff),
            defined,
            finished,
            rejected,
            protected,
            checkpoints: checkpoint_files(reader),
            plan: PrunePlan::default(),
        })
    }

    fn push(&mut self, path: PathBuf, reason: PruneReason) {
        self.plan.items.push(PruneItem { path, reason });
    }

    /// Old control requests, unless they name a task that stays; a request still to be
    /// applied keeps its task (a retry of a failed task).
    fn control_requests(&mut self) {
        let control_dir = self.reader.dir().control();
        for name in list_names(&control_dir) {
            if name.starts_with('.') {
                continue;
            }
            let path = control_dir.join(&name);
            let task_id = read_regular(&path, crate::queue::control::MAX_REQUEST_BYTES)
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .and_then(|v| v["task_id"].as_str().map(str::to_string));
            let age_ok = mtime(&path).is_some_and(|at| at <= self.orphan_cutoff);
            let names_live_task = task_id
                .as_ref()
                .is_some_and(|id| self.protected.contains(id));
            if age_ok && !names_live_task {
                self.push(path, PruneReason::Control);
            } else if let Some(id) = task_id {
                self.protected.insert(id);
            }
        }
    }

    /// Finished tasks past the retention, and older generations of those that stay.
    fn finished_tasks(&mut self, keep_generations: Option<usize>) {
        let dir = self.reader.dir().clone();
        let finished: Vec<String> = self.finished.iter().cloned().collect();
        for id in &finished {
            if self.protected.contains(id) {
                continue;
            }
            let Some(record_path) = [dir.done_file(id), dir.failed_file(id)]
                .into_iter()
                .find(|p| p.exists())
            else {
                continue;
            };
            let at = Record::read(&record_path)
                .ok()
                .and_then(|r| r.at)
                .or_else(|| mtime(&record_path));
            if at.is_some_and(|at| at <= self.cutoff) {
                self.plan.finished_tasks += 1;
                self.task_files(id);
                for path in [dir.task_file(id), dir.done_file(id), dir.failed_file(id)] {
                    if path.exists() || path.is_symlink() {
                        self.push(path, PruneReason::Finished);
                    }
                }
            } else if let Some(keep) = keep_generations {
                let older = self.checkpoints.get(id).map(|(_, older)| older.clone());
                for generation in older.unwrap_or_default().into_iter().skip(keep) {
                    let path = self.generation_path(id, generation);
                    self.push(path, PruneReason::Generation);
                }
            }
        }
    }

    /// `runs/<id>/` and every checkpoint file of a task being pruned.
    fn task_files(&mut self, id: &str) {
        let run_dir = self.reader.run_dir(id);
        if run_dir.exists() || run_dir.is_symlink() {
            self.push(run_dir, PruneReason::Finished);
        }
        for path in self.checkpoint_paths(id) {
            if path.exists() || path.is_symlink() {
                self.push(path, PruneReason::Finished);
            }
        }
    }

    /// Rejection records past the retention, each with the file's bytes.
    fn rejected_records(&mut self) {
        let dir = self.reader.dir().clone();
        for (stem, record) in std::mem::take(&mut self.rejected) {
            if record.at.is_some_and(|at| at <= self.cutoff) {
                let input = record.value["input"]
                    .as_str()
                    .filter(|key| QueueDir::is_rejected_input_key(key))
                    .map(|key| self.reader.path_of_key(key))
                    .unwrap_or_else(|| dir.rejected_input_file(&stem));
                if input.exists() {
                    self.push(input, PruneReason::Rejected);
                }
                self.push(record.path, PruneReason::Rejected);
                self.plan.rejected_records += 1;
            }
        }
    }

    /// Run directories and checkpoint files of no task at all, once old enough.
    fn orphans(&mut self) {
        let runs = self.reader.dir().runs_dir();
        for name in list_names(&runs) {
            let path = runs.join(&name);
            if name.starts_with('.') || self.known(&name) || !path.is_dir() {
                continue;
            }
            if newest_mtime(&path).is_some_and(|at| at <= self.orphan_cutoff) {
                self.push(path, PruneReason::Orphan);
            }
        }
        let ids: Vec<String> = self
            .checkpoints
            .keys()
            .filter(|id| !self.known(id))
            .cloned()
            .collect();
        for id in &ids {
            for path in self.checkpoint_paths(id) {
                if mtime(&path).is_some_and(|at| at <= self.orphan_cutoff) {
                    self.push(path, PruneReason::Orphan);
                }
            }
        }
    }

    fn known(&self, id: &str) -> bool {
        self.finished.contains(id) || self.defined.contains(id) || self.protected.contains(id)
    }

    /// A task's checkpoint files on disk: older generations newest first, then the latest.
    fn checkpoint_paths(&self, id: &str) -> Vec<PathBuf> {
        let Some((latest, older)) = self.checkpoints.get(id) else {
            return Vec::new();
        };
        let mut paths: Vec<PathBuf> = older
            .iter()
            .map(|generation| self.generation_path(id, *generation))
            .collect();
        if *latest {
            let key = CheckpointStore::latest_file_key(id);
            paths.push(self.reader.path_of_key(&key));
        }
        paths
    }

    fn generation_path(&self, id: &str, generation: u64) -> PathBuf {
        let key = CheckpointStore::generation_file_key(id, generation);
        self.reader.path_of_key(&key)
    }
}

/// Every checkpoint file in the queue, by task, as the store names them (links and other
/// entries included: prune removes what is there, not only what the store would read).
fn checkpoint_files(reader: &QueueReader) -> CheckpointFiles {
    let mut files = CheckpointFiles::new();
    for name in list_names(&reader.dir().checkpoint_dir()) {
        match CheckpointStore::parse_file_name(&name) {
            Some(CheckpointFileName::Older {
                task_id,
                generation,
            }) => files.entry(task_id.into()).or_default().1.push(generation),
            Some(CheckpointFileName::Latest { task_id }) => {
                files.entry(task_id.into()).or_default().0 = true;
            }
            None => {}
        }
    }
    for (_, older) in files.values_mut() {
        older.sort_unstable_by(|a, b| b.cmp(a));
    }
    files
}

/// Removes planned items without following a link planted in the queue.
#[derive(Debug)]
pub struct QueuePruner {
    root: PathBuf,
    opened: OpenedQueue,
}

impl QueuePruner {
    /// Open the queue for removals, refusing it if one of its directories is a symbolic link
    /// or not a directory — before anything is read, since such a directory would lead the
    /// plan (and, for root, the removals) outside the queue.
    pub fn open(reader: &QueueReader) -> Result<QueuePruner, UnsafeQueueError> {
        Ok(QueuePruner {
            root: reader.root().to_path_buf(),
            opened: OpenedQueue::open(reader.root())?,
        })
    }

    /// Remove one planned item (a file, or a directory with all it holds). Returns whether it
    /// was a directory; a missing path is `NotFound`.
    pub fn remove(&self, item: &PruneItem) -> io::Result<bool> {
        let relative: &Path = item.path.strip_prefix(&self.root).unwrap_or(&item.path);
        self.opened.remove(relative)
    }

    /// After the removals: remove the blobs (`blobs/`, the files checkpoints named) that no
    /// checkpoint left names, as the daemon's collection does (holding off its saves
    /// meanwhile). Returns how many went; a queue without blobs has none to look at.
    pub fn collect_blobs(&self) -> Result<usize, crate::store::StoreError> {
        let blobs = crate::store::blobs::BlobStore::existing(&self.root);
        if !blobs.holds_any() {
            return Ok(0);
        }
        let storage = std::sync::Arc::new(crate::store::FileStorage::new(&self.root));
        CheckpointStore::with_storage(storage)
            .with_blobs(std::sync::Arc::new(blobs))
            .collect_blobs()
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;
    use std::time::Duration;

    use chrono::Utc;

    use super::{PruneItem, PruneReason, PruneRules};
    use crate::queue::{QueueDir, QueueReader};

    fn write(root: &Path, key: &str, text: &str) {
        let path = root.join(key);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    const TASK: &str = r#"{"id": "x", "phases": [{"name": "a", "run": ["true"]}]}"#;

    /// A queue with a finished task and its files, a pending task with a checkpoint, and
    /// checkpoint files of no task (one whose name only looks like a generation).
    fn queue() -> tempfile::TempDir {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        QueueDir::new(root).create_all().unwrap();
        write(root, "tasks/t1.json", TASK);
        write(
            root,
            "done/t1.json",
            r#"{"status": "done", "finished_at": "2020-01-01T00:00:00Z"}"#,
        );
        for name in ["t1.json.gz", "t1.1.json.gz", "t1.2.json.gz", "t1.3.json.gz"] {
            write(root, &format!("incremental/{name}"), "x");
        }
        write(root, "runs/t1/0-a.log", "log");
        write(root, "tasks/p.json", TASK);
        write(root, "incremental/p.json.gz", "x");
        write(root, "incremental/a.05.json.gz", "x");
        tmp
    }

    fn items(root: &Path, rules: PruneRules, later: Duration) -> Vec<(String, PruneReason)> {
        let reader = QueueReader::open(root);
        let now = Utc::now() + chrono::Duration::from_std(later).unwrap();
        let plan = reader.prune_plan(&rules, now).unwrap();
        plan.items
            .into_iter()
            .map(|PruneItem { path, reason }| {
                let relative = path.strip_prefix(reader.root()).unwrap();
                (relative.display().to_string(), reason)
            })
            .collect()
    }

    #[test]
    fn a_finished_task_goes_whole_record_last_and_orphans_once_past_the_grace() {
        let tmp = queue();
        let rules = PruneRules {
            older_than: Duration::ZERO,
            keep_generations: None,
        };
        let finished = PruneReason::Finished;
        let expected = vec![
            ("runs/t1".to_string(), finished),
            ("incremental/t1.3.json.gz".into(), finished),
            ("incremental/t1.2.json.gz".into(), finished),
            ("incremental/t1.1.json.gz".into(), finished),
            ("incremental/t1.json.gz".into(), finished),
            ("tasks/t1.json".into(), finished),
            ("done/t1.json".into(), finished),
            // `a.05` is a task id (a generation is never written with a leading zero).
            ("incremental/a.05.json.gz".into(), PruneReason::Orphan),
        ];
        assert_eq!(
            items(tmp.path(), rules, Duration::from_secs(3600)),
            expected
        );
        // Within the grace, the orphan stays.
        assert_eq!(items(tmp.path(), rules, Duration::ZERO), expected[..7]);
    }

    #[test]
    fn generations_beyond_the_kept_ones_go_for_a_task_that_stays() {
        let tmp = queue();
        let rules = PruneRules {
            older_than: Duration::from_secs(100 * 365 * 86_400),
            keep_generations: Some(1),
        };
        assert_eq!(
            items(tmp.path(), rules, Duration::ZERO),
            vec![
                (
                    "incremental/t1.2.json.gz".to_string(),
                    PruneReason::Generation
                ),
                ("incremental/t1.1.json.gz".into(), PruneReason::Generation),
            ]
        );
    }

    #[test]
    fn an_unreadable_current_work_plans_nothing() {
        let tmp = queue();
        write(tmp.path(), "current_work.json", "{not json");
        let reader = QueueReader::open(tmp.path());
        let rules = PruneRules {
            older_than: Duration::ZERO,
            keep_generations: None,
        };
        let err = reader.prune_plan(&rules, Utc::now()).unwrap_err();
        assert!(err.to_string().contains("current_work.json"), "{err}");
    }
}
