# Shared by the benchmark scripts (sourced, with `root` set to the repository):
# B, the binary (BACKFILL, or target/release/backfill built here), and `now`.
if [ -z "${BACKFILL:-}" ]; then
  (cd "$root" && cargo build --release --bin backfill >&2)
  BACKFILL="$root/target/release/backfill"
fi
B="$BACKFILL"
now() { date +%s.%N; }
