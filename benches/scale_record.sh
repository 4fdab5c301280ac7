#!/usr/bin/env bash
# The record run and the cold reads of BENCHMARKS.md (issue 43):
#
#   benches/scale_record.sh record [--scale S] [--state-compression C] [--work DIR]
#   benches/scale_record.sh cold   [--scale S] [--work DIR]
#
# record (default scale 30, --state-compression lz4): `backfill gen tpch-lineitem --scale S`,
#   then `backfill replay` of it, each with its wall time and its peak anonymous memory and
#   resident set (sampled every 50 ms from /proc, as ../shared/tools/peakmem.py does); the dataset's, the state's and the
#   output's bytes; then an independent check with DuckDB: over snapshot + changes (inserts
#   and U+ counted +1, deletes and U- -1) and over the output the same way, the signed count
#   of rows and the signed sum of DuckDB's hash of every column must be equal (a multiset
#   hash of the final table: any row missing, extra or changed moves it).
# cold (default scale 10), two rounds, each in turn with a warm and a cold page cache
#   (`echo 3 > /proc/sys/vm/drop_caches`, root): (a) a fresh replay, the dataset read cold;
#   (b) a replay killed with SIGKILL once its backfill began (its load committed), then
#   the rerun, which scans the whole upstream table from the state: the durable scan, cold.
#
# Needs `pip install duckdb`. BACKFILL names the binary (default: target/release/backfill,
# built here). DIR (default target/scale-record) keeps the dataset; delete it afterwards
# (scale 30: about 6 GB of dataset, 17 GB of LZ4 state, 6 GB of output).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode=record
scale=""
compression=lz4
work="$root/target/scale-record"
while [ $# -gt 0 ]; do
  case "$1" in
    record|cold) mode="$1" ;;
    --scale) scale="$2"; shift ;;
    --state-compression) compression="$2"; shift ;;
    --work) work="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$scale" ] || { [ "$mode" = record ] && scale=30 || scale=10; }
# shellcheck source=benches/common.sh
. "$root/benches/common.sh"
mkdir -p "$work"
cd "$work"
ds="l$scale"
# timed LABEL CMD...: runs CMD (its output in LABEL.log), prints LABEL, its wall time and
# its peak anonymous and resident memory (sampled beside it as peakmem.py samples).
timed() {
  local label="$1"; shift
  local s; s=$(now)
  "$@" > "$label.log" 2>&1 &
  local pid=$! anon=0 rss=0 a r
  while kill -0 "$pid" 2>/dev/null; do
    a=$(awk '/^RssAnon:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    r=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    [ "${a:-0}" -gt "$anon" ] && anon=$a
    [ "${r:-0}" -gt "$rss" ] && rss=$r
    sleep 0.05
  done
  local rc=0
  wait "$pid" || rc=$?
  echo "$label: $(echo "$(now) - $s" | bc) s, peak anonymous $anon KiB, peak resident $rss KiB, exit $rc"
  return "$rc"
}
echo "scale $scale, $(nproc) cores, $("$B" --version), load average $(cut -d' ' -f1-3 /proc/loadavg)"

if [ "$mode" = record ]; then
  [ -d "$ds" ] || timed gen "$B" gen tpch-lineitem --scale "$scale" --out "$ds"
  rm -rf out
  timed replay "$B" replay "$ds" --out out --progress plain --state-compression "$compression"
  grep -E "done in|certificate|output rows" replay.log || true
  echo "dataset $(du -sb "$ds" | cut -f1) bytes, state $(du -sb out/state | cut -f1) bytes, output $(du -sb out/changes | cut -f1) bytes"
  cat > check.py <<'EOF'
import sys, duckdb
ds, out = sys.argv[1], sys.argv[2]
con = duckdb.connect()
con.execute("SET threads = 2")
cols = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{ds}/snapshot/*.parquet')").fetchall()]
h = "hash(" + ", ".join(cols) + ")::HUGEINT"
sign = "CASE WHEN _op IN (1, 4) THEN 1 ELSE -1 END"
expected = con.execute(f"""
  SELECT sum(n), sum(hs) FROM (
    SELECT count(*)::HUGEINT n, sum({h}) hs FROM read_parquet('{ds}/snapshot/*.parquet')
    UNION ALL
    SELECT sum({sign})::HUGEINT, sum({sign} * {h}) FROM read_parquet('{ds}/changes/*.parquet'))
""").fetchone()
found = con.execute(f"""
  SELECT sum({sign})::HUGEINT, sum({sign} * {h}) FROM read_parquet('{out}/changes/*.parquet')
""").fetchone()
print(f"expected rows {expected[0]}, hash sum {expected[1]}")
print(f"output   rows {found[0]}, hash sum {found[1]}")
print("independent check:", "equal" if tuple(expected) == tuple(found) else "DIFFERENT")
sys.exit(0 if tuple(expected) == tuple(found) else 1)
EOF
  timed check python3 check.py "$ds" out
  cat check.log
else
  [ -d "$ds" ] || "$B" gen tpch-lineitem --scale "$scale" --out "$ds" > gen.log 2>&1
  drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
  # warm_then_cold LABEL PREPARE GREP: runs PREPARE, then the replay, with a warm page cache
  # and then a dropped one; prints each time and what GREP finds in its summary.
  warm_then_cold() {
    local label="$1" prepare="$2" pattern="$3" cache s
    for cache in warm cold; do
      $prepare
      sync
      if [ "$cache" = cold ]; then drop; fi
      s=$(now)
      "$B" replay "$ds" --out out --progress none > "$label-$round-$cache.log" 2>&1
      echo "($label) round $round $cache: $(echo "$(now) - $s" | bc) s; $(grep -oE "$pattern" "$label-$round-$cache.log" | tr '\n' ' ')"
    done
  }
  fresh() { rm -rf out; }
  from_killed() { rm -rf out && cp -a killed out; }
  for round in 1 2; do
    warm_then_cold a fresh 'done in .*'
    rm -rf out
    "$B" replay "$ds" --out out --progress plain > /dev/null 2> killed.progress &
    pid=$!
    # (A replay that ends first, on a small dataset, leaves a finished state: (b) then
    # measures a run that finds its job done.)
    until grep -q "^snapshot " killed.progress 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do
      sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true
    rm -rf killed && cp -a out killed
    warm_then_cold b from_killed 'done in .*|resumed from checkpoint epoch [0-9]+'
    rm -rf killed
  done
  rm -rf out
fi
