//! The status of a queue kept up to date instead of rebuilt: a long-lived reader (the
//! dashboard's) keeps every task's view and, at each refresh, builds again only the tasks
//! whose files or place in the queue changed. [`QueueReader::status`] is a refresh of an empty
//! cache, so the two read a queue the same way.
//!
//! A refresh reads the shared files once (the work state, the daemon's lock, the listings of
//! `tasks/`, `done/` and `failed/`). A task's view is built again when its place changed
//! (which directories name it, its work-state entry, whether the daemon lives), when it runs
//! (its checkpoints and journal advance without the entry changing), when it is new, and when
//! a file its view was read from changed: each such file's size, inode, modification and
//! change times are kept ([`Stamp`]). A file changed less than [`SETTLE`] before it was looked
//! at may change again within the same tick of the file system's clock without its times
//! moving, so its task is built again at every refresh until the file has settled: a change
//! always shows up at the next refresh. Each view carries the number of the refresh that built
//! it ([`StatusCache::built_at`]), so that a caller keeping what it makes of a view (the
//! dashboard's JSON) makes it again only for those. Rejection records are read once each: they
//! are never rewritten.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};

use super::files::quietly;
use super::record::{self, Record};
use super::task_view::{rejected_view, submitted_view, task_view, Listing};
use super::{json_stems, LoadOptions, QueueReader, QueueView, TaskView};
use crate::queue::QueueDir;
use crate::store::current_work::{ActiveStatus, ActiveTask, StartPoint};
use crate::store::CheckpointStore;
use crate::task_id::TaskId;

/// How long after its last change a file is trusted not to change unseen: longer than the
/// coarsest tick of a file system's clock, with room for a network file system's.
pub(super) const SETTLE: Duration = Duration::from_secs(2);

/// Where a task stands in the queue's shared files: a change means its view is out of date.
#[derive(Debug, Clone, PartialEq)]
struct Place {
    in_tasks: bool,
    in_done: bool,
    in_failed: bool,
    entry: Option<ActiveTask>,
    retry_of: Option<DateTime<Utc>>,
    daemon_running: bool,
}

/// What a file looked like (`None` in [`Stamps`]: there was none).
#[derive(Debug, Clone, PartialEq)]
struct Stamp {
    len: u64,
    inode: u64,
    modified: Option<SystemTime>,
    changed: (i64, i64),
}

/// The files a task's view was read from, as they looked just before.
#[derive(Debug, Clone, PartialEq)]
struct Stamps {
    files: Vec<Option<Stamp>>,
    /// Whether every file had settled ([`SETTLE`]) when looked at.
    settled: bool,
}

impl Stamps {
    /// Look at the files the view of a task at `place` is read from.
    fn of(dir: &QueueDir, id: &str, place: &Place, settle: Duration) -> Stamps {
        let root = dir.root();
        let mut paths: Vec<PathBuf> = vec![dir.task_file(id)];
        if place.in_done {
            paths.push(dir.done_file(id));
        }
        if place.in_failed {
            paths.push(dir.failed_file(id));
        }
        if place.entry.is_none() && !place.in_done && !place.in_failed {
            paths.push(root.join(StartPoint::key(id)));
        }
        if place.entry.is_some() || place.in_failed {
            paths.push(root.join(CheckpointStore::latest_file_key(id)));
        }
        let now = SystemTime::now();
        let mut settled = true;
        let files = paths
            .iter()
            .map(|path| {
                let meta = std::fs::symlink_metadata(path).ok()?;
                Some(Stamp::of(&meta, now, settle, &mut settled))
            })
            .collect();
        Stamps { files, settled }
    }
}

