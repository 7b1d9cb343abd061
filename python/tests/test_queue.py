"""`cairn.Queue`: submit, wait, steer and fork through the same client as the `cairn` commands,
against a real daemon on a queue directory and on a throwaway PostgreSQL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

import cairn
from conftest import cairn_command, run_cairn

PYTHON = sys.executable


def loop_task(id: str, iterations: int, sleep: float) -> dict:
    """A loop whose each iteration adds one to `n`, sleeping `sleep` seconds first."""
    step = (
        "import json, sys, time\n"
        "r = json.load(sys.stdin)\n"
        f"time.sleep({sleep})\n"
        "print(json.dumps({'state': {'n': r['state']['n'] + 1}}))"
    )
    return {
        "id": id,
        "phases": [
            {
                "name": "count",
                "kind": "loop",
                "run": [PYTHON, "-c", step],
                "initial_state": {"n": 0},
                "max_iterations": iterations,
            }
        ],
    }


def failing_task(id: str) -> dict:
    return {"id": id, "retry": {"max_attempts": 1}, "phases": [{"name": "x", "run": ["false"]}]}


@contextmanager
def daemon(queue: Path, run_args: List[str]) -> Iterator[subprocess.Popen]:
    """`cairn --queue QUEUE run RUN_ARGS`, ended by pid at the end whatever happened."""
    process = subprocess.Popen([cairn_command(), "--queue", str(queue), "run", *run_args])
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()


def wait_state(q: cairn.Queue, id: str, state: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            entry = q.status(id)
        except cairn.QueueError:
            entry = {}
        if entry.get("state") == state:
            return entry
        assert time.monotonic() < deadline, f"{id} never became {state}: {entry}"
        time.sleep(0.1)


def steer_and_wait(q: cairn.Queue) -> None:
    """What both backends must do alike, with a daemon running on `q`."""
    # Submit and wait: the record, with the loop's result.
    quick = q.submit(loop_task("quick", 3, 0))
    assert quick == "quick"
    record = q.wait(quick, timeout=120)
    assert record["status"] == "done" and record["result"] == {"n": 3}

    # A failed task raises the typed error naming it; retry brings it back (and it fails again).
    failing = q.submit(failing_task("broken"))
    with pytest.raises(cairn.TaskFailed) as failed:
        q.wait(failing, timeout=120)
    assert failed.value.task_id == "broken" and failed.value.status == "failed"
    assert "broken" in str(failed.value)
    assert q.retry(failing).startswith("retry: ")

    # Pause, resume, cancel a running loop.
    slow = q.submit(loop_task("slow", 400, 0.2))
    wait_state(q, slow, "running")
    assert "took the request" in q.pause(slow)
    wait_state(q, slow, "paused")
    with pytest.raises(TimeoutError):
        q.wait(slow, timeout=0.5)
    assert "took the request" in q.resume(slow)
    wait_state(q, slow, "running")
    q.cancel(slow)
    with pytest.raises(cairn.TaskCancelled):
        q.wait(slow, timeout=120)

    # A request the daemon refuses raises with its reason.
    with pytest.raises(cairn.QueueError, match="not paused"):
        q.resume(quick)
    # Bad input is refused before anything is written.
    with pytest.raises(cairn.InvalidTask, match="phases"):
        q.submit({"id": "empty", "phases": []})
    with pytest.raises(cairn.InvalidTask, match="already exists"):
        q.submit(loop_task("quick", 1, 0))
    with pytest.raises(cairn.UsageError):
        q.pause("not an id!")

    # Fork the finished loop from its latest checkpoint with a patched state.
    forked = q.fork(quick, patch={"n": 100}, as_id="quick-fork")
    assert forked == "quick-fork"
    assert q.wait(forked, timeout=120)["result"]["n"] >= 100
    shown = q.show(quick)
    assert shown["id"] == "quick"


def test_queue_on_a_directory(queue: Path) -> None:
    q = cairn.Queue(queue)
    with daemon(queue, []):
        steer_and_wait(q)
    # What Python submitted is what the command reads.
    shown = run_cairn(["--queue", str(queue), "status", "--json"])
    assert shown.returncode == 0, shown.stderr
    assert '"quick-fork"' in shown.stdout


def test_submit_refuses_a_missing_queue_unless_told_to_create_it(tmp_path: Path) -> None:
    q = cairn.Queue(tmp_path / "new-queue")
    with pytest.raises(cairn.QueueError, match="there is no queue"):
        q.submit(loop_task("x", 1, 0))
    assert q.submit(loop_task("x", 1, 0), create=True) == "x"
    assert (tmp_path / "new-queue" / "inbox" / "x.json").exists()


def postgres_bin() -> Optional[Path]:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True):
        return candidate.parent
    return None


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A PostgreSQL of its own in a temporary directory (as the `postgres` user when root),
    stopped and removed at the end; its URL."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail("PostgreSQL's initdb is missing (CI=true)")
        print("*** SKIPPED: PostgreSQL's initdb is missing ***", file=sys.stderr)
        pytest.skip("PostgreSQL's initdb is missing")
    base = Path(tempfile.mkdtemp(prefix="cairn-pg-"))
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir()
    as_postgres: List[str] = []
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
        shutil.chown(sockets, "postgres")
        as_postgres = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]
    port = 20000 + os.getpid() % 20000
    subprocess.run([*as_postgres, str(bin_dir / "initdb"), "-D", str(data), "-U", "cairn",
                    "--auth=trust"], check=True, capture_output=True)
    subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-l",
                    str(base / "log"), "-o", f"-p {port} -k {sockets} -c listen_addresses=''",
                    "start"], check=True, capture_output=True)
    try:
        yield f"postgresql://cairn@/postgres?host={sockets}&port={port}"
    finally:
        subprocess.run([*as_postgres, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_queue_on_a_shared_database(tmp_path: Path) -> None:
    with throwaway_postgres() as url:
        migrated = run_cairn(["db", "migrate", "--db", url])
        assert migrated.returncode == 0, migrated.stderr
        q = cairn.Queue(db=url)
        assert "postgres" in q.location
        local = tmp_path / "node"
        local.mkdir(mode=0o750)
        with daemon(local, ["--db", url]) as running:
            steer_and_wait(q)
            assert running.poll() is None


def test_a_task_paused_by_its_budget_goes_on_once_the_limit_is_raised(queue: Path) -> None:
    step = (
        "import json, sys\n"
        "r = json.load(sys.stdin)\n"
        "print(json.dumps({'state': {'n': r['state']['n'] + 1}, 'cost': 0.01}))"
    )
    task = {
        "id": "paid",
        "budget": {"max_cost": 0.03, "on_exceed": "pause"},
        "phases": [{"name": "spend", "kind": "loop", "run": [PYTHON, "-c", step],
                    "initial_state": {"n": 0}, "max_iterations": 6}],
    }
    q = cairn.Queue(queue)
    with daemon(queue, []):
        q.submit(task)
        paused = wait_state(q, "paid", "paused")
        assert paused["iteration"] <= 4, paused
        with pytest.raises(cairn.UsageError):
            q.set_budget("paid", -1)
        assert "took the request" in q.set_budget("paid", 1.0)
        q.resume("paid")
        record = q.wait("paid", timeout=120)
    assert record["result"] == {"n": 6}
    assert record["max_cost"] == 1.0
