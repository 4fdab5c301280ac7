#!/usr/bin/env bash
# Object storage figures of BENCHMARKS.md (issue 45), on a local moto S3 server:
#
#   benches/object_storage.sh [bench|kill] [--runs N] [--work DIR]
#
# bench (default), N rounds in turn on TPC-H lineitem scale 1:
#   (a) `backfill replay` into a local --out, then into s3://benchI/out (summaries in
#       DIR/bench-a-*.log: checkpoints uploaded, upload to commit p50/p99); in round 1,
#       `backfill verify` of both;
#   (b) one unsharded replay, then --shard 0/2 and --shard 1/2 at once (--parallelism 1);
#   then (c) the restore of a finished output: its cache deleted, the same command (scale 1
#   and the bundled scale 0.01).
# kill: the issue's done-when: --shard 0/2 and --shard 1/2 at once into s3://dwbk/out;
#   shard 1 killed with SIGKILL once the bucket holds a checkpoint of it past the load
#   (KILL_AFTER=S: S seconds in instead), its cache deleted, the same command run again;
#   `backfill verify`; then pyarrow's S3 filesystem reads the bucket's output and DuckDB
#   compares its net count per full row with snapshot + changes.
#
# Needs `pip install 'moto[server]' pyarrow duckdb`; builds the release binary. Times on
# stdout; DIR (default target/s3-bench) keeps the dataset and the logs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
mode=bench
runs=3
work="$root/target/s3-bench"
while [ $# -gt 0 ]; do
  case "$1" in
    bench|kill) mode="$1" ;;
    --runs) runs="$2"; shift ;;
    --work) work="$2"; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
(cd "$root" && cargo build --release --bin backfill >&2)
B="$root/target/release/backfill"
mkdir -p "$work"
cd "$work"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=x AWS_SECRET_ACCESS_KEY=x \
  AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
python3 -m moto.server -H 127.0.0.1 -p "$port" > moto.log 2>&1 &
moto=$!
trap 'kill $moto 2>/dev/null || true' EXIT
sleep 3
bucket() { python3 -c "import boto3; boto3.client('s3').create_bucket(Bucket='$1')"; }
[ -d l1 ] || "$B" gen tpch-lineitem --scale 1 --out l1 > gen.log 2>&1
now() { date +%s.%N; }
exec 3>&1
# t LABEL CMD...: runs CMD (its output in the caller's redirection), prints LABEL and its time.
t() { local label="$1"; shift; local s; s=$(now); local rc=0; "$@" || rc=$?; \
      echo "$label $(echo "$(now) - $s" | bc) s (exit $rc; load $(cut -d' ' -f1 /proc/loadavg))" >&3; }
small="$root/datasets/tpch-lineitem-sf0.01"

if [ "$mode" = bench ]; then
  for i in $(seq 1 "$runs"); do
    bucket "bench$i"
    rm -rf lo sh "cache-$i"
    t "a$i local:" "$B" replay l1 --out lo --progress none > "bench-a-local-$i.log" 2>&1
    t "a$i s3:   " "$B" replay l1 --out "s3://bench$i/out" --cache "cache-$i" --progress none > "bench-a-s3-$i.log" 2>&1
    grep -h "commit latency" "bench-a-local-$i.log" | sed 's/^/  local: /'
    grep -h "commit latency\|checkpoints  \|published" "bench-a-s3-$i.log" | sed 's/^/  s3:    /'
    if [ "$i" = 1 ]; then
      t "verify local:" "$B" verify l1 lo > bench-v-local.log 2>&1
      t "verify s3:   " "$B" verify l1 s3://bench1/out > bench-v-s3.log 2>&1
    fi
    rm -rf lo
    t "b$i one:  " "$B" replay l1 --out lo --progress none > "bench-b-one-$i.log" 2>&1
    s=$(now)
    "$B" replay l1 --out sh --progress none --shard 0/2 --parallelism 1 > "bench-b-s0-$i.log" 2>&1 &
    other=$!
    "$B" replay l1 --out sh --progress none --shard 1/2 --parallelism 1 > "bench-b-s1-$i.log" 2>&1
    wait $other
    echo "b$i two shards: $(echo "$(now) - $s" | bc) s"
    rm -rf lo sh
  done
  echo "state bytes (scale 1): $(du -sb cache-1/state | cut -f1)"
  rm -rf cache-1
  t "c restore scale 1:" "$B" replay l1 --out s3://bench1/out --cache cache-1 --progress none > bench-c-1.log 2>&1
  grep -h restored bench-c-1.log
  bucket small
  rm -rf cs
  "$B" replay "$small" --out s3://small/out --cache cs --progress none > /dev/null 2>&1
  echo "state bytes (scale 0.01): $(du -sb cs/state | cut -f1)"
  rm -rf cs
  t "c restore scale 0.01:" "$B" replay "$small" --out s3://small/out --cache cs --progress none > bench-c-small.log 2>&1
  grep -h restored bench-c-small.log
  rm -rf cs cache-*
  exit 0
