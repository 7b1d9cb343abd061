#!/usr/bin/env python3
"""Run every checkpoint-benchmark configuration round-robin and print the medians.

Each configuration of the checkpoint workload (bench/workload.md) runs `--rounds` times
(default 3), interleaved with the others so that a noisy moment of the machine spreads over all
of them: cairn durable through the commit log (the default) and by the atomic replace alone,
cairn published (no fsync), the raw atomic-replace reference and the appended, fdatasync'd
record of the same bytes. `--variants` and `--flavours` pick a subset; `--baseline` adds
another build's commit-log runs to the same rounds, to compare two builds fairly. The flavour
`langgraph` adds LangGraph's SQLite saver (bench/peers/langgraph_sqlite.py, run by `--python`,
which must have `langgraph-checkpoint-sqlite` installed) to the same rounds; `python` and
`cairnsaver` add cairn's Python package (bench/peers/cairn_python.py: the binding's
`CheckpointStore.save`, and `CairnSaver.put` timed as the SQLite saver's `put` is). Every run's JSON
line is printed as it comes; a Markdown table of the medians of the per-run values follows.

    cargo build --release && python3 bench/checkpoint_matrix.py [--rounds 5] [--cairn PATH]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = [("1k", 1), ("64k", 1), ("1m", 1), ("1k", 100), ("64k", 100)]
FLAVOURS = {
    "raw": ["--raw", "replace"],
    "append": ["--raw", "append"],
    "log": ["--commit-path", "log"],
    "replace": ["--commit-path", "replace"],
    "published": ["--durability", "none"],
}
# Peers that implement the same workload; each is a script run by `--python`.
PEERS = {
    "langgraph": [os.path.join(ROOT, "bench", "peers", "langgraph_sqlite.py")],
    # cairn's Python package (`pip install "./python[langgraph]"` into `--python`'s environment).
    "python": [os.path.join(ROOT, "bench", "peers", "cairn_python.py"), "--api", "store"],
    "cairnsaver": [os.path.join(ROOT, "bench", "peers", "cairn_python.py"), "--api", "saver"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cairn", default=os.path.join(ROOT, "target", "release", "cairn"))
    ap.add_argument("--baseline", help="another cairn binary whose commit-log runs join the rounds")
    ap.add_argument("--dir", default=os.path.join(ROOT, "bench", ".data"))
    ap.add_argument("--variants", default=",".join(f"{s}/{c}" for s, c in VARIANTS),
                    help="size/conc pairs, comma-separated (default: all)")
    ap.add_argument("--flavours", default=",".join(FLAVOURS),
                    help="comma-separated, of: " + ", ".join(list(FLAVOURS) + list(PEERS)))
    ap.add_argument("--python", default=sys.executable,
                    help="the Python that runs the peers' scripts")
    args = ap.parse_args()
    variants = [(v.split("/")[0], int(v.split("/")[1])) for v in args.variants.split(",")]
    flavours = []
    for name in args.flavours.split(","):
        if name in PEERS:
            flavours.append((name, args.python, PEERS[name]))
        elif name in FLAVOURS:
            flavours.append((name, args.cairn, ["bench", "checkpoint"] + FLAVOURS[name]))
        else:
            sys.exit(f"unknown flavour {name!r}; known: {', '.join(list(FLAVOURS) + list(PEERS))}")
    if args.baseline:
        flavours.append(("baseline", args.baseline, ["bench", "checkpoint"] + FLAVOURS["log"]))
    os.makedirs(args.dir, exist_ok=True)
    fs = subprocess.run(["df", "-T", args.dir], capture_output=True, text=True).stdout
    print(fs.strip(), file=sys.stderr)

    rows = {}
    for _ in range(args.rounds):
        for size, conc in variants:
            for name, binary, flags in flavours:
                cmd = [binary] + flags + ["--size", size, "--conc", str(conc), "--dir", args.dir]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                line = json.loads(out)
                line["run"] = name
                print(json.dumps(line), flush=True)
                rows.setdefault((name, line["mode"], size, conc), []).append(line)

    print()
    print("| run | mode | size | conc | n | stored bytes | p50 ms | p99 ms | checkpoints/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (impl, mode, size, conc), lines in sorted(rows.items(), key=lambda kv: (kv[0][3], kv[0][2])):
        med = lambda k: statistics.median(l[k] for l in lines)
        print(f"| {impl} | {mode} | {size} | {conc} | {lines[0]['n']} | "
              f"{med('stored_bytes'):,.0f} | {med('p50_ms'):.3f} | {med('p99_ms'):.3f} | "
              f"{med('ops_s'):,.0f} |")


if __name__ == "__main__":
    main()
