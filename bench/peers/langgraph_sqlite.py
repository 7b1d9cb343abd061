#!/usr/bin/env python3
"""The checkpoint workload (bench/workload.md) through LangGraph's SQLite checkpoint saver.

Runs one variant and prints one JSON line in the workload's format, so that
`bench/checkpoint_matrix.py --flavours ...,langgraph` can put it in the same rounds as cairn.
The saver is used as LangGraph ships it: `SqliteSaver` on one connection, which switches the
database to WAL; SQLite's own `synchronous` setting is kept and reported (`shipped` when it is
FULL, which syncs the WAL on every commit). The timed call is `SqliteSaver.put`, with the
task's whole state as the checkpoint's one channel value; building the checkpoint dict around
the state is not timed. Concurrent variants use `AsyncSqliteSaver` with one asyncio task per
workload task, as LangGraph's async graphs do.

    pip install langgraph-checkpoint-sqlite
    python3 bench/peers/langgraph_sqlite.py --size 1k --conc 1 --dir bench/.data
"""
import argparse
import asyncio
import hashlib
import json
import math
import os
import shutil
import sqlite3
import sys
import tempfile
import time

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

MASK = (1 << 64) - 1
VOCAB = """the model agent task result step tool call output input context token prompt response
query answer data value function returns list string number error retry loop state checkpoint
resume progress phase final partial summary analysis report document source search index vector
embedding score rank filter batch queue worker process thread async await update write read file
path json object field key because therefore however additionally first second next then finally
we it this that which should could would will can may must is are was were be been has have not
and or with for from into over under about between within without across message memory plan
goal user system cache graph node edge run job limit size time count item record event log trace
span metric schema""".split()
WINDOW = {"1k": 3, "64k": 174, "1m": 2790}
# (size, conc) -> iterations per task, as the workload's variants table gives them.
ITERATIONS = {("1k", 1): 2000, ("64k", 1): 500, ("1m", 1): 100, ("1k", 100): 50, ("64k", 100): 10}
# A few of the workload's reference digests: the generator must make the very same bytes.
REFERENCE = [
    ("1k", 0, 0, "4db96e48a2c35ff512141a28ec523dec7caefa570310abb78e333ee8918c1218"),
    ("1k", 7, 13, "cda2d3c1303c3ccb08266aae05105a6c23859bd8dbb0d9fb48fc34dc07893588"),
    ("64k", 99, 9, "d0909d4777d87449cbe8cc0c3911eb1b9f2f684e1f3fc2f967f458502a7eae4d"),
]


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return x, z ^ (z >> 31)


def entry(task, k):
    s, r = splitmix64((task << 32) | k)
    count = 24 + r % 49
    words = []
    for _ in range(count):
        s, x = splitmix64(s)
        words.append(VOCAB[x % 128])
    s, r2 = splitmix64(s)
    return {"step": k, "role": "assistant", "text": " ".join(words) + ".",
            "score": (r2 % 10000) / 10000, "tokens": count * 4 // 3,
            "latency_ms": (r2 >> 16) % 5000}


def state(size, task, iteration):
    window = WINDOW[size]
    return {"task_id": f"task-{task:04d}", "iteration": iteration, "phase": "running",
            "results": [entry(task, k) for k in range(iteration, iteration + window)]}


def canonical(value):
    return json.dumps(value, separators=(",", ":"))


def check_generator():
    for size, task, iteration, digest in REFERENCE:
        got = hashlib.sha256(canonical(state(size, task, iteration)).encode()).hexdigest()
        if got != digest:
            sys.exit(f"generator mismatch at {size} task {task} iteration {iteration}: {got}")


def checkpoint_of(value):
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6())
    checkpoint["channel_values"] = {"state": value}
    checkpoint["channel_versions"] = {"state": value["iteration"] + 1}
    return checkpoint


def config_of(task_id, parent):
    configurable = {"thread_id": task_id, "checkpoint_ns": ""}
    if parent:
        configurable["checkpoint_id"] = parent
    return {"configurable": configurable}


def nearest_rank(sorted_values, q):
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def run_sequential(path, size, iterations):
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
    latencies, json_bytes, parent = [], 0, None
    for i in range(iterations):
        value = state(size, 0, i)
        json_bytes += len(canonical(value))
        checkpoint = checkpoint_of(value)
        config = config_of(value["task_id"], parent)
        start = time.perf_counter()
        saver.put(config, checkpoint, {"step": i}, {"state": i + 1})
        latencies.append(time.perf_counter() - start)
        parent = checkpoint["id"]
    conn.close()
    return synchronous, latencies, json_bytes, sum(latencies)


async def run_concurrent(path, size, tasks, iterations):
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    latencies, json_bytes = [], [0]
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        async with saver.conn.execute("PRAGMA synchronous") as cur:
            synchronous = (await cur.fetchone())[0]

        async def one_task(task):
            parent = None
            for i in range(iterations):
                value = state(size, task, i)
                json_bytes[0] += len(canonical(value))
                checkpoint = checkpoint_of(value)
                config = config_of(value["task_id"], parent)
                start = time.perf_counter()
                await saver.aput(config, checkpoint, {"step": i}, {"state": i + 1})
                latencies.append(time.perf_counter() - start)
                parent = checkpoint["id"]

        start = time.perf_counter()
        await asyncio.gather(*(one_task(t) for t in range(tasks)))
        wall = time.perf_counter() - start
    return synchronous, latencies, json_bytes[0], wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(WINDOW), default="1k")
    ap.add_argument("--conc", type=int, default=1)
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", ".data"))
    args = ap.parse_args()
    iterations = ITERATIONS.get((args.size, args.conc))
    if iterations is None:
        sys.exit(f"no such variant in bench/workload.md: {args.size} x {args.conc}")
    check_generator()
    os.makedirs(args.dir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="langgraph-", dir=args.dir)
    path = os.path.join(work, "checkpoints.sqlite")
    try:
        if args.conc == 1:
            synchronous, latencies, json_bytes, total = run_sequential(path, args.size, iterations)
        else:
            synchronous, latencies, json_bytes, total = asyncio.run(
                run_concurrent(path, args.size, args.conc, iterations))
        conn = sqlite3.connect(path)
        stored = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints"
        ).fetchone()[0]
        conn.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(latencies)
    ordered = sorted(latencies)
    mode = "shipped" if synchronous == 2 else f"synchronous={synchronous}"
    print(json.dumps({
        "impl": "langgraph-sqlite", "mode": mode, "size": args.size, "conc": args.conc,
        "n": n, "json_bytes": round(json_bytes / n), "stored_bytes": round(stored / n),
        "p50_ms": round(nearest_rank(ordered, 0.5) * 1000, 3),
        "p99_ms": round(nearest_rank(ordered, 0.99) * 1000, 3),
        "ops_s": round(n / total, 1),
    }))


if __name__ == "__main__":
    main()
