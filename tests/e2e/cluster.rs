//! Several daemons sharing one queue in a real, throwaway PostgreSQL (`cairn run --db`), each
//! a separate `cairn` process with its own local directory, as on separate hosts: a daemon
//! killed mid-iteration has its tasks resumed elsewhere from their last checkpoint; a frozen
//! one writes nothing once its leases were taken over, stops its commands and goes on; the
//! work is spread over the daemons; random kills lose and duplicate no task.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::signal::Signal::{SIGCONT, SIGSTOP};
use serde_json::{json, Value};

use crate::common::postgres::{final_record, query_texts, submit_task, PgCluster};
use crate::common::{
    add_args, loop_result, loop_task, once_task, process_alive, side_events, wait_until, Daemon,
    SideEvent, TestQueue, DEADLINE, SIGKILL, SIGTERM,
};

/// The lease the daemons run with: short enough to wait out, long enough for renewals (every
/// half second) on a loaded machine.
const LEASE: Duration = Duration::from_secs(3);

/// A daemon's host: its local queue directory and the daemon running on it.
struct Host {
    queue: TestQueue,
    node: String,
    daemon: Option<Daemon>,
}

impl Host {
    fn new(node: &str) -> Host {
        Host {
            queue: TestQueue::new(),
            node: node.to_string(),
            daemon: None,
        }
    }

    /// Start `cairn run --db` on this host, with `extra` arguments.
    fn start(&mut self, url: &str, extra: &[&str]) {
        let lease = format!("{}s", LEASE.as_secs());
        let mut args = vec!["--db", url, "--node", &self.node, "--lease", &lease];
        args.extend_from_slice(extra);
        self.daemon = Some(self.queue.start(&args));
    }

    fn daemon(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("the host's daemon was started")
    }
}

/// Unix time now, to compare with the side file's.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Wait until every task of `ids` has a final record; returns them.
fn wait_records(url: &str, ids: &[String], timeout: Duration) -> BTreeMap<String, Value> {
    let mut records = BTreeMap::new();
    wait_until("every task has its record", timeout, || {
        for id in ids {
            if !records.contains_key(id) {
                if let Some(record) = final_record(url, id) {
                    records.insert(id.clone(), record);
                }
            }
        }
        records.len() == ids.len()
    });
    records
}

/// The side file's events of task `id`.
fn events_of<'a>(events: &'a [SideEvent], id: &str) -> Vec<&'a SideEvent> {
    events.iter().filter(|e| e.task == id).collect()
}

fn node_of(event: &SideEvent) -> &str {
    &event.lease.as_ref().expect("a shared queue's line").node
}

