#!/usr/bin/env bash
# Where the CPU of a warm call goes, against the floor's: at concurrency 8,
# where both cores are busy and throughput is their CPU over the CPU per call.
# For one fnrun build, ROUNDS times: N calls of the bench's `cat` image, with
# the machine's busy time (user, nice, system, irq and softirq from
# /proc/stat), the daemon's own (its threads' user and system time) and the
# load client's (`time`) counted over them and one second after (the last
# runs' ends); then N runs of the floor (`unshare -Urmnpfiu --mount-proc
# true`, `xargs -P 8`, as bench/run.sh) counted the same way. What is neither
# the daemon nor the client is the spawner's, the sandboxes' and the kernel
# threads' (the network namespaces' cleanup).
#
#   bench/cpu_budget.sh FNRUN [ROUNDS=2]      N=1500 by default
#
# Root, like bench/run.sh; results in docs/benchmarks-history.md ("what bounds
# the p50 and c=8 targets").
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FNRUN=${1:?usage: bench/cpu_budget.sh FNRUN [ROUNDS]}
ROUNDS=${2:-2}
N=${N:-1500}
# shellcheck source=bench/warm.sh
. "$ROOT/bench/warm.sh"

busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
HZ=$(getconf CLK_TCK)

for _ in $(seq "$ROUNDS"); do
  start_daemon "$FNRUN"
  load warmup 8 200 20 > /dev/null
  sleep 1
  b0=$(busy); d0=$(cpu_ticks "$DAEMON_PID"); t0=$(date +%s.%N)
  /usr/bin/time -f "%U %S" -o "$WORK/load.time" "$LOADGEN" --socket "$WORK/sock" \
    --image "oci:$LAYOUT:latest" --input "$WORK/input.yaml" -c 8 -n "$N" --warmup 0 \
    --label budget --json /dev/null > /dev/null 2>&1
  t1=$(date +%s.%N)
  sleep 1
  b1=$(busy); d1=$(cpu_ticks "$DAEMON_PID")
  stop_daemon
  read -r lu ls < "$WORK/load.time"
  awk -v b=$((b1 - b0)) -v d=$((d1 - d0)) -v lu="$lu" -v ls="$ls" -v n="$N" -v hz="$HZ" \
    -v w0="$t0" -v w1="$t1" 'BEGIN {
      all = b / hz * 1e6 / n; daemon = d / hz * 1e6 / n; client = (lu + ls) * 1e6 / n
      printf "fnrun c=8: %.0f runs/s; CPU us/call: all %.0f, daemon %.0f, load client %.0f, the rest %.0f\n",
        n / (w1 - w0), all, daemon, client, all - daemon - client }'

  b0=$(busy); t0=$(date +%s.%N)
  seq "$N" | xargs -P 8 -I{} unshare -Urmnpfiu --mount-proc true
  t1=$(date +%s.%N)
  sleep 1
  b1=$(busy)
  awk -v b=$((b1 - b0)) -v n="$N" -v hz="$HZ" -v w0="$t0" -v w1="$t1" 'BEGIN {
    printf "floor c=8: %.0f runs/s; CPU us/run: all %.0f\n", n / (w1 - w0), b / hz * 1e6 / n }'
done
