//! Kill torture: runs the real `cairn run` over a mixed workload and kills it at random moments.
//!
//! ```text
//! cargo run --release --example torture -- --kills N [--seed S] [--keep DIR] [--cairn PATH]
//! ```
//!
//! The workload, in batches of eight tasks dropped into `inbox/` whenever the queue runs low:
//! `loop` tasks (`tests/fixtures/logging_loop.py`, `checkpoint_every` 1 and 3), `items` tasks
//! (`tests/fixtures/items_twice.py`, concurrency 3) and `worker` tasks
//! (`tests/fixtures/worker_helper.py`, on the Python helper, which waits for each checkpoint to
//! be committed), each logging every run of an iteration or item to its
//! own side file. The daemon is killed with SIGKILL (about one time in five: SIGTERM, a clean
//! stop) a random moment after it has made progress, and restarted, until N kills are done;
//! then `cairn run --exit-when-idle` finishes the queue.
//!
//! Checked after every kill and restart:
//! - every `incremental/*.json.gz` decodes;
//! - every task submitted is in `inbox/`, `tasks/` or `done/` (none lost), none in `failed/`;
//! - the temp files (`*.cairn.tmp`) a kill left behind are gone once the restarted daemon has
//!   started running commands again.
//!
//! Checked at the end:
//! - every task is in `done/` exactly once, nothing is in `failed/`, `inbox/` is empty,
//!   `current_work.json` lists no task in flight and no temp file is left in the queue;
//! - every task's result equals an uninterrupted run's (computed from the fixtures'
//!   deterministic state);
//! - per task, the iterations (items) that ran more than once are no more than the kills
//!   allow: per SIGKILL while the task was in flight, `checkpoint_every` for a loop (the one in
//!   flight plus the completed ones not yet checkpointed), `concurrency` for items, 1 for a
//!   worker (the iteration in flight: it starts the next one only once cairn has answered that
//!   the last one is committed); per SIGTERM, none.
//!
//! It prints one summary line and exits 0, or exits 1 with a message on the first violation.

// The run and its checks read as one story each; the line limit is for the library's functions.
#![allow(clippy::too_many_lines)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

use cairn::store::decode_checkpoint;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

/// Tasks that may run at once (`cairn run --max-tasks`).
const MAX_TASKS: usize = 4;
/// How long to wait for anything before calling it a hang.
const DEADLINE: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("torture: VIOLATION: {err}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    kills: u64,
    seed: u64,
    keep: Option<PathBuf>,
    cairn: PathBuf,
}

fn usage() -> String {
    "usage: torture --kills N [--seed S] [--keep DIR] [--cairn PATH]".to_string()
}

fn parse_options() -> Result<Options, String> {
    let mut kills = None;
    let mut seed = None;
    let mut keep = None;
    let mut cairn = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value; {}", usage()))
        };
        match arg.as_str() {
            "--kills" => kills = Some(value()?.parse().map_err(|e| format!("--kills: {e}"))?),
            "--seed" => seed = Some(value()?.parse().map_err(|e| format!("--seed: {e}"))?),
            "--keep" => keep = Some(PathBuf::from(value()?)),
            "--cairn" => cairn = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; {}", usage())),
        }
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cairn = match cairn {
        Some(path) => path,
        None => ["target/release/cairn", "target/debug/cairn"]
            .iter()
            .map(|p| manifest.join(p))
            .find(|p| p.exists())
            .ok_or("no target/release/cairn or target/debug/cairn: build cairn or pass --cairn")?,
    };
    Ok(Options {
        kills: kills.ok_or_else(usage)?,
        seed: seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        }),
        keep,
        cairn,
    })
}

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Loop { every: u64 },
    Items,
    Worker,
}

/// One task of the workload and what it should end with.
struct Spec {
    id: String,
    kind: Kind,
    side: PathBuf,
    expected: Value,
    /// Re-runs the kills allow this task so far.
    allowed: u64,
}

impl Spec {
    /// Re-runs one SIGKILL may cause while the task is in flight.
    fn per_kill(&self) -> u64 {
        match self.kind {
            Kind::Loop { every } => every,
            Kind::Items => ITEMS_CONCURRENCY,
            Kind::Worker => 1,
        }
    }
}