/// A daemon killed mid-iteration: each of its tasks resumes on another daemon within about a
/// lease, from its last checkpoint (at most the iteration in flight runs again), under a
/// higher epoch, and every result equals an uninterrupted run's.
#[test]
fn a_killed_daemons_tasks_resume_elsewhere_from_their_checkpoints() {
    let test = "a_killed_daemons_tasks_resume_elsewhere_from_their_checkpoints";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let ids: Vec<String> = (0..12).map(|i| format!("loop-{i:02}")).collect();
    for id in &ids {
        submit_task(&url, &loop_task(id, &side, 15, 0.3));
    }
    // Room for half the tasks on each daemon: whichever is killed, the other two have a slot
    // for each of its tasks, which then start as soon as their leases expired.
    let mut hosts: Vec<Host> = ["n1", "n2", "n3"].iter().map(|n| Host::new(n)).collect();
    for host in &mut hosts {
        host.start(&url, &["--max-tasks", "6"]);
    }
    // Kill a daemon once it is well into its tasks: an iteration past the third ended there.
    let well_into = wait_for_event(&side, |e| e.event == "end" && e.iteration >= 3);
    let victim = node_of(&well_into).to_string();
    let host = hosts.iter_mut().find(|h| h.node == victim).unwrap();
    host.daemon().kill_hard();
    let killed_at = unix_now();
    let records = wait_records(&url, &ids, DEADLINE);

    let events = side_events(&side);
    let mut resumed = 0;
    for id in &ids {
        assert_eq!(records[id]["status"], "done", "{id}: {}", records[id]);
        assert_eq!(records[id]["result"], loop_result(15), "{id}");
        let task_events = events_of(&events, id);
        let on_victim: Vec<_> = task_events
            .iter()
            .filter(|e| node_of(e) == victim)
            .collect();
        let elsewhere_after: Vec<_> = task_events
            .iter()
            .filter(|e| node_of(e) != victim && e.lease.as_ref().unwrap().at >= killed_at)
            .collect();
        if on_victim.is_empty() || elsewhere_after.is_empty() {
            continue;
        }
        resumed += 1;
        let moves = query_texts(
            &url,
            "SELECT event->>'from_node' FROM cairn_events
             WHERE task_id = $1 AND event->>'event' = 'taken_over'",
            &[id],
        );
        assert!(
            moves
                .iter()
                .any(|m| m[0].as_deref() == Some(victim.as_str())),
            "{id}: its timeline does not say it was taken over from {victim}: {moves:?}"
        );
        let started_on_victim: BTreeSet<u64> = on_victim
            .iter()
            .filter(|e| e.event == "start")
            .map(|e| e.iteration)
            .collect();
        let started_after: BTreeSet<u64> = elsewhere_after
            .iter()
            .filter(|e| e.event == "start")
            .map(|e| e.iteration)
            .collect();
        let again: Vec<_> = started_on_victim.intersection(&started_after).collect();
        assert!(
            again.len() <= 1,
            "{id}: iterations {again:?} ran on {victim} and again after its death; only the one \
             in flight may"
        );
        let first_after = elsewhere_after[0].lease.as_ref().unwrap();
        let old_epoch = on_victim.last().unwrap().lease.as_ref().unwrap().epoch;
        assert!(
            first_after.epoch > old_epoch,
            "{id}: the takeover raised the epoch"
        );
        eprintln!(
            "{id}: resumed on {} {:.2} s after {victim} was killed (lease {} s), from iteration {}",
            first_after.node,
            first_after.at - killed_at,
            LEASE.as_secs(),
            elsewhere_after[0].iteration,
        );
        // Generous for a loaded machine; the figure above is what docs/cluster.md reports.
        assert!(
            first_after.at - killed_at <= (LEASE * 4).as_secs_f64() + 10.0,
            "{id}: resumed {:.1} s after the kill",
            first_after.at - killed_at
        );
    }
    assert!(
        resumed > 0,
        "no task of n1 was resumed elsewhere: {events:?}"
    );
}

