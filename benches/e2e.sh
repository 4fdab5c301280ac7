#!/usr/bin/env bash
# End-to-end benchmark: `backfill replay` of TPC-H lineitem against a DuckDB copy of the same
# rows, in one run, on this machine.
#
#   benches/e2e.sh [--scale S] [--runs N] [--warmup W] [--work DIR] [--threads T]
#                  [--timer auto|hyperfine|bash] [-- EXTRA REPLAY ARGS]
#
# 1. builds the release `backfill` binary (cargo, from this repository);
# 2. generates lineitem at scale S into DIR/lineitem-S (kept and reused by later runs);
# 3. runs W untimed warm-up rounds of the three commands, then times N rounds of them, each
#    round running them in turn (--timer bash, the default, also `auto`: the machine's load
#    hits all three alike, and the ratios shown are the median of the rounds' own, with
#    their range; --timer hyperfine: N runs of each command one after another, mean times,
#    for hyperfine's statistics):
#    - DuckDB (Python package, installed with pip if missing, T threads):
#      COPY (snapshot UNION ALL changes, without _epoch/_op) TO one zstd Parquet file;
#    - `backfill replay` with the defaults (merged order, durable, checkpoint every epoch);
#    - `backfill replay --order vnode`;
#    every run into a new output (the previous run's output removed before it, untimed: a
#    replay is durable and would resume otherwise);
# 4. runs `backfill verify` on both replay outputs;
# 5. prints mean wall times and ratios against the DuckDB copy, with the machine's load.
#
# The warm-up takes the first run's costs out of the figures: the dataset's first read from
# disk, and on a virtual machine the host's first backing of the guest memory each program
# touches (a huge page touched for the first time in a fresh VM costs about ten times a reused
# one; DuckDB's copy holds 1.7 GB at scale 1, the replay about 0.5 GB).
#
# Defaults: --scale 1, --runs 1, --warmup 1, --work target/e2e, --threads 2, --timer auto.
# Scale 1 is 6.0M snapshot rows and 1.2M changes; it needs a few GB of disk under DIR and
# takes minutes.
set -euo pipefail

scale=1
runs=1
warmup=1
threads=2
timer=auto
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$root/target/e2e"
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --scale) scale="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --timer) timer="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "e2e.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "e2e: $*" >&2; }

# 1. The binary.
log "building the release binary"
(cd "$root" && cargo build --release --quiet --bin backfill)
target_dir="${CARGO_TARGET_DIR:-$root/target}"
backfill="$target_dir/release/backfill"

# DuckDB, from PyPI if missing.
python="${PYTHON:-python3}"
if ! "$python" -c 'import duckdb' 2>/dev/null; then
  log "installing the duckdb Python package"
  "$python" -m pip install --quiet duckdb
fi
duckdb_version="$("$python" -c 'import duckdb; print(duckdb.__version__)')"

# 2. The dataset.
mkdir -p "$work"
work="$(cd "$work" && pwd)"
dataset="$work/lineitem-$scale"
if [[ ! -f "$dataset/dataset.json" ]]; then
  rm -rf "$dataset"
  log "generating lineitem at scale $scale"
  "$backfill" gen tpch-lineitem --scale "$scale" --out "$dataset"
fi

# 3. The timed commands.
cat >"$work/duckdb_copy.py" <<'EOF'
import sys

import duckdb

