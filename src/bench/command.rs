//! `cairn bench …`: benchmarks of cairn's real code paths, printing one JSON line per run.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use cairn::cli::error::{print_line, CliResult};
use cairn::cli::{exit, ExtraCommands};
use cairn::store::CommitPath;

use super::checkpoint::{default_dir, CheckpointBench, Durability, Reference};
use super::queue::{Measurement, QueueOptions};
use super::workload::SizeClass;

// The binary's subcommand added to the library's command line. Not a doc comment: clap would
// make it the about text of `cairn` itself.
#[derive(Debug, Subcommand)]
pub(crate) enum BenchCommand {
    /// Measure cairn's hot paths and print the figures (one JSON line per run).
    Bench(BenchArgs),
}

impl ExtraCommands for BenchCommand {
    fn run(self) -> CliResult<u8> {
        let BenchCommand::Bench(args) = self;
        run(args).map(|()| exit::OK)
    }
}

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// The checkpoint workload of bench/workload.md through cairn's checkpoint path;
    /// prints {"impl": "cairn", "mode", "size", "conc", "n", "json_bytes", "stored_bytes",
    /// "p50_ms", "p99_ms", "ops_s"}.
    Checkpoint(CheckpointArgs),
    /// Queue throughput, pickup latency, loop-iteration overhead, resume time and peak memory
    /// of the real daemon.
    Queue(QueueArgs),
    /// What starting one command costs the daemon's thread, by spawn path (fork with a
    /// pre-exec hook, or the daemon's vfork-style clone), with the process made as large as
    /// a daemon with thousands of tasks in flight.
    Spawn(super::spawn::SpawnArgs),
    /// What storing a checkpoint's file costs (changed, and unchanged since the last
    /// checkpoint) against writing and fsyncing the same bytes to a new file.
    Files(super::files::FilesArgs),
    /// The HTTP listener with many tasks in the queue: the dashboard's first screen and
    /// /metrics of a real daemon run with --listen; prints {"bench": "web", "tasks",
    /// "first_screen_ms_p50", "first_screen_ms_max", "metrics_ms_p50", "metrics_ms_max", ...}.
    Web(WebArgs),
}

/// Options of `cairn bench web`.
#[derive(Debug, Args)]
struct WebArgs {
    /// Tasks in the queue (one running, the others pending).
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    tasks: usize,
    /// Requests of each kind timed.
    #[arg(long, default_value_t = 5, value_name = "N")]
    rounds: usize,
    /// Checkpointed iterations of each throughput run (0: none).
    #[arg(long, default_value_t = 2000, value_name = "N")]
    iterations: u64,
    /// Turns of three throughput runs: the listener off, on and idle, on and polled.
    #[arg(long, default_value_t = 3, value_name = "N")]
    turns: usize,
    /// Where the run directory is made.
    #[arg(long, value_name = "DIR", default_value_os_t = default_dir())]
    dir: PathBuf,
}

/// Options of `cairn bench queue`.
#[derive(Debug, Args)]
struct QueueArgs {
    /// Tasks dropped into the inbox at once for the throughput figure.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    tasks: usize,
    /// Tasks dropped one at a time into an idle daemon for the pickup-latency figure.
    #[arg(long, default_value_t = 200, value_name = "N")]
    paced_tasks: usize,
    /// The pause between a paced task being done and the next one being dropped.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration, value_name = "DURATION")]
    pace: Duration,
    /// Iterations of the loop-overhead task.
    #[arg(long, default_value_t = 1_000, value_name = "M")]
    loop_iterations: u64,
    /// Tasks in flight in current_work.json for the resume figure.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    resume_tasks: usize,
    /// Tasks started at once and kept running (`sleep 3600`) for the running figure: the
    /// daemon's memory with all of them in flight.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    running_tasks: usize,
    /// One-command tasks run by cairn and by pueue (when installed) for the side-by-side figure.
    #[arg(long, default_value_t = 500, value_name = "N")]
    side_by_side_tasks: usize,
    /// The daemon's --max-tasks (and pueue's parallelism) in the throughput, pickup, loop and
    /// side-by-side runs (its default is 4).
    #[arg(long, default_value_t = 4, value_name = "N")]
    max_tasks: usize,
    /// The daemon's --max-tasks in the resume run; by default --resume-tasks, since that many
    /// tasks were running when the daemon was killed.
    #[arg(long, value_name = "N")]
    resume_max_tasks: Option<usize>,
    /// Only these measurements (comma-separated); all of them by default.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "WHAT")]
    only: Vec<Measurement>,
    /// Where run directories are made (the same file system as the queues you care about).
    #[arg(long, value_name = "DIR", default_value_os_t = default_dir())]
    dir: PathBuf,
    /// Keep the run's queues and daemon logs (their directory is printed on stderr).
    #[arg(long)]
    keep: bool,
    /// Run the daemons on a shared queue in this PostgreSQL database ("impl":
    /// "cairn-postgres"): the throughput, pickup and resume figures only. An empty database
    /// of its own, since it adds and removes tasks.
    #[arg(long, value_name = "URL")]
    db: Option<String>,
}

