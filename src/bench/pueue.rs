//! The queue benchmark's peer: the same one-command tasks run by pueue (a widely used task
//! queue daemon), with the same parallelism, in the same run as cairn's, when `pueue` and
//! `pueued` are on the `PATH`.
//!
//! pueue gets its own configuration, data and socket under the run directory, so a user's
//! pueue is not touched. Its default group is paused while the tasks are added (one `pueue add`
//! each, as a user would) and then started: what is timed is from `pueue start` to the last
//! task's end as pueue records it (`pueue status --json`), that is running the tasks, not
//! submitting them (the submission time is printed beside it). pueue runs each command through
//! `sh -c`, as it always does.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::Value;

use super::round_to;

/// How long pueued may take to answer its first `pueue status`.
const START_LIMIT: Duration = Duration::from_secs(30);

/// The `side_by_side` line of a peer.
#[derive(Debug, Serialize)]
pub(crate) struct PeerLine {
    pub bench: &'static str,
    pub what: &'static str,
    #[serde(rename = "impl")]
    pub implementation: &'static str,
    pub version: String,
    pub tasks: usize,
    pub max_tasks: usize,
    pub command: String,
    /// `pueue start` → the last task's end.
    pub seconds: f64,
    pub tasks_s: f64,
    /// Adding the tasks (one `pueue add` each), before the clock starts.
    pub submit_seconds: f64,
    /// pueued's peak resident memory (`VmHWM`).
    pub peak_rss_mib: f64,
}

/// `pueue` and `pueued` if both are on the `PATH`.
pub(crate) fn find() -> Option<(PathBuf, PathBuf)> {
    let path = std::env::var_os("PATH")?;
    let find = |name: &str| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    };
    Some((find("pueue")?, find("pueued")?))
}

/// Run `tasks` commands `command` (`sh -c` words) `max_tasks` at a time in a private pueued
/// under `dir`.
pub(crate) fn run(
    (pueue, pueued): (PathBuf, PathBuf),
    dir: &Path,
    tasks: usize,
    max_tasks: usize,
    command: &str,
) -> anyhow::Result<PeerLine> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let config = write_config(dir, max_tasks)?;
    let client = Client { pueue, config };
    let version = client.output(&["--version"])?.trim().to_string();
    let mut daemon = PueueDaemon::start(&pueued, &client.config, dir)?;
    client.wait_until_answering(&mut daemon)?;
    client.output(&["parallel", &max_tasks.to_string()])?;
    client.output(&["pause"])?;
    let submit = Instant::now();
    for _ in 0..tasks {
        client.output(&["add", "--", command])?;
    }
    let submit_seconds = submit.elapsed().as_secs_f64();
    let started = SystemTime::now();
    client.output(&["start"])?;
    client.output(&["wait"])?;
    let status: Value = serde_json::from_str(&client.output(&["status", "--json"])?)
        .context("reading `pueue status --json`")?;
    let last_end = last_end(&status, tasks)?;
    let peak_rss_mib = daemon.peak_rss_mib()?;
    let _ = client.output(&["shutdown"]);
    daemon.wait_or_kill();
    let elapsed = last_end.duration_since(started).unwrap_or_default();
    Ok(PeerLine {
        bench: "queue",
        what: "side_by_side",
        implementation: "pueue",
        version,
        tasks,
        max_tasks,
        command: command.to_string(),
        seconds: round_to(elapsed.as_secs_f64(), 3),
        tasks_s: round_to(tasks as f64 / elapsed.as_secs_f64().max(1e-9), 1),
        submit_seconds: round_to(submit_seconds, 3),
        peak_rss_mib,
    })
}

/// A pueue configuration that keeps everything under `dir`.
fn write_config(dir: &Path, max_tasks: usize) -> anyhow::Result<PathBuf> {
    let config = dir.join("pueue.yml");
    let text = format!(
        "shared:\n  pueue_directory: {data}\n  runtime_directory: {run}\n  \
         use_unix_socket: true\n  unix_socket_path: {run}/pueue.socket\n\
         daemon:\n  default_parallel_tasks: {max_tasks}\n",
        data = dir.join("data").display(),
        run = dir.join("run").display(),
    );
    fs::create_dir_all(dir.join("run")).context("creating pueue's runtime directory")?;
    fs::write(&config, text).with_context(|| format!("writing {}", config.display()))?;
    Ok(config)
}

/// The latest `end` of the `tasks` finished tasks in `pueue status --json`; fails unless every
/// task succeeded.
fn last_end(status: &Value, tasks: usize) -> anyhow::Result<SystemTime> {
    let all = status["tasks"]
        .as_object()
        .context("`pueue status --json` has no tasks")?;
    if all.len() != tasks {
        bail!("pueue lists {} tasks, not {tasks}", all.len());
    }
    let mut last = SystemTime::UNIX_EPOCH;
    for (id, task) in all {
        let done = &task["status"]["Done"];
        let result = &done["result"];
        if result != "Success" {
            bail!("pueue task {id} did not succeed: {}", task["status"]);
        }
        let end = done["end"]
            .as_str()
            .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
            .with_context(|| format!("pueue task {id} has no end time: {}", task["status"]))?;
        last = last.max(SystemTime::from(end));
    }
    Ok(last)
}

/// The `pueue` client with the bench's configuration.
struct Client {
    pueue: PathBuf,
    config: PathBuf,
}

impl Client {
    fn output(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(&self.pueue)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running pueue {args:?}"))?;
        if !output.status.success() {
            bail!(
                "pueue {args:?} failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    fn wait_until_answering(&self, daemon: &mut PueueDaemon) -> anyhow::Result<()> {
        let since = Instant::now();
        loop {
            if self.output(&["status"]).is_ok() {
                return Ok(());
            }
            if let Some(status) = daemon.child.try_wait().context("checking on pueued")? {
                bail!("pueued exited ({status}); see {}", daemon.log.display());
            }
            if since.elapsed() > START_LIMIT {
                bail!("pueued did not answer within {START_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A private `pueued`, killed if the bench fails half-way.
struct PueueDaemon {
    child: Child,
    log: PathBuf,
}

impl PueueDaemon {
    fn start(pueued: &Path, config: &Path, dir: &Path) -> anyhow::Result<PueueDaemon> {
        let log = dir.join("pueued.log");
        let log_file =
            fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = Command::new(pueued)
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log_file.try_clone()?))
            .stderr(Stdio::from(log_file))
            .spawn()
            .context("starting pueued")?;
        Ok(PueueDaemon { child, log })
    }

    fn peak_rss_mib(&self) -> anyhow::Result<f64> {
        super::proc_stats::peak_rss_mib(self.child.id() as i32)
    }

    fn wait_or_kill(&mut self) {
        let since = Instant::now();
        while since.elapsed() < START_LIMIT {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PueueDaemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