const ITEMS_CONCURRENCY: u64 = 3;

/// The retry policy of every task: many attempts, short backoff. A task should never fail
/// here; this only keeps a daemon bug from being hidden behind a long backoff.
fn retry() -> Value {
    json!({"max_attempts": 50, "backoff": "100ms", "max_backoff": "1s"})
}

/// A batch of eight tasks: loops with `checkpoint_every` 1, 1, 3, 3, two items tasks, two
/// workers. Sizes vary with the seed.
fn make_batch(batch: usize, rng: &mut fastrand::Rng, dir: &Path) -> Vec<(Spec, Value)> {
    let mut out = Vec::new();
    for (n, every) in [1u64, 1, 3, 3].into_iter().enumerate() {
        let id = format!("b{batch}-loop{n}-every{every}");
        let side = dir.join(format!("{id}.side"));
        let iterations = rng.u64(8..=16);
        let task = json!({
            "id": id,
            "retry": retry(),
            "phases": [{
                "name": "count",
                "kind": "loop",
                "run": ["python3", fixture("logging_loop.py"), side, "--sleep", "0.05"],
                "max_iterations": iterations,
                "checkpoint_every": every,
            }],
        });
        let expected = json!({
            "sum": (0..iterations).map(|i| i * i).sum::<u64>(),
            "seen": (0..iterations).collect::<Vec<_>>(),
        });
        let kind = Kind::Loop { every };
        out.push((
            Spec {
                id,
                kind,
                side,
                expected,
                allowed: 0,
            },
            task,
        ));
    }
    for n in 0..2 {
        let id = format!("b{batch}-items{n}");
        let side = dir.join(format!("{id}.side"));
        let items: Vec<u64> = (0..rng.u64(6..=12)).map(|_| rng.u64(0..1000)).collect();
        let task = json!({
            "id": id,
            "retry": retry(),
            "phases": [{
                "name": "double",
                "kind": "items",
                "items": items,
                "concurrency": ITEMS_CONCURRENCY,
                "run": ["python3", fixture("items_twice.py"), side, "--sleep", "0.1"],
            }],
        });
        let expected: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(i, item)| json!({"index": i, "item": item, "twice": item * 2, "inputs": []}))
            .collect();
        let expected = json!(expected);
        out.push((
            Spec {
                id,
                kind: Kind::Items,
                side,
                expected,
                allowed: 0,
            },
            task,
        ));
    }
    for n in 0..2 {
        let id = format!("b{batch}-worker{n}");
        let side = dir.join(format!("{id}.side"));
        let iterations = rng.u64(8..=16);
        let task = json!({
            "id": id,
            "retry": retry(),
            "phases": [{
                "name": "work",
                "kind": "worker",
                "run": ["python3", fixture("worker_helper.py"), side,
                        "--iterations", iterations.to_string(), "--sleep", "0.05"],
            }],
        });
        let expected = json!({
            "sum": (0..iterations).map(|i| i * i).sum::<u64>(),
            "last": iterations - 1,
        });
        out.push((
            Spec {
                id,
                kind: Kind::Worker,
                side,
                expected,
                allowed: 0,
            },
            task,
        ));
    }
    out
}