impl QueueArgs {
    fn into_options(self) -> QueueOptions {
        QueueOptions {
            tasks: self.tasks,
            paced_tasks: self.paced_tasks,
            pace: self.pace,
            loop_iterations: self.loop_iterations,
            resume_tasks: self.resume_tasks,
            side_by_side_tasks: self.side_by_side_tasks,
            max_tasks: self.max_tasks,
            resume_max_tasks: self.resume_max_tasks,
            running_tasks: self.running_tasks,
            only: self.only,
            dir: self.dir,
            keep: self.keep,
            db: self.db,
        }
    }
}

#[derive(Debug, Args)]
struct CheckpointArgs {
    /// The state size class.
    #[arg(long, value_enum, default_value = "1k")]
    size: SizeClass,
    /// Tasks checkpointing at once: 1 (sequential) or 100 (the concurrent variant; any number
    /// above 1 runs that many tasks with the concurrent variant's iteration count).
    #[arg(long, default_value_t = 1)]
    conc: usize,
    /// fsync: survives power loss (what the daemon does); none: rename without fsync.
    #[arg(long, value_enum, default_value = "fsync")]
    durability: Durability,
    /// Where run directories are made (the same file system as the data you care about).
    #[arg(long, value_name = "DIR", default_value_os_t = default_dir())]
    dir: PathBuf,
    /// Keep the run's checkpoints (their directory is printed on stderr), so that
    /// `cairn --queue DIR checkpoint task-0000` can decode them.
    #[arg(long)]
    keep: bool,
    /// Measure a reference instead, on each state's canonical JSON: `replace` (the default)
    /// is the bare atomic replace (temp file, fsync, rename, directory fsync), printed with
    /// "impl": "raw"; `append` appends it to the task's log and fdatasyncs, printed with
    /// "impl": "append".
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "replace", value_name = "REFERENCE")]
    raw: Option<Reference>,
    /// How cairn's checkpoints are made durable: through the checkpoint directory's commit
    /// log (one fdatasync) or by the atomic replace alone (fsync, rename, directory fsync).
    #[arg(long, value_enum, default_value = "log", value_name = "PATH")]
    commit_path: CommitPath,
    /// Checkpoint into a shared queue in this PostgreSQL database instead ("impl":
    /// "cairn-postgres"): an empty database of its own, since it adds and removes tasks.
    #[arg(long, value_name = "URL", conflicts_with = "raw")]
    db: Option<String>,
}

pub(crate) fn run(args: BenchArgs) -> CliResult {
    match args.bench {
        Bench::Checkpoint(args) => checkpoint(args),
        Bench::Queue(args) => Ok(super::run_queue(&args.into_options())?),
        Bench::Spawn(args) => spawn(args),
        Bench::Files(args) => files(args),
        Bench::Web(args) => {
            let options = super::web::WebOptions {
                tasks: args.tasks,
                rounds: args.rounds,
                iterations: args.iterations,
                turns: args.turns,
                dir: args.dir,
            };
            let line = super::web::run(&options)?;
            print_line(line)
        }
    }
}

fn files(args: super::files::FilesArgs) -> CliResult {
    for result in super::files::run(&args)? {
        let line = serde_json::to_string(&result)
            .map_err(|e| anyhow::Error::new(e).context("printing the result"))?;
        print_line(line)?;
    }
    Ok(())
}

fn spawn(args: super::spawn::SpawnArgs) -> CliResult {
    for result in super::spawn::run(&args)? {
        let line = serde_json::to_string(&result)
            .map_err(|e| anyhow::Error::new(e).context("printing the result"))?;
        print_line(line)?;
    }
    Ok(())
}

fn checkpoint(args: CheckpointArgs) -> CliResult {
    let bench = CheckpointBench {
        size: args.size,
        conc: args.conc,
        durability: args.durability,
        dir: args.dir,
        keep: args.keep,
        raw: args.raw,
        commit_path: args.commit_path,
        db: args.db,
    };
    let (result, root) = bench.run()?;
    let line = serde_json::to_string(&result)
        .map_err(|e| anyhow::Error::new(e).context("printing the result"))?;
    print_line(line)?;
    if args.keep {
        eprintln!("checkpoints kept in {}", root.display());
    }
    Ok(())
}
