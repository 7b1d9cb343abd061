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
import asyncio
import os
import shutil
import sqlite3
import tempfile
import time

from langgraph.checkpoint.sqlite import SqliteSaver

from graph_checkpoint import checkpoint_of, config_of
from workload_state import prepared, print_result, variant_args


def run_sequential(path, size, iterations):
    states = prepared(size, 1, iterations)
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    synchronous = conn.execute("PRAGMA synchronous").fetchone()[0]
    latencies, json_bytes, parent = [], 0, None
    for i in range(iterations):
        value, size_json = states[(0, i)]
        json_bytes += size_json
        checkpoint = checkpoint_of(value)
        config = config_of(value["task_id"], parent)
        start = time.perf_counter()
        saver.put(config, checkpoint, {"step": i}, {"state": i + 1})
        latencies.append(time.perf_counter() - start)
        parent = checkpoint["id"]
    conn.close()
    return synchronous, latencies, json_bytes, sum(latencies)


async def run_concurrent(path, size, tasks, iterations):
    states = prepared(size, tasks, iterations)
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    latencies, json_bytes = [], [0]
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        async with saver.conn.execute("PRAGMA synchronous") as cur:
            synchronous = (await cur.fetchone())[0]

        async def one_task(task):
            parent = None
            for i in range(iterations):
                value, size_json = states[(task, i)]
                json_bytes[0] += size_json
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
    args, iterations = variant_args(__doc__.splitlines()[0])
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
    mode = "shipped" if synchronous == 2 else f"synchronous={synchronous}"
    print_result("langgraph-sqlite", mode, args, latencies, json_bytes,
                 stored / len(latencies), total)


if __name__ == "__main__":
    main()
