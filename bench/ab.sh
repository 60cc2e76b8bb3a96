#!/usr/bin/env bash
# A/B of two fnrun builds on the warm path: interleaved rounds, each with a
# fresh daemon of one build, 200 sequential calls (p50) and 600 calls at
# concurrency 8 (runs/s) of the bench's `cat` image, and the daemon's own CPU
# time per call over both (its threads' user and system time from
# /proc/PID/stat; not its sandboxes', nor the spawner's). Interleaving and
# paired ratios keep a slow spell of the machine from favouring either side;
# the CPU time moves far less with the machine than the latencies do.
#
#   bench/ab.sh OLD_FNRUN NEW_FNRUN [ROUNDS=8]
#   LOAD_ARGS="--deadline 30" bench/ab.sh ...   (calls carry a grpc-timeout)
#   DAEMON_ARGS="--sandbox-pool 0" bench/ab.sh ...   (options of both daemons)
#
# The binaries are release builds (e.g. `git worktree add /tmp/old <commit>`
# then `cargo build --release -p fnrun` there). The load client is built from
# this checkout. Root, like bench/run.sh; prints per-round and median ratios.
set -euo pipefail

OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${3:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/warm.sh
. "$ROOT/bench/warm.sh"

for r in $(seq "$ROUNDS"); do
  for side in old new; do
    bin=$OLD; [ "$side" = new ] && bin=$NEW
    start_daemon "$bin"
    load first 1 1 0 >/dev/null
    t0=$(awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat")
    p50=$(load seq 1 200 20 | awk '{print $5}')
    tput=$(load c8 8 600 40 | awk '{print $10}')
    t1=$(awk '{print $14 + $15}' "/proc/$DAEMON_PID/stat")
    # Clock ticks (USER_HZ) over the 860 calls, in microseconds per call.
    cpu=$(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) / 860 ))
    echo "$r $side $p50 $tput $cpu"
    stop_daemon
  done
done | tee "$WORK/ab.txt"

python3 - "$WORK/ab.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r, side, p50, tput, cpu in rows:
    by.setdefault(r, {})[side] = (float(p50), float(tput), float(cpu))
pairs = [v for v in by.values() if len(v) == 2]
lat = [v["new"][0] / v["old"][0] for v in pairs]
thr = [v["new"][1] / v["old"][1] for v in pairs]
print(f"p50 (ms), median of rounds: old {statistics.median(v['old'][0] for v in pairs):.2f}, "
      f"new {statistics.median(v['new'][0] for v in pairs):.2f}; "
      f"paired new/old median {statistics.median(lat):.2f} ({min(lat):.2f}..{max(lat):.2f})")
print(f"c=8 runs/s, median of rounds: old {statistics.median(v['old'][1] for v in pairs):.0f}, "
      f"new {statistics.median(v['new'][1] for v in pairs):.0f}; "
      f"paired new/old median {statistics.median(thr):.2f} ({min(thr):.2f}..{max(thr):.2f})")
cpu = [v["new"][2] / v["old"][2] for v in pairs]
print(f"daemon CPU us/call, median of rounds: old {statistics.median(v['old'][2] for v in pairs):.0f}, "
      f"new {statistics.median(v['new'][2] for v in pairs):.0f}; "
      f"paired new/old median {statistics.median(cpu):.2f} ({min(cpu):.2f}..{max(cpu):.2f})")
PY