/// A daemon frozen (SIGSTOP) for longer than its lease: its tasks are taken over; once it
/// wakes it writes nothing for them (no checkpoint, state or record under its old epoch), its
/// commands are stopped, and it goes on taking new work.
#[test]
fn a_frozen_daemon_writes_nothing_after_a_takeover_and_goes_on() {
    let test = "a_frozen_daemon_writes_nothing_after_a_takeover_and_goes_on";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    // Iteration 3 of the first attempt takes a minute: the frozen daemon's command is still
    // running when it wakes, and must be stopped then, not left to finish.
    let mut task = loop_task("slow", &side, 8, 0.2);
    add_args(&mut task, &["--slow", "3:60"]);
    submit_task(&url, &task);
    let mut a = Host::new("a");
    a.start(&url, &["--max-tasks", "2"]);
    let in_slow = wait_for_event(&side, |e| e.event == "start" && e.iteration == 3);
    let old_epoch = in_slow.lease.as_ref().unwrap().epoch;
    a.daemon().signal(SIGSTOP);
    let frozen_at = unix_now();

    let mut b = Host::new("b");
    b.start(&url, &["--max-tasks", "2"]);
    let records = wait_records(&url, &["slow".to_string()], DEADLINE);
    assert_eq!(records["slow"]["status"], "done");
    assert_eq!(records["slow"]["result"], loop_result(8));
    let taken_over = side_events(&side)
        .into_iter()
        .find(|e| node_of(e) == "b")
        .expect("b ran the task");
    assert!(taken_over.lease.as_ref().unwrap().epoch > old_epoch);
    let written_before = rows_under_epoch(&url, "slow", old_epoch);

    // b steps aside, so that new work can only go to a.
    b.daemon().signal(SIGTERM);
    b.daemon().wait_exit(DEADLINE);
    a.daemon().signal(SIGCONT);
    eprintln!(
        "a was frozen for {:.1} s (lease {} s)",
        unix_now() - frozen_at,
        LEASE.as_secs()
    );
    wait_until(
        "a's command of the lost task is stopped",
        DEADLINE / 4,
        || !process_alive(in_slow.pid),
    );
    submit_task(
        &url,
        &json!({"id": "after", "phases": [{"name": "p", "run": ["python3", "-c", "import os, json; print(json.dumps(os.environ['CAIRN_NODE']))"]}]}),
    );
    let records = wait_records(&url, &["after".to_string()], DEADLINE);
    assert_eq!(records["after"]["result"], "a", "a took the new work");
    assert!(a.daemon().is_running(), "a is still running");
    assert_eq!(
        rows_under_epoch(&url, "slow", old_epoch),
        written_before,
        "a wrote for the task under its old epoch after waking"
    );
    let record_epoch = &query_texts(
        &url,
        "SELECT lease_epoch::text FROM cairn_records WHERE task_id = $1",
        &["slow"],
    )[0][0];
    assert_ne!(
        record_epoch.as_deref(),
        Some(old_epoch.to_string().as_str())
    );
}

/// Wait for the first side-file event `matches` accepts.
fn wait_for_event(side: &std::path::Path, matches: impl Fn(&SideEvent) -> bool) -> SideEvent {
    crate::common::wait_for("the side file's event", DEADLINE, || {
        side_events(side).into_iter().find(|e| matches(e))
    })
}

/// Everything stored for `task` under `epoch`: checkpoints, outputs, events, records.
fn rows_under_epoch(url: &str, task: &str, epoch: u64) -> Vec<Vec<Option<String>>> {
    let epoch = epoch.to_string();
    query_texts(
        url,
        "SELECT 'checkpoint', generation::text FROM cairn_checkpoints
             WHERE task_id = $1 AND lease_epoch = $2::text::bigint
         UNION ALL SELECT 'output', phase_index::text FROM cairn_outputs
             WHERE task_id = $1 AND lease_epoch = $2::text::bigint
         UNION ALL SELECT 'event', id::text FROM cairn_events
             WHERE task_id = $1 AND lease_epoch = $2::text::bigint
         UNION ALL SELECT 'record', status FROM cairn_records
             WHERE task_id = $1 AND lease_epoch = $2::text::bigint
         ORDER BY 1, 2",
        &[task, &epoch],
    )
}

/// Sixty half-second tasks, two at a time per daemon: three daemons share them out (each
/// runs a share) and finish sooner than one; both figures are printed.
#[test]
fn three_daemons_share_the_work_of_sixty_tasks() {
    let test = "three_daemons_share_the_work_of_sixty_tasks";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let one = run_sixty(&pg.create_database("one"), &["solo"]);
    let three = run_sixty(&pg.create_database("three"), &["x", "y", "z"]);
    eprintln!(
        "60 tasks of 0.5 s, --max-tasks 2: one daemon {:.2} s, three daemons {:.2} s: {:.2}x",
        one.elapsed.as_secs_f64(),
        three.elapsed.as_secs_f64(),
        one.elapsed.as_secs_f64() / three.elapsed.as_secs_f64()
    );
    for (node, count) in &three.per_node {
        assert!(
            *count >= 5,
            "{node} ran only {count} of the 60 tasks: {:?}",
            three.per_node
        );
    }
    assert_eq!(three.per_node.len(), 3, "{:?}", three.per_node);
}

