#!/usr/bin/env python3
"""The checkpoint workload (bench/workload.md) through cairn's Python package.

Runs one variant and prints one JSON line in the workload's format, so that
`bench/checkpoint_matrix.py --flavours ...,python,cairnsaver` puts it in the same rounds as
`cairn bench checkpoint` (the Rust path) and LangGraph's SQLite saver:

- `--api store` times `cairn.CheckpointStore.save` of the task's state: what the binding adds
  to the Rust store (converting the Python state to JSON, the call) is the difference from the
  `log` flavour.
- `--api saver` times `cairn.langgraph.CairnSaver.put` with the task's whole state as the
  checkpoint's one channel value, exactly as `langgraph_sqlite.py` times `SqliteSaver.put`.

Concurrent variants run one thread per workload task for the store (it releases the GIL while
it waits on the disk) and, for the saver, `aput` from one asyncio task per workload task, as
the LangGraph peers do.

    pip install "./python[langgraph]"
    python3 bench/peers/cairn_python.py --api saver --size 1k --conc 1 --dir bench/.data
"""
import argparse
import asyncio
import os
import shutil
import tempfile
import threading
import time

import cairn

from workload_state import prepared, print_result, variant_args


def run_store(path, size, tasks, iterations):
    """`CheckpointStore.save` timed; one thread per workload task (the store releases the GIL
    while it waits on the disk)."""
    states = prepared(size, tasks, iterations)
    store = cairn.CheckpointStore(path)
    latencies, json_bytes, lock = [], [0], threading.Lock()

    def one_task(task):
        for i in range(iterations):
            value, size_json = states[(task, i)]
            start = time.perf_counter()
            store.save(value["task_id"], value, i + 1)
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                json_bytes[0] += size_json

    start = time.perf_counter()
    threads = [threading.Thread(target=one_task, args=(t,)) for t in range(tasks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, json_bytes[0], time.perf_counter() - start


def run_saver(path, size, tasks, iterations):
    """`CairnSaver.put` timed on the checkpoints the LangGraph peers put; with several tasks,
    `aput` from one asyncio task per workload task, as the peers and LangGraph's async graphs
    do."""
    from cairn.langgraph import CairnSaver
    from graph_checkpoint import checkpoint_of, config_of

    states = prepared(size, tasks, iterations)
    saver = CairnSaver(path)
    latencies, json_bytes = [], [0]

    def checkpoint_for(task, i, parent):
        value, size_json = states[(task, i)]
        json_bytes[0] += size_json
        return checkpoint_of(value), config_of(value["task_id"], parent)

    if tasks == 1:
        parent = None
        for i in range(iterations):
            checkpoint, config = checkpoint_for(0, i, parent)
            start = time.perf_counter()
            saver.put(config, checkpoint, {"step": i}, {"state": i + 1})
            latencies.append(time.perf_counter() - start)
            parent = checkpoint["id"]
        return latencies, json_bytes[0], sum(latencies)

    async def one_task(task):
        parent = None
        for i in range(iterations):
            checkpoint, config = checkpoint_for(task, i, parent)
            start = time.perf_counter()
            await saver.aput(config, checkpoint, {"step": i}, {"state": i + 1})
            latencies.append(time.perf_counter() - start)
            parent = checkpoint["id"]

    async def all_tasks():
        start = time.perf_counter()
        await asyncio.gather(*(one_task(t) for t in range(tasks)))
        return time.perf_counter() - start

    wall = asyncio.run(all_tasks())
    return latencies, json_bytes[0], wall


def stored_bytes(path):
    total = 0
    for root, _, files in os.walk(os.path.join(path, "incremental")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files if not f.startswith("."))
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api", choices=["store", "saver"], default="store")
    args, iterations = variant_args(None, ap)
    work = tempfile.mkdtemp(prefix=f"cairn-python-{args.api}-", dir=args.dir)
    try:
        run = run_store if args.api == "store" else run_saver
        latencies, json_bytes, wall = run(work, args.size, args.conc, iterations)
        # The store keeps the latest and three older generations of each task; the saver one
        # file per checkpoint: per checkpoint, what the last ones take.
        kept = stored_bytes(work)
        files = sum(1 for _, _, fs in os.walk(os.path.join(work, "incremental"))
                    for f in fs if not f.startswith("."))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # One task: the timed calls alone, as langgraph_sqlite.py counts; many: the wall time.
    seconds = sum(latencies) if args.conc == 1 else wall
    print_result("cairn-python-" + args.api, "durable", args, latencies, json_bytes,
                 kept / max(files, 1), seconds)


if __name__ == "__main__":
    main()
