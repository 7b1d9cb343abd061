//! A shared queue lives through faults of its database: several real `cairn run --db`
//! daemons with loop tasks on a throwaway PostgreSQL that is restarted under them (`pg_ctl
//! restart -m fast` and `-m immediate`), or stopped for a short outage in the middle of a
//! loop. Every task finishes without a daemon restart, no attempt is used up (each task may
//! fail once at most, and none does), no daemon panics, no task is left `running`, and a
//! checkpoint save that fails during the outage is tried again within the lease (the iteration
//! it holds is not run again). Daemons behind a delaying proxy (a slow link) with a short lease
//! make progress instead of claiming their tasks over and over.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::delay_proxy::DelayProxy;
use crate::common::postgres::{final_record, query_texts, submit_task, PgCluster, SUPERUSER};
use crate::common::{
    loop_result, loop_task, side_events, wait_until, Daemon, SideEvent, TestQueue, DEADLINE,
    SIGTERM,
};

/// One daemon's host: its local directory and its daemon.
struct Host {
    /// Kept for the daemon's life: its directory goes with it.
    _queue: TestQueue,
    daemon: Daemon,
}

impl Host {
    fn start(url: &str, node: &str, lease: &str, max_tasks: &str) -> Host {
        let queue = TestQueue::new();
        let daemon = queue.start(&[
            "--db",
            url,
            "--node",
            node,
            "--lease",
            lease,
            "--max-tasks",
            max_tasks,
        ]);
        Host {
            _queue: queue,
            daemon,
        }
    }
}

/// A loop task of `iterations` that may fail once at most: an attempt used up by the
/// database's outage fails it for good.
fn one_attempt_loop(id: &str, side: &std::path::Path, iterations: u64, sleep: f64) -> Value {
    let mut task = loop_task(id, side, iterations, sleep);
    task["retry"] = json!({"max_attempts": 1});
    task
}