fi

# kill: the done-when.
bucket dwbk
rm -rf c0 c1
"$B" replay l1 --out s3://dwbk/out --cache c0 --progress none --shard 0/2 > s0.log 2>&1 &
s0=$!
"$B" replay l1 --out s3://dwbk/out --cache c1 --progress none --shard 1/2 > s1a.log 2>&1 &
s1=$!
if [ -n "${KILL_AFTER:-}" ]; then
  sleep "$KILL_AFTER"
else
  python3 - <<'PY'
import boto3, json, time
c = boto3.client('s3')
prefix = 'out/_backfill-state.shard-1-of-2/checkpoint-'
while True:
    keys = [o['Key'] for o in c.list_objects_v2(Bucket='dwbk', Prefix=prefix).get('Contents', [])]
    if keys:
        doc = json.loads(c.get_object(Bucket='dwbk', Key=sorted(keys)[-1])['Body'].read())
        if doc.get('committed_epoch') is not None:
            print('killing shard 1: its bucket checkpoint', doc['seq'], 'is at epoch', doc['committed_epoch'])
            break
    time.sleep(0.05)
PY
fi
kill -9 $s1 || true
wait $s1 || true
rm -rf c1
t "shard 1 rerun on an empty cache:" "$B" replay l1 --out s3://dwbk/out --cache c1 --progress none --shard 1/2 > s1b.log 2>&1
cat s1b.log
wait $s0
t "verify:" "$B" verify l1 s3://dwbk/out > verify.log 2>&1
cat verify.log
python3 - "$AWS_ENDPOINT_URL" <<'PY'
import glob, sys
import duckdb, pyarrow.dataset as pads, pyarrow.fs as pafs
fs = pafs.S3FileSystem(endpoint_override=sys.argv[1], access_key="x", secret_key="x",
                       region="us-east-1", scheme="http")
ds = pads.dataset("dwbk/out/changes", filesystem=fs, format="parquet")
out = ds.to_table()
print("pyarrow read", out.num_rows, "rows in", len(ds.files), "files")
con = duckdb.connect()
con.register("out_t", out)
cols = ", ".join(c for c in out.column_names if c not in ("_op", "_epoch"))
snap, chg = glob.glob("l1/snapshot/*.parquet"), glob.glob("l1/changes/*.parquet")
print("missing, extra, expected rows, output rows:", con.execute(f"""
with e as (select {cols}, sum(n) n from (
    select {cols}, 1 n from read_parquet({snap})
    union all select {cols}, case when _op in (1, 4) then 1 else -1 end from read_parquet({chg}))
  group by all having sum(n) <> 0),
g as (select {cols}, sum(case when _op in (1, 4) then 1 else -1 end) n from out_t
  group by all having sum(case when _op in (1, 4) then 1 else -1 end) <> 0)
select (select count(*) from (select * from e except all select * from g)), (select count(*) from (select * from g except all select * from e)),
       (select sum(n) from e), (select sum(n) from g)""").fetchall())
PY