/// How a run of the sixty tasks went.
struct SixtyRun {
    elapsed: Duration,
    /// Tasks each node ran.
    per_node: BTreeMap<String, usize>,
}

/// Submit sixty tasks that each sleep half a second and print their node, run them on daemons
/// named `nodes` (`--max-tasks 2 --exit-when-idle`), and time it from the daemons' start to
/// the last one's exit.
fn run_sixty(url: &str, nodes: &[&str]) -> SixtyRun {
    let ids: Vec<String> = (0..60).map(|i| format!("t{i:02}")).collect();
    for id in &ids {
        let script =
            "import os, json, time; time.sleep(0.5); print(json.dumps(os.environ['CAIRN_NODE']))";
        submit_task(
            url,
            &json!({"id": id, "phases": [{"name": "p", "run": ["python3", "-c", script]}]}),
        );
    }
    let mut hosts: Vec<Host> = nodes.iter().map(|n| Host::new(n)).collect();
    let started = Instant::now();
    for host in &mut hosts {
        host.start(url, &["--max-tasks", "2", "--exit-when-idle"]);
    }
    for host in &mut hosts {
        let node = host.node.clone();
        let daemon = host.daemon();
        let status = daemon.wait_exit(DEADLINE * 2);
        assert!(status.success(), "{node}: {status}\n{}", daemon.stderr());
    }
    let elapsed = started.elapsed();
    let records = wait_records(url, &ids, DEADLINE);
    let mut per_node = BTreeMap::new();
    for record in records.values() {
        assert_eq!(record["status"], "done", "{record}");
        let node = record["result"]
            .as_str()
            .expect("the node's name")
            .to_string();
        *per_node.entry(node).or_default() += 1;
    }
    SixtyRun { elapsed, per_node }
}

/// Many tasks under random SIGKILLs of random daemons (each restarted under its name): every
/// task ends with exactly one record, none lost.
#[test]
fn random_kills_of_random_daemons_lose_no_task() {
    let test = "random_kills_of_random_daemons_lose_no_task";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let mut ids = Vec::new();
    for i in 0..150 {
        let id = format!("once-{i:03}");
        submit_task(&url, &once_task(&id, &json!({"i": i})));
        ids.push(id);
    }
    for i in 0..30 {
        let id = format!("loop-{i:02}");
        submit_task(&url, &loop_task(&id, &side, 6, 0.1));
        ids.push(id);
    }
    let mut hosts: Vec<Host> = ["k1", "k2", "k3"].iter().map(|n| Host::new(n)).collect();
    for host in &mut hosts {
        host.start(&url, &["--max-tasks", "4"]);
    }
    // A pseudo-random but repeatable choice of victims and pauses.
    let mut seed: u64 = 0x5eed_cafe;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut kills = 0;
    while kills < 8 && records_count(&url) < ids.len() {
        std::thread::sleep(Duration::from_millis(500 + next(1500)));
        let victim = &mut hosts[next(3) as usize];
        victim.daemon().signal(SIGKILL);
        victim.daemon().wait_exit(DEADLINE);
        kills += 1;
        victim.start(&url, &["--max-tasks", "4"]);
    }
    let records = wait_records(&url, &ids, DEADLINE * 2);
    for (id, record) in &records {
        assert_eq!(record["status"], "done", "{id}: {record}");
        if let Some(i) = id.strip_prefix("once-") {
            assert_eq!(record["result"], json!({"i": i.parse::<u64>().unwrap()}));
        } else {
            assert_eq!(record["result"], loop_result(6), "{id}");
        }
    }
    let rows = query_texts(&url, "SELECT count(*)::text FROM cairn_records", &[]);
    assert_eq!(rows[0][0].as_deref(), Some(ids.len().to_string().as_str()));
    eprintln!(
        "{} tasks done exactly once each under {kills} SIGKILLs",
        ids.len()
    );
    for host in &mut hosts {
        host.daemon().signal(SIGTERM);
        host.daemon().wait_exit(DEADLINE);
    }
}

