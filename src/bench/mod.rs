//! Benchmarks that drive cairn's real code paths and print figures (`cairn bench …`).
//!
//! Speed is measured here, never by timed assertions in tests. Each benchmark prints one JSON
//! line per run, so runs of cairn and of other checkpointers can be tabulated together
//! (`bench/workload.md` defines the line for checkpoints).

pub(crate) mod checkpoint;
pub(crate) mod command;
pub(crate) mod files;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
pub(crate) mod proc_stats;
pub(crate) mod pueue;
pub(crate) mod queue;
#[cfg(feature = "postgres")]
mod queue_db;
pub(crate) mod spawn;
pub(crate) mod web;
pub(crate) mod workload;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

/// Run the queue benchmarks (`cairn bench queue`) on a queue directory, or with `--db` on a
/// shared queue, printing one JSON line per figure.
pub(crate) fn run_queue(args: &queue::QueueOptions) -> anyhow::Result<()> {
    if args.max_tasks == 0 || args.resume_max_tasks == Some(0) {
        bail!("--max-tasks and --resume-max-tasks must be at least 1");
    }
    #[cfg(feature = "postgres")]
    if let Some(url) = &args.db {
        return queue_db::run(args, url);
    }
    #[cfg(not(feature = "postgres"))]
    if args.db.is_some() {
        bail!("this cairn was built without PostgreSQL (the cargo feature `postgres`)");
    }
    queue::run(args)
}

/// The directory a benchmark makes its run directories in (`bench/.data` by default),
/// created with its missing ancestors; [`remove_if_empty`](Self::remove_if_empty) takes away
/// again what it created, so a run that keeps nothing leaves nothing behind.
#[derive(Debug)]
pub(crate) struct RunDirParent {
    /// The directories it created, innermost first.
    created: Vec<PathBuf>,
}

impl RunDirParent {
    pub(crate) fn create(dir: &Path) -> anyhow::Result<RunDirParent> {
        let created = dir
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .map(Path::to_path_buf)
            .collect();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(RunDirParent { created })
    }

    /// Remove the directories it created that are empty, innermost first.
    pub(crate) fn remove_if_empty(&self) {
        for dir in &self.created {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
        }
    }
}

/// The nearest-rank percentile (the `ceil(q·n)`-th smallest) of ascending `sorted`.
pub(crate) fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds, rounded to 4 decimals like the reference helpers.
pub(crate) fn millis(d: Duration) -> f64 {
    round_to(d.as_secs_f64() * 1e3, 4)
}

/// `value` rounded to `decimals` places.
pub(crate) fn round_to(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let ms = |n| Duration::from_millis(n);
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 0.5), ms(50));
        assert_eq!(percentile(&sorted, 0.99), ms(99));
        assert_eq!(percentile(&sorted[..3], 0.5), ms(2));
        assert_eq!(percentile(&sorted[..1], 0.99), ms(1));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }
}