/// Wait until every task of `ids` has a final record; returns them.
fn wait_records(url: &str, ids: &[String]) -> BTreeMap<String, Value> {
    let mut records = BTreeMap::new();
    wait_until("every task has its record", DEADLINE * 2, || {
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

/// Wait until the side file shows an iteration of at least `iteration` ended.
fn wait_iteration(side: &std::path::Path, iteration: u64) {
    wait_until("the loops are under way", DEADLINE, || {
        side_events(side)
            .iter()
            .any(|e| e.event == "end" && e.iteration >= iteration)
    });
}

/// What every fault test checks once the tasks are done: each record is `done` with the
/// uninterrupted result and no failed attempt, nothing is left running, every daemon still
/// runs, and none panicked.
fn check_outcome(
    url: &str,
    ids: &[String],
    iterations: u64,
    records: &BTreeMap<String, Value>,
    hosts: &mut [Host],
) {
    for id in ids {
        let record = &records[id];
        assert_eq!(record["status"], "done", "{id}: {record}");
        assert_eq!(record["result"], loop_result(iterations), "{id}");
        assert_eq!(
            record["failed_attempts"], 0,
            "{id} used up an attempt: {record}"
        );
    }
    let running = query_texts(url, "SELECT id FROM cairn_tasks WHERE state <> 'done'", &[]);
    assert!(running.is_empty(), "tasks not done: {running:?}");
    for host in hosts.iter_mut() {
        assert!(
            host.daemon.is_running(),
            "a daemon exited: {}",
            host.daemon.stderr()
        );
        let log = host.daemon.stderr();
        assert!(!log.contains("panicked"), "a daemon panicked:\n{log}");
    }
}

/// Stop every daemon with SIGTERM and wait for it.
fn stop_all(hosts: &mut [Host]) {
    for host in hosts.iter_mut() {
        host.daemon.signal(SIGTERM);
    }
    for host in hosts.iter_mut() {
        host.daemon.wait_exit(DEADLINE);
    }
}

/// Restart the database with `mode` under three daemons (`--lease 3s`) running twelve loop
/// tasks of one attempt each, once the loops are under way.
fn restart_under_three_daemons(test: &str, mode: &str) {
    let Some(mut pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let iterations = 12;
    let ids: Vec<String> = (0..12).map(|i| format!("loop-{i:02}")).collect();
    for id in &ids {
        submit_task(&url, &one_attempt_loop(id, &side, iterations, 0.3));
    }
    let mut hosts: Vec<Host> = ["n1", "n2", "n3"]
        .iter()
        .map(|node| Host::start(&url, node, "3s", "4"))
        .collect();
    wait_iteration(&side, 2);
    pg.restart(mode);
    let records = wait_records(&url, &ids);
    check_outcome(&url, &ids, iterations, &records, &mut hosts);
    stop_all(&mut hosts);
}

#[test]
fn a_fast_restart_of_the_database_under_three_daemons_uses_up_no_attempt() {
    restart_under_three_daemons(
        "a_fast_restart_of_the_database_under_three_daemons_uses_up_no_attempt",
        "fast",
    );
}

#[test]
fn an_immediate_restart_of_the_database_under_three_daemons_uses_up_no_attempt() {
    restart_under_three_daemons(
        "an_immediate_restart_of_the_database_under_three_daemons_uses_up_no_attempt",
        "immediate",
    );
}

/// The iterations of `id` that started more than once.
fn started_twice(events: &[SideEvent], id: &str) -> Vec<u64> {
    let mut starts: BTreeMap<u64, usize> = BTreeMap::new();
    for event in events.iter().filter(|e| e.task == id && e.event == "start") {
        *starts.entry(event.iteration).or_default() += 1;
    }
    starts
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(iteration, _)| iteration)
        .collect()
}

/// The database goes away for about two seconds in the middle of a loop that checkpoints
/// every iteration, on a daemon whose lease (20 s) outlasts the outage: the save that fails
/// is tried again until the database is back, so no iteration runs twice, and the task ends
/// done in its one attempt.
#[test]
fn a_checkpoint_save_that_fails_in_a_short_outage_is_tried_again_within_the_lease() {
    let test = "a_checkpoint_save_that_fails_in_a_short_outage_is_tried_again_within_the_lease";
    let Some(mut pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let iterations = 20;
    let ids = vec!["through-outage".to_string()];
    submit_task(&url, &one_attempt_loop(&ids[0], &side, iterations, 0.2));
    let mut hosts = vec![Host::start(&url, "n1", "20s", "1")];
    wait_iteration(&side, 3);
    pg.stop("fast");
    std::thread::sleep(Duration::from_secs(2));
    pg.resume();
    let records = wait_records(&url, &ids);
    check_outcome(&url, &ids, iterations, &records, &mut hosts);
    let log = hosts[0].daemon.stderr();
    assert!(
        log.contains("trying it again while the lease holds"),
        "no write failed during the outage, so the test proved nothing:\n{log}"
    );
    let again = started_twice(&side_events(&side), &ids[0]);
    assert!(
        again.is_empty(),
        "iterations {again:?} ran twice: a save failed during the outage was not retried\n{log}"
    );
    stop_all(&mut hosts);
}

/// Two daemons reach the database through a link that delays every packet by 300 ms each way
/// (a 600 ms round trip, a fifth of their 3 s lease): the tasks make progress and finish in
/// their one attempt, each claimed only a few times, not over and over (a daemon that fenced
/// itself before its commands started raised the epochs and ran nothing, and no task ever
/// finished). On a loaded machine a claim whose answer comes back after the daemon gave up on
/// it raises the epoch once more without running anything, so a few claims are allowed.
#[test]
fn a_slow_link_with_a_short_lease_makes_progress_without_claiming_over_and_over() {
    let test = "a_slow_link_with_a_short_lease_makes_progress_without_claiming_over_and_over";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let proxy = DelayProxy::start(pg.dir(), Duration::from_millis(300));
    let slow_url = proxy.url(SUPERUSER);
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let iterations = 5;
    let ids: Vec<String> = (0..4).map(|i| format!("slow-{i}")).collect();
    for id in &ids {
        submit_task(&url, &one_attempt_loop(id, &side, iterations, 0.2));
    }
    let mut hosts: Vec<Host> = ["n1", "n2"]
        .iter()
        .map(|node| Host::start(&slow_url, node, "3s", "2"))
        .collect();
    let records = wait_records(&url, &ids);
    check_outcome(&url, &ids, iterations, &records, &mut hosts);
    for row in query_texts(&url, "SELECT id, lease_epoch::text FROM cairn_tasks", &[]) {
        let epoch: u64 = row[1].as_deref().unwrap().parse().unwrap();
        eprintln!("{}: claimed {epoch} time(s)", row[0].as_deref().unwrap());
        assert!(
            epoch <= 5,
            "{:?} was claimed {epoch} times over a slow link: its daemons kept losing it",
            row[0]
        );
    }
    stop_all(&mut hosts);
}

/// `cairn status --db` judges a daemon gone by its own lease, not by a constant: a daemon
/// with a 3 s lease SIGKILLed while it runs a task is shown gone once it was not seen for its
/// lease (by the database's clock), and its task's expired lease is shown awaiting takeover.
#[test]
fn status_judges_a_killed_daemon_gone_by_its_lease_and_its_task_awaiting_takeover() {
    let test = "status_judges_a_killed_daemon_gone_by_its_lease_and_its_task_awaiting_takeover";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    submit_task(&url, &loop_task("long", &side, 100, 1.0));
    let mut host = Host::start(&url, "n1", "3s", "1");
    wait_until("the task runs", DEADLINE, || {
        side_events(&side).iter().any(|e| e.event == "start")
    });
    host.daemon.kill_hard();
    // By the database's clock: the daemon's last renewal is older than its lease.
    wait_until("the killed daemon is past its lease", DEADLINE, || {
        query_texts(
            &url,
            "SELECT name FROM cairn_nodes
             WHERE name = 'n1' AND last_seen_at < now() - interval '3.5 seconds'",
            &[],
        )
        .len()
            == 1
    });
    let json = scratch.cairn_output(&["status", "--db", &url, "--json"], b"");
    assert!(json.status.success(), "{json:?}");
    let document: Value = serde_json::from_slice(&json.stdout).unwrap();
    let nodes = document["nodes"].to_string();
    let n1 = document["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["name"] == "n1"))
        .unwrap_or_else(|| panic!("no node n1 in {nodes}"));
    assert_eq!(
        n1["alive"], false,
        "a daemon dead for its lease is shown alive: {nodes}"
    );
    let human = scratch.cairn_output(&["status", "--db", &url], b"");
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("awaiting takeover"),
        "the expired lease is not shown awaiting takeover:\n{text}"
    );
}

/// A daemon cut off from the database silently (its link passes nothing and closes nothing)
/// for well past its 3 s lease, while it runs loop tasks of 6 s iterations: it stops their
/// commands before another daemon can take them over (no iteration of it starts or ends once
/// another node started the task under a newer epoch: the iteration in flight was stopped, not
/// left to run beside its successor), the other daemon finishes them, and once the link heals
/// the cut-off daemon goes on, without a panic or an attempt used up.
#[test]
fn a_daemon_cut_off_silently_stops_its_commands_before_its_tasks_move() {
    let test = "a_daemon_cut_off_silently_stops_its_commands_before_its_tasks_move";
    let Some(pg) = PgCluster::start(test) else {
        return;
    };
    let url = pg.url();
    let proxy = DelayProxy::start(pg.dir(), Duration::ZERO);
    let scratch = TestQueue::new();
    let side = scratch.aux("iterations.side");
    let iterations = 3;
    let ids: Vec<String> = (0..4).map(|i| format!("cut-{i}")).collect();
    for id in &ids {
        submit_task(&url, &one_attempt_loop(id, &side, iterations, 6.0));
    }
    let mut hosts = vec![Host::start(&proxy.url(SUPERUSER), "n1", "3s", "4")];
    wait_until("n1 runs its tasks", DEADLINE, || {
        side_events(&side)
            .iter()
            .filter(|e| e.event == "start")
            .count()
            >= 4
    });
    hosts.push(Host::start(&url, "n2", "3s", "4"));
    proxy.cut(true);
    wait_until("n2 took a task over", DEADLINE, || {
        side_events(&side)
            .iter()
            .any(|e| e.lease.as_ref().is_some_and(|l| l.node == "n2"))
    });
    // Cut for longer than the iterations in flight on n1 take: unless n1 stopped them, they
    // end (and log it) while the task already runs on n2.
    std::thread::sleep(Duration::from_secs(8));
    proxy.cut(false);
    let records = wait_records(&url, &ids);
    check_outcome(&url, &ids, iterations, &records, &mut hosts);
    let events = side_events(&side);
    for id in &ids {
        let of_task: Vec<&SideEvent> = events.iter().filter(|e| &e.task == id).collect();
        let Some(taken_at) = of_task
            .iter()
            .filter_map(|e| e.lease.as_ref())
            .filter(|l| l.node == "n2")
            .map(|l| l.at)
            .reduce(f64::min)
        else {
            continue;
        };
        let late: Vec<_> = of_task
            .iter()
            .filter(|e| {
                e.lease
                    .as_ref()
                    .is_some_and(|l| l.node == "n1" && l.at >= taken_at)
            })
            .collect();
        assert!(
            late.is_empty(),
            "{id}: the cut-off n1 ran the task after n2 took it over: {late:?}"
        );
    }
    stop_all(&mut hosts);
}
