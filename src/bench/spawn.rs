//! `cairn bench spawn`: what starting one command costs the daemon's async thread, by spawn
//! path, while the process is as large as a daemon with thousands of tasks in flight.
//!
//! A `fork` copies the page tables of the whole process, so its cost grows with the daemon's
//! resident memory; the daemon's `clone(CLONE_VM | CLONE_VFORK)` (see `runner::spawn`) does
//! not. The reference, `fork`, is what the standard library does when the death signal is
//! armed in a `pre_exec` hook, as cairn once did. The bench makes the process large
//! (`--resident-mb` of touched heap, like the daemon's per-task state), optionally keeps
//! `--resident-children` commands running (as tasks in flight would), then starts `--count`
//! short commands (`true`) one after another through each path and prints, per path, how long
//! the spawn call blocked the thread and how long until the command had exited.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use super::{millis, percentile};
use cairn::runner::{
    spawn_in_group, CommandProcess, Confinement, Environment, InheritedEnv, StdinFrom, StdoutTo,
};

/// How a command is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SpawnPath {
    /// A full `fork` whose child arms the death signal before `exec` (a `pre_exec` hook).
    Fork,
    /// The daemon's path: a `vfork`-style clone that shares the daemon's memory.
    Clone,
}

/// A started command, by path.
enum Started {
    Fork(tokio::process::Child),
    Clone(CommandProcess),
}

impl Started {
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Started::Fork(child) => child.wait().await,
            Started::Clone(child) => child.wait().await,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct SpawnArgs {
    /// Commands started per path.
    #[arg(long, default_value_t = 2000)]
    pub count: usize,
    /// Heap touched before spawning, in MB (a daemon with 10,000 tasks in flight: 350-450).
    #[arg(long, default_value_t = 400)]
    pub resident_mb: usize,
    /// Commands (`sleep`) kept running during the measurement.
    #[arg(long, default_value_t = 0)]
    pub resident_children: usize,
}

/// One path's figures.
#[derive(Debug, Serialize)]
pub(crate) struct SpawnResult {
    pub bench: &'static str,
    pub path: &'static str,
    pub resident_mb: usize,
    pub resident_children: usize,
    pub count: usize,
    /// The spawn call: what the async thread is blocked for.
    pub spawn_p50_ms: f64,
    pub spawn_p99_ms: f64,
    pub spawn_mean_ms: f64,
    /// Spawn call to the command's exit being reaped.
    pub run_p50_ms: f64,
}

/// Run the bench and return one result per path, the fork first.
pub(crate) fn run(args: &SpawnArgs) -> anyhow::Result<Vec<SpawnResult>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let ballast = touched_heap(args.resident_mb);
    let results = runtime.block_on(async {
        let mut sleepers = Vec::new();
        for _ in 0..args.resident_children {
            sleepers.push(spawn(SpawnPath::Clone, &["sleep", "600"])?);
        }
        let mut results = Vec::new();
        for path in [SpawnPath::Fork, SpawnPath::Clone] {
            results.push(measure(path, args).await?);
        }
        drop(sleepers); // kill_on_drop
        anyhow::Ok(results)
    })?;
    drop(ballast);
    Ok(results)
}

async fn measure(path: SpawnPath, args: &SpawnArgs) -> anyhow::Result<SpawnResult> {
    let mut spawns = Vec::with_capacity(args.count);
    let mut runs = Vec::with_capacity(args.count);
    for _ in 0..args.count {
        let start = Instant::now();
        let mut child = spawn(path, &["true"])?;
        spawns.push(start.elapsed());
        let status = child.wait().await.context("waiting for `true`")?;
        runs.push(start.elapsed());
        anyhow::ensure!(status.success(), "`true` ended with {status}");
    }
    let total: Duration = spawns.iter().sum();
    spawns.sort();
    runs.sort();
    Ok(SpawnResult {
        bench: "spawn",
        path: match path {
            SpawnPath::Fork => "fork",
            SpawnPath::Clone => "clone",
        },
        resident_mb: args.resident_mb,
        resident_children: args.resident_children,
        count: args.count,
        spawn_p50_ms: millis(percentile(&spawns, 0.5)),
        spawn_p99_ms: millis(percentile(&spawns, 0.99)),
        spawn_mean_ms: millis(total / args.count.max(1) as u32),
        run_p50_ms: millis(percentile(&runs, 0.5)),
    })
}

/// The bench's environment, prepared once as the daemon prepares its own.
static INHERITED_ENV: std::sync::LazyLock<InheritedEnv> =
    std::sync::LazyLock::new(|| cairn::runner::daemon_env(&[]));

#[allow(unsafe_code)] // the reference path: a pre_exec hook, as cairn once spawned
fn spawn(path: SpawnPath, argv: &[&str]) -> anyhow::Result<Started> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    let log = std::fs::File::options()
        .append(true)
        .open("/dev/null")
        .context("opening /dev/null")?;
    let started = match path {
        SpawnPath::Fork => {
            let mut command = tokio::process::Command::new(&argv[0]);
            command
                .args(&argv[1..])
                .current_dir("/")
                .stdin(Stdio::null())
                .stdout(Stdio::from(log.try_clone()?))
                .stderr(Stdio::from(log))
                .process_group(0)
                .kill_on_drop(true);
            // SAFETY: between fork and exec only async-signal-safe system calls (prctl), and
            // the error is a bare OS code, which does not allocate.
            unsafe {
                command.pre_exec(|| {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                        .map_err(std::io::Error::from)
                });
            }
            command.spawn().map(Started::Fork)
        }
        SpawnPath::Clone => spawn_in_group(
            &argv,
            Path::new("/"),
            Environment {
                inherited: &INHERITED_ENV,
                task: &[],
            },
            log,
            StdinFrom::Null,
            StdoutTo::Log,
            &Confinement::default(),
        )
        .map(Started::Clone),
    };
    started.with_context(|| format!("starting {argv:?}"))
}

/// `mb` megabytes of heap in 4 KiB pieces, each written to, as the daemon's many small
/// allocations are.
fn touched_heap(mb: usize) -> Vec<Box<[u8]>> {
    (0..mb * 256)
        .map(|i| vec![i as u8; 4096].into_boxed_slice())
        .collect()
}
