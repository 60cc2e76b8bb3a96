#!/usr/bin/env bash
# A/B of two fnrun builds on the warm path: interleaved rounds, each with a
# fresh daemon of one build, 400 sequential calls (p50, p99 and the share of
# them that found the sandbox pool empty, from the daemon's metrics) and 600
# calls at concurrency 8 (runs/s) of the bench's `cat` image, and the
# daemon's own CPU time per call over both (its threads' user and system
# time from /proc/PID/stat; not its sandboxes', nor the spawner's).
# Interleaving and paired ratios keep a slow spell of the machine from
# favouring either side; the CPU time moves far less with the machine than
# the latencies do.
#
#   bench/ab.sh OLD_FNRUN NEW_FNRUN [ROUNDS=8]
#   LOAD_ARGS="--deadline 30" bench/ab.sh ...   (calls carry a grpc-timeout)
#   DAEMON_ARGS="--sandbox-pool 0" bench/ab.sh ...   (options of both daemons)
#   AB_METRICS=HOST:PORT   where the daemons serve metrics (127.0.0.1:9479)
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
AB_METRICS=${AB_METRICS:-127.0.0.1:9479}
DAEMON_ARGS="${DAEMON_ARGS:-} --metrics-listen $AB_METRICS"

# The daemon's count of calls that found the sandbox pool empty.
misses() {
  curl -sf "http://$AB_METRICS/metrics" |
    awk '$1 == "fnrun_sandbox_pool_misses_total" {n = $2} END {print n + 0}'
}

for r in $(seq "$ROUNDS"); do
  for side in old new; do
    bin=$OLD; [ "$side" = new ] && bin=$NEW
    start_daemon "$bin"
    load first 1 1 0 >/dev/null
    t0=$(cpu_ticks "$DAEMON_PID")
    m0=$(misses)
    read -r p50 p99 < <(load seq 1 400 20 | awk '{print $5, $7}')
    # Of the 420 sequential calls (the warm-up's too), in percent.
    miss=$(awk -v a="$m0" -v b="$(misses)" 'BEGIN {printf "%.1f", (b - a) * 100 / 420}')
    tput=$(load c8 8 600 40 | awk '{print $10}')
    t1=$(cpu_ticks "$DAEMON_PID")
    # Clock ticks (USER_HZ) over the 1060 calls, in microseconds per call.
    cpu=$(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) / 1060 ))
    echo "$r $side $p50 $tput $cpu $p99 $miss"
    stop_daemon
  done
done | tee "$WORK/ab.txt"

python3 - "$WORK/ab.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for r, side, p50, tput, cpu, p99, miss in rows:
    by.setdefault(r, {})[side] = (float(p50), float(tput), float(cpu), float(p99), float(miss))
pairs = [v for v in by.values() if len(v) == 2]
lat = [v["new"][0] / v["old"][0] for v in pairs]
tail = [v["new"][3] / v["old"][3] for v in pairs]
thr = [v["new"][1] / v["old"][1] for v in pairs]
print(f"p50 (ms), median of rounds: old {statistics.median(v['old'][0] for v in pairs):.2f}, "
      f"new {statistics.median(v['new'][0] for v in pairs):.2f}; "
      f"paired new/old median {statistics.median(lat):.2f} ({min(lat):.2f}..{max(lat):.2f})")
print(f"p99 (ms), median of rounds: old {statistics.median(v['old'][3] for v in pairs):.2f}, "
      f"new {statistics.median(v['new'][3] for v in pairs):.2f}; "
      f"paired new/old median {statistics.median(tail):.2f} ({min(tail):.2f}..{max(tail):.2f})")
print("sequential calls that found the pool empty (%), median of rounds: "
      f"old {statistics.median(v['old'][4] for v in pairs):.1f}, "
      f"new {statistics.median(v['new'][4] for v in pairs):.1f}")
print(f"c=8 runs/s, median of rounds: old {statistics.median(v['old'][1] for v in pairs):.0f}, "
      f"new {statistics.median(v['new'][1] for v in pairs):.0f}; "
      f"paired new/old median {statistics.median(thr):.2f} ({min(thr):.2f}..{max(thr):.2f})")
cpu = [v["new"][2] / v["old"][2] for v in pairs]
print(f"daemon CPU us/call, median of rounds: old {statistics.median(v['old'][2] for v in pairs):.0f}, "
      f"new {statistics.median(v['new'][2] for v in pairs):.0f}; "
      f"paired new/old median {statistics.median(cpu):.2f} ({min(cpu):.2f}..{max(cpu):.2f})")
PY
