"""A Python loop on the package alone, SIGKILLed at random moments and restarted: every run
resumes after the last acknowledged iteration, and the result is an uninterrupted run's."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

ITERATIONS = 300
KILLS = 20

LOOP = """
import json, sys, time
import cairn

store = cairn.CheckpointStore(sys.argv[1])
side = open(sys.argv[2], "a", buffering=1)
side.write("run\\n")
loop = cairn.LoopCheckpointer(store, "killed")
for i, state in loop.range(int(sys.argv[3]), state={"total": 0, "squares": []}):
    side.write(f"start {i}\\n")
    time.sleep(0.01)
    state["total"] += i * i
    state["squares"].append(i * i)
    loop.checkpoint(i + 1, state)
    side.write(f"acked {i}\\n")
print(json.dumps(loop.resume().state))
"""


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

    # Each run starts at the iteration after the last one acknowledged before it, so that
    # at most the iteration in flight when a kill came runs again.
    runs = [[]]
    for line in side.read_text().splitlines()[1:]:
        if line == "run":
            runs.append([])
        else:
            runs[-1].append(line)
    acked = -1
    for events in runs:
        starts = [int(e.split()[1]) for e in events if e.startswith("start")]
        if starts:
            first = starts[0]
            assert acked + 1 <= first <= acked + 2, (acked, first, events)
        acked = max([acked] + [int(e.split()[1]) for e in events if e.startswith("acked")])
    started = sum(line.startswith("start") for line in side.read_text().splitlines())
    assert ITERATIONS <= started <= ITERATIONS + kills

    shown = subprocess.run(
        ["cairn", "--queue", str(queue), "checkpoint", "killed"],
        capture_output=True, text=True, timeout=600,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["iteration_count"] == ITERATIONS