/// The iterations (items) started, per the side file, one entry per start.
fn starts(spec: &Spec) -> Vec<u64> {
    let text = fs::read_to_string(&spec.side).unwrap_or_default();
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            match (spec.kind, f.as_slice()) {
                // worker_helper.py: `start <iteration> <pid>`
                (Kind::Worker, ["start", i, _]) => i.parse().ok(),
                // logging_loop.py, items_twice.py: `start <task> <iteration> <attempt> <pid>`
                (Kind::Loop { .. } | Kind::Items, ["start", _, i, _, _]) => i.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

/// Total starts, and the starts beyond the first of each iteration (re-runs).
fn run_counts(spec: &Spec) -> (u64, u64) {
    let all = starts(spec);
    let distinct: BTreeSet<u64> = all.iter().copied().collect();
    (all.len() as u64, (all.len() - distinct.len()) as u64)
}

fn list(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every `*.cairn.tmp` file under `dir`, recursively.
fn temp_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for name in list(dir) {
        let path = dir.join(&name);
        if path.is_dir() && !path.is_symlink() {
            temp_files(&path, found);
        } else if name.ends_with(".cairn.tmp") {
            found.push(path);
        }
    }
}

struct Torture {
    opts: Options,
    rng: fastrand::Rng,
    queue: PathBuf,
    aux: PathBuf,
    specs: Vec<Spec>,
    batches: usize,
    daemons: usize,
}

struct Daemon {
    child: Child,
    n: usize,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Torture {
    fn start(&mut self, args: &[&str]) -> Result<Daemon, String> {
        self.daemons += 1;
        let n = self.daemons;
        let stderr = fs::File::create(self.aux.join(format!("daemon-{n}.stderr")))
            .map_err(|e| format!("creating a daemon's stderr file: {e}"))?;
        let child = Command::new(&self.opts.cairn)
            .arg("--queue")
            .arg(&self.queue)
            .arg("run")
            .args(["--max-tasks", &MAX_TASKS.to_string()])
            .args(args)
            .env_remove("CAIRN_QUEUE")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.opts.cairn.display()))?;
        Ok(Daemon { child, n })
    }

    fn wait_exit(&self, daemon: &mut Daemon, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = daemon.child.try_wait().map_err(|e| e.to_string())? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "daemon #{} did not exit within {timeout:?}{}",
                    daemon.n,
                    self.stderr_tail(daemon.n)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn stderr_tail(&self, n: usize) -> String {
        let text =
            fs::read_to_string(self.aux.join(format!("daemon-{n}.stderr"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        format!("\n--- last lines of daemon #{n}'s stderr ---\n{tail}")
    }

    /// Tasks not yet in `done/`.
    fn outstanding(&self) -> Vec<&Spec> {
        let done: BTreeSet<String> = list(&self.queue.join("done")).into_iter().collect();
        self.specs
            .iter()
            .filter(|s| !done.contains(&format!("{}.json", s.id)))
            .collect()
    }

    /// Drop a batch into the inbox (temp dot-file, then rename), dated back so the daemon
    /// takes it at once.
    fn add_batch(&mut self) -> Result<(), String> {
        let batch = self.batches;
        self.batches += 1;
        for (spec, task) in make_batch(batch, &mut self.rng, &self.aux) {
            let temp = self.queue.join(format!("inbox/.{}.json.writing", spec.id));
            let mut file = fs::File::create(&temp).map_err(|e| format!("inbox: {e}"))?;
            file.write_all(&serde_json::to_vec_pretty(&task).expect("a task serialises"))
                .map_err(|e| format!("inbox: {e}"))?;
            file.set_modified(SystemTime::now() - Duration::from_secs(600))
                .map_err(|e| format!("inbox: {e}"))?;
            drop(file);
            fs::rename(&temp, self.queue.join(format!("inbox/{}.json", spec.id)))
                .map_err(|e| format!("inbox: {e}"))?;
            self.specs.push(spec);
        }
        Ok(())
    }

    /// Total starts of iterations and items over all side files.
    fn total_starts(&self) -> u64 {
        self.specs.iter().map(|s| starts(s).len() as u64).sum()
    }

    /// With the daemon down: every checkpoint decodes; every task is somewhere; nothing failed.
    fn check_at_rest(&self, when: &str) -> Result<(), String> {
        let incremental = self.queue.join("incremental");
        for name in list(&incremental) {
            if name.ends_with(".json.gz") {
                let bytes = fs::read(incremental.join(&name))
                    .map_err(|e| format!("{when}: reading incremental/{name}: {e}"))?;
                decode_checkpoint(&bytes)
                    .map_err(|e| format!("{when}: incremental/{name} does not decode: {e}"))?;
            }
        }
        let failed = list(&self.queue.join("failed"));
        if !failed.is_empty() {
            let first =
                fs::read_to_string(self.queue.join("failed").join(&failed[0])).unwrap_or_default();
            return Err(format!(
                "{when}: failed/ holds {failed:?}; {}: {first}",
                failed[0]
            ));
        }
        for spec in &self.specs {
            let name = format!("{}.json", spec.id);
            if !["inbox", "tasks", "done"]
                .iter()
                .any(|dir| self.queue.join(dir).join(&name).exists())
            {
                return Err(format!(
                    "{when}: task {} is lost (not in inbox/, tasks/ or done/)",
                    spec.id
                ));
            }
        }
        Ok(())
    }

    /// Wait until some iteration or item starts after `before` starts in all (the daemon has
    /// made it through its start), or until everything is done.
    fn wait_progress(&self, daemon: &mut Daemon, before: u64) -> Result<(), String> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            if self.total_starts() > before || self.outstanding().is_empty() {
                return Ok(());
            }
            if let Some(status) = daemon.child.try_wait().map_err(|e| e.to_string())? {
                return Err(format!(
                    "daemon #{} exited on its own with {status}{}",
                    daemon.n,
                    self.stderr_tail(daemon.n)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "daemon #{} started no iteration within {DEADLINE:?}{}",
                    daemon.n,
                    self.stderr_tail(daemon.n)
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn run() -> Result<(), String> {
    let opts = parse_options()?;
    let began = Instant::now();
    let tmp = tempfile::Builder::new()
        .prefix("cairn-torture-")
        .tempdir()
        .map_err(|e| format!("creating a temp dir: {e}"))?;
    let base = match &opts.keep {
        Some(dir) => {
            fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
            dir.clone()
        }
        None => tmp.path().to_path_buf(),
    };
    let queue = base.join("queue");
    let aux = base.join("side");
    for dir in [queue.join("inbox"), aux.clone()] {
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let seed = opts.seed;
    eprintln!(
        "torture: seed {seed}, {} kills, queue {}, cairn {}",
        opts.kills,
        queue.display(),
        opts.cairn.display()
    );
    let mut t = Torture {
        rng: fastrand::Rng::with_seed(seed),
        opts,
        queue,
        aux,
        specs: Vec::new(),
        batches: 0,
        daemons: 0,
    };
    let (mut sigkills, mut sigterms) = (0u64, 0u64);
    let mut leftover_temps: Vec<PathBuf> = Vec::new();
    let mut temps_left = 0usize;
    while sigkills + sigterms < t.opts.kills {
        // Keep enough work queued that the daemon is always busy.
        if t.outstanding().len() < 2 * MAX_TASKS {
            t.add_batch()?;
        }
        let before = t.total_starts();
        let mut daemon = t.start(&[])?;
        t.wait_progress(&mut daemon, before)?;
        // Commands run again, so the start is over: what the last kill left is cleaned up.
        for path in &leftover_temps {
            if path.exists() {
                return Err(format!(
                    "the temp file {} left by a kill survived the restart of daemon #{}",
                    path.display(),
                    daemon.n
                ));
            }
        }
        std::thread::sleep(Duration::from_millis(t.rng.u64(0..1200)));
        // The tasks in flight at this kill: started (a side file) and not done.
        let in_flight: Vec<usize> = {
            let done: BTreeSet<String> = list(&t.queue.join("done")).into_iter().collect();
            (0..t.specs.len())
                .filter(|&i| {
                    let s = &t.specs[i];
                    s.side.exists() && !done.contains(&format!("{}.json", s.id))
                })
                .collect()
        };
        let sigterm = t.rng.u32(0..5) == 0;
        let n = daemon.n;
        if sigterm {
            sigterms += 1;
            kill(Pid::from_raw(daemon.child.id() as i32), Signal::SIGTERM)
                .map_err(|e| format!("SIGTERM: {e}"))?;
            let status = t.wait_exit(&mut daemon, DEADLINE)?;
            if status.code() != Some(0) {
                return Err(format!(
                    "daemon #{n} exited with {status} after SIGTERM, not 0{}",
                    t.stderr_tail(n)
                ));
            }
        } else {
            sigkills += 1;
            kill(Pid::from_raw(daemon.child.id() as i32), Signal::SIGKILL)
                .map_err(|e| format!("SIGKILL: {e}"))?;
            t.wait_exit(&mut daemon, DEADLINE)?;
            for &i in &in_flight {
                let per_kill = t.specs[i].per_kill();
                t.specs[i].allowed += per_kill;
            }
        }
        // A task that was not in flight may have started between the look and the kill;
        // commands die with the daemon, so allow for it as for any in flight.
        if !sigterm {
            let done: BTreeSet<String> = list(&t.queue.join("done")).into_iter().collect();
            for i in 0..t.specs.len() {
                if !in_flight.contains(&i)
                    && t.specs[i].side.exists()
                    && !done.contains(&format!("{}.json", t.specs[i].id))
                {
                    let per_kill = t.specs[i].per_kill();
                    t.specs[i].allowed += per_kill;
                }
            }
        }
        let kind = if sigterm { "SIGTERM" } else { "SIGKILL" };
        t.check_at_rest(&format!(
            "after kill {} ({kind}) of daemon #{n}",
            sigkills + sigterms
        ))?;
        leftover_temps.clear();
        temp_files(&t.queue, &mut leftover_temps);
        temps_left += leftover_temps.len();
    }
    // Finish the queue.
    let mut daemon = t.start(&["--exit-when-idle"])?;
    let status = t.wait_exit(&mut daemon, Duration::from_secs(600))?;
    if status.code() != Some(0) {
        return Err(format!(
            "the final `cairn run --exit-when-idle` exited with {status}{}",
            t.stderr_tail(daemon.n)
        ));
    }
    t.check_at_rest("at the end")?;
    let mut temps = Vec::new();
    temp_files(&t.queue, &mut temps);
    if !temps.is_empty() {
        return Err(format!("temp files left at the end: {temps:?}"));
    }
    let current_work = fs::read_to_string(t.queue.join("current_work.json"))
        .map_err(|e| format!("reading current_work.json at the end: {e}"))?;
    let current_work: Value = serde_json::from_str(&current_work)
        .map_err(|e| format!("current_work.json does not parse at the end: {e}"))?;
    if current_work["active_tasks"] != json!([]) {
        return Err(format!(
            "current_work.json still lists tasks in flight at the end: {}",
            current_work["active_tasks"]
        ));
    }
    let inbox: Vec<String> = list(&t.queue.join("inbox"));
    if !inbox.is_empty() {
        return Err(format!("inbox/ not empty at the end: {inbox:?}"));
    }
    let done = list(&t.queue.join("done"));
    let ids: BTreeMap<String, usize> = t
        .specs
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("{}.json", s.id), i))
        .collect();
    for name in &done {
        if name.ends_with(".json") && !ids.contains_key(name) {
            return Err(format!(
                "done/ holds {name}, which is no task of the workload"
            ));
        }
    }
    let (mut iterations, mut reruns) = (0u64, 0u64);
    for spec in &t.specs {
        let path = t.queue.join("done").join(format!("{}.json", spec.id));
        let text = fs::read_to_string(&path)
            .map_err(|e| format!("task {} is not in done/: {e}", spec.id))?;
        let record: Value = serde_json::from_str(&text)
            .map_err(|e| format!("done/{}.json does not parse: {e}", spec.id))?;
        if record["result"] != spec.expected {
            return Err(format!(
                "task {}: result {} differs from the uninterrupted run's {}",
                spec.id, record["result"], spec.expected
            ));
        }
        let (all, again) = run_counts(spec);
        if again > spec.allowed {
            return Err(format!(
                "task {} ({:?}): {again} re-runs, but the kills it was in flight for allow {}; \
                 starts in order: {:?} (side file {})",
                spec.id,
                spec.kind,
                spec.allowed,
                starts(spec),
                spec.side.display()
            ));
        }
        iterations += all;
        reruns += again;
    }
    let seconds = began.elapsed().as_secs_f64();
    println!(
        "torture: ok: seed {seed}, kills {} (SIGKILL {sigkills}, SIGTERM {sigterms}), tasks {}, \
         iterations run {iterations}, re-runs {reruns}, seconds {seconds:.1}",
        sigkills + sigterms,
        t.specs.len()
    );
    eprintln!(
        "torture: temp files left by the kills (all removed by the next start): {temps_left}"
    );
    if t.opts.keep.is_some() {
        eprintln!("torture: kept {}", base.display());
    }
    Ok(())
}
