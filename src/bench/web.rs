//! `cairn bench web`: what the HTTP listener answers in, with many tasks in the queue, and
//! what it costs the daemon. A real daemon (`cairn run --listen`) holds `--tasks` tasks, one
//! running and the rest pending; the benchmark times the dashboard's first screen (the page
//! and the one page of the table it fetches), the whole status document, `/metrics` and a
//! task's page, beside a reference taken in the same run: `cairn status --json`, which reads
//! every task's files. Then it runs a task of `--iterations` checkpointed iterations on the
//! same queue, by turns with the listener off, on and idle, and on and polled as a browser
//! polls it, each on a daemon started for it, the task let go once the daemon (and its
//! listener's first read of the queue) is ready, and gives each run's checkpoints per second.
//! It prints one JSON line; no figure is asserted.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use cairn::queue::{QueueDir, QueueReader};
use cairn::store::events::Event;
use cairn::store::journal;

/// Options of `cairn bench web`.
#[derive(Debug, Clone)]
pub(crate) struct WebOptions {
    pub tasks: usize,
    pub rounds: usize,
    /// Iterations of each throughput run (0: no throughput runs).
    pub iterations: u64,
    /// Turns of three throughput runs: the listener off, on and idle, on and polled.
    pub turns: usize,
    pub dir: PathBuf,
}

/// The rows the dashboard's first screen asks for (as `assets/app.js` does).
const FIRST_SCREEN: &str = "/api/status?offset=0&limit=200";

/// Longer than the listener keeps refreshing its document after a request (`WATCHED_FOR` in
/// `cli/web/reader.rs`): waited after the first read so that an idle listener is idle.
const IDLE_AFTER: Duration = Duration::from_secs(11);

/// How a throughput run's daemon listens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Listening {
    Off,
    Idle,
    Polled,
}

impl Listening {
    const ALL: [Listening; 3] = [Listening::Off, Listening::Idle, Listening::Polled];

    fn name(self) -> &'static str {
        match self {
            Listening::Off => "listener_off",
            Listening::Idle => "listener_on",
            Listening::Polled => "polled",
        }
    }
}

/// Run the benchmark: one JSON line on stdout.
pub(crate) fn run(options: &WebOptions) -> anyhow::Result<Value> {
    let parent = super::RunDirParent::create(&options.dir)?;
    let run_dir = tempfile::Builder::new()
        .prefix("cairn-bench-web-")
        .tempdir_in(&options.dir)
        .context("creating the run directory")?;
    let result = measure(run_dir.path(), options);
    drop(run_dir);
    parent.remove_if_empty();
    result
}

fn measure(dir: &Path, options: &WebOptions) -> anyhow::Result<Value> {
    let queue = dir.join("queue");
    let inbox = QueueDir::new(&queue).inbox();
    std::fs::create_dir_all(&inbox)?;
    for n in 0..options.tasks {
        let task = json!({
            "id": format!("t{n:05}"),
            "phases": [{"name": "wait", "run": ["sleep", "3600"]}],
        });
        std::fs::write(inbox.join(format!("t{n:05}.json")), task.to_string())?;
    }
    let runs = throughput_runs(options);
    let daemon = Daemon::start(dir, &queue, 1, true)?;
    let figures = daemon
        .taken_in(options.tasks)
        .and_then(|()| screens(&daemon, options))
        .and_then(|figures| {
            // The first run's task waits, first in line, for the daemon that runs it.
            if let Some((id, _)) = runs.first() {
                daemon.submit_spin(dir, id, options.iterations)?;
            }
            Ok(figures)
        });
    daemon.stop();
    let mut figures = figures?;
    figures["status_cli_ms"] = json!(status_cli_ms(&queue, options.rounds)?);
    figures["throughput"] = throughput(dir, &queue, options, &runs)?;
    Ok(figures)
}

/// The throughput runs: a task id each, and how its daemon listens, by turns.
fn throughput_runs(options: &WebOptions) -> Vec<(String, Listening)> {
    if options.iterations == 0 {
        return Vec::new();
    }
    // Each turn starts with the next way: every run leaves one more idle task in flight, so
    // that no way always runs with the fewest.
    (0..options.turns)
        .flat_map(|turn| {
            (0..Listening::ALL.len()).map(move |n| {
                let how = Listening::ALL[(n + turn) % Listening::ALL.len()];
                (format!("spin-{turn}-{}", how.name()), how)
            })
        })
        .collect()
}

