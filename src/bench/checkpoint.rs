//! `cairn bench checkpoint`: the checkpoint workload of `bench/workload.md` through cairn's real
//! checkpoint path ([`Queue::checkpointer`]: a [`LoopCheckpointer`] fenced by the task's lease →
//! [`CheckpointStore`] → [`FileStorage`]), the code the daemon's
//! loop phases run.
//!
//! Sequential runs call the checkpointer on one thread, as an embedding program does.
//! Concurrent runs start every task at once as a tokio task on a multi-thread runtime, and
//! each checkpoint call runs on tokio's blocking pool, as the daemon's phase runners do.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::workload::{mean_canonical_bytes, SizeClass, TaskState};
use super::{millis, percentile, round_to};
use cairn::queue::{Queue, QueueDir};
use cairn::store::{
    CheckpointStore, CommitPath, FileOps, FileStorage, LoopCheckpointer, RealFileOps, Storage,
    UnsyncedFileOps,
};

/// What a checkpoint call promises when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Durability {
    /// Survives power loss: the temp file and the directory are fsynced (what the daemon does).
    Fsync,
    /// Survives a crash of the process only: rename without fsync.
    None,
}

impl Durability {
    /// The `mode` of the result line, in the workload's words.
    fn mode(self) -> &'static str {
        match self {
            Durability::Fsync => "durable",
            Durability::None => "published",
        }
    }
}

/// One configuration of the benchmark.
#[derive(Debug, Clone)]
pub(crate) struct CheckpointBench {
    pub size: SizeClass,
    /// 1 for the sequential variant, else the number of concurrent tasks.
    pub conc: usize,
    pub durability: Durability,
    /// The directory under which the run's queue directory is made (and removed unless
    /// `keep`).
    pub dir: PathBuf,
    /// Keep the checkpoints after the run (to inspect them with `cairn checkpoint`).
    pub keep: bool,
    /// Measure a reference instead of cairn (see [`Reference`]).
    pub raw: Option<Reference>,
    /// How cairn's checkpoints are made durable (on files).
    pub commit_path: CommitPath,
    /// Checkpoint into a shared queue in this PostgreSQL database instead of files.
    pub db: Option<String>,
}

/// What the disk can do with each state's canonical bytes and plain syscalls, measured in the
/// same run as cairn for comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Reference {
    /// The bare atomic replace: temp file, fsync, rename, directory fsync (`"impl": "raw"`).
    Replace,
    /// One record appended to a log file and made durable with one fdatasync, as a
    /// write-ahead log commits (`"impl": "append"`); each task has its own log.
    Append,
}

/// The one-line result the workload defines.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CheckpointResult {
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub mode: &'static str,
    /// cairn's commit path (`log` or `replace`); absent for the references.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<&'static str>,
    pub size: &'static str,
    pub conc: usize,
    pub n: usize,
    pub json_bytes: u64,
    pub stored_bytes: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub ops_s: f64,
}

/// One timed checkpoint call.
struct Sample {
    latency: Duration,
    stored_bytes: u64,
}

impl CheckpointBench {
    /// Run the configuration once; returns the result and the queue directory it wrote.
    pub(crate) fn run(&self) -> anyhow::Result<(CheckpointResult, PathBuf)> {
        let Some(iterations) = self.size.iterations(self.conc) else {
            bail!(
                "the workload has no concurrent variant for size {}",
                self.size.name()
            );
        };
        if self.conc == 0 {
            bail!("--conc must be at least 1");
        }
        let parent = super::RunDirParent::create(&self.dir)?;
        let root = self.fresh_root()?;
        let ops: Arc<dyn FileOps> = match self.durability {
            Durability::Fsync => Arc::new(RealFileOps),
            Durability::None => Arc::new(UnsyncedFileOps),
        };
        let storage = FileStorage::with_ops(&root, ops);
        // Made durable before the clock starts, so the first save does not sync it.
        let checkpoint_dir = QueueDir::new(&root).checkpoint_dir();
        storage
            .create_dir(CheckpointStore::DIR)
            .with_context(|| format!("creating {}", checkpoint_dir.display()))?;
        let storage = storage
            .with_commit_path(CheckpointStore::DIR, self.commit_path)
            .with_context(|| format!("opening the commit log in {}", checkpoint_dir.display()))?;
        // Owned as the daemon owns a queue, so that every checkpoint passes the same lease
        // check as a loop phase's.
        let (queue, bench_tasks) = self.open_queue(&root, storage, iterations)?;

        let started = Instant::now();
        let (samples, wall) = if let Some(reference) = self.raw {
            let samples = run_raw(
                &checkpoint_dir,
                reference,
                self.size,
                self.conc,
                iterations,
                self.durability,
            )?;
            (samples, started.elapsed())
        } else if self.conc == 1 {
            (
                run_sequential(&queue, self.size, iterations)?,
                started.elapsed(),
            )
        } else {
            run_concurrent(&queue, self.size, self.conc, iterations)?
        };
        drop(queue);
        drop(bench_tasks);

        let result = summarize(self, iterations, samples, wall);
        if !self.keep {
            std::fs::remove_dir_all(&root)
                .with_context(|| format!("removing {}", root.display()))?;
            parent.remove_if_empty();
        }
        Ok((result, root))
    }