impl Stamp {
    fn of(
        meta: &std::fs::Metadata,
        now: SystemTime,
        settle: Duration,
        settled: &mut bool,
    ) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let changed_at = SystemTime::UNIX_EPOCH
            + Duration::new(meta.ctime().max(0) as u64, meta.ctime_nsec().max(0) as u32);
        let modified = meta.modified().ok();
        let newest = modified.map_or(changed_at, |m| m.max(changed_at));
        // A time ahead of the clock is not trusted either.
        if now.duration_since(newest).map_or(true, |age| age < settle) {
            *settled = false;
        }
        Stamp {
            len: meta.len(),
            inode: meta.ino(),
            modified,
            changed: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// One task's view as kept, with what it was read from and the refresh that built it.
#[derive(Debug)]
struct Kept {
    place: Place,
    stamps: Stamps,
    view: TaskView,
    built_at: u64,
}

/// The views of a queue's tasks, kept between refreshes.
#[derive(Debug)]
pub struct StatusCache {
    views: HashMap<String, Kept>,
    /// Rejection records by stem (`None`: a `failed/rejected-*` file that is a task's record).
    rejections: HashMap<String, Option<Record>>,
    /// The number of the latest refresh.
    refreshes: u64,
    settle: Duration,
    /// How many views the last refresh built (for the benchmark and the tests).
    pub last_built: usize,
}

impl Default for StatusCache {
    fn default() -> StatusCache {
        StatusCache::new()
    }
}

impl StatusCache {
    pub fn new() -> StatusCache {
        StatusCache {
            views: HashMap::new(),
            rejections: HashMap::new(),
            refreshes: 0,
            settle: SETTLE,
            last_built: 0,
        }
    }

    /// The queue's status, reading only what changed; the views stay kept.
    pub fn status(&mut self, reader: &QueueReader, options: LoadOptions) -> QueueView {
        let (listing, now) = self.refresh(reader);
        let views: Vec<TaskView> = self.views.values().map(|kept| kept.view.clone()).collect();
        self.assemble(reader, listing, now, options, views)
    }

    /// The queue's status read once: every view built and none kept.
    pub(super) fn read_once(reader: &QueueReader, options: LoadOptions) -> QueueView {
        let mut cache = StatusCache::new();
        let (listing, now) = cache.refresh(reader);
        let views: Vec<TaskView> = std::mem::take(&mut cache.views)
            .into_values()
            .map(|kept| kept.view)
            .collect();
        cache.assemble(reader, listing, now, options, views)
    }

    /// The refresh that last built the view of task `id` (`None`: none kept, as for a task
    /// still in the inbox or a rejection, which are built at each refresh).
    pub fn built_at(&self, id: &str) -> Option<u64> {
        self.views.get(id).map(|kept| kept.built_at)
    }

    /// Build again the views whose task changed, and forget those of tasks gone.
    fn refresh<'r>(&mut self, reader: &'r QueueReader) -> (Listing<'r>, DateTime<Utc>) {
        let now = Utc::now();
        self.refreshes += 1;
        let listing = quietly(|| Listing::read(reader));
        let places = self.places(reader, &listing);
        self.views.retain(|id, _| places.contains_key(id));
        let mut built = 0;
        for (id, place) in places {
            let stamps = Stamps::of(reader.dir(), &id, &place, self.settle);
            if self
                .views
                .get(&id)
                .is_some_and(|kept| kept.fresh(&place, &stamps))
            {
                continue;
            }
            let Ok(task_id) = TaskId::parse(id.as_str()) else {
                continue;
            };
            let view = quietly(|| task_view(&listing, &task_id));
            built += 1;
            let kept = Kept {
                place,
                stamps,
                view,
                built_at: self.refreshes,
            };
            self.views.insert(id, kept);
        }
        self.last_built = built;
        (listing, now)
    }

    /// Every task id the queue knows (rejections apart) and its place.
    fn places(&mut self, reader: &QueueReader, listing: &Listing) -> HashMap<String, Place> {
        let dir = reader.dir();
        let tasks: HashSet<String> = json_stems(&dir.tasks()).into_iter().collect();
        let done: HashSet<String> = json_stems(&dir.done_dir()).into_iter().collect();
        let mut failed = HashSet::new();
        let mut stems_seen = HashSet::new();
        for stem in json_stems(&dir.failed_dir()) {
            stems_seen.insert(stem.clone());
            if self.rejection(reader, &stem).is_some() {
                continue;
            }
            failed.insert(stem);
        }
        self.rejections.retain(|stem, _| stems_seen.contains(stem));
        let entries: HashMap<&str, &ActiveTask> = listing
            .work
            .active_tasks
            .iter()
            .map(|entry| (entry.task_id.as_str(), entry))
            .collect();
        let ids: BTreeSet<&str> = tasks
            .iter()
            .chain(&done)
            .chain(&failed)
            .map(String::as_str)
            .chain(entries.keys().copied())
            .collect();
        ids.into_iter()
            .map(|id| {
                let place = Place {
                    in_tasks: tasks.contains(id),
                    in_done: done.contains(id),
                    in_failed: failed.contains(id),
                    entry: entries.get(id).map(|e| (*e).clone()),
                    retry_of: listing.retry_of.get(id).copied(),
                    daemon_running: listing.daemon.running,
                };
                (id.to_string(), place)
            })
            .collect()
    }

    /// The rejection record `failed/<stem>.json`, read once.
    fn rejection(&mut self, reader: &QueueReader, stem: &str) -> Option<&Record> {
        if !stem.starts_with("rejected-") {
            return None;
        }
        self.rejections
            .entry(stem.to_string())
            .or_insert_with(|| reader.rejection(stem))
            .as_ref()
    }

    /// The view of the whole queue from the task `views`: in flight first, then pending,
    /// finished and rejected; by id within each.
    fn assemble(
        &self,
        reader: &QueueReader,
        listing: Listing,
        now: DateTime<Utc>,
        options: LoadOptions,
        mut tasks: Vec<TaskView>,
    ) -> QueueView {
        let mut warnings = listing.warnings.clone();
        // A file in the inbox whose id is taken already will be rejected, not run.
        let known: HashSet<String> = tasks.iter().map(|t| t.id.clone()).collect();
        tasks.extend(
            reader
                .inbox_tasks()
                .into_iter()
                .filter(|(_, task)| !known.contains(task.id().as_str()))
                .map(|(name, task)| submitted_view(reader, &name, task)),
        );
        let mut rejected: Vec<(&String, &Record)> = self
            .rejections
            .iter()
            .filter_map(|(stem, record)| Some((stem, record.as_ref()?)))
            .collect();
        let rejected_count = rejected.len();
        // Most recent first; ties (same time) by name.
        rejected
            .sort_by(|(a_stem, a), (b_stem, b)| b.at.cmp(&a.at).then_with(|| a_stem.cmp(b_stem)));
        tasks.extend(
            rejected
                .into_iter()
                .take(options.rejected)
                .map(|(stem, record)| rejected_view(stem, record.clone())),
        );
        tasks.sort_by(|a, b| {
            record::rank(&a.state)
                .cmp(&record::rank(&b.state))
                .then_with(|| a.id.cmp(&b.id))
        });
        for task in &tasks {
            warnings.extend(task.warnings.iter().cloned());
        }
        QueueView {
            root: reader.root().to_path_buf(),
            now,
            daemon: listing.daemon,
            tasks,
            inbox: reader.inbox_count(),
            rejected: rejected_count,
            warnings,
            current_work_problem: listing.work_problem.clone(),
            cluster: None,
            limits: reader.published_limits(listing.daemon),
        }
    }
}

impl Kept {
    /// Whether the view still holds: same place, same files, all settled, and not running.
    fn fresh(&self, place: &Place, stamps: &Stamps) -> bool {
        let running = place
            .entry
            .as_ref()
            .is_some_and(|e| e.status == ActiveStatus::Running);
        !running && stamps.settled && self.place == *place && self.stamps == *stamps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::read::tests::{id, queue, task, write};
    use crate::queue::{QueueDir, QueueLock};
    use crate::store::current_work::CurrentWork;

    /// What the dashboard shows of each task, to compare the kept views with a full read.
    fn shown(view: &QueueView) -> Vec<String> {
        view.tasks
            .iter()
            .map(|t| {
                format!(
                    "{} {} {:?} {:?}/{:?} {:?} {:?}",
                    t.id,
                    t.state.as_str(),
                    t.phase,
                    t.iteration,
                    t.total,
                    t.attempts,
                    t.error
                )
            })
            .collect()
    }

    fn same_as_a_full_read(cache: &mut StatusCache, reader: &QueueReader) -> QueueView {
        let options = LoadOptions { rejected: 10 };
        let kept = cache.status(reader, options);
        let full = reader.status(options);
        assert_eq!(shown(&kept), shown(&full));
        assert_eq!(
            (kept.inbox, kept.rejected, kept.daemon),
            (full.inbox, full.rejected, full.daemon)
        );
        kept
    }

    fn set_work(root: &std::path::Path, entries: Vec<ActiveTask>) {
        let work = CurrentWork {
            active_tasks: entries,
            ..CurrentWork::default()
        };
        write(
            root,
            "current_work.json",
            &serde_json::to_string(&work).unwrap(),
        );
    }

    #[test]
    fn kept_views_follow_every_change_a_full_read_sees() {
        let tmp = queue();
        let root = tmp.path();
        let reader = QueueReader::open(root);
        let mut cache = StatusCache::new();
        same_as_a_full_read(&mut cache, &reader);

        // A new task, a task that finished, a rejection, and the running one moved on.
        write(root, "tasks/n.json", &task("n"));
        write(
            root,
            "failed/p.json",
            r#"{"status": "failed", "failed_at": "2026-01-03T00:00:00Z", "error": "late"}"#,
        );
        write(
            root,
            "failed/rejected-worse-4d5e6f.json",
            r#"{"status": "rejected", "file": "inbox/worse.json", "reason": "empty",
                "rejected_at": "2026-01-03T00:00:00Z"}"#,
        );
        let mut entry = ActiveTask::new(&id("r"), "a");
        entry.attempt = 2;
        entry.iterations = 4;
        set_work(root, vec![entry.clone()]);
        let view = same_as_a_full_read(&mut cache, &reader);
        assert_eq!(view.rejected, 2);

        // A daemon takes the queue: the entry is running, not interrupted.
        let lock = QueueLock::acquire(reader.dir()).unwrap();
        same_as_a_full_read(&mut cache, &reader);
        drop(lock);

        // A task removed (pruned), and the entry gone with its record written.
        fs_remove(root, "tasks/n.json");
        set_work(root, Vec::new());
        write(
            root,
            "done/r.json",
            r#"{"status": "done", "finished_at": "2026-01-04T00:00:00Z", "attempts": 2}"#,
        );
        same_as_a_full_read(&mut cache, &reader);
    }