/// The listener's figures, each request timed `rounds` times.
fn screens(daemon: &Daemon, options: &WebOptions) -> anyhow::Result<Value> {
    let addr = daemon.listen.context("the daemon listens")?;
    let (mut first_screen, mut whole, mut metrics, mut task) = (vec![], vec![], vec![], vec![]);
    let mut status_bytes = 0;
    for _ in 0..options.rounds.max(1) {
        // Past a second: the listener refreshes its document in between.
        std::thread::sleep(Duration::from_millis(1100));
        first_screen.push(timed(|| {
            get(addr, "/")?;
            get(addr, FIRST_SCREEN)
        })?);
        let started = Instant::now();
        status_bytes = get(addr, "/api/status")?.len();
        whole.push(started.elapsed());
        metrics.push(timed(|| get(addr, "/metrics"))?);
        task.push(timed(|| {
            get(addr, "/task/t00000")?;
            get(addr, "/api/task/t00000")
        })?);
    }
    Ok(json!({
        "bench": "web",
        "tasks": options.tasks,
        "rounds": first_screen.len(),
        "status_bytes": status_bytes,
        "first_screen_ms_p50": median_ms(&mut first_screen),
        "first_screen_ms_max": max_ms(&first_screen),
        "status_document_ms_p50": median_ms(&mut whole),
        "metrics_ms_p50": median_ms(&mut metrics),
        "metrics_ms_max": max_ms(&metrics),
        "task_page_ms_p50": median_ms(&mut task),
    }))
}

/// The reference: `cairn status --json`, which reads every task's files, the daemon stopped.
fn status_cli_ms(queue: &Path, rounds: usize) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("finding the cairn binary")?;
    let mut times = Vec::new();
    for _ in 0..rounds.max(1) {
        let started = Instant::now();
        let out = Command::new(&exe)
            .arg("--queue")
            .arg(queue)
            .args(["status", "--json"])
            .stderr(Stdio::null())
            .output()
            .context("running cairn status --json")?;
        if !out.status.success() {
            bail!("cairn status --json failed: {}", out.status);
        }
        times.push(started.elapsed());
    }
    Ok(median_ms(&mut times))
}

/// Checkpoints per second of a task run alone with the listener off, on and idle, and on
/// and polled, by turns on the same queue.
fn throughput(
    dir: &Path,
    queue: &Path,
    options: &WebOptions,
    runs: &[(String, Listening)],
) -> anyhow::Result<Value> {
    if runs.is_empty() {
        return Ok(Value::Null);
    }
    let mut rates: Vec<(Listening, Vec<f64>)> = Listening::ALL.map(|how| (how, vec![])).into();
    for (n, (id, how)) in runs.iter().enumerate() {
        let next = runs.get(n + 1).map(|(next, _)| next.as_str());
        let rate = spin(dir, queue, (id, *how), next, options.iterations)?;
        if let Some((_, list)) = rates.iter_mut().find(|(h, _)| h == how) {
            list.push(rate);
        }
    }
    let mut figures = json!({ "iterations": options.iterations });
    for (how, list) in rates {
        figures[format!("checkpoints_per_s_{}", how.name())] = json!(list);
    }
    Ok(figures)
}

/// One throughput run of the task `id` (accepted, first in line) on a daemon started for it,
/// let go once the daemon is ready (and, listening, has read the queue once: an idle listener
/// is then left alone, a polled one is polled as a browser polls it until the task is done).
fn spin(
    dir: &Path,
    queue: &Path,
    (id, how): (&str, Listening),
    next: Option<&str>,
    iterations: u64,
) -> anyhow::Result<f64> {
    // A slot for it beside the tasks in flight, which the daemon resumes first.
    let in_flight = QueueReader::open(queue)
        .current_work()
        .map(|work| work.active_tasks.len())
        .unwrap_or(0);
    let daemon = Daemon::start(dir, queue, in_flight + 1, how != Listening::Off)?;
    let ran = daemon.ready(how).and_then(|()| {
        let watching = Arc::new(AtomicBool::new(true));
        let watcher = daemon
            .listen
            .filter(|_| how == Listening::Polled)
            .map(|addr| {
                let watching = Arc::clone(&watching);
                std::thread::spawn(move || poll(addr, &watching))
            });
        let finished = std::fs::write(go_file(dir, id), "")
            .context("starting the task")
            .and_then(|()| daemon.wait_done(id));
        watching.store(false, Ordering::Relaxed);
        if let Some(watcher) = watcher {
            let _ = watcher.join();
        }
        finished
    });
    // Once it is done, the next one is submitted while every slot is taken again, so that it
    // waits, first in line, for the next daemon.
    let ran = ran.and_then(|()| match next {
        Some(next) => daemon.submit_spin(dir, next, iterations),
        None => Ok(()),
    });
    daemon.stop();
    ran?;
    checkpoint_rate(queue, id)
}

/// The file whose creation lets the throughput task `id` go on from its first phase to the
/// checkpointed one: the daemon starts it at once, the run begins when the bench says.
fn go_file(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("go-{id}"))
}

