"""cairn.langgraph.CairnSaver: LangGraph's own conformance suite, and a graph killed and resumed."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cairn


def _require(module: str):
    """Import `module`, or skip loudly (fail under CI=true, where it must be installed)."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError as error:
        if os.environ.get("CI") in ("true", "1"):
            pytest.fail(f"{module} is not installed, and CI=true: {error}")
        pytest.skip(f"*** SKIPPED: {module} is not installed ({error}) ***")


def test_the_saver_passes_langgraphs_conformance_suite_in_every_capability():
    conformance = _require("langgraph.checkpoint.conformance")
    from cairn.langgraph import CairnSaver

    @conformance.checkpointer_test(name="CairnSaver")
    async def saver():
        with tempfile.TemporaryDirectory() as path:
            yield CairnSaver(path)

    report = asyncio.run(conformance.validate(saver))
    results = report.results
    capabilities = {
        "put", "put_writes", "get_tuple", "list", "delete_thread",
        "delete_for_runs", "copy_thread", "prune",
    }
    assert set(results) == capabilities, results
    for name, result in results.items():
        assert result.detected, f"{name} not detected"
        assert result.passed and result.tests_failed == 0, f"{name}: {result.failures}"
        assert result.tests_passed > 0, name


GRAPH = textwrap.dedent(
    """
    import sys, time
    from typing import TypedDict
    from langgraph.graph import StateGraph, START, END
    from cairn.langgraph import CairnSaver

    STEPS = 30

    class State(TypedDict):
        step: int
        total: int

    def work(state):
        with open(sys.argv[2], "a") as ran:
            ran.write(f"{state['step']}\\n")
        time.sleep(0.02)
        return {"step": state["step"] + 1, "total": state["total"] + state["step"] ** 2}

    builder = StateGraph(State)
    builder.add_node("work", work)
    builder.add_edge(START, "work")
    builder.add_conditional_edges("work", lambda s: END if s["step"] >= STEPS else "work")
    graph = builder.compile(checkpointer=CairnSaver(sys.argv[1]))
    config = {"configurable": {"thread_id": "t1"}, "recursion_limit": 1000}
    resuming = bool(graph.get_state(config).next)
    result = graph.invoke(
        None if resuming else {"step": 0, "total": 0}, config, durability="sync"
    )
    print(result["total"])
    """
)


def test_a_graph_killed_at_random_resumes_at_its_last_super_step(tmp_path: Path):
    _require("langgraph.graph")
    script = tmp_path / "graph.py"
    script.write_text(GRAPH)
    store, ran = tmp_path / "store", tmp_path / "ran.log"
    rng = random.Random(7)
    kills = 0
    while True:
        child = subprocess.Popen(
            [sys.executable, str(script), str(store), str(ran)],
            stdout=subprocess.PIPE,
            text=True,
        )
        if kills < 5:
            # Kill it once it has run a few more steps (or let it end).
            before = len(ran.read_text().split()) if ran.exists() else 0
            want = before + rng.randint(2, 5)
            deadline = time.monotonic() + 300
            while child.poll() is None and time.monotonic() < deadline:
                done = len(ran.read_text().split()) if ran.exists() else 0
                if done >= want:
                    child.send_signal(signal.SIGKILL)
                    kills += 1
                    break
                time.sleep(0.005)
        out, _ = child.communicate(timeout=600)
        if child.returncode == 0:
            break
        assert child.returncode == -signal.SIGKILL, (child.returncode, out)
    assert kills >= 1
    assert int(out.strip()) == sum(i * i for i in range(30))
    steps = [int(s) for s in ran.read_text().split()]
    assert sorted(set(steps)) == list(range(30))
    # Each kill loses at most the super-step in flight.
    assert len(steps) - 30 <= kills, (kills, steps)
    # The store is cairn's: the command decodes what the saver wrote.
    entries = sorted(p.name for p in (store / "incremental").glob("lgc-*.json.gz"))
    shown = run_cairn(["--queue", str(store), "checkpoint", entries[0][: -len(".json.gz")]])
    assert shown.returncode == 0, shown.stderr
    assert "thread_id" in shown.stdout