    fn fs_remove(root: &std::path::Path, key: &str) {
        std::fs::remove_file(root.join(key)).unwrap();
    }

    #[test]
    fn unchanged_tasks_are_not_built_again_and_a_rewrite_in_place_shows_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        QueueDir::new(root).create_all().unwrap();
        let count = 50;
        for n in 0..count {
            write(
                root,
                &format!("tasks/t{n:02}.json"),
                &task(&format!("t{n:02}")),
            );
        }
        let reader = QueueReader::open(root);
        // Files this fresh have not settled: every refresh builds them again.
        let mut cache = StatusCache::new();
        cache.status(&reader, LoadOptions::default());
        cache.status(&reader, LoadOptions::default());
        assert_eq!(cache.last_built, count, "unsettled files are read again");

        // Trusted at once (as files are after SETTLE): only what changed is built again.
        cache.settle = Duration::ZERO;
        cache.status(&reader, LoadOptions::default());
        let before = cache.built_at("t07");
        cache.status(&reader, LoadOptions::default());
        assert_eq!(cache.last_built, 0, "nothing changed");
        assert_eq!(cache.built_at("t07"), before);

        // A definition rewritten in place (no listing shows it) is seen at the next refresh.
        let rewritten = task("t07").replace("\"a\"", "\"renamed\"");
        std::fs::write(root.join("tasks/t07.json"), rewritten).unwrap();
        let view = cache.status(&reader, LoadOptions::default());
        assert_eq!(cache.last_built, 1);
        assert!(cache.built_at("t07") > before);
        let phase = view
            .tasks
            .iter()
            .find(|t| t.id == "t07")
            .and_then(|t| t.phase.clone());
        assert_eq!(phase.as_deref(), Some("renamed"));
    }

    #[test]
    fn a_file_changed_within_the_settling_time_is_read_at_every_refresh() {
        let tmp = queue();
        let root = tmp.path();
        let reader = QueueReader::open(root);
        let mut cache = StatusCache::new();
        cache.settle = Duration::from_secs(3600);
        cache.status(&reader, LoadOptions::default());
        // The same size, possibly the same tick of the clock: the times may not move.
        let same_size = task("n").replace("\"a\"", "\"b\"");
        write(root, "tasks/n.json", &task("n"));
        cache.status(&reader, LoadOptions::default());
        write(root, "tasks/n.json", &same_size);
        let view = cache.status(&reader, LoadOptions::default());
        let phase = view
            .tasks
            .iter()
            .find(|t| t.id == "n")
            .and_then(|t| t.phase.clone());
        assert_eq!(phase.as_deref(), Some("b"));
    }
}