fn records_count(url: &str) -> usize {
    query_texts(url, "SELECT count(*)::text FROM cairn_records", &[])[0][0]
        .as_deref()
        .unwrap_or("0")
        .parse()
        .unwrap()
}

/// A daemon stopped with SIGTERM hands its leases back after the iteration in flight: another
/// daemon resumes its task from the checkpoint at once, not after the lease, and nothing is
/// counted as a crash.
#[test]
fn a_stopped_daemon_hands_its_tasks_over_at_once() {
    let test = "a_stopped_daemon_hands_its_tasks_over_at_once";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    submit_task(&url, &loop_task("handed", &side, 12, 0.3));
    let mut a = Host::new("a");
    a.start(&url, &["--max-tasks", "1"]);
    wait_for_event(&side, |e| e.event == "end" && e.iteration >= 2);
    let mut b = Host::new("b");
    b.start(&url, &["--max-tasks", "1"]);
    wait_until("b is up", DEADLINE, || {
        b.daemon().stderr().contains("cairn daemon started")
    });
    a.daemon().signal(SIGTERM);
    let stopped = a.daemon().wait_exit(DEADLINE);
    assert!(stopped.success(), "{stopped}\n{}", a.daemon().stderr());
    let stopped_at = unix_now();
    let records = wait_records(&url, &["handed".to_string()], DEADLINE);
    assert_eq!(records["handed"]["result"], loop_result(12));
    let events = side_events(&side);
    let on_b = events
        .iter()
        .find(|e| node_of(e) == "b")
        .expect("b resumed the task");
    let started_on_a: BTreeSet<u64> = events
        .iter()
        .filter(|e| node_of(e) == "a" && e.event == "start")
        .map(|e| e.iteration)
        .collect();
    assert!(
        !started_on_a.contains(&on_b.iteration),
        "iteration {} ran twice: a finished its iteration in flight and checkpointed it",
        on_b.iteration
    );
    let crashes = query_texts(
        &url,
        "SELECT crash_count::text FROM cairn_tasks WHERE id = $1",
        &["handed"],
    );
    assert_eq!(crashes[0][0].as_deref(), Some("0"), "a release is no crash");
    eprintln!(
        "b resumed the task {:.2} s after a exited (lease {} s)",
        on_b.lease.as_ref().unwrap().at - stopped_at,
        LEASE.as_secs()
    );
}

/// A task that kills every daemon that runs it is quarantined after its crash limit: the
/// daemon that would claim it next records it failed, saying why, instead of running it.
#[test]
fn a_task_that_keeps_killing_its_daemon_is_quarantined() {
    let test = "a_task_that_keeps_killing_its_daemon_is_quarantined";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let runs = scratch.aux("runs.log");
    // Each run notes itself, then SIGKILLs its daemon (the command's parent).
    let script = format!("echo run >> '{}'; kill -9 $PPID; sleep 60", runs.display());
    submit_task(
        &url,
        &json!({"id": "killer", "phases": [{"name": "p", "run": ["sh", "-c", script]}]}),
    );
    let crash_limit = 5; // as `submit_task` sets it
    let mut host = Host::new("victim");
    let deaths = restart_until_recorded(
        &mut host,
        &url,
        &["killer"],
        &["--max-tasks", "1"],
        crash_limit + 1,
    );
    let record = final_record(&url, "killer").unwrap();
    assert_eq!(record["status"], "failed", "{record}");
    assert!(
        record["error"].as_str().unwrap().contains("quarantined"),
        "{record}"
    );
    let runs = std::fs::read_to_string(&runs).unwrap().lines().count();
    assert_eq!(runs, deaths, "one run per death, none after the quarantine");
    assert!(deaths >= crash_limit, "quarantined after {deaths} deaths");
    // The timeline says why it moved each time and what was decided.
    let journal = query_texts(
        &url,
        "SELECT event->>'event', event->>'from_node', event->>'verdict' FROM cairn_events
         WHERE task_id = 'killer' ORDER BY id",
        &[],
    );
    let crashes = journal
        .iter()
        .filter(|e| e[0].as_deref() == Some("taken_over") && e[2].as_deref() == Some("crash"))
        .count();
    assert!(
        crashes >= crash_limit - 1 && journal.iter().all(|e| e[0].as_deref() != Some("taken_over") || e[1].as_deref() == Some("victim")),
        "each takeover after a death is journaled with its verdict: {journal:?}"
    );
    assert!(
        journal
            .iter()
            .any(|e| e[0].as_deref() == Some("quarantined")),
        "the quarantine is journaled: {journal:?}"
    );
    host.daemon().signal(SIGTERM);
    host.daemon().wait_exit(DEADLINE);
}

