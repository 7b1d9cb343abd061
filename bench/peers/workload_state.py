"""The checkpoint workload's states (bench/workload.md), for the Python implementations of it.

`state(size, task, iteration)` makes the very bytes cairn's generator makes; `check_generator()`
checks a few of the workload's reference digests first, as every implementation must.
"""
import argparse
import hashlib
import json
import math
import os
import sys

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


def prepared(size, tasks, iterations):
    """Every state a variant saves, `(task, iteration) -> (state, canonical bytes)`, made before
    the clock starts: building states is not timed, and in Python it would otherwise take a
    concurrent run's wall time (and the GIL) from the checkpointer. A task's states share their
    entry objects, as its window slides; nothing a checkpointer does may change them."""
    window = WINDOW[size]
    out = {}
    for task in range(tasks):
        entries = [entry(task, k) for k in range(iterations + window - 1)]
        for i in range(iterations):
            value = {"task_id": f"task-{task:04d}", "iteration": i, "phase": "running",
                     "results": entries[i:i + window]}
            out[(task, i)] = (value, len(canonical(value)))
    return out


def canonical(value):
    return json.dumps(value, separators=(",", ":"))


def check_generator():
    for size, task, iteration, digest in REFERENCE:
        got = hashlib.sha256(canonical(state(size, task, iteration)).encode()).hexdigest()
        if got != digest:
            sys.exit(f"generator mismatch at {size} task {task} iteration {iteration}: {got}")


def nearest_rank(sorted_values, q):
    return sorted_values[max(0, math.ceil(q * len(sorted_values)) - 1)]


def variant_args(description, parser=None):
    """The workload variant asked for on the command line (`--size`, `--conc`, `--dir`, and
    whatever `parser` adds), its iterations per task, with the generator checked and the run
    directory's parent made."""
    ap = parser or argparse.ArgumentParser(description=description)
    ap.add_argument("--size", choices=sorted(WINDOW), default="1k")
    ap.add_argument("--conc", type=int, default=1)
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(__file__), "..", ".data"))
    args = ap.parse_args()
    iterations = ITERATIONS.get((args.size, args.conc))
    if iterations is None:
        sys.exit(f"no such variant in bench/workload.md: {args.size} x {args.conc}")
    check_generator()
    os.makedirs(args.dir, exist_ok=True)
    return args, iterations


def print_result(impl, mode, args, latencies, json_bytes, stored_bytes, seconds):
    """The workload's one JSON line: `stored_bytes` per checkpoint, `seconds` the time the
    throughput is counted over."""
    n = len(latencies)
    ordered = sorted(latencies)
    print(json.dumps({
        "impl": impl, "mode": mode, "size": args.size, "conc": args.conc, "n": n,
        "json_bytes": round(json_bytes / n), "stored_bytes": round(stored_bytes),
        "p50_ms": round(nearest_rank(ordered, 0.5) * 1000, 3),
        "p99_ms": round(nearest_rank(ordered, 0.99) * 1000, 3),
        "ops_s": round(n / seconds, 1),
    }))
