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
# shellcheck source=bench/warm.sh
. "$ROOT/bench/warm.sh"

for r in $(seq "$ROUNDS"); do
  for bin in "$@"; do
    start_daemon "$bin"
    load first 1 1 0 >/dev/null
    p50=$(load m 1 300 30 | awk '{print $5}')
    before=$(cpu_ticks "$DAEMON_PID")
    tput=$(load m 8 1500 40 | awk '{print $10}')
    echo "$r $bin $p50 $tput $(( $(cpu_ticks "$DAEMON_PID") - before ))"
    stop_daemon
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