    /// The queue the checkpoints go to: files at `root`, or a share of the database's (whose
    /// tasks the second value removes when dropped).
    fn open_queue(
        &self,
        root: &Path,
        storage: FileStorage,
        _iterations: u64,
    ) -> anyhow::Result<(Queue, Option<Box<dyn std::any::Any>>)> {
        let Some(url) = &self.db else {
            let queue = Queue::open_files(root, Some(Arc::new(storage) as Arc<dyn Storage>))
                .with_context(|| format!("opening the queue {}", root.display()))?;
            return Ok((queue, None));
        };
        #[cfg(feature = "postgres")]
        {
            let ids: Vec<String> = (0..self.conc)
                .map(|task| TaskState::new(task as u64, self.size).task_id().to_string())
                .collect();
            let (queue, tasks) = super::postgres::open(root, url, &ids)?;
            Ok((queue, Some(Box::new(tasks))))
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = url;
            bail!("this cairn was built without PostgreSQL (the cargo feature `postgres`)")
        }
    }

    /// A new, empty directory for this run under `self.dir` (which exists).
    fn fresh_root(&self) -> anyhow::Result<PathBuf> {
        let name = format!(
            "cairn-{}-c{}-{}-",
            self.size.name(),
            self.conc,
            self.durability.mode()
        );
        let root = tempfile::Builder::new()
            .prefix(&name)
            .tempdir_in(&self.dir)
            .with_context(|| format!("creating a run directory in {}", self.dir.display()))?;
        Ok(root.keep())
    }
}

/// One task's loop on this thread: build the state (untimed), checkpoint it (timed).
fn run_sequential(queue: &Queue, size: SizeClass, iterations: u64) -> anyhow::Result<Vec<Sample>> {
    let mut state = TaskState::new(0, size);
    let mut checkpointer = fenced_checkpointer(queue, state.task_id())?;
    let mut samples = Vec::with_capacity(iterations as usize);
    for _ in 0..iterations {
        samples.push(timed_checkpoint(&mut checkpointer, &state)?);
        state.advance();
    }
    Ok(samples)
}

/// The task's checkpointer as a loop phase gets it: under the task's lease.
fn fenced_checkpointer(queue: &Queue, task_id: &str) -> anyhow::Result<LoopCheckpointer> {
    let lease = queue.backend().claim(task_id)?;
    Ok(queue.checkpointer(&lease, "bench")?)
}

/// Checkpoint iteration `state.iteration()` as completed, timing the call.
fn timed_checkpoint(
    checkpointer: &mut LoopCheckpointer,
    state: &TaskState,
) -> anyhow::Result<Sample> {
    let started = Instant::now();
    checkpointer
        .checkpoint(state.iteration() + 1, state)
        .with_context(|| format!("checkpointing {}", state.task_id()))?;
    let latency = started.elapsed();
    let stored_bytes = checkpointer
        .take_last_saved()
        .map(|saved| saved.bytes)
        .unwrap_or(0);
    Ok(Sample {
        latency,
        stored_bytes,
    })
}

/// `conc` tasks started at once; each checkpoint call goes to the blocking pool and a task's
/// next iteration starts when its call has returned. Every task is claimed before the clock
/// starts (a claim is no checkpoint, and on a database it is several statements); returns the
/// samples and the wall time from the first checkpoint call to the last answer.
fn run_concurrent(
    queue: &Queue,
    size: SizeClass,
    conc: usize,
    iterations: u64,
) -> anyhow::Result<(Vec<Sample>, Duration)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        // Claimed off the async threads, as the daemon claims (a database blocks).
        let mut claims = tokio::task::JoinSet::new();
        for task in 0..conc {
            let queue = queue.clone();
            claims.spawn_blocking(move || {
                let state = TaskState::new(task as u64, size);
                let checkpointer = fenced_checkpointer(&queue, state.task_id())?;
                anyhow::Ok((state, checkpointer))
            });
        }
        let mut claimed = Vec::with_capacity(conc);
        while let Some(joined) = claims.join_next().await {
            claimed.push(joined.context("a claim panicked")??);
        }
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (mut state, mut checkpointer) in claimed {
            tasks.spawn(async move {
                let mut samples = Vec::with_capacity(iterations as usize);
                for _ in 0..iterations {
                    let started = Instant::now();
                    let (back_checkpointer, back_state, result) =
                        tokio::task::spawn_blocking(move || {
                            let result = timed_checkpoint(&mut checkpointer, &state);
                            (checkpointer, state, result)
                        })
                        .await
                        .context("a checkpoint call panicked")?;
                    let latency = started.elapsed();
                    checkpointer = back_checkpointer;
                    state = back_state;
                    samples.push(Sample {
                        latency,
                        stored_bytes: result?.stored_bytes,
                    });
                    state.advance();
                }
                anyhow::Ok(samples)
            });
        }
        let mut all = Vec::with_capacity(conc * iterations as usize);
        while let Some(joined) = tasks.join_next().await {
            all.extend(joined.context("a benchmark task panicked")??);
        }
        Ok((all, started.elapsed()))
    })
}