def test_keep_bounds_the_checkpoints_of_each_thread_and_namespace(tmp_path: Path):
    _require("langgraph.checkpoint.base")
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.base.id import uuid6
    from cairn.langgraph import CairnSaver

    saver = CairnSaver(tmp_path, keep=2)
    with pytest.raises(ValueError):
        CairnSaver(tmp_path, keep=0)
    for thread in ("a", "b"):
        config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        for step in range(5):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6(clock_seq=step))
            config = saver.put(config, checkpoint, {"step": step}, {})
            saver.put_writes(config, [("ch", step)], "task")
    for thread in ("a", "b"):
        kept = list(saver.list({"configurable": {"thread_id": thread}}))
        assert [t.metadata["step"] for t in kept] == [4, 3]
        assert [t.pending_writes for t in kept] == [[("task", "ch", 4)], [("task", "ch", 3)]]
    # The entries of the checkpoints let go are gone, their writes too.
    assert len(saver.store.tasks("lgc-")) == 4
    assert len(saver.store.tasks("lgw-")) == 4


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "review_graph.py"


def _graph_task(task_id: str, rounds: int, max_cost: float) -> dict:
    return {
        "id": task_id,
        "cwd": str(EXAMPLE.parent),
        "env": {"REVIEW_ROUNDS": str(rounds), "REVIEW_STEP_SECONDS": "0.05"},
        "budget": {"max_cost": max_cost},
        "phases": [{"name": "review", "kind": "worker", "run": [sys.executable, EXAMPLE.name]}],
    }


def _submit(queue: Path, tmp_path: Path, task: dict) -> None:
    import json

    path = tmp_path / f"{task['id']}.json"
    path.write_text(json.dumps(task))
    submitted = run_cairn(["--queue", str(queue), "submit", str(path)])
    assert submitted.returncode == 0, submitted.stderr


def _rounds_run(queue: Path, task_id: str) -> list:
    log = queue / "runs" / task_id / "0-review.log"
    if not log.exists():
        return []
    return [int(line.split()[1].rstrip(":")) for line in log.read_text().splitlines()
            if line.startswith("round ")]


def test_the_example_graph_under_the_daemon_resumes_at_its_next_super_step(
    queue: Path, tmp_path: Path
):
    """The example graph as a `worker` phase: the daemon is SIGKILLed twice mid-graph (its
    worker dies with it); each restart resumes the graph at its next super-step, and the
    graph ends with every round run, at most the one in flight per kill again."""
    import json

    from conftest import cairn_command

    _require("langgraph.graph")
    _submit(queue, tmp_path, _graph_task("review", rounds=20, max_cost=1.0))
    kills = 0
    for _ in range(2):
        daemon = subprocess.Popen([cairn_command(), "--queue", str(queue), "run"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            target = len(_rounds_run(queue, "review")) + 4
            deadline = time.monotonic() + 300
            while (len(_rounds_run(queue, "review")) < target and daemon.poll() is None
                   and not (queue / "failed" / "review.json").exists()
                   and time.monotonic() < deadline):
                time.sleep(0.02)
            assert len(_rounds_run(queue, "review")) >= target, "the graph made no progress"
        finally:
            # Killed by pid whatever happened, so a failing run leaves no daemon behind.
            os.kill(daemon.pid, signal.SIGKILL)
            daemon.wait()
        kills += 1
    finished = run_cairn(["--queue", str(queue), "run", "--exit-when-idle"])
    assert finished.returncode == 0, finished.stderr
    record = json.loads((queue / "done" / "review.json").read_text())
    assert record["result"]["rounds"] == 20, record
    rounds = _rounds_run(queue, "review")
    assert sorted(set(rounds)) == list(range(20)), rounds
    assert len(rounds) - 20 <= kills, rounds
    # Each restart went on from where the last committed super-step left it.
    assert rounds[0] == 0 and all(b <= a + 1 for a, b in zip(rounds, rounds[1:])), rounds


def test_the_example_graph_stops_at_its_budget(queue: Path, tmp_path: Path):
    import json

    _require("langgraph.graph")
    _submit(queue, tmp_path, _graph_task("costly", rounds=20, max_cost=0.05))
    finished = run_cairn(["--queue", str(queue), "run", "--exit-when-idle"])
    assert finished.returncode == 0, finished.stderr
    record = json.loads((queue / "failed" / "costly.json").read_text())
    assert record["status"] == "budget_exceeded", record
    rounds = _rounds_run(queue, "costly")
    assert 5 <= len(rounds) <= 6, rounds