/// Ask what a browser showing the first screen asks, every second, while `watching`.
fn poll(addr: SocketAddr, watching: &AtomicBool) {
    while watching.load(Ordering::Relaxed) {
        let _ = get(addr, "/").and_then(|_| get(addr, FIRST_SCREEN));
        let _ = get(addr, "/metrics");
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Checkpoints per second of a task, from its journal: between its first and last checkpoint.
fn checkpoint_rate(queue: &Path, id: &str) -> anyhow::Result<f64> {
    let events = journal::read(queue, id).with_context(|| format!("reading {id}'s journal"))?;
    let at: Vec<_> = events
        .iter()
        .filter(|e| matches!(e.event, Event::Checkpoint { .. }))
        .map(|e| e.at)
        .collect();
    let (Some(first), Some(last)) = (at.first(), at.last()) else {
        bail!("{id} wrote no checkpoint");
    };
    let seconds = (*last - *first).num_microseconds().unwrap_or(0) as f64 / 1e6;
    Ok(round(if seconds > 0.0 {
        (at.len() - 1) as f64 / seconds
    } else {
        0.0
    }))
}

/// A `cairn run` of the benchmark's queue, with its listener or without.
struct Daemon {
    child: std::cell::RefCell<Child>,
    queue: PathBuf,
    listen: Option<SocketAddr>,
}

impl Daemon {
    fn start(dir: &Path, queue: &Path, max_tasks: usize, listen: bool) -> anyhow::Result<Daemon> {
        let exe = std::env::current_exe().context("finding the cairn binary")?;
        let mut command = Command::new(exe);
        command.arg("--queue").arg(queue).args([
            "run",
            "--max-tasks",
            &max_tasks.to_string(),
            "--stop-grace",
            "1s",
        ]);
        let listen = if listen {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
            command.args(["--listen", &addr.to_string()]);
            Some(addr)
        } else {
            None
        };
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("daemon.stderr"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting cairn run")?;
        Ok(Daemon {
            child: std::cell::RefCell::new(child),
            queue: queue.to_path_buf(),
            listen,
        })
    }

    /// Wait until the daemon has taken every task in (the status document lists none
    /// submitted).
    fn taken_in(&self, tasks: usize) -> anyhow::Result<()> {
        let addr = self.listen.context("the daemon listens")?;
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let taken = get(addr, "/api/status?limit=1")
                .ok()
                .and_then(|body| serde_json::from_str::<Value>(&body).ok())
                .map(|page| {
                    page["total"].as_u64().unwrap_or(0)
                        - page["counts"]["submitted"].as_u64().unwrap_or(0)
                });
            if taken == Some(tasks as u64) {
                return Ok(());
            }
            self.still_running()?;
            if Instant::now() > deadline {
                bail!("the daemon did not take the {tasks} tasks in within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Wait until the daemon is ready (it takes tasks in once recovered) and its listener, if
    /// any, has read the queue once; an idle one is then left until it stops refreshing.
    fn ready(&self, how: Listening) -> anyhow::Result<()> {
        let Some(addr) = self.listen else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(600);
        while get(addr, "/readyz").is_err() || get(addr, "/api/status?limit=1").is_err() {
            self.still_running()?;
            if Instant::now() > deadline {
                bail!("the daemon was not ready within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if how == Listening::Idle {
            std::thread::sleep(IDLE_AFTER);
        }
        Ok(())
    }

    /// Submit a throughput task, first in line: a first phase that waits for its
    /// [`go_file`], then `iterations` checkpointed iterations; wait until the daemon has taken
    /// it in.
    fn submit_spin(&self, dir: &Path, id: &str, iterations: u64) -> anyhow::Result<()> {
        let wait = "while [ ! -e \"$0\" ]; do sleep 0.05; done";
        let go = go_file(dir, id).display().to_string();
        let task = json!({
            "id": id,
            "priority": 100,
            "phases": [{"name": "wait", "run": ["sh", "-c", wait, go]},
                       {"name": "spin", "kind": "loop", "run": ["echo", "{}"],
                        "max_iterations": iterations}],
        });
        let dir = QueueDir::new(&self.queue);
        std::fs::write(dir.inbox().join(format!("{id}.json")), task.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(600);
        while !dir.task_file(id).exists() {
            self.still_running()?;
            if Instant::now() > deadline {
                bail!("{id} was not taken in within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Wait until the task `id` has its record of done.
    fn wait_done(&self, id: &str) -> anyhow::Result<()> {
        let record = QueueDir::new(&self.queue).done_file(id);
        let deadline = Instant::now() + Duration::from_secs(600);
        while !record.exists() {
            self.still_running()?;
            if Instant::now() > deadline {
                bail!("{id} was not done within 10 minutes");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    fn still_running(&self) -> anyhow::Result<()> {
        match self.child.borrow_mut().try_wait()? {
            Some(status) => bail!("the daemon exited ({status}); see daemon.stderr"),
            None => Ok(()),
        }
    }

    fn stop(self) {
        let mut child = self.child.into_inner();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = child.wait();
    }
}

fn timed(request: impl FnOnce() -> anyhow::Result<String>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    request()?;
    Ok(started.elapsed())
}

fn round(value: f64) -> f64 {
    (value * 10.0).round() / 10.0
}

fn median_ms(times: &mut [Duration]) -> f64 {
    times.sort();
    times
        .get(times.len() / 2)
        .map_or(0.0, |t| round(t.as_secs_f64() * 1000.0))
}

fn max_ms(times: &[Duration]) -> f64 {
    times
        .iter()
        .max()
        .map_or(0.0, |t| round(t.as_secs_f64() * 1000.0))
}

/// One GET, its body; an answer other than 200 is an error.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").context("a malformed answer")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_string())
}
