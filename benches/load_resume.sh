#!/usr/bin/env bash
# What a kill during the snapshot load costs (issue 47; BENCHMARKS.md, "A kill during the
# snapshot load"):
#
#   benches/load_resume.sh [--scale S] [--pairs N] [--at F] [--work DIR] [--verify]
#
# On TPC-H lineitem at scale S (default 1; made with `backfill gen` in DIR if missing), N
# pairs (default 3) in turn, each:
#   fresh:  `backfill replay lS --out DIR/fresh` (its wall time and its load, from the start
#           to the backfill: the summary's "snapshot load");
#   killed: the same command into DIR/killed, killed with SIGKILL when its load has loaded
#           F (default 0.8) of the snapshot's rows: at the moment the fresh run got there (from
#           its `--progress plain` load lines, timed as they come, interpolated between two),
#           so the kill falls anywhere between two load steps; then run again to the end (its
#           wall time and load, and where its load and its validation resumed).
# It prints one line a pair: the time the rerun saves over the fresh run, whole and to the
# backfill's start, each as a share of the fresh run's load. With --verify, `backfill verify`
# checks each rerun's output. BACKFILL names the binary (default: target/release/backfill,
# built here). Delete DIR afterwards: at scale 10 it holds about 25 GB.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
scale=1
pairs=3
at=0.8
work="$root/target/load-resume"
verify=false
while [ $# -gt 0 ]; do
  case "$1" in
    --scale) scale="$2"; shift ;;
    --pairs) pairs="$2"; shift ;;
    --at) at="$2"; shift ;;
    --work) work="$2"; shift ;;
    --verify) verify=true ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
# shellcheck source=benches/common.sh
. "$root/benches/common.sh"
mkdir -p "$work"
cd "$work"
ds="l$scale"
[ -d "$ds" ] || "$B" gen tpch-lineitem --scale "$scale" --out "$ds" > "gen-$scale.log" 2>&1

# Each line of stdin with the time it came.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(now)" "$line"; done; }
# seconds LOG: the summary's "snapshot load" of LOG, in seconds.
load_of() {
  sed -n 's/.*(snapshot load \([0-9.]*\)\(ms\|s\|µs\|ns\)).*/\1 \2/p' "$1" |
    awk '{ f = ($2 == "ms") ? 0.001 : ($2 == "µs") ? 0.000001 : ($2 == "ns") ? 1e-9 : 1;
           printf "%.2f", $1 * f }'
}

echo "scale $scale, kill at $at of the fresh load, $(nproc) cores; $("$B" --version)"
printf '%-5s %-22s %-8s %-22s %-40s %-14s %-14s\n' pair "fresh wall (load)" "kill at" \
  "rerun wall (load)" "resumed at: load, validation" "saved (whole)" "saved (load)"
for i in $(seq 1 "$pairs"); do
  rm -rf fresh killed
  s=$(now)
  "$B" replay "$ds" --out fresh --progress plain > "fresh-$i.log" 2> >(stamp > "fresh-$i.progress")
  fresh=$(echo "$(now) - $s" | bc)
  fresh_load=$(load_of "fresh-$i.log")
  rm -rf fresh
  # When the fresh load had loaded F of the rows, from the start.
  delay=$(awk -v start="$s" -v at="$at" '
    $2 == "load" { split($3, r, "/"); loaded = r[1]; total = r[2];
      if (loaded >= at * total) {
        t = t0 + (at * total - a0) / (loaded - a0) * ($1 - t0); printf "%.3f", t - start; exit }
      t0 = $1; a0 = loaded }
    BEGIN { t0 = start; a0 = 0 }' "fresh-$i.progress")
  "$B" replay "$ds" --out killed --progress none > "killed-$i.log" 2>&1 &
  pid=$!
  sleep "$delay"
  kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  s=$(now)
  "$B" replay "$ds" --out killed --progress none > "rerun-$i.log" 2>&1
  rerun=$(echo "$(now) - $s" | bc)
  rerun_load=$(load_of "rerun-$i.log")
  load_at=$(sed -n 's/.*load resumed at \([0-9,]*\) of.*/\1/p' "rerun-$i.log")
  validation_at=$(sed -n 's/.*validation resumed at \([0-9,]*\) of.*/\1/p' "rerun-$i.log")
  grep -q "validation started over" "rerun-$i.log" && validation_at="started over"
  grep -q "load resumed" "rerun-$i.log" || load_at="(none: $(grep -o 'resumed from checkpoint epoch [0-9]*' "rerun-$i.log" || echo 'fresh'))"
  saved=$(echo "scale=2; 100 * ($fresh - $rerun) / $fresh_load" | bc)
  saved_load=$(echo "scale=2; 100 * ($fresh_load - $rerun_load) / $fresh_load" | bc)
  printf '%-5s %-22s %-8s %-22s %-40s %-14s %-14s\n' "$i" \
    "$(printf '%.2f s (%.2f s)' "$fresh" "$fresh_load")" "$delay s" \
    "$(printf '%.2f s (%.2f s)' "$rerun" "$rerun_load")" \
    "${load_at:-?}, ${validation_at:-(validated before)}" "$saved%" "$saved_load%"
  if $verify; then
    "$B" verify "$ds" killed > "verify-$i.log" 2>&1 || { echo "verify failed: verify-$i.log"; exit 1; }
  fi
done
rm -rf killed
