#!/usr/bin/env bash
# perf/before_after.sh OLD_BIN NEW_BIN [ROUNDS]
#
# Three figures of two builds, measured alternately in one session on this
# machine (old, new, old, new, ...: the shared machine's drift falls on
# both), each round from a fresh data dir:
#   - fncall runs/s: fncall_bench, /bin/true at concurrency 16 and 256;
#   - container creations/s: container_bench, creations alone at
#     concurrency 1 and 16;
#   - durable session writes/s: session_bench's annotations, each
#     session's next write from the callback of its previous one.
# Prints every round's figures, then per figure the median of each build
# and the new/old ratio. OLD_BIN and NEW_BIN are bin dirs (dsecd, the
# benches, dsec-spawner, dsec-agent; e.g. a worktree of the old commit
# built with scripts/dev build). Runs as root (containers). ROUNDS: 3.
#
#   git worktree add /tmp/old <commit> && (cd /tmp/old && scripts/dev build)
#   perf/before_after.sh /tmp/old/build/bin build/bin 3
set -euo pipefail
old=$(cd "${1:?OLD_BIN}" && pwd)
new=$(cd "${2:?NEW_BIN}" && pwd)
rounds=${3:-3}
work=$(mktemp -d /tmp/dsec-ab.XXXXXX)
dsecd_pid=
cleanup() {
  [ -n "$dsecd_pid" ] && kill "$dsecd_pid" 2>/dev/null && wait "$dsecd_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Starts BIN's dsecd on a fresh data dir; waits for its ready line.
start() {
  local bin=$1 data=$work/data
  rm -rf "$data"
  "$bin/dsecd" --data-dir "$data" --fncall-pool 64 --listen 127.0.0.1:7650 --admin 127.0.0.1:7651 \
    --http off >"$work/dsecd.log" 2>&1 &
  dsecd_pid=$!
  for _ in $(seq 600); do
    [ -f "$data/dsecd.json" ] && return 0
    kill -0 "$dsecd_pid" 2>/dev/null || { cat "$work/dsecd.log" >&2; return 1; }
    sleep 0.1
  done
  echo "before_after: $bin/dsecd did not start in 60 s" >&2
  return 1
}
stop() {
  kill "$dsecd_pid" 2>/dev/null || true
  wait "$dsecd_pid" 2>/dev/null || true
  dsecd_pid=
}

# One round of BIN: prints "fncall16 fncall256 create1 create16 writes".
round() {
  local bin=$1 f c s
  start "$bin"
  f=$("$bin/fncall_bench" --data-dir "$work/data" --runs 3000 --no-python --concurrency 16,256 --warmup 300)
  c=$("$bin/container_bench" --data-dir "$work/data" --creates 200 --concurrency 1,16 --churn 0 --execs 0 \
        --idle 0 --crun-runs 0)
  stop
  s=$("$bin/session_bench" --sessions 256 --steps 1 --rtt-steps 1 --annotations 100 --recovery 0)
  echo "$f" | awk '$1 == "/bin/true" && $2 == 16 {a = $4} $1 == "/bin/true" && $2 == 256 {b = $4} END {printf "%s %s ", a, b}'
  echo "$c" | awk '$1 == 1 && $2 == "|" {a = $3} $1 == 16 && $2 == "|" {b = $3} END {printf "%s %s ", a, b}'
  echo "$s" | awk -F': ' '/each with its next write in/ {split($2, v, "/"); printf "%s\n", v[1]}'
}

printf '%-5s %-4s %12s %12s %12s %12s %14s\n' round build "fncall c16" "fncall c256" "create c1" "create c16" "writes/s"
for r in $(seq "$rounds"); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    line=$(round "$bin")
    echo "$which $line" >>"$work/results"
    # shellcheck disable=SC2086
    printf '%-5s %-4s %12s %12s %12s %12s %14s\n' "$r" "$which" $line
  done
done
echo
python3 - "$work/results" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = ["fncall runs/s c16", "fncall runs/s c256", "container creations/s c1", "container creations/s c16",
         "durable session writes/s"]
print(f"{'figure':28} {'old (median, range)':>26} {'new (median, range)':>26} {'new/old':>8}")
for i, n in enumerate(names):
    o = [float(r[i + 1]) for r in rows if r[0] == "old" and len(r) > i + 1]
    w = [float(r[i + 1]) for r in rows if r[0] == "new" and len(r) > i + 1]
    if not o or not w:
        print(f"{n:28} (no figures)")
        continue
    mo, mw = statistics.median(o), statistics.median(w)
    print(f"{n:28} {mo:10.0f} ({min(o):.0f}-{max(o):.0f}) {mw:12.0f} ({min(w):.0f}-{max(w):.0f}) {mw / mo:8.2f}")
EOF
