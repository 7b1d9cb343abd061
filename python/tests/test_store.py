"""The store from Python: what it writes is the daemon's format, read back exactly."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

import cairn
from conftest import run_cairn

BIG = 2**100 + 7
LONG_DECIMAL = Decimal("3.1415926535897932384626433832795028841971")


def test_state_round_trips_exactly_through_python_and_the_command(queue: Path) -> None:
    store = cairn.CheckpointStore(queue)
    state = {
        "big": BIG,
        "negative": -(2**70),
        "decimal": LONG_DECIMAL,
        "float": 0.1,
        "nested": [1, "two", None, True, {"x": 2.5}],
    }
    generation = store.save("exact", state, 3)
    assert generation == 1

    latest = store.latest("exact")
    assert latest is not None
    assert latest.iteration == 3 and latest.generation == 1 and not latest.done
    assert latest.state == state
    assert type(latest.state["decimal"]) is Decimal
    assert type(latest.state["float"]) is float

    # The installed command decodes the same file, every digit kept.
    shown = run_cairn(["--queue", str(queue), "checkpoint", "exact"])
    assert shown.returncode == 0, shown.stderr
    assert f'"big": {BIG}' in shown.stdout
    assert f'"decimal": {LONG_DECIMAL}' in shown.stdout
    assert json.loads(shown.stdout)["iteration_count"] == 3


def test_generations_are_kept_listed_read_and_deleted(queue: Path) -> None:
    store = cairn.CheckpointStore(queue)
    for n in range(1, 7):
        assert store.save("gens", {"n": n}, n) == n
    history = store.history("gens")
    # The latest and the three before it.
    assert [g.generation for g in history] == [6, 5, 4, 3]
    assert all(g.error is None for g in history)
    assert store.generation("gens", 4).state == {"n": 4}
    with pytest.raises(cairn.CheckpointError):
        store.generation("gens", 1)

    listed = run_cairn(["--queue", str(queue), "history", "gens"])
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()[1:]] == ["6", "5", "4", "3"]

    store.delete("gens")
    assert store.latest("gens") is None
    assert store.history("gens") == []


def test_what_cannot_be_json_is_refused_and_nothing_is_written(queue: Path) -> None:
    store = cairn.CheckpointStore(queue)
    with pytest.raises(TypeError, match="set"):
        store.save("bad", {"s": {1, 2}}, 1)
    with pytest.raises(TypeError, match="keys must be strings"):
        store.save("bad", {1: "x"}, 1)
    with pytest.raises(ValueError, match="NaN or infinity"):
        store.save("bad", float("nan"), 1)
    with pytest.raises(cairn.CheckpointError, match="task"):
        store.save("../escape", {}, 1)
    assert store.latest("bad") is None


def test_a_checkpoint_the_daemon_wrote_is_read_from_python(queue: Path) -> None:
    script = (
        "import json, sys; m = json.load(sys.stdin); "
        "print(json.dumps({'state': {'i': m['iteration'], 'big': 2**90}}))"
    )
    task = {
        "id": "daemon-loop",
        "phases": [
            {"name": "count", "kind": "loop", "run": ["python3", "-c", script],
             "max_iterations": 4}
        ],
    }
    task_file = queue.parent / "daemon-loop.json"
    task_file.write_text(json.dumps(task))
    submitted = run_cairn(["--queue", str(queue), "submit", str(task_file)])
    assert submitted.returncode == 0, submitted.stderr
    ran = run_cairn(["--queue", str(queue), "run", "--exit-when-idle"])
    assert ran.returncode == 0, ran.stderr

    latest = cairn.CheckpointStore(queue).latest("daemon-loop")
    assert latest is not None
    assert latest.done and latest.iteration == 4 and latest.phase == "count"
    assert latest.state == {"i": 3, "big": 2**90}


def test_tasks_are_listed_by_prefix_and_forks_take_a_patched_state(queue: Path) -> None:
    store = cairn.CheckpointStore(queue)
    for i in range(3):
        store.save("run-a", {"i": i, "keep": {"x": 1, "y": 2}}, i + 1, done=i == 2, output="out")
    store.save("other", {"i": 0}, 1)
    assert store.tasks() == ["other", "run-a"]
    assert store.tasks("run-") == ["run-a"]

    new = store.fork("run-a", gen=2, patch={"keep": {"y": None, "z": BIG}}, as_id="run-b")
    assert new == "run-b"
    forked = store.latest("run-b")
    assert forked.state == {"i": 1, "keep": {"x": 1, "z": BIG}}
    assert (forked.iteration, forked.done, forked.output) == (2, False, None)

    named = store.fork("run-a")
    assert named.startswith("run-a-") and named in store.tasks()
    assert store.latest(named).state["i"] == 2

    with pytest.raises(cairn.CheckpointError, match="has checkpoints already"):
        store.fork("run-a", as_id="run-b")
    with pytest.raises(cairn.CheckpointError, match="no checkpoint"):
        store.fork("missing")
    with pytest.raises(ValueError, match="as_id"):
        store.fork("run-a", as_id="bad/id")
    # The command reads the fork as any other checkpoint.
    shown = run_cairn(["--queue", str(queue), "checkpoint", "run-b"])
    assert shown.returncode == 0, shown.stderr
    assert str(BIG) in shown.stdout


def test_keep_generations_bounds_the_older_generations_kept(queue: Path) -> None:
    store = cairn.CheckpointStore(queue, keep_generations=1)
    for i in range(5):
        store.save("t", {"i": i}, i + 1)
    assert [g.generation for g in store.history("t")] == [5, 4]
