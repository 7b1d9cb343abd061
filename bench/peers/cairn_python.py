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

Concurrent variants run one thread per workload task (the store releases the GIL while it
waits on the disk).

    pip install "./python[langgraph]"
    python3 bench/peers/cairn_python.py --api saver --size 1k --conc 1 --dir bench/.data
"""
import argparse
import os
import shutil
import tempfile
import threading
import time

import cairn

from workload_state import canonical, print_result, state, variant_args


def run(api, path, size, tasks, iterations):
    if api == "store":
        store = cairn.CheckpointStore(path)

        def save(task, i, value, parent):
            store.save(value["task_id"], value, i + 1)
            return None
    else:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        from cairn.langgraph import CairnSaver

        saver = CairnSaver(path)

        def save(task, i, value, parent):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = str(uuid6())
            checkpoint["channel_values"] = {"state": value}
            checkpoint["channel_versions"] = {"state": i + 1}
            configurable = {"thread_id": value["task_id"], "checkpoint_ns": ""}
            if parent:
                configurable["checkpoint_id"] = parent
            start = time.perf_counter()
            saver.put({"configurable": configurable}, checkpoint, {"step": i}, {"state": i + 1})
            return start, checkpoint["id"]

    latencies, json_bytes, lock = [], [0], threading.Lock()

    def one_task(task):
        parent = None
        for i in range(iterations):
            value = state(size, task, i)
            size_json = len(canonical(value))
            start = time.perf_counter()
            timed = save(task, i, value, parent)
            if timed is not None:
                start, parent = timed
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
    wall = time.perf_counter() - start
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
        latencies, json_bytes, wall = run(args.api, work, args.size, args.conc, iterations)
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