dataset, out, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
con = duckdb.connect()
con.execute(f"SET threads = {threads}")
con.execute(
    f"""COPY (
        SELECT * FROM read_parquet('{dataset}/snapshot/*.parquet')
        UNION ALL
        SELECT * EXCLUDE (_epoch, _op) FROM read_parquet('{dataset}/changes/*.parquet')
    ) TO '{out}' (FORMAT parquet, COMPRESSION zstd)"""
)
EOF
names=("duckdb copy ($threads threads)" "replay (defaults: merged)" "replay --order vnode")
quoted_extra=""
if [[ ${#extra[@]} -gt 0 ]]; then quoted_extra="$(printf ' %q' "${extra[@]}")"; fi
q() { printf '%q' "$1"; }
commands=(
  "$(q "$python") $(q "$work/duckdb_copy.py") $(q "$dataset") $(q "$work/duckdb.parquet") $threads"
  "$(q "$backfill") replay $(q "$dataset") --out $(q "$work/merged") --progress none$quoted_extra"
  "$(q "$backfill") replay $(q "$dataset") --out $(q "$work/vnode") --order vnode --progress none$quoted_extra"
)
# Run before each timed run, untimed: every run writes a new output.
prepares=(
  "rm -f $(q "$work/duckdb.parquet")"
  "rm -rf $(q "$work/merged")"
  "rm -rf $(q "$work/vnode")"
)

load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
declare -a seconds ratio_text
if [[ "$timer" == auto ]]; then timer=bash; fi
if [[ "$timer" == hyperfine ]]; then
  log "timing with hyperfine ($runs runs each)"
  hyperfine --runs "$runs" --warmup "$warmup" --export-json "$work/times.json" --style basic \
    --prepare "${prepares[0]}" --prepare "${prepares[1]}" --prepare "${prepares[2]}" \
    -n "${names[0]}" "${commands[0]}" \
    -n "${names[1]}" "${commands[1]}" \
    -n "${names[2]}" "${commands[2]}" >&2
  mapfile -t seconds < <("$python" -c '
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(r["mean"])' "$work/times.json")
else
  # Rounds: each runs the three commands in turn, so a change in the machine's load (it is
  # shared) hits all three alike; each round gives its own ratios, and the table shows their
  # median and range.
  log "timing with bash: $warmup warm-up round(s), then $runs round(s) of the three commands in turn"
  # Command $1 into its log; on failure the log is shown and the script stops.
  run_command() {
    bash -c "${commands[$1]}" >"$work/run-$1.log" 2>&1 || {
      cat "$work/run-$1.log" >&2
      exit 1
    }
  }
  for ((r = 0; r < warmup; r++)); do
    for i in "${!commands[@]}"; do
      log "warm-up $((r + 1)) of $warmup: ${names[$i]}"
      bash -c "${prepares[$i]}"
      run_command "$i"
    done
  done
  declare -A took
  for ((r = 0; r < runs; r++)); do
    for i in "${!commands[@]}"; do
      log "round $((r + 1)) of $runs: ${names[$i]}"
      bash -c "${prepares[$i]}"
      start=$(date +%s.%N)
      run_command "$i"
      end=$(date +%s.%N)
      took[$i,$r]=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
      log "  $(printf '%.2f' "${took[$i,$r]}") s"
    done
  done
  for i in "${!commands[@]}"; do
    times=()
    ratios=()
    for ((r = 0; r < runs; r++)); do
      times+=("${took[$i,$r]}")
      ratios+=("$(awk -v a="${took[$i,$r]}" -v b="${took[0,$r]}" 'BEGIN { print a / b }')")
    done
    seconds[$i]=$(printf '%s\n' "${times[@]}" | awk '{ t += $1 } END { print t / NR }')
    ratio_text[$i]=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '
      { r[NR] = $1 }
      END {
        m = (NR % 2) ? r[(NR + 1) / 2] : (r[NR / 2] + r[NR / 2 + 1]) / 2
        if (NR == 1) printf "%.2fx", m
        else printf "%.2fx (%.2f to %.2f)", m, r[1], r[NR]
      }')
  done
fi
load_after="$(cut -d' ' -f1-3 /proc/loadavg)"

# 4. Verify the replays.
verdict=()
for out in merged vnode; do
  if "$backfill" verify "$dataset" "$work/$out" >"$work/verify-$out.log" 2>&1; then
    verdict+=("verified")
  else
    verdict+=("VERIFY FAILED (see $work/verify-$out.log)")
  fi
done

# 5. The table.
rows="$("$python" -c '
import duckdb, sys
d = sys.argv[1]
con = duckdb.connect()
count = lambda part: con.execute(
    f"SELECT count(*) FROM read_parquet(\x27{d}/{part}/*.parquet\x27)"
).fetchall()[0][0]
s, c = count("snapshot"), count("changes")
print(f"{s} snapshot rows + {c} changes")' "$dataset")"
echo
echo "lineitem scale $scale: $rows; $runs run(s) each after $warmup warm-up round(s); $(nproc) cores;" \
  "load average before $load_before, after $load_after"
echo "duckdb $duckdb_version; backfill $("$backfill" --version | cut -d' ' -f2)" \
  "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || true)"
if [[ ${#extra[@]} -gt 0 ]]; then echo "extra replay arguments:${quoted_extra}"; fi
echo
echo "| what | wall time | vs DuckDB copy | output |"
echo "|---|---|---|---|"
base="${seconds[0]}"
notes=("-" "${verdict[0]}" "${verdict[1]}")
for i in "${!names[@]}"; do
  ratio="${ratio_text[$i]:-$(awk -v s="${seconds[$i]}" -v b="$base" 'BEGIN { printf "%.2fx", s / b }')}"
  printf '| %s | %.1f s | %s | %s |\n' "${names[$i]}" "${seconds[$i]}" "$ratio" "${notes[$i]}"
done
for v in "${verdict[@]}"; do [[ "$v" == verified ]] || exit 1; done
