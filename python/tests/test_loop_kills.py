"""A Python loop on the package alone, SIGKILLed at random moments and restarted: every run
resumes after the last acknowledged iteration, and the result is an uninterrupted run's. The
same script, unchanged, as a daemon's `worker` phase."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

from conftest import cairn_command, run_cairn

ITERATIONS = 300
KILLS = 20

LOOP = """
import json, sys, time
import cairn

store = cairn.CheckpointStore(sys.argv[1])
side = open(sys.argv[2], "a", buffering=1)
side.write("run\\n")
iterations = int(sys.argv[3])
loop = cairn.LoopCheckpointer(store, "killed")
state = {"total": 0, "squares": []}
for i, state in loop.range(iterations, state=state):
    side.write(f"start {i}\\n")
    time.sleep(0.01)
    state["total"] += i * i
    state["squares"].append(i * i)
    loop.checkpoint(i + 1, state)
    side.write(f"acked {i}\\n")
final = loop.resume()
if final is not None and final.iteration == iterations:
    state = final.state
loop.finish(iterations, state)
print(json.dumps(state))
"""


def side_runs(side: Path) -> List[List[str]]:
    """The side log's events, one list per run of the script."""
    runs: List[List[str]] = []
    for line in side.read_text().splitlines():
        if line == "run":
            runs.append([])
        else:
            runs[-1].append(line)
    return runs


def check_resumed_after_last_ack(runs: List[List[str]]) -> None:
    """Each run starts at the iteration after the last one known committed before it (acked,
    or resumed from by a run): at most the iteration in flight when a kill came runs again."""
    committed = 0
    for events in runs:
        starts = [int(e.split()[1]) for e in events if e.startswith("start")]
        if starts:
            first = starts[0]
            # Resumed from `first`: the kill came before or after the one in flight committed.
            assert committed <= first <= committed + 1, (committed, first, events)
            committed = first
        acked = [int(e.split()[1]) + 1 for e in events if e.startswith("acked")]
        committed = max([committed] + acked)


def test_a_loop_killed_twenty_times_resumes_after_its_last_acknowledged_iteration(
    queue: Path, tmp_path: Path
) -> None:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    side = tmp_path / "side.log"
    rng = random.Random(int(os.environ.get("CAIRN_TEST_SEED", "7")))
    command = [sys.executable, str(script), str(queue), str(side), str(ITERATIONS)]

    kills = 0
    while True:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        if kills < KILLS:
            time.sleep(rng.uniform(0.05, 0.3))
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()
                kills += 1
                continue
        out, _ = process.communicate(timeout=600)
        assert process.returncode == 0
        break

    assert kills == KILLS, f"the loop finished after {kills} kills"
    final = json.loads(out)
    assert final["total"] == sum(i * i for i in range(ITERATIONS))
    assert final["squares"] == [i * i for i in range(ITERATIONS)]
    check_resumed_after_last_ack(side_runs(side))
    started = sum(line.startswith("start") for line in side.read_text().splitlines())
    assert ITERATIONS <= started <= ITERATIONS + kills

    shown = run_cairn(["--queue", str(queue), "checkpoint", "killed"])
    assert shown.returncode == 0, shown.stderr
    decoded = json.loads(shown.stdout)
    assert decoded["iteration_count"] == ITERATIONS and decoded["done"] is True


def test_the_same_script_as_a_worker_phase_resumes_after_the_daemon_is_killed(
    queue: Path, tmp_path: Path
) -> None:
    """Unchanged, the script runs as a daemon's `worker` phase: its checkpoints go through the
    daemon, and after SIGKILLs of the daemon (which take the worker with it) it resumes with
    at most the iteration in flight repeated."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    side = tmp_path / "side.log"
    iterations = 120
    task = {
        "id": "worker-loop",
        "phases": [{
            "name": "work",
            "kind": "worker",
            "run": [sys.executable, str(script), str(tmp_path / "standalone"), str(side),
                    str(iterations)],
        }],
    }
    task_file = tmp_path / "worker-loop.json"
    task_file.write_text(json.dumps(task))
    submitted = run_cairn(["--queue", str(queue), "submit", str(task_file)])
    assert submitted.returncode == 0, submitted.stderr

    def acked() -> int:
        if not side.exists():
            return 0
        return sum(line.startswith("acked") for line in side.read_text().splitlines())

    for _ in range(3):
        daemon = subprocess.Popen([cairn_command(), "--queue", str(queue), "run"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            target = acked() + 5
            deadline = time.monotonic() + 300
            while acked() < target and time.monotonic() < deadline and daemon.poll() is None:
                time.sleep(0.02)
            assert acked() >= target, "the worker made no progress"
        finally:
            # Killed by pid whatever happened, so a failing run leaves no daemon behind.
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.wait()
    finished = run_cairn(["--queue", str(queue), "run", "--exit-when-idle"])
    assert finished.returncode == 0, finished.stderr

    record = json.loads((queue / "done" / "worker-loop.json").read_text())
    assert record["result"]["total"] == sum(i * i for i in range(iterations)), record
    assert record["result"]["squares"] == [i * i for i in range(iterations)]
    check_resumed_after_last_ack(side_runs(side))
    # Checkpoints went to the daemon, not to the script's own directory.
    assert not (tmp_path / "standalone" / "incremental" / "killed.json.gz").exists()


EXACT_WORKER = """
import sys
from decimal import Decimal
import cairn

loop = cairn.LoopCheckpointer(None, "exact")
resumed = loop.resume()
with open(sys.argv[1], "a") as side:
    side.write(repr(None if resumed is None else resumed.state) + "\\n")
if resumed is None:
    state = {"big": 2**100 + 7, "decimal": Decimal("3.1415926535897932384626433832795028841971")}
    loop.checkpoint(1, state)
    sys.exit(75)  # resume me: the daemon starts the script again from that checkpoint
loop.finish(2, resumed.state)
"""


def test_numbers_travel_exactly_through_a_worker_phase(queue: Path, tmp_path: Path) -> None:
    """A worker phase's state with a 101-bit integer and a 40-digit Decimal: the checkpoint the
    daemon commits, the state it resumes the script with and the phase's output keep every
    digit."""
    script = tmp_path / "exact.py"
    script.write_text(EXACT_WORKER)
    side = tmp_path / "side.log"
    task = {
        "id": "exact-worker",
        "phases": [{"name": "work", "kind": "worker",
                    "run": [sys.executable, str(script), str(side)]}],
    }
    task_file = tmp_path / "exact.json"
    task_file.write_text(json.dumps(task))
    assert run_cairn(["--queue", str(queue), "submit", str(task_file)]).returncode == 0
    finished = run_cairn(["--queue", str(queue), "run", "--exit-when-idle"])
    assert finished.returncode == 0, finished.stderr
    runs = side.read_text().splitlines()
    assert runs == [
        "None",
        "{'big': 1267650600228229401496703205383, "
        "'decimal': Decimal('3.1415926535897932384626433832795028841971')}",
    ], runs
    record = (queue / "done" / "exact-worker.json").read_text()
    assert "3.1415926535897932384626433832795028841971" in record
    assert "1267650600228229401496703205383" in record