/// The references cairn is compared against: each task atomically replaces one file with its
/// state's canonical bytes, or appends them to its own log, with plain syscalls and nothing
/// else (no envelope, no compression, no generations). Concurrent tasks are threads.
fn run_raw(
    dir: &Path,
    reference: Reference,
    size: SizeClass,
    conc: usize,
    iterations: u64,
    durability: Durability,
) -> anyhow::Result<Vec<Sample>> {
    let replace_all = |task: usize| -> anyhow::Result<Vec<Sample>> {
        let mut state = TaskState::new(task as u64, size);
        let target = dir.join(format!("{}.json", state.task_id()));
        let temp = dir.join(format!(".{}.json.tmp", state.task_id()));
        let log_path = dir.join(format!("{}.log", state.task_id()));
        let mut log = match reference {
            Reference::Append => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&log_path)
                    .with_context(|| format!("creating {}", log_path.display()))?,
            ),
            Reference::Replace => None,
        };
        let mut samples = Vec::with_capacity(iterations as usize);
        for _ in 0..iterations {
            let bytes = state.canonical();
            let started = Instant::now();
            match &mut log {
                Some(log) => append_record(log, &bytes, durability)
                    .with_context(|| format!("appending to {}", log_path.display()))?,
                None => atomic_replace(&temp, &target, dir, &bytes, durability)
                    .with_context(|| format!("replacing {}", target.display()))?,
            }
            samples.push(Sample {
                latency: started.elapsed(),
                stored_bytes: bytes.len() as u64,
            });
            state.advance();
        }
        Ok(samples)
    };
    if conc == 1 {
        return replace_all(0);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..conc)
            .map(|task| scope.spawn(move || replace_all(task)))
            .collect();
        let mut all = Vec::new();
        for handle in handles {
            match handle.join() {
                Ok(samples) => all.extend(samples?),
                Err(_) => bail!("a raw benchmark thread panicked"),
            }
        }
        Ok(all)
    })
}

/// Write `bytes` to `temp`, fsync it, rename it over `target`, fsync `dir`.
fn atomic_replace(
    temp: &Path,
    target: &Path,
    dir: &Path,
    bytes: &[u8],
    durability: Durability,
) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(temp)?;
    file.write_all(bytes)?;
    if durability == Durability::Fsync {
        file.sync_all()?;
    }
    drop(file);
    std::fs::rename(temp, target)?;
    if durability == Durability::Fsync {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Append `bytes` to `log` and fdatasync it: what one commit of a write-ahead log costs.
fn append_record(
    log: &mut std::fs::File,
    bytes: &[u8],
    durability: Durability,
) -> std::io::Result<()> {
    use std::io::Write;
    log.write_all(bytes)?;
    if durability == Durability::Fsync {
        log.sync_data()?;
    }
    Ok(())
}

/// The result line: percentiles of the latencies, and checkpoints/s as the workload defines
/// it (n / summed latency for sequential runs, n / wall clock for concurrent ones).
fn summarize(
    bench: &CheckpointBench,
    iterations: u64,
    samples: Vec<Sample>,
    wall: Duration,
) -> CheckpointResult {
    let n = samples.len();
    let stored: u64 = samples.iter().map(|s| s.stored_bytes).sum();
    let mut latencies: Vec<Duration> = samples.into_iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let busy = if bench.conc == 1 {
        latencies.iter().sum::<Duration>()
    } else {
        wall
    };
    CheckpointResult {
        implementation: match (bench.raw, &bench.db) {
            (Some(Reference::Replace), _) => "raw",
            (Some(Reference::Append), _) => "append",
            (None, Some(_)) => "cairn-postgres",
            (None, None) => "cairn",
        },
        mode: bench.durability.mode(),
        commit: match (bench.raw, &bench.db, bench.commit_path) {
            (Some(_), _, _) | (None, Some(_), _) => None,
            (None, None, CommitPath::Log) => Some("log"),
            (None, None, CommitPath::Replace) => Some("replace"),
        },
        size: bench.size.name(),
        conc: bench.conc,
        n,
        json_bytes: mean_canonical_bytes(bench.size, iterations).round() as u64,
        stored_bytes: (stored as f64 / n.max(1) as f64).round() as u64,
        p50_ms: millis(percentile(&latencies, 0.50)),
        p99_ms: millis(percentile(&latencies, 0.99)),
        ops_s: round_to(n as f64 / busy.as_secs_f64().max(1e-9), 1),
    }
}

/// The default parent of run directories: `bench/.data` under the current directory, as the
/// workload asks (the same file system as the repository).
pub(crate) fn default_dir() -> PathBuf {
    Path::new("bench").join(".data")
}
