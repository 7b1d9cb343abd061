//! `cairn bench web`: what the HTTP listener answers in, with many tasks in the queue. A real
//! daemon (`cairn run --listen`) holds `--tasks` tasks, one running and the rest pending; the
//! benchmark times the dashboard's first screen (the page and the status document it fetches,
//! read afresh) and `/metrics`, and prints one JSON line. No figure is asserted anywhere.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// Options of `cairn bench web`.
#[derive(Debug, Clone)]
pub struct WebOptions {
    pub tasks: usize,
    pub rounds: usize,
    pub dir: std::path::PathBuf,
}

/// Run the benchmark: one JSON line on stdout.
pub fn run(options: &WebOptions) -> anyhow::Result<Value> {
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
    let inbox = crate::queue::QueueDir::new(&queue).inbox();
    std::fs::create_dir_all(&inbox)?;
    for n in 0..options.tasks {
        let task = json!({
            "id": format!("t{n:05}"),
            "phases": [{"name": "wait", "run": ["sleep", "3600"]}],
        });
        std::fs::write(inbox.join(format!("t{n:05}.json")), task.to_string())?;
    }
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let exe = std::env::current_exe().context("finding the cairn binary")?;
    let stderr = std::fs::File::create(dir.join("daemon.stderr"))?;
    let mut daemon = Command::new(exe)
        .arg("--queue")
        .arg(&queue)
        .args([
            "run",
            "--max-tasks",
            "1",
            "--stop-grace",
            "1s",
            "--listen",
            &addr.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .context("starting cairn run --listen")?;
    let figures = (|| {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let taken = get(addr, "/api/status")
                .ok()
                .and_then(|body| serde_json::from_str::<Value>(&body).ok())
                .and_then(|status| {
                    status["tasks"]
                        .as_array()
                        .map(|tasks| tasks.iter().filter(|t| t["state"] != "submitted").count())
                });
            if taken == Some(options.tasks) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon did not take the {} tasks in within 10 minutes",
                    options.tasks
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        let mut first_screen = Vec::new();
        let mut metrics = Vec::new();
        let mut status_bytes = 0;
        for _ in 0..options.rounds.max(1) {
            // Past the status document's second of sharing: each round reads the queue anew.
            std::thread::sleep(Duration::from_millis(1100));
            let started = Instant::now();
            get(addr, "/")?;
            status_bytes = get(addr, "/api/status")?.len();
            first_screen.push(started.elapsed());
            let started = Instant::now();
            get(addr, "/metrics")?;
            metrics.push(started.elapsed());
        }
        Ok(json!({
            "bench": "web",
            "tasks": options.tasks,
            "rounds": first_screen.len(),
            "status_bytes": status_bytes,
            "first_screen_ms_p50": median_ms(&mut first_screen),
            "first_screen_ms_max": max_ms(&first_screen),
            "metrics_ms_p50": median_ms(&mut metrics),
            "metrics_ms_max": max_ms(&metrics),
        }))
    })();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    figures
}

fn median_ms(times: &mut [Duration]) -> f64 {
    times.sort();
    times
        .get(times.len() / 2)
        .map_or(0.0, |t| t.as_secs_f64() * 1000.0)
}

fn max_ms(times: &[Duration]) -> f64 {
    times.iter().max().map_or(0.0, |t| t.as_secs_f64() * 1000.0)
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
