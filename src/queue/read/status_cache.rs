//! The status of a queue kept up to date instead of rebuilt: a long-lived reader (the
//! dashboard's) keeps every task's view and, at each refresh, reads again only the tasks whose
//! place in the queue changed, plus the running ones and a few others in turn.
//!
//! A refresh reads the shared files once (the work state, the daemon's lock, the listings of
//! `tasks/`, `done/` and `failed/`), as [`QueueReader::status`] does. A task's view is built
//! again when its place changed (which directories name it, its work-state entry, whether the
//! daemon lives), when it runs (its checkpoints advance without the entry changing), when it
//! is new, and in turn for the rest ([`REVALIDATE_SHARE`] of them per refresh), so that a
//! change no listing shows (a definition rewritten in place) is seen within a bounded number
//! of refreshes. Rejection records are read once each: they are never rewritten.

use std::collections::{BTreeSet, HashMap, HashSet};

use chrono::{DateTime, Utc};

use super::files::quietly;
use super::record::{self, Record};
use super::task_view::{rejected_view, submitted_view, task_view, Listing};
use super::{json_stems, LoadOptions, QueueReader, QueueView, TaskView};
use crate::store::current_work::{ActiveStatus, ActiveTask};
use crate::task_id::TaskId;

/// Each refresh builds again one task in this many of those whose place did not change (and at
/// least [`REVALIDATE_AT_LEAST`]): with a refresh a second, every view is at most about this
/// many seconds older than its files.
pub const REVALIDATE_SHARE: usize = 32;

/// The fewest unchanged tasks a refresh builds again.
const REVALIDATE_AT_LEAST: usize = 64;

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

/// The views of a queue's tasks, kept between refreshes.
#[derive(Debug, Default)]
pub struct StatusCache {
    views: HashMap<String, (Place, TaskView)>,
    /// Rejection records by stem (`None`: a `failed/rejected-*` file that is a task's record).
    rejections: HashMap<String, Option<Record>>,
    /// Where the turn of revalidation stands: the last id built again in turn.
    cursor: Option<String>,
    /// How many views the last refresh built (for the benchmark and the tests).
    pub last_built: usize,
}

impl StatusCache {
    pub fn new() -> StatusCache {
        StatusCache::default()
    }

    /// The queue's status, as [`QueueReader::status`] gives it, reading only what changed.
    pub fn status(&mut self, reader: &QueueReader, options: LoadOptions) -> QueueView {
        let now = Utc::now();
        let listing = quietly(|| Listing::read(reader));
        let places = self.places(reader, &listing);
        self.forget_gone(&places);
        let due = self.due_for_revalidation(&places);
        let mut built = 0;
        for (id, place) in places {
            let running = place
                .entry
                .as_ref()
                .is_some_and(|e| e.status == ActiveStatus::Running);
            let fresh = self
                .views
                .get(&id)
                .is_some_and(|(known, _)| *known == place);
            if fresh && !running && !due.contains(&id) {
                continue;
            }
            let Ok(task_id) = TaskId::parse(id.as_str()) else {
                continue;
            };
            let view = quietly(|| task_view(&listing, &task_id));
            built += 1;
            self.views.insert(id, (place, view));
        }
        self.last_built = built;
        self.assemble(reader, listing, now, options)
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

    fn forget_gone(&mut self, places: &HashMap<String, Place>) {
        self.views.retain(|id, _| places.contains_key(id));
    }

    /// The ids to build again in turn this refresh: the next share after the cursor, by id.
    fn due_for_revalidation(&mut self, places: &HashMap<String, Place>) -> HashSet<String> {
        let mut known: Vec<&String> = self
            .views
            .keys()
            .filter(|id| places.contains_key(*id))
            .collect();
        known.sort();
        let count = (known.len() / REVALIDATE_SHARE)
            .max(REVALIDATE_AT_LEAST)
            .min(known.len());
        let start = match &self.cursor {
            Some(cursor) => known.partition_point(|id| *id <= cursor),
            None => 0,
        };
        let due: Vec<String> = known
            .iter()
            .cycle()
            .skip(start)
            .take(count)
            .map(|id| (*id).clone())
            .collect();
        self.cursor = due.last().cloned();
        due.into_iter().collect()
    }

    /// The view of the whole queue from the views kept, as [`QueueReader::status`] orders it.
    fn assemble(
        &self,
        reader: &QueueReader,
        listing: Listing,
        now: DateTime<Utc>,
        options: LoadOptions,
    ) -> QueueView {
        let mut warnings = listing.warnings.clone();
        let mut tasks: Vec<TaskView> = self.views.values().map(|(_, view)| view.clone()).collect();
        let known: HashSet<&str> = self.views.keys().map(String::as_str).collect();
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
    fn unchanged_tasks_are_read_again_only_in_turn_and_each_within_the_share() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        QueueDir::new(root).create_all().unwrap();
        let count = 4 * REVALIDATE_AT_LEAST;
        for n in 0..count {
            write(
                root,
                &format!("tasks/t{n:04}.json"),
                &task(&format!("t{n:04}")),
            );
        }
        let reader = QueueReader::open(root);
        let mut cache = StatusCache::new();
        cache.status(&reader, LoadOptions::default());
        assert_eq!(
            cache.last_built, count,
            "the first refresh reads every task"
        );
        cache.status(&reader, LoadOptions::default());
        assert_eq!(
            cache.last_built, REVALIDATE_AT_LEAST,
            "then only a share in turn"
        );

        // A definition rewritten in place (no listing shows it) is seen within a full turn.
        let rewritten = task("t0000").replace("\"a\"", "\"renamed\"");
        write(root, "tasks/t0000.json", &rewritten);
        let phase_of_first = |cache: &mut StatusCache| {
            let view = cache.status(&reader, LoadOptions::default());
            view.tasks
                .into_iter()
                .find(|t| t.id == "t0000")
                .and_then(|t| t.phase)
        };
        let turns = count.div_ceil(REVALIDATE_AT_LEAST);
        let seen = (0..turns).any(|_| phase_of_first(&mut cache).as_deref() == Some("renamed"));
        assert!(
            seen,
            "the rewritten definition was not read in {turns} refreshes"
        );
    }
}
