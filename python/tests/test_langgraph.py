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
