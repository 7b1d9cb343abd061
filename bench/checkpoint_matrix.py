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
`CheckpointStore.save`, and `CairnSaver.put` timed as the SQLite saver's `put` is);
`langgraph-postgres` adds LangGraph's PostgreSQL saver (bench/peers/langgraph_postgres.py, which
needs `langgraph-checkpoint-postgres` and `psycopg[binary]`) against the server `--pg-url` names,
or else a throwaway one the harness starts in `--dir` (initdb + pg_ctl, socket only, PostgreSQL's
default durability; as the `postgres` user when root) and removes at the end; without
PostgreSQL's programs that flavour is skipped, saying so. Every run's JSON line is printed as it
comes; a Markdown table of the medians of the per-run values follows, then the ratios that
compare the Python paths (each the median of the per-round ratios): the binding's store against
`cairn bench checkpoint` (`python` ÷ `log`), and `CairnSaver` against each LangGraph saver.

    cargo build --release && python3 bench/checkpoint_matrix.py [--rounds 5] [--cairn PATH]
    python3 bench/checkpoint_matrix.py --python VENV/bin/python \
        --flavours log,python,cairnsaver,langgraph,langgraph-postgres
"""
import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

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
    # LangGraph's PostgreSQL saver; `--db URL` is added (`--pg-url` or a throwaway server).
    "langgraph-postgres": [os.path.join(ROOT, "bench", "peers", "langgraph_postgres.py")],
}
# The ratios printed after the medians: (numerator, denominator), by their runs' names.
RATIOS = [("python", "log"), ("cairnsaver", "langgraph"), ("cairnsaver", "langgraph-postgres"),
          ("langgraph", "langgraph-postgres")]


def postgres_bin():
    """The directory of PostgreSQL's server programs, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl", path=os.path.dirname(found)):
        return Path(found).parent
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True):
        return candidate.parent
    return None


def has_user(name):
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


@contextmanager
def throwaway_postgres(bin_dir, parent):
    """A PostgreSQL of its own in a temporary directory under `parent` (the benchmark's disk),
    on a Unix socket only, with the server's default durability (fsync, synchronous_commit);
    as the `postgres` user when run as root (PostgreSQL refuses root). Stopped and removed at
    the end; yields its URL."""
    base = Path(tempfile.mkdtemp(prefix="pg-", dir=parent))
    data = base / "data"
    as_user = {}
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    port = 20000 + os.getpid() % 20000
    started = False
    try:
        subprocess.run([str(bin_dir / "initdb"), "-D", str(data), "-U", "cairn", "--auth=trust",
                        "-E", "UTF8", "--locale", "C"],
                       check=True, capture_output=True, cwd=base, **as_user)
        subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-w", "-t", "120",
                        "-l", str(base / "log"),
                        "-o", f"-p {port} -k {base} -c listen_addresses=''", "start"],
                       check=True, capture_output=True, cwd=base, **as_user)
        started = True
        yield f"postgresql://cairn@/postgres?host={base}&port={port}"
    finally:
        if started:
            stop = subprocess.run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
                                   "-t", "120", "stop"], capture_output=True, cwd=base, **as_user)
            if stop.returncode != 0:
                pid_file = data / "postmaster.pid"
                if pid_file.exists():
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
                    time.sleep(1)
        shutil.rmtree(base, ignore_errors=True)


def per_round_ratios(runs, num, den, key):
    """The median over the rounds of num's `key` ÷ den's, per (size, conc) both ran."""
    out = {}
    for (name, size, conc), lines in runs.items():
        if name != num or (den, size, conc) not in runs:
            continue
        pairs = zip(lines, runs[(den, size, conc)])
        out[(size, conc)] = statistics.median(a[key] / b[key] for a, b in pairs if b[key])
    return out


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
    ap.add_argument("--pg-url", help="a PostgreSQL server for langgraph-postgres (each run "
                    "makes and drops a database of its own); default: a throwaway server")
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
    # A SIGTERM stops the rounds as Ctrl-C does, so that a throwaway server is still removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped by SIGTERM"))

    server = None
    if any(name == "langgraph-postgres" for name, _, _ in flavours) and not args.pg_url:
        bin_dir = postgres_bin()
        missing = None
        if bin_dir is None:
            missing = ("PostgreSQL's server programs (initdb, pg_ctl) are not installed "
                       "(apt-get install postgresql)")
        elif os.geteuid() == 0 and not has_user("postgres"):
            missing = "running as root, and there is no `postgres` user to run PostgreSQL as"
        if missing:
            print(f"*** SKIPPED langgraph-postgres: {missing}, and no --pg-url was given ***",
                  file=sys.stderr)
            flavours = [f for f in flavours if f[0] != "langgraph-postgres"]
        else:
            server = throwaway_postgres(bin_dir, args.dir)
    if server is not None:
        with server as url:
            run_rounds(args, variants, flavours, url)
    else:
        run_rounds(args, variants, flavours, args.pg_url)


def run_rounds(args, variants, flavours, pg_url):
    if pg_url:
        version = subprocess.run(
            [args.python, "-c", "import psycopg,sys; c=psycopg.connect(sys.argv[1]); "
             "print(c.execute('SHOW server_version').fetchone()[0])", pg_url],
            capture_output=True, text=True)
        print(f"PostgreSQL {version.stdout.strip() or version.stderr.strip()} at {pg_url}",
              file=sys.stderr)
    rows, runs = {}, {}
    for _ in range(args.rounds):
        for size, conc in variants:
            for name, binary, flags in flavours:
                extra = ["--db", pg_url] if name == "langgraph-postgres" else []
                cmd = [binary] + flags + extra + ["--size", size, "--conc", str(conc),
                                                  "--dir", args.dir]
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
                line = json.loads(done.stdout)
                line["run"] = name
                print(json.dumps(line), flush=True)
                rows.setdefault((name, line["mode"], size, conc), []).append(line)
                runs.setdefault((name, size, conc), []).append(line)

    print()
    print("| run | mode | size | conc | n | stored bytes | p50 ms | p99 ms | checkpoints/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (impl, mode, size, conc), lines in sorted(rows.items(), key=lambda kv: (kv[0][3], kv[0][2])):
        med = lambda k: statistics.median(l[k] for l in lines)
        print(f"| {impl} | {mode} | {size} | {conc} | {lines[0]['n']} | "
              f"{med('stored_bytes'):,.0f} | {med('p50_ms'):.3f} | {med('p99_ms'):.3f} | "
              f"{med('ops_s'):,.0f} |")

    ratios = []
    for num, den in RATIOS:
        through = per_round_ratios(runs, num, den, "ops_s")
        p50 = per_round_ratios(runs, num, den, "p50_ms")
        ratios += [(num, den, size, conc, through[(size, conc)], p50[(size, conc)])
                   for size, conc in variants if (size, conc) in through]
    if ratios:
        print()
        print("| ratio (median of the rounds') | size | conc | checkpoints/s | p50 |")
        print("|---|---|---|---|---|")
        for num, den, size, conc, through, p50 in ratios:
            print(f"| {num} ÷ {den} | {size} | {conc} | {through:.2f}× | {p50:.2f}× |")


if __name__ == "__main__":
    main()
