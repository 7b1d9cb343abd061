#!/usr/bin/env python3
"""Where the Python binding's `CheckpointStore.save` spends its time, one task, in one process.

For each size of the checkpoint workload (bench/workload.md) it times, interleaved call by call
on the same states so that the machine's load falls on all alike:

- `save`: `CheckpointStore.save(task, state, i)`, the `python` flavour's call;
- `save-text`: the same save of a state whose whole content is one string (the canonical JSON of
  the workload's state, as `{"text": ...}`): the same bytes to compress, sync and write, but
  almost nothing to convert from Python objects, so `save` − `save-text` is about what walking
  the Python objects into JSON costs while the GIL is held;
- `json.dumps`: CPython's C encoder on the same state, for scale.

It prints one JSON line per size with the p50 of each, in milliseconds. A probe to read beside
`bench/checkpoint_matrix.py --flavours log,python` (the Rust path in the same rounds).

    python3 bench/peers/binding_cost.py --dir bench/.data [--calls 200]
"""
import argparse
import json
import os
import shutil
import statistics
import tempfile
import time

import cairn

from workload_state import canonical, check_generator, state


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", ".data"))
    ap.add_argument("--calls", type=int, default=200, help="calls of each kind per size")
    ap.add_argument("--sizes", default="1k,64k,1m")
    args = ap.parse_args()
    check_generator()
    os.makedirs(args.dir, exist_ok=True)
    for size in args.sizes.split(","):
        calls = args.calls if size != "1m" else max(args.calls // 4, 10)
        states = [state(size, 0, i) for i in range(calls)]
        texts = [{"text": canonical(s)} for s in states]
        times = {"save": [], "save-text": [], "json.dumps": []}
        work = tempfile.mkdtemp(prefix="cairn-binding-", dir=args.dir)
        try:
            store = cairn.CheckpointStore(work)
            for i, (value, text) in enumerate(zip(states, texts)):
                start = time.perf_counter()
                store.save("task-0000", value, i + 1)
                middle = time.perf_counter()
                store.save("text-0000", text, i + 1)
                end = time.perf_counter()
                json.dumps(value, separators=(",", ":"))
                times["save"].append(middle - start)
                times["save-text"].append(end - middle)
                times["json.dumps"].append(time.perf_counter() - end)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        p50 = {k: round(statistics.median(v) * 1000, 3) for k, v in times.items()}
        p50["conversion"] = round(p50["save"] - p50["save-text"], 3)
        print(json.dumps({"size": size, "calls": calls, "p50_ms": p50}), flush=True)


if __name__ == "__main__":
    main()
