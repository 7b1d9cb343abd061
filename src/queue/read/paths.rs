//! The paths the read side names: where each kind of file of a queue lives (see
//! `queue/README.md`), beside the storage keys in `layout.rs`.

use std::path::PathBuf;

use crate::queue::QueueDir;
use crate::store::CheckpointStore;

/// The directory of final records of tasks that ended done.
const DONE_DIR: &str = "done";
/// The directory of failed, cancelled and budget-stopped records and of rejections.
const FAILED_DIR: &str = "failed";
/// The directory of per-task working files.
const RUNS_DIR: &str = "runs";
/// The directory task files are dropped into.
const INBOX_DIR: &str = "inbox";

impl QueueDir {
    /// The inbox's name inside the queue, for messages that speak of `inbox/`.
    pub const INBOX_NAME: &'static str = INBOX_DIR;

    /// `done/`.
    pub fn done_dir(&self) -> PathBuf {
        self.root().join(DONE_DIR)
    }

    /// `failed/`.
    pub fn failed_dir(&self) -> PathBuf {
        self.root().join(FAILED_DIR)
    }

    /// `runs/`.
    pub fn runs_dir(&self) -> PathBuf {
        self.root().join(RUNS_DIR)
    }

    /// `incremental/`, where the checkpoint store keeps its files.
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.root().join(CheckpointStore::DIR)
    }

    /// `current_work.json`.
    pub fn current_work_file(&self) -> PathBuf {
        self.root().join(QueueDir::CURRENT_WORK_KEY)
    }

    /// `tasks/<id>.json`.
    pub fn task_file(&self, id: &str) -> PathBuf {
        self.root().join(QueueDir::task_key(id))
    }

    /// `done/<id>.json`.
    pub fn done_file(&self, id: &str) -> PathBuf {
        self.root().join(QueueDir::done_key(id))
    }

    /// `failed/<id>.json` (`<id>` may be a rejection's stem).
    pub fn failed_file(&self, id: &str) -> PathBuf {
        self.root().join(QueueDir::failed_key(id))
    }

    /// `failed/<stem>.input`: the bytes of a rejected file, unless its record names them.
    pub fn rejected_input_file(&self, stem: &str) -> PathBuf {
        self.failed_dir().join(format!("{stem}.input"))
    }

    /// A key that may name a rejected file's bytes: one in `failed/`, never outside.
    pub fn is_rejected_input_key(key: &str) -> bool {
        key.strip_prefix(FAILED_DIR)
            .is_some_and(|rest| rest.starts_with('/'))
            && !key.contains("..")
    }

    /// Storage key of a task file waiting in the inbox, as `submit` and `fork` name it.
    pub fn inbox_key(task_id: &str) -> String {
        format!("{INBOX_DIR}/{task_id}.json")
    }

    /// How the rejection record of a file dropped into the inbox names it (`file`).
    pub fn inbox_names(file: &str) -> [String; 2] {
        [
            format!("{INBOX_DIR}/{file}"),
            format!("{INBOX_DIR}/{file}.json"),
        ]
    }

    /// Storage key of a task definition read from the inbox, for messages.
    pub fn inbox_name_key(name: &str) -> String {
        format!("{INBOX_DIR}/{name}")
    }

    /// The storage keys that make an id taken: its definition, its records, its inbox file.
    pub fn keys_of_id(task_id: &str) -> [String; 4] {
        [
            QueueDir::task_key(task_id),
            QueueDir::done_key(task_id),
            QueueDir::failed_key(task_id),
            QueueDir::inbox_key(task_id),
        ]
    }
}
