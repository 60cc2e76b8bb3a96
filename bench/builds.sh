#!/usr/bin/env bash
# Several fnrun builds side by side on the warm path: interleaved rounds, each
# with a fresh daemon of one build; 300 sequential calls (p50, ms), then 1,500
# calls at concurrency 8 (runs/s) while the daemon's own CPU time is counted
# (clock ticks, /proc/PID/stat utime+stime; children excluded). Where
# bench/ab.sh says whether two builds differ, this says which step of a
# series of builds a difference came with, and whether it is the daemon's.
#
#   bench/builds.sh ROUNDS FNRUN...
#
# Prints "round build p50 runs/s daemon-ticks" per run, then the medians and
# the paired ratios against the first build. Root, like bench/ab.sh.
set -euo pipefail

ROUNDS=$1; shift
[ $# -ge 2 ] || { echo "usage: bench/builds.sh ROUNDS FNRUN FNRUN..." >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/work/target-bench}
cargo build --release -q --manifest-path "$ROOT/Cargo.toml" -p fnrun-bench
LOADGEN=$CARGO_TARGET_DIR/release/fnrun-loadgen
command -v umoci >/dev/null || { echo "builds.sh: needs umoci (bench/run.sh installs it)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/fnrun-builds.XXXXXX)
chmod 0755 "$WORK"
DAEMON_PID=""
cleanup() {
  [ -n "$DAEMON_PID" ] && kill "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null || true
  chmod -R u+rwX "$WORK" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# shellcheck source=bench/cat_image.sh
. "$ROOT/bench/cat_image.sh"
cat_image "$WORK"
LAYOUT=$WORK/cat-layout

load() { # conc n warmup -> the summary line
  "$LOADGEN" --socket "$WORK/sock" --image "oci:$LAYOUT:latest" --input "$WORK/input.yaml" \
    -c "$1" -n "$2" --warmup "$3" --label m --json /dev/null 2>&1 | awk '$1 == "m"'
}
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    rm -rf "$WORK/cache" "$WORK/sock"
    "$bin" serve --listen "unix:$WORK/sock" --cache-dir "$WORK/cache" > "$WORK/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 100); do [ -S "$WORK/sock" ] && break; sleep 0.1; done
    load 1 1 0 >/dev/null
    p50=$(load 1 300 30 | awk '{print $5}')
    before=$(ticks "$DAEMON_PID")
    tput=$(load 8 1500 40 | awk '{print $10}')
    echo "$r $bin $p50 $tput $(( $(ticks "$DAEMON_PID") - before ))"
    kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true; DAEMON_PID=""
  done
done | tee "$WORK/builds.txt"

python3 - "$WORK/builds.txt" "$@" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 5]
builds = sys.argv[2:]
by = collections.defaultdict(dict)
for r, b, p50, tput, ticks in rows:
    by[r][b] = (float(p50), float(tput), float(ticks))
base = builds[0]
for b in builds:
    med = [statistics.median(by[r][b][i] for r in by) for i in range(3)]
    ratio = [statistics.median(by[r][b][i] / by[r][base][i] for r in by) for i in range(3)]
    print(f"{b}: p50 {med[0]:.2f} ms x{ratio[0]:.3f}, c=8 {med[1]:.0f}/s x{ratio[1]:.3f}, "
          f"daemon ticks {med[2]:.0f} x{ratio[2]:.3f}")
PY
