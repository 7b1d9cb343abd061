#!/usr/bin/env python3
"""The checkpoint workload (bench/workload.md) through LangGraph's PostgreSQL checkpoint saver.

Runs one variant against the PostgreSQL server `--db` names and prints one JSON line in the
workload's format, so that `bench/checkpoint_matrix.py --flavours ...,langgraph-postgres` puts
it in the same rounds as cairn and the SQLite saver (the harness starts a throwaway server for
it). Each run makes a database of its own on that server and drops it afterwards. The saver is
used as LangGraph ships it: `PostgresSaver.from_conn_string` (one connection, autocommit),
`setup()`, and the server's own durability (reported: `shipped` when `fsync` and
`synchronous_commit` are on, PostgreSQL's defaults). The timed call is `PostgresSaver.put`
with the same checkpoints `langgraph_sqlite.py` puts (the task's whole state as the one
channel value); concurrent variants use `AsyncPostgresSaver` with one asyncio task per workload
task, as LangGraph's async graphs do.

    pip install langgraph-checkpoint-postgres "psycopg[binary]"
    python3 bench/peers/langgraph_postgres.py --db postgresql:///postgres?host=/sock --size 1k
"""
import argparse
import asyncio
import os
import time
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import make_conninfo
from langgraph.checkpoint.postgres import PostgresSaver

from graph_checkpoint import checkpoint_of, config_of
from workload_state import prepared, print_result, variant_args


@contextmanager
def database_of_its_own(url):
    """A new, empty database on the server `url` names, dropped at the end; its conninfo."""
    name = f"lg_bench_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(url, dbname=name)
    finally:
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def durability(conn):
    """`shipped` when the server syncs every commit (PostgreSQL's defaults), else its settings."""
    values = {}
    for name in ("fsync", "synchronous_commit"):
        row = conn.execute(f"SHOW {name}").fetchone()
        values[name] = row[name] if isinstance(row, dict) else row[0]
    if values == {"fsync": "on", "synchronous_commit": "on"}:
        return "shipped"
    return ",".join(f"{k}={v}" for k, v in values.items())


def run_sequential(conninfo, size, iterations):
    states = prepared(size, 1, iterations)
    latencies, json_bytes, parent = [], 0, None
    with PostgresSaver.from_conn_string(conninfo) as saver:
        saver.setup()
        mode = durability(saver.conn)
        for i in range(iterations):
            value, size_json = states[(0, i)]
            json_bytes += size_json
            checkpoint = checkpoint_of(value)
            config = config_of(value["task_id"], parent)
            start = time.perf_counter()
            saver.put(config, checkpoint, {"step": i}, {"state": i + 1})
            latencies.append(time.perf_counter() - start)
            parent = checkpoint["id"]
    return mode, latencies, json_bytes, sum(latencies)


async def run_concurrent(conninfo, size, tasks, iterations):
    states = prepared(size, tasks, iterations)
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

    latencies, json_bytes = [], [0]
    async with AsyncPostgresSaver.from_conn_string(conninfo) as saver:
        await saver.setup()

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
    return latencies, json_bytes[0], wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True,
                    help="a PostgreSQL server's URL; the run makes and drops a database on it")
    args, iterations = variant_args(None, ap)
    with database_of_its_own(args.db) as conninfo:
        if args.conc == 1:
            mode, latencies, json_bytes, total = run_sequential(conninfo, args.size, iterations)
        else:
            latencies, json_bytes, total = asyncio.run(
                run_concurrent(conninfo, args.size, args.conc, iterations))
        with psycopg.connect(conninfo) as conn:
            if args.conc != 1:
                mode = durability(conn)
            # What the saver keeps per checkpoint: its row (checkpoint JSONB, metadata) and the
            # channel value's blob, as stored (after any TOAST compression).
            stored = conn.execute(
                "SELECT (SELECT COALESCE(SUM(pg_column_size(checkpoint) + pg_column_size(metadata)), 0)"
                " FROM checkpoints) + (SELECT COALESCE(SUM(pg_column_size(blob)), 0)"
                " FROM checkpoint_blobs)").fetchone()[0]
    print_result("langgraph-postgres", mode, args, latencies, json_bytes,
                 stored / len(latencies), total)


if __name__ == "__main__":
    main()