/// Crash blame across daemons: a task that kills its daemon while three innocent tasks run
/// beside it makes them all suspects, not crashes; each is then tried alone, so only the
/// killer is counted and quarantined, and the innocent ones end done.
#[test]
fn only_the_task_that_kills_its_daemon_is_quarantined_not_the_ones_beside_it() {
    let test = "only_the_task_that_kills_its_daemon_is_quarantined_not_the_ones_beside_it";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let killer = "kill -9 $PPID; sleep 60";
    submit_task(
        &url,
        &json!({"id": "killer", "phases": [{"name": "p", "run": ["sh", "-c", killer]}]}),
    );
    let innocent: Vec<String> = (1..=3).map(|n| format!("innocent{n}")).collect();
    for id in &innocent {
        submit_task(
            &url,
            &json!({"id": id, "phases": [{"name": "p", "run": ["sleep", "2"]}]}),
        );
    }
    let crash_limit = 5; // as `submit_task` sets it
    let mut host = Host::new("victim");
    let all: Vec<&str> = std::iter::once("killer")
        .chain(innocent.iter().map(String::as_str))
        .collect();
    let deaths = restart_until_recorded(
        &mut host,
        &url,
        &all,
        &["--max-tasks", "4"],
        crash_limit + 2,
    );
    let record = final_record(&url, "killer").unwrap();
    assert_eq!(record["status"], "failed", "{record}");
    assert!(
        record["error"].as_str().unwrap().contains("quarantined"),
        "{record}"
    );
    for id in &innocent {
        let record = final_record(&url, id).unwrap();
        assert_eq!(record["status"], "done", "{id} is innocent: {record}");
    }
    // The first death had all four in flight: no one was counted. Then the killer died alone
    // on each of its trials until its crash limit.
    assert_eq!(deaths, crash_limit + 1, "deaths before the quarantine");
    host.daemon().signal(SIGTERM);
    host.daemon().wait_exit(DEADLINE);
}

/// Start the host's daemon again each time it dies (a task of `ids` kills it), until every
/// task of `ids` has its final record; returns how many times it died (at most `max_deaths`).
fn restart_until_recorded(
    host: &mut Host,
    url: &str,
    ids: &[&str],
    args: &[&str],
    max_deaths: usize,
) -> usize {
    let all_recorded = || ids.iter().all(|id| final_record(url, id).is_some());
    let mut deaths = 0;
    while !all_recorded() {
        assert!(
            deaths <= max_deaths,
            "not every task of {ids:?} was recorded after {deaths} deaths"
        );
        host.start(url, args);
        let daemon = host.daemon();
        crate::common::wait_for(
            "the daemon dies or every task is recorded",
            DEADLINE,
            || {
                if daemon.try_status().is_some() {
                    Some(true)
                } else {
                    all_recorded().then_some(false)
                }
            },
        );
        if host.daemon().try_status().is_some() {
            deaths += 1;
        }
    }
    deaths
}
