"""Throughput of `arrangement_backfill.backfill(...)` from a pyarrow Table against the same job
through the Rust API (`benches/embed.rs`) on the same rows, in turn, each run a fresh process.

    python3 python/bench/throughput.py [--rows N] [--changes M] [--runs R] [--work DIR]
                                       [--parallelism P] [--order merged|vnode]

Writes DIR/snapshot.parquet (N rows: id Int64 key, v Int64, w Utf8 with NULLs) and
DIR/changes.parquet (M changes in 100 epochs: updates, deletes, inserts) once; then R rounds,
each running the Python side and the Rust side (`cargo bench --bench embed`, built in release
first) one after the other. Both time the same work, after reading both files into memory
(untimed): the load into an in-memory store, the job over the changes with the package's
defaults, and its changelog read to the end. Prints each side's median seconds and rows/s and
the median of the rounds' own ratios (Python / Rust throughput), with their range.

Defaults: 4M rows, 400k changes, 5 runs, work dir target/python-bench.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PYTHON_SIDE = """
import json, sys, time
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import arrangement_backfill as ab
d, parallelism, order = sys.argv[1], int(sys.argv[2]), sys.argv[3]
snapshot = pq.read_table(f"{d}/snapshot.parquet")
changes = pq.read_table(f"{d}/changes.parquet")
started = time.perf_counter()
reader = ab.backfill(snapshot, changes, key=["id"], parallelism=parallelism, order=order)
rows = net = 0
for batch in reader:
    rows += batch.num_rows
    inserts = pc.sum(pc.is_in(batch.column("_op"), pa.array([1, 4], pa.int8()))).as_py() or 0
    net += 2 * inserts - batch.num_rows
print(json.dumps({"seconds": time.perf_counter() - started, "rows": rows, "net": net}))
"""


def make(work, rows, changes):
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = f"{work}/made-{rows}-{changes}"
    if os.path.exists(marker):
        return
    os.makedirs(work, exist_ok=True)
    rng = random.Random(7)
    ids = list(range(0, rows * 2, 2))
    v = [rng.randrange(1 << 40) for _ in ids]
    w = [None if i % 10 == 0 else f"value-{i % 1000}" for i in range(rows)]
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("v", pa.int64()), ("w", pa.utf8())])
    pq.write_table(pa.table([ids, v, w], schema=schema), f"{work}/snapshot.parquet")
    live = dict(zip(ids, zip(v, w)))
    keys = list(ids)
    out = {"_epoch": [], "_op": [], "id": [], "v": [], "w": []}

    def emit(epoch, op, key, values):
        out["_epoch"].append(epoch)
        out["_op"].append(op)
        out["id"].append(key)
        out["v"].append(values[0])
        out["w"].append(values[1])

    per_epoch = max(1, changes // 100)
    next_key = rows * 2 + 1
    for epoch in range(1, 101):
        touched = set()
        made = 0
        while made < per_epoch:
            roll = rng.random()
            if roll < 0.3:
                key, next_key = next_key, next_key + 2
                values = (rng.randrange(1 << 40), "new")
                live[key] = values
                keys.append(key)
                emit(epoch, 1, key, values)
                made += 1
                continue
            key = keys[rng.randrange(len(keys))]
            if key not in live or key in touched:
                continue
            touched.add(key)
            if roll < 0.5:
                emit(epoch, 2, key, live.pop(key))
                made += 1
            else:
                new = (rng.randrange(1 << 40), "updated")
                emit(epoch, 3, key, live[key])
                emit(epoch, 4, key, new)
                live[key] = new
                made += 2
    cschema = pa.schema([("_epoch", pa.uint64()), ("_op", pa.int8())] + list(schema))
    pq.write_table(pa.table([out[c] for c in cschema.names], schema=cschema), f"{work}/changes.parquet")
    open(marker, "w").close()


def run(cmd):
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--changes", type=int, default=400_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", default=os.path.join(ROOT, "target", "python-bench"))
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--order", default="merged", choices=["merged", "vnode"])
    a = parser.parse_args()
    make(a.work, a.rows, a.changes)
    subprocess.run(["cargo", "bench", "--bench", "embed", "--no-run"], check=True, cwd=ROOT)
    side = [str(a.parallelism), a.order]
    python = [sys.executable, "-c", PYTHON_SIDE, a.work] + side
    rust = ["cargo", "bench", "-q", "--bench", "embed", "--", a.work, "--parallelism", side[0], "--order", side[1]]
    run(python)  # warm-up: the files' first read, the first touch of the memory
    results = {"python": [], "rust": []}
    ratios, results_rows = [], []
    for i in range(a.runs):
        p, r = run(python), run(rust)
        # Rows out vary with timing (changes to rows not yet read are not sent); the table
        # they make does not.
        assert p["net"] == r["net"], (p, r)
        results_rows.append(p["rows"])
        results["python"].append(p["seconds"])
        results["rust"].append(r["seconds"])
        ratios.append(r["seconds"] / p["seconds"])
        print(f"round {i + 1}: python {p['seconds']:.3f} s, rust {r['seconds']:.3f} s, "
              f"python/rust throughput {ratios[-1]:.3f}", flush=True)
    rows = statistics.median(results_rows)
    for name, times in results.items():
        m = statistics.median(times)
        print(f"{name:6} median {m:.3f} s  {rows / m:,.0f} rows/s out (each the table's net {p['net']:,} rows)")
    print(f"python throughput / rust throughput: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f}), {a.rows:,} rows + {a.changes:,} changes, "
          f"{a.runs} rounds, load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
